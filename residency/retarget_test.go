package residency

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/plan"
)

// TestRetargetRandom runs decode-like passes over random models while the
// placement changes at random between them (a budget that shrinks and
// grows): every view read back holds the file's bytes whatever the plan
// was when it was copied or uploaded, the device pool holds exactly the
// resident regions and the slots after every change, a Retarget while a
// group is held is refused, and Close gives every byte back.
func TestRetargetRandom(t *testing.T) {
	iters := 40
	if testing.Short() || onGPU() {
		iters = 12
	}
	var promoted, demoted int
	defer func() {
		if !t.Failed() && (promoted == 0 || demoted == 0) {
			t.Errorf("the changes promoted %d groups and demoted %d: want both", promoted, demoted)
		}
	}()
	for it := range iters {
		seed := uint64(it) + 100
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			d := testDevice(t, seed, func(o *sim.Options) { o.ReadOnlyHostRegister = rng.IntN(3) > 0 })
			span := 8
			if onGPU() {
				span = 14
			}
			m := randomModel(t, rng, 1+rng.IntN(8), 1<<uint(10+rng.IntN(span)))
			p := randomPlan(t, rng, m, 2+rng.IntN(3))
			dev, host := pools(t, d)
			o := Options{Live: true, Source: randomSource(rng, d), BounceBytes: uint64(4096 << rng.IntN(6)), Bounces: 1 + rng.IntN(3)}
			r, err := New(context.Background(), d, dev, host, m, p, o)
			if err != nil {
				t.Fatal(err)
			}
			if st := r.Stats(); st.Source == "none" {
				t.Fatalf("a live residency has no host source: %+v", st)
			}
			rd := newReader(t, d, r, m)
			changes := 0
			for ev := range 12 + rng.IntN(12) {
				if rng.IntN(3) > 0 {
					for g := range r.Plan().Groups {
						if err := rd.acquire(g); err != nil {
							t.Fatalf("event %d: acquire %d: %v", ev, g, err)
						}
						if err := rd.release(g); err != nil {
							t.Fatal(err)
						}
					}
					if rng.IntN(2) == 0 {
						rd.verify()
					}
					continue
				}
				// The compute has read what it acquired: sync it, as the
				// engine does before it retargets.
				rd.verify()
				np := randomPlan(t, rng, m, 2+rng.IntN(3))
				if len(r.Plan().Groups) > 0 && rng.IntN(4) == 0 {
					if err := rd.acquire(0); err != nil {
						t.Fatal(err)
					}
					if _, err := r.Retarget(context.Background(), np); !errors.Is(err, ErrState) {
						t.Fatalf("Retarget with group 0 held: %v, want ErrState", err)
					}
					if err := rd.release(0); err != nil {
						t.Fatal(err)
					}
					rd.verify()
				}
				before := r.Stats().ResidentGroups
				ch, err := r.Retarget(context.Background(), np)
				if err != nil {
					t.Fatalf("event %d: retarget: %v", ev, err)
				}
				changes++
				promoted, demoted = promoted+ch.Promoted, demoted+ch.Demoted
				st := r.Stats()
				ns := len(np.Streamed())
				if st.ResidentGroups != len(np.Groups)-ns || st.PassBytes != np.StreamedBytes || before-ch.Demoted+ch.Promoted != st.ResidentGroups {
					t.Fatalf("event %d: stats %+v after %+v, plan streams %d of %d", ev, st, ch, ns, len(np.Groups))
				}
				want := st.ResidentBytes + uint64(st.Slots)*st.SlotBytes
				if used := dev.Stats().UsedBytes; used != want {
					t.Fatalf("event %d: device pool holds %d bytes, the placement %d (resident %d, %d slots of %d)", ev, used, want, st.ResidentBytes, st.Slots, st.SlotBytes)
				}
				if ns > 0 && (st.Slots != np.Slots || st.SlotBytes < np.SlotBytes) || ns == 0 && st.Slots != 0 {
					t.Fatalf("event %d: %d slots of %d bytes for a plan of %d of %d streaming %d groups", ev, st.Slots, st.SlotBytes, np.Slots, np.SlotBytes, ns)
				}
			}
			rd.verify()
			if _, err := r.Retarget(context.Background(), &plan.WeightPlan{}); err == nil {
				t.Fatal("Retarget to a plan of other groups accepted")
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			checkEmpty(t, fmt.Sprintf("after Close (%d changes)", changes), dev, host)
		})
	}
}

