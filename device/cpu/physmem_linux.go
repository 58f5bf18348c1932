package cpu

import "syscall"

// physicalMemory returns the host's RAM in bytes (sysinfo), or 16 GiB when
// it cannot be read.
func physicalMemory() uint64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil || si.Totalram == 0 {
		return 16 << 30
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}
