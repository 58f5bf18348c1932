package pool_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/memwall/memwall/pool"
)

// TestTargetRatioValues: 0 is the default, NoTarget sets none, a ratio
// below 1 (a negative one included, which meant "none" before NoTarget)
// is refused with an error naming the field and the values that work.
func TestTargetRatioValues(t *testing.T) {
	for _, r := range []float64{-1, -0.5, 0.5, 0.999, math.NaN()} {
		p, err := pool.New(simVirtual(t), pool.Options{TargetRatio: r})
		if err == nil {
			p.Close()
			t.Fatalf("TargetRatio %v: accepted", r)
		}
		if msg := err.Error(); !strings.Contains(msg, "TargetRatio") || !strings.Contains(msg, "NoTarget") {
			t.Errorf("TargetRatio %v: %v", r, err)
		}
	}
	// And ratios drawn over the whole line: below 1 refused, from 1 up
	// (to NoTarget) in effect as given.
	r := rand.New(rand.NewPCG(7, 13))
	for range 200 {
		x := math.Ldexp(r.Float64(), r.IntN(2000)-1000) // 2^-1000 .. 2^1000
		if r.IntN(2) == 0 {
			x = -x
		}
		p, err := pool.New(simVirtual(t), pool.Options{TargetRatio: x})
		switch {
		case x < 1 && err == nil:
			p.Close()
			t.Fatalf("TargetRatio %v: accepted", x)
		case x >= 1 && err != nil:
			t.Fatalf("TargetRatio %v: %v", x, err)
		case x >= 1:
			if got := p.Options().TargetRatio; got != x {
				t.Errorf("TargetRatio %v: in effect %v", x, got)
			}
			p.Close()
		}
	}
	for _, c := range []struct {
		in, want float64
	}{{0, pool.DefaultTargetRatio}, {1, 1}, {1.5, 1.5}, {pool.NoTarget, pool.NoTarget}} {
		p, err := pool.New(simVirtual(t), pool.Options{TargetRatio: c.in})
		if err != nil {
			t.Fatalf("TargetRatio %v: %v", c.in, err)
		}
		if got := p.Options().TargetRatio; got != c.want {
			t.Errorf("TargetRatio %v: in effect %v, want %v", c.in, got, c.want)
		}
		p.Close()
	}
}

// TestNoTargetKeepsPages: with NoTarget a pool unmaps nothing while it
// stays within its limit, however far its reserve passes its peak of use;
// the same requests under a target (moving pages at once) unmap.
func TestNoTargetKeepsPages(t *testing.T) {
	run := func(o pool.Options) pool.Stats {
		o.Cache = pool.CacheOff
		p, err := pool.New(simVirtual(t), o)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		// Each block a little larger than the last and freed before the
		// next, a small block kept live after each: use stays near 10 MiB,
		// while no freed range holds the next block, which goes on new
		// pages (or, under a target, on pages moved from the holes).
		for i := uint64(1); i <= 8; i++ {
			b, err := p.Alloc(i<<20+4096, pool.AllocOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Alloc(300<<10, pool.AllocOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := p.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		return p.Stats()
	}
	keep := run(pool.Options{TargetRatio: pool.NoTarget})
	if keep.Unmaps != 0 {
		t.Errorf("NoTarget: %d unmaps, peak reserved %d MiB; want every page kept", keep.Unmaps, keep.PeakReservedBytes>>20)
	}
	moved := run(pool.Options{HoldTime: -1})
	if moved.Unmaps == 0 || moved.PeakReservedBytes >= keep.PeakReservedBytes {
		t.Errorf("default target, eager: %d unmaps, peak reserved %d MiB (NoTarget %d MiB); want pages moved", moved.Unmaps, moved.PeakReservedBytes>>20, keep.PeakReservedBytes>>20)
	}
}

// TestErrorPrefix: a pool with the default name is "pool" in its messages,
// not "pool pool"; a named one is "pool NAME". Checked on a bad option, a
// double free and an out-of-memory error.
func TestErrorPrefix(t *testing.T) {
	for _, c := range []struct{ name, want string }{{"", "pool: "}, {"pool", "pool: "}, {"kv", "pool kv: "}} {
		if _, err := pool.New(simVirtual(t), pool.Options{Name: c.name, Alignment: 3}); err == nil || !strings.HasPrefix(err.Error(), c.want+"alignment 3") {
			t.Errorf("name %q, bad alignment: %v; want the prefix %q", c.name, err, c.want)
		}
		p, err := pool.New(simVirtual(t), pool.Options{Name: c.name, Limit: 4 << 20})
		if err != nil {
			t.Fatal(err)
		}
		b, err := p.Alloc(1<<20, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
		if err := p.Free(b); err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "pool pool") {
			t.Errorf("name %q, double free: %v; want the prefix %q", c.name, err, c.want)
		}
		if _, err := p.Alloc(64<<20, pool.AllocOptions{}); err == nil || !strings.HasPrefix(err.Error(), c.want+"cannot allocate") {
			t.Errorf("name %q, over the limit: %v; want the prefix %q", c.name, err, c.want)
		}
		p.Close()
	}
}
