//go:build !linux

package cpu

func populate(b []byte) { touch(b) }

func adviseHuge([]byte) {}

func collapse([]byte) {}
