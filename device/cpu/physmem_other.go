//go:build !linux

package cpu

// physicalMemory is 16 GiB where the host's RAM is not read (set
// Options.TotalBytes for the real figure).
func physicalMemory() uint64 { return 16 << 30 }
