package pool

import (
	"time"
)

// Stats is a snapshot of one pool's accounting, the JSON stats memwall
// prints and the source of telemetry's metrics. Sizes are bytes.
type Stats struct {
	Name     string `json:"name"`
	Backend  string `json:"backend"`
	Strategy string `json:"strategy"`
	Growth   string `json:"growth"`

	// ReservedBytes is device memory the pool holds (allocated chunks or
	// mapped pages); PeakReservedBytes its high-water mark.
	ReservedBytes     uint64 `json:"reserved_bytes"`
	PeakReservedBytes uint64 `json:"peak_reserved_bytes"`
	LimitBytes        uint64 `json:"limit_bytes"`
	// UsedBytes is bytes in live blocks as handed out (after rounding, with
	// any alignment slack before the address); RequestedBytes what
	// callers asked for.
	UsedBytes      uint64 `json:"used_bytes"`
	RequestedBytes uint64 `json:"requested_bytes"`
	PeakUsedBytes  uint64 `json:"peak_used_bytes"`
	// CachedBytes are freed blocks kept in per-processor caches;
	// PendingBytes blocks freed on a stream whose work may still run.
	CachedBytes  uint64 `json:"cached_bytes"`
	PendingBytes uint64 `json:"pending_bytes"`
	LiveBlocks   int    `json:"live_blocks"`
	// FreeBytes is reserved memory no block holds (for a virtual pool:
	// free bytes on mapped pages). LargestFreeBytes is its largest
	// contiguous range and Fragmentation largest over total free (1 = one
	// range): both walk the arenas' free ranges, so only DetailedStats
	// sets them (Stats leaves them 0).
	FreeBytes        uint64  `json:"free_bytes"`
	LargestFreeBytes uint64  `json:"largest_free_bytes,omitempty"`
	Utilization      float64 `json:"utilization"`             // used / reserved
	Fragmentation    float64 `json:"fragmentation,omitempty"` // largest free / total free

	ByPurpose map[string]uint64 `json:"by_purpose"`
	Tenants   []TenantStats     `json:"tenants,omitempty"`

	Allocs uint64 `json:"allocs"`
	Frees  uint64 `json:"frees"`
	// OOMs counts the allocations the pool refused; a tenant's refusals
	// by its quota, made before the pool is asked, count in its
	// TenantStats.
	OOMs uint64 `json:"ooms"`
	// Device calls the pool made.
	DeviceAllocs uint64 `json:"device_allocs"`
	DeviceFrees  uint64 `json:"device_frees"`
	Maps         uint64 `json:"maps"`
	Unmaps       uint64 `json:"unmaps"`

	AllocP50 time.Duration `json:"alloc_p50_ns"`
	AllocP99 time.Duration `json:"alloc_p99_ns"`
}

// DeviceCalls is the total number of driver allocations, frees, maps and
// unmaps.
func (s Stats) DeviceCalls() uint64 { return s.DeviceAllocs + s.DeviceFrees + s.Maps + s.Unmaps }

// TenantStats is one tenant's accounting.
type TenantStats struct {
	Name      string `json:"name"`
	UsedBytes uint64 `json:"used_bytes"`
	PeakBytes uint64 `json:"peak_bytes"`
	Quota     uint64 `json:"quota_bytes"` // 0 = none
	OOMs      uint64 `json:"ooms"`
}

// Stats returns the pool's counters. It takes the pool's lock for a few
// loads and reads each processor cache's counters as they stand, without
// stopping any goroutine and without walking pages or free ranges: cheap
// enough for every scrape. While other goroutines allocate and free, the
// figures of different processors may be a few operations apart; with no
// operation in flight they are exact.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	c, cached := p.totals()
	free := p.reserved.Load() - min(p.reserved.Load(), p.takenNow())
	p.mu.Unlock()
	return p.stats(c, cached, free)
}

// DetailedStats is Stats with LargestFreeBytes and Fragmentation, which
// walk every arena's free ranges under the pool's lock (time in the number
// of free ranges; allocations wait meanwhile).
func (p *Pool) DetailedStats() Stats {
	p.mu.Lock()
	st := p.arenaStats()
	p.shardArenaStats(&st)
	c, cached := p.totals()
	p.mu.Unlock()
	s := p.stats(c, cached, st.free)
	s.LargestFreeBytes, s.Fragmentation = st.largest, st.frag()
	return s
}

func (p *Pool) stats(c counters, cached, free uint64) Stats {
	lat := p.AllocLatency()
	s := Stats{
		Name:              p.opts.Name,
		Backend:           p.info.Backend,
		Strategy:          p.opts.Strategy,
		Growth:            p.opts.Growth.String(),
		ReservedBytes:     p.reserved.Load(),
		PeakReservedBytes: p.peakReserved.Load(),
		LimitBytes:        p.limitBytes(),
		UsedBytes:         c.used(),
		RequestedBytes:    c.requested,
		PeakUsedBytes:     p.peakUsed.Load(),
		CachedBytes:       cached,
		PendingBytes:      p.pendingBytes.Load(),
		LiveBlocks:        int(c.allocs - c.frees),
		FreeBytes:         free,
		ByPurpose:         map[string]uint64{},
		Tenants:           p.tenantStats(),
		Allocs:            c.allocs,
		Frees:             c.frees,
		OOMs:              p.ooms.Load(),
		DeviceAllocs:      p.devAllocs.Load(),
		DeviceFrees:       p.devFrees.Load(),
		Maps:              p.maps.Load(),
		Unmaps:            p.unmaps.Load(),
		AllocP50:          lat.Quantile(0.5),
		AllocP99:          lat.Quantile(0.99),
	}
	if p.host {
		s.Backend += "-pinned-host"
	}
	if s.ReservedBytes > 0 {
		s.Utilization = float64(s.UsedBytes) / float64(s.ReservedBytes)
	}
	for i := Purpose(0); i < numPurposes; i++ {
		if v := c.byPurpose[i]; v > 0 {
			s.ByPurpose[i.String()] = v
		}
	}
	return s
}
