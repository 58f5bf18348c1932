//go:build !amd64 && !arm64

package kvcache

func prefetch(addr uintptr) {}
