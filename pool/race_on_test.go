//go:build race

package pool_test

// raceOn lowers the work of the heaviest tests under the race detector.
const raceOn = true
