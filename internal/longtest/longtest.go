// Package longtest holds the module's one -long test flag. By default
// `go test ./...` runs every test at a size that keeps the whole suite within
// minutes on a laptop; `go test ./... -long` runs the heavy property tests,
// long random operation sequences and large models at full size.
//
// Quick start, in a _test.go file:
//
//	func TestPropertyRandomOps(t *testing.T) {
//		ops := longtest.Choose(20_000, 1_000_000)
//		...
//	}
//
// Every package with tests imports longtest (a blank import is enough), so
// that the flag is defined in every test binary `go test ./... -long` starts;
// this package's own test holds that rule over the module.
package longtest

import "flag"

// long is registered on the test binary's command line when a test package
// imports this one; only test code imports it.
var long = flag.Bool("long", false, "run heavy property tests and long random sequences at full size")

// Enabled reports whether -long was given. It must be called from a test (after
// flag parsing), not from a package initializer.
func Enabled() bool { return *long }

// Choose returns full under -long and short otherwise.
func Choose[T any](short, full T) T {
	if *long {
		return full
	}
	return short
}
