package pool_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
)

// FuzzLayers drives a stack of layers read from the input — over a pool
// (its growth, cache and limit from the first byte) or over a pool over
// another pool: two sibling tenants with quotas, a tenant over one of them
// through a counter, and an event log over the lot — with an operation
// sequence read from the rest (up to 400 operations): allocations through
// any layer of any size,
// frees through the right layer, a wrong one, twice, or stream-ordered.
// After every operation: a tenant's use is the Sizes of its live blocks
// (a nested tenant's counted in both) and within its quota, the counter
// agrees with what passed through it, the pool with every live block, and
// every refusal is an out-of-memory error or an invalid handle that
// changed nothing. At the end the log reads back as a valid trace and
// freeing everything gives every byte back. Nothing may panic.
func FuzzLayers(f *testing.F) {
	f.Add([]byte{0, 0, 10, 1, 20, 2, 12, 3, 0, 4, 1, 5, 0, 6, 2})
	f.Add([]byte{1, 2, 24, 2, 24, 2, 24, 2, 24, 7, 0, 7, 1, 8, 0})
	f.Add([]byte{6, 3, 14, 3, 14, 4, 3, 5, 2, 9, 0, 1, 25, 0, 25})
	f.Add([]byte{13, 0, 26, 1, 26, 2, 26, 3, 26, 4, 26, 7, 0, 7, 0, 8, 1})
	f.Fuzz(runLayers)
}

func runLayers(t *testing.T, data []byte) {
	if len(data) == 0 {
		return
	}
	cfg, data := data[0], data[1:]
	d := fuzzDevice()
	o := pool.Options{}
	if cfg&1 != 0 {
		o.Growth = pool.GrowChunks
	}
	if cfg&2 != 0 {
		o.Cache = pool.CacheOff
	} else if cfg&4 != 0 {
		o.Cache = pool.CacheShared
	}
	if cfg&8 != 0 {
		o.Limit = 128 << 20
	}
	if cfg&16 != 0 {
		parent, err := pool.New(d, pool.Options{Name: "parent"})
		if err != nil {
			t.Fatal(err)
		}
		defer parent.Close()
		o.Upstream = pool.Chunks(parent, pool.AllocOptions{})
	}
	p, err := pool.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, _ := p.Tenant("a", 96<<20)
	b, _ := p.Tenant("b", 0)
	cnt := pool.NewCounter(a, "between")
	c := pool.NewTenant(cnt, "c", 40<<20) // charged to a as well, counted between
	var buf bytes.Buffer
	log := trace.NewEventLog(&buf)
	layers := []pool.Resource{p, a, b, c, log.Wrap(c)}
	quota := map[*pool.Tenant]uint64{a: 96 << 20, c: 40 << 20}
	chainOf := func(i int) []*pool.Tenant {
		switch i {
		case 1:
			return []*pool.Tenant{a}
		case 2:
			return []*pool.Tenant{b}
		case 3, 4:
			return []*pool.Tenant{c, a}
		}
		return nil
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	type held struct {
		b     pool.Block
		layer int
	}
	var live []held
	use := map[*pool.Tenant]uint64{}
	var between uint64 // bytes through the counter: blocks of c
	account := func(h held, sign int) {
		for _, tn := range chainOf(h.layer) {
			if sign > 0 {
				use[tn] += h.b.Size
			} else {
				use[tn] -= h.b.Size
			}
		}
		if h.layer >= 3 {
			if sign > 0 {
				between += h.b.Size
			} else {
				between -= h.b.Size
			}
		}
	}
	for n := 0; len(data) >= 2 && n < 400; n++ {
		op, arg := data[0], data[1]
		data = data[2:]
		switch k := int(op % 10); {
		case k < 5:
			size := uint64(1) << (arg % 27)
			size += uint64(arg) * 37 % size
			blk, err := layers[k].Alloc(size, pool.AllocOptions{Purpose: pool.Purpose(arg % 6)})
			if err != nil {
				var oom *pool.OOMError
				if !errors.As(err, &oom) || !errors.Is(err, pool.ErrOutOfMemory) {
					t.Fatalf("alloc of %d through layer %d: %v", size, k, err)
				}
				if oom.Cause == pool.CauseQuota {
					// The request, or the block it got (rounded to a size
					// class or the alignment: at most a quarter more, plus
					// 256 bytes), passes a quota on its way down.
					over := false
					for _, tn := range chainOf(k) {
						over = over || quota[tn] > 0 && use[tn]+size+size/4+256 > quota[tn]
					}
					if !over {
						t.Fatalf("quota refused %d bytes through layer %d within every quota: %v", size, k, err)
					}
				}
				break
			}
			for _, x := range live {
				if blk.Ptr < x.b.Ptr+device.Ptr(x.b.Size) && x.b.Ptr < blk.Ptr+device.Ptr(blk.Size) {
					t.Fatalf("block [%#x,+%d) through layer %d overlaps live block [%#x,+%d)", uint64(blk.Ptr), blk.Size, k, uint64(x.b.Ptr), x.b.Size)
				}
			}
			h := held{blk, k}
			account(h, +1)
			live = append(live, h)
		case len(live) > 0 && k < 9:
			i := int(arg) % len(live)
			h := live[i]
			before := p.Stats()
			// A wrong layer refuses and changes nothing.
			if w := int(op/10) % len(layers); w != h.layer && !(w >= 3 && h.layer >= 3) {
				if err := layers[w].Free(h.b); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("a block of layer %d freed through layer %d: %v", h.layer, w, err)
				}
				if after := p.Stats(); after.UsedBytes != before.UsedBytes || after.LiveBlocks != before.LiveBlocks {
					t.Fatal("a refused free changed the pool")
				}
			}
			var err error
			if k == 8 {
				err = layers[h.layer].FreeAsync(h.b, s)
			} else {
				err = layers[h.layer].Free(h.b)
			}
			if err != nil {
				t.Fatalf("free through layer %d: %v", h.layer, err)
			}
			if err := layers[h.layer].Free(h.b); !errors.Is(err, pool.ErrInvalidHandle) {
				t.Fatalf("double free through layer %d: %v", h.layer, err)
			}
			account(h, -1)
			live = append(live[:i], live[i+1:]...)
		default:
			p.Trim()
		}
		for _, tn := range []*pool.Tenant{a, b, c} {
			st := tn.Stats()
			if st.UsedBytes != use[tn] || st.Quota > 0 && st.PeakBytes > st.Quota {
				t.Fatalf("tenant %s: %+v, its live blocks hold %d", tn.Name(), st, use[tn])
			}
		}
		if cs := cnt.Stats(); cs.UsedBytes != between {
			t.Fatalf("counter between c and a: %d bytes, c's blocks hold %d", cs.UsedBytes, between)
		}
		if ps := p.Stats(); ps.LiveBlocks != len(live) {
			t.Fatalf("pool: %d live blocks, %d held", ps.LiveBlocks, len(live))
		}
	}
	for _, h := range live {
		if err := layers[h.layer].Free(h.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	_ = d.DestroyStream(s)
	p.Trim()
	if st := p.Stats(); st.UsedBytes != 0 || st.LiveBlocks != 0 || a.Used()+b.Used()+c.Used() != 0 {
		t.Fatalf("after freeing everything: %+v, tenants %d %d %d", st, a.Used(), b.Used(), c.Used())
	}
	if err := log.Flush(); err != nil {
		t.Fatal(err)
	}
	rd, err := trace.NewReader(bytes.NewReader(buf.Bytes()), "log.jsonl", trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := rd.Next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the log layer's output: %v", err)
		}
	}
}
