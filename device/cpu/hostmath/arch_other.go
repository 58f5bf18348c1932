//go:build !amd64

package hostmath

import "runtime"

func supported(v Variant) bool { return v == Generic }

func archFor(Variant) archKernels { return archKernels{} }

// Features names the platform: no vector variants are built for it yet.
func Features() string { return runtime.GOARCH + " (generic kernels only)" }
