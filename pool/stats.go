package pool

import (
	"github.com/memwall/memwall/telemetry"
)

// Stats returns a snapshot of the pool's accounting. It reads the
// per-processor caches by stopping them, which stops the world for a
// moment (as runtime.ReadMemStats does): tens of microseconds, meant for
// monitoring and tests, not for every allocation. ReservedBytes is the
// lock-free figure to sample often.
func (p *Pool) Stats() telemetry.PoolStats {
	p.mu.Lock()
	st := p.arenaStats()
	c, cached := p.totalsLocked()
	p.mu.Unlock()
	lat := p.AllocLatency()
	s := telemetry.PoolStats{
		Name:              p.opts.Name,
		Backend:           p.info.Backend,
		Strategy:          p.opts.Strategy,
		Growth:            p.opts.Growth.String(),
		ReservedBytes:     p.reserved.Load(),
		PeakReservedBytes: p.peakReserved.Load(),
		LimitBytes:        p.opts.Limit,
		UsedBytes:         c.used(),
		RequestedBytes:    c.requested,
		PeakUsedBytes:     p.peakUsed.Load(),
		CachedBytes:       cached,
		PendingBytes:      p.pendingBytes.Load(),
		LiveBlocks:        int(c.allocs - c.frees),
		FreeBytes:         st.free,
		LargestFreeBytes:  st.largest,
		Fragmentation:     st.frag(),
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
