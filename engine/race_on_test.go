//go:build race

package engine_test

// raceEnabled: the race detector slows the simulator's kernels tenfold;
// tests that only check numerics skip under it with -short (CI's race step).
const raceEnabled = true
