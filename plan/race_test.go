//go:build race

package plan

// raceEnabled reports a -race build, which runs the search 10-20x slower.
const raceEnabled = true
