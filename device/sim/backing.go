package sim

import "runtime"

// mapMin is the smallest backing that is mapped outside the Go heap; smaller
// ones are Go memory, which costs no system call.
const mapMin = 256 << 10

// backed is the bytes behind an allocation or a physical chunk (or, for a
// host-mapped buffer, the host's slice itself).
type backed struct {
	buf []byte
	// release gives back buf when bytes mapped it (nil: Go memory, left to
	// the collector).
	release func()
}

// bytes returns the n bytes behind b, made zeroed at first use. Where the
// system allows it (mapAnon), bytes of at least mapMin are an anonymous
// mapping outside the Go heap: a page costs host memory only once written,
// and all of it returns to the system at drop, instead of staying in the Go
// heap until a collection and being cleared again for the next allocation
// there. A device dropped without Close gives its mappings back when they
// are collected.
func (b *backed) bytes(n uint64) []byte {
	if b.buf != nil {
		return b.buf
	}
	if n >= mapMin {
		if m, err := mapAnon(n); err == nil {
			c := runtime.AddCleanup(b, unmapAnon, m)
			b.buf, b.release = m, func() {
				c.Stop()
				unmapAnon(m)
			}
			return m
		}
	}
	b.buf = make([]byte, n)
	return b.buf
}

// drop forgets b's bytes, giving back those bytes mapped.
func (b *backed) drop() {
	if b.release != nil {
		b.release()
		b.release = nil
	}
	b.buf = nil
}

// dropAll gives back the bytes of every allocation and physical chunk,
// released chunks still mapped included.
func (m *memory) dropAll() {
	for _, r := range m.allocs {
		r.drop()
	}
	for _, c := range m.chunks {
		c.drop()
	}
	for _, r := range m.reserves {
		for _, mp := range r.maps {
			mp.chunk.drop()
		}
	}
}