// TestRetargetNeedsLive: a Residency made without Options.Live refuses.
func TestRetargetNeedsLive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	d := testDevice(t, 1, nil)
	m := randomModel(t, rng, 3, 4096)
	p := randomPlan(t, rng, m, 2)
	dev, host := pools(t, d)
	r, err := New(context.Background(), d, dev, host, m, p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Retarget(context.Background(), p); err == nil {
		t.Fatal("Retarget without Options.Live accepted")
	}
}

// TestMappedGroups: groups the plan maps (read in place from host memory)
// read back the file's bytes through their views while the others stay
// resident or stream, take nothing from the device pool, survive
// Retarget, and are refused where the registration they need cannot be
// made.
func TestMappedGroups(t *testing.T) {
	for it := range 16 {
		seed := uint64(it) + 300
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 13))
			d := testDevice(t, seed, func(o *sim.Options) { o.ReadOnlyHostRegister = true })
			m := randomModel(t, rng, 1+rng.IntN(6), 1<<uint(10+rng.IntN(8)))
			groups, err := plan.GroupWeights(m.Tensors)
			if err != nil {
				t.Fatal(err)
			}
			var mappedBytes uint64
			for i := range groups {
				if groups[i].Layer < 0 || rng.IntN(4) == 0 {
					groups[i].Mapped = true
					mappedBytes += groups[i].Copy
				}
			}
			o := plan.WeightOptions{Budget: 1 << 50, Slots: 2, LinkGBps: 25, Granule: 512}
			full, err := plan.PlanWeights(groups, o)
			if err != nil {
				t.Fatal(err)
			}
			o.Budget = full.MinimumBytes + rng.Uint64N(full.PeakBytes-full.MinimumBytes+1)
			p, err := plan.PlanWeights(groups, o)
			if err != nil {
				t.Fatal(err)
			}
			dev, host := pools(t, d)
			live := rng.IntN(2) == 0
			r, err := New(context.Background(), d, dev, host, m, p, Options{Live: live})
			if err != nil {
				t.Fatal(err)
			}
			if st := r.Stats(); st.MappedBytes != mappedBytes || st.ResidentBytes != dev.Stats().UsedBytes-uint64(st.Slots)*st.SlotBytes {
				t.Fatalf("stats %+v, mapped %d, device pool %d", st, mappedBytes, dev.Stats().UsedBytes)
			}
			rd := newReader(t, d, r, m)
			for pass := range 3 {
				for g := range p.Groups {
					if err := rd.acquire(g); err != nil {
						t.Fatalf("pass %d: %v", pass, err)
					}
					if err := rd.release(g); err != nil {
						t.Fatal(err)
					}
				}
				rd.verify()
				if live && pass == 1 {
					o.Budget = full.MinimumBytes + rng.Uint64N(full.PeakBytes-full.MinimumBytes+1)
					np, err := plan.PlanWeights(groups, o)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := r.Retarget(context.Background(), np); err != nil {
						t.Fatal(err)
					}
					p = np
				}
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			checkEmpty(t, "after Close", dev, host)
			if mappedBytes == 0 {
				return
			}
			if _, err := New(context.Background(), d, dev, host, m, p, Options{Source: Pinned}); err == nil {
				t.Fatal("mapped groups with a pinned-copy source accepted")
			}
			if onGPU() {
				return // a device that cannot register read-only memory is a simulator's option
			}
			nd := testDevice(t, seed, func(o *sim.Options) { o.ReadOnlyHostRegister = false })
			ndev, nhost := pools(t, nd)
			if _, err := New(context.Background(), nd, ndev, nhost, m, p, Options{}); err == nil {
				t.Fatal("mapped groups on a device that cannot register read-only memory accepted")
			}
		})
	}
}
