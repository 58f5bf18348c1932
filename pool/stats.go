package pool

import (
	"github.com/memwall/memwall/telemetry"
)

// Stats returns a snapshot of the pool's accounting.
func (p *Pool) Stats() telemetry.PoolStats {
	p.mu.Lock()
	st := p.arenaStats()
	p.mu.Unlock()
	s := telemetry.PoolStats{
		Name:              p.opts.Name,
		Backend:           p.info.Backend,
		Strategy:          p.opts.Strategy,
		Growth:            p.opts.Growth.String(),
		ReservedBytes:     p.reserved.Load(),
		PeakReservedBytes: p.peakReserved.Load(),
		LimitBytes:        p.opts.Limit,
		UsedBytes:         p.used.Load(),
		RequestedBytes:    p.requested.Load(),
		PeakUsedBytes:     p.peakUsed.Load(),
		CachedBytes:       p.cached.Load(),
		PendingBytes:      p.pendingBytes.Load(),
		LiveBlocks:        int(p.live.Load()),
		FreeBytes:         st.free,
		LargestFreeBytes:  st.largest,
		Fragmentation:     st.frag(),
		ByPurpose:         map[string]uint64{},
		Tenants:           p.tenantStats(),
		Allocs:            p.allocs.Load(),
		Frees:             p.frees.Load(),
		OOMs:              p.ooms.Load(),
		DeviceAllocs:      p.devAllocs.Load(),
		DeviceFrees:       p.devFrees.Load(),
		Maps:              p.maps.Load(),
		Unmaps:            p.unmaps.Load(),
		AllocP50:          p.latency.Quantile(0.5),
		AllocP99:          p.latency.Quantile(0.99),
	}
	if p.host {
		s.Backend += "-pinned-host"
	}
	if s.ReservedBytes > 0 {
		s.Utilization = float64(s.UsedBytes) / float64(s.ReservedBytes)
	}
	for i := Purpose(0); i < numPurposes; i++ {
		if v := p.byPurpose[i].Load(); v > 0 {
			s.ByPurpose[i.String()] = v
		}
	}
	return s
}
