package pool

import "github.com/memwall/memwall/device"

// Range is a range of device addresses.
type Range struct {
	Ptr  device.Ptr
	Size uint64
}

// ReservedBytes returns the bytes the pool holds from the device now (the
// same figure as Stats().ReservedBytes, without taking any lock), for
// callers that sample it often.
func (p *Pool) ReservedBytes() uint64 { return p.reserved.Load() }

// Reservations returns, in address order within each arena, the ranges of
// device memory the pool holds now: each chunk, and each run of mapped
// pages of a virtual arena. The slice is the caller's.
func (p *Pool) Reservations() []Range {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := p.reservationsLocked()
	p.eachShard(func(s *Pool) {
		s.mu.Lock()
		rs = append(rs, s.reservationsLocked()...)
		s.mu.Unlock()
	})
	return rs
}

// reservationsLocked is Reservations with p.mu held.
func (p *Pool) reservationsLocked() []Range {
	var rs []Range
	for _, a := range p.arenas {
		if !a.virtual {
			rs = append(rs, Range{Ptr: a.base, Size: a.size})
			continue
		}
		for i := 0; i < len(a.pages); i++ {
			if !a.pages[i].mapped {
				continue
			}
			va := a.base + device.Ptr(uint64(i)*a.pageBytes)
			if n := len(rs); n > 0 && rs[n-1].Ptr+device.Ptr(rs[n-1].Size) == va {
				rs[n-1].Size += a.pageBytes
				continue
			}
			rs = append(rs, Range{Ptr: va, Size: a.pageBytes})
		}
	}
	return rs
}
