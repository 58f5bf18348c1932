//go:build race

package alloc_test

// raceEnabled shortens the long random sequences: the race detector slows
// the allocators about tenfold and they are single-threaded anyway.
const raceEnabled = true
