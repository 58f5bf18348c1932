package pool

import (
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/memwall/memwall/device"
)

// Tenant is a named sub-pool with a quota: a model or a user session on a
// shared server. A tenant can neither exceed its quota nor free another
// tenant's (or the pool's untenanted) blocks.
type Tenant struct {
	p     *Pool
	nm    string
	quota uint64 // 0 = no quota
	used  atomic.Uint64
	peak  atomic.Uint64
	ooms  atomic.Uint64
}

// Tenant creates a tenant with the given quota in bytes (0 = none). Names
// are unique within a pool.
func (p *Pool) Tenant(name string, quota uint64) (*Tenant, error) {
	if name == "" {
		return nil, fmt.Errorf("pool %s: tenant name is empty", p.opts.Name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.tenants[name]; ok {
		return nil, fmt.Errorf("pool %s: tenant %q already exists", p.opts.Name, name)
	}
	t := &Tenant{p: p, nm: name, quota: quota}
	p.tenants[name] = t
	return t, nil
}

// Name returns the tenant's name.
func (t *Tenant) Name() string { return t.nm }

// Used returns the bytes the tenant holds in live blocks.
func (t *Tenant) Used() uint64 { return t.used.Load() }

func (t *Tenant) name() string {
	if t == nil {
		return ""
	}
	return t.nm
}

// Alloc allocates on behalf of the tenant, within its quota.
func (t *Tenant) Alloc(size uint64, o AllocOptions) (Block, error) { return t.p.alloc(t, size, o) }

// Free frees one of the tenant's blocks.
func (t *Tenant) Free(b Block) error { return t.p.free(t, b) }

// FreeAsync frees one of the tenant's blocks, stream-ordered on s.
func (t *Tenant) FreeAsync(b Block, s device.Stream) error { return t.p.freeAsync(t, b, s) }

func (t *Tenant) charge(n uint64) error {
	for {
		cur := t.used.Load()
		if t.quota != 0 && cur+n > t.quota {
			t.ooms.Add(1)
			return &OOMError{Pool: t.p.opts.Name, Tenant: t.nm, Requested: n, Quota: t.quota, TenantUsed: cur,
				Cause: CauseQuota, Tried: []string{"quota check"}}
		}
		if t.used.CompareAndSwap(cur, cur+n) {
			updateMax(&t.peak, cur+n)
			return nil
		}
	}
}

func (t *Tenant) uncharge(n uint64) { t.used.Add(^(n - 1)) }

func (p *Pool) tenantStats() []TenantStats {
	p.mu.Lock()
	ts := make([]TenantStats, 0, len(p.tenants))
	for _, t := range p.tenants {
		ts = append(ts, TenantStats{Name: t.nm, UsedBytes: t.used.Load(), PeakBytes: t.peak.Load(), Quota: t.quota, OOMs: t.ooms.Load()})
	}
	p.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts
}
