package pool

import (
	"errors"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/memwall/memwall/device"
)

// Tenant is the limit and tenant layer: a named Resource over another that
// holds the bytes of its live blocks to a quota (a model or a user session
// on a shared server) and frees only blocks it handed out. A pool's blocks
// record the tenant that handed them out (the outermost, when tenants
// stack), so a tenant's block is refused by the pool, by the tenants below
// it and by any other tenant, freed through anything but its own tenant;
// a block of another resource carries no such record and is taken on
// trust. Tenants stack: a session's tenant over a model's tenant is
// charged by both. A tenant charges a block's Size as handed out (the pool's rounding
// to a size class or its alignment included) and gives it back when the
// layer below accepts the free; the quota is never exceeded, not even for
// a moment between concurrent allocations.
type Tenant struct {
	up    Resource
	below *Tenant // ownerOf(up): the nearest tenant below
	nm    string
	pool  string // the pool's name for errors, when made by Pool.Tenant
	quota uint64 // 0 = no quota
	used  atomic.Uint64
	peak  atomic.Uint64
	ooms  atomic.Uint64
}

// NewTenant returns a tenant named name over up with the given quota in
// bytes (0 = none).
func NewTenant(up Resource, name string, quota uint64) *Tenant {
	return &Tenant{up: up, below: ownerOf(up), nm: name, quota: quota}
}

// Tenant creates a tenant over the pool with the given quota in bytes
// (0 = none), listed in the pool's Stats. Names are unique within a pool.
func (p *Pool) Tenant(name string, quota uint64) (*Tenant, error) {
	if name == "" {
		return nil, fmt.Errorf("%s: tenant name is empty", poolLabel(p.opts.Name))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.tenants[name]; ok {
		return nil, fmt.Errorf("%s: tenant %q already exists", poolLabel(p.opts.Name), name)
	}
	t := NewTenant(p, name, quota)
	t.pool = p.opts.Name
	p.tenants[name] = t
	return t, nil
}

// Name returns the tenant's name.
func (t *Tenant) Name() string { return t.nm }

// Used returns the bytes the tenant holds in live blocks.
func (t *Tenant) Used() uint64 { return t.used.Load() }

// Upstream returns the resource the tenant allocates from.
func (t *Tenant) Upstream() Resource { return t.up }

// Stats returns the tenant's accounting.
func (t *Tenant) Stats() TenantStats {
	return TenantStats{Name: t.nm, UsedBytes: t.used.Load(), PeakBytes: t.peak.Load(), Quota: t.quota, OOMs: t.ooms.Load()}
}

func (t *Tenant) name() string {
	if t == nil {
		return ""
	}
	return t.nm
}

// Alloc allocates within the tenant's quota. A request that its quota
// cannot hold fails with an *OOMError of Cause CauseQuota before the layer
// below is asked; one that the layer below refuses fails with that layer's
// error, naming the tenant.
func (t *Tenant) Alloc(size uint64, o AllocOptions) (Block, error) {
	// Charge the request first, so that concurrent allocations never
	// pass the quota together, then what the block holds.
	if err := t.charge(size, size); err != nil {
		return Block{}, err
	}
	if o.tenant == nil {
		o.tenant = t // the label events and snapshots show: the outermost tenant
	}
	b, err := t.up.Alloc(size, o)
	if err != nil {
		t.uncharge(size)
		// A refusal below names the tenant asked (the outermost, as
		// each tenant on the way sets it); a quota's names its own.
		var oom *OOMError
		if errors.As(err, &oom) && oom.Cause != CauseQuota {
			oom.Tenant = t.nm
		}
		if errors.Is(err, ErrOutOfMemory) {
			t.ooms.Add(1)
		}
		return Block{}, err
	}
	if b.Size > size {
		if err := t.charge(b.Size-size, size); err != nil {
			t.uncharge(size)
			if b.m != nil {
				b.gen |= passed // the tenant's own, passed down
			}
			_ = t.up.Free(b) // just handed out: nothing uses it
			return Block{}, err
		}
	} else if b.Size < size {
		t.uncharge(size - b.Size)
	}
	return b, nil
}

// Free frees one of the tenant's blocks.
func (t *Tenant) Free(b Block) error {
	n, err := t.take(&b)
	if err != nil {
		return err
	}
	if err := t.up.Free(b); err != nil {
		return err
	}
	t.uncharge(n)
	return nil
}

// FreeAsync frees one of the tenant's blocks, stream-ordered on s.
func (t *Tenant) FreeAsync(b Block, s device.Stream) error {
	n, err := t.take(&b)
	if err != nil {
		return err
	}
	if err := t.up.FreeAsync(b, s); err != nil {
		return err
	}
	t.uncharge(n)
	return nil
}

// take checks that b may be freed through the tenant and returns the
// bytes it was charged. A pool's block handed to Free by the caller must
// be the tenant's own; take marks its handle passed down, and a tenant
// below takes it then as a block of a tenant over it.
func (t *Tenant) take(b *Block) (uint64, error) {
	if m := b.m; m != nil {
		owner := m.tenant
		if b.gen&passed == 0 {
			if owner != t {
				return 0, t.refuse(*b, owner)
			}
			b.gen |= passed
		} else if !t.under(owner) {
			return 0, t.refuse(*b, owner)
		}
	}
	return heldBytes(*b), nil
}

// under reports whether the tenant is o or lies below it.
func (t *Tenant) under(o *Tenant) bool {
	for ; o != nil; o = o.below {
		if o == t {
			return true
		}
	}
	return false
}

func (t *Tenant) refuse(b Block, owner *Tenant) error {
	who := "the pool's"
	if owner != nil {
		who = fmt.Sprintf("tenant %q's", owner.nm)
	}
	return fmt.Errorf("%s: block %#x is %s, not tenant %q's: %w", t.where(), uint64(b.Ptr), who, t.nm, ErrInvalidHandle)
}

func (t *Tenant) where() string {
	if t.pool != "" {
		return poolLabel(t.pool)
	}
	return fmt.Sprintf("tenant %q", t.nm)
}

// charge adds n bytes to the tenant's use, or refuses (for a request of
// req bytes) when that would pass the quota.
func (t *Tenant) charge(n, req uint64) error {
	for {
		cur := t.used.Load()
		if t.quota != 0 && (n > t.quota || cur > t.quota-n) {
			t.ooms.Add(1)
			return &OOMError{Pool: t.pool, Tenant: t.nm, Requested: req, Quota: t.quota, TenantUsed: cur,
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
		ts = append(ts, t.Stats())
	}
	p.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts
}
