package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/fleet"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

// member is one model of a test fleet: its engine on its own pools, the
// prompts it serves and the tokens its solo run gave for them.
type member struct {
	name      string
	m         *llama.Model
	ks        *kernels.Set
	dev, host *pool.Pool
	e         *engine.Engine
	prompts   [][]int
	want      [][]int
}

// models writes three small models of different shapes and seeds.
func models(t *testing.T) []*llama.Model {
	t.Helper()
	var out []*llama.Model
	for i, spec := range []struct {
		format        string
		heads, kvh    int
		seed          uint64
		layers, inter int
	}{{synth.Safetensors, 0, 0, 1, 0, 0}, {synth.GGUF, 4, 2, 2, 3, 0}, {synth.Safetensors, 0, 0, 3, 5, 320}} {
		cfg := synth.Tiny()
		cfg.Seed = spec.seed
		if spec.heads > 0 {
			cfg.Heads, cfg.KVHeads = spec.heads, spec.kvh
		}
		if spec.layers > 0 {
			cfg.Layers = spec.layers
		}
		if spec.inter > 0 {
			cfg.Inter = spec.inter
		}
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := dir
		if spec.format == synth.GGUF {
			path = filepath.Join(dir, "model.gguf")
		} else {
			path = filepath.Join(dir, "model.safetensors")
		}
		if _, err := synth.Generate(context.Background(), cfg, path, synth.Options{Format: spec.format, Workers: 2}); err != nil {
			t.Fatal(err)
		}
		if spec.format != synth.GGUF {
			path = dir
		}
		m, err := llama.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		out = append(out, m)
	}
	return out
}

func simDevice(t *testing.T) device.Device {
	o := sim.DefaultOptions()
	o.TotalBytes = 1 << 30
	o.Kernels = kernels.Sim()
	o.Shuffle = true
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

var opts = engine.Options{MaxTokens: 80, PrefillChunk: 16}

const maxNew = 10

// solo runs each prompt on a resident engine of its own and records the
// tokens.
func solo(t *testing.T, d device.Device, mb *member) {
	t.Helper()
	ks, err := kernels.Load(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Close()
	dev, err := pool.New(d, pool.DefaultOptions(d))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	host, err := pool.NewHost(d, pool.Options{Name: "solo-host"})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	o := opts
	o.Budget = 256 << 20
	e, err := engine.New(context.Background(), d, ks, dev, host, mb.m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, p := range mb.prompts {
		res, err := e.Generate(context.Background(), p, engine.Sampling{MaxNew: maxNew, IgnoreEOS: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		mb.want = append(mb.want, res.Tokens)
	}
}

// join makes mb's live engine at its minimum on pools of its own whose
// every event checks that all the fleet's pools together reserve at most
// bound.
func join(t *testing.T, d device.Device, mb *member, check func(string)) {
	t.Helper()
	var err error
	if mb.ks, err = kernels.Load(d, nil); err != nil {
		t.Fatal(err)
	}
	o := opts
	o.Live = true
	minBytes := minimum(t, d, mb)
	po := pool.DefaultOptions(d)
	po.Name, po.Limit, po.ReserveBytes = mb.name, minBytes, d.Info().TotalBytes
	po.OnEvent = func(pool.Event) { check(mb.name) }
	if mb.dev, err = pool.New(d, po); err != nil {
		t.Fatal(err)
	}
	if mb.host, err = pool.NewHost(d, pool.Options{Name: mb.name + "-host"}); err != nil {
		t.Fatal(err)
	}
	o.Budget = minBytes
	if mb.e, err = engine.New(context.Background(), d, mb.ks, mb.dev, mb.host, mb.m, o); err != nil {
		t.Fatal(err)
	}
	if got := mb.e.MinimumBudget(); got != minBytes {
		t.Fatalf("%s: MinimumBudget %d, Estimate's minimum %d", mb.name, got, minBytes)
	}
}

// minimum is the budget Estimate says mb's live engine needs at least.
func minimum(t *testing.T, d device.Device, mb *member) uint64 {
	t.Helper()
	n, err := minimumOf(d, mb)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func minimumOf(d device.Device, mb *member) (uint64, error) {
	o := opts
	o.Budget, o.Live = 1, true
	_, err := engine.Estimate(context.Background(), mb.m, o, d.Info())
	var be *engine.BudgetError
	if !errors.As(err, &be) {
		return 0, fmt.Errorf("%s: budget 1: %v", mb.name, err)
	}
	return be.Minimum, nil
}

// unloadReload takes mb out of the fleet (its engine closed, its pools
// trimmed to nothing) and loads it again on the same pools: room for its
// minimum, an engine there, Add.
func unloadReload(ctx context.Context, d device.Device, f *fleet.Fleet, mb *member) error {
	err := f.Remove(ctx, mb.name, func() error {
		err := mb.e.Close()
		mb.dev.Trim()
		mb.host.Trim()
		if r := mb.dev.ReservedBytes(); r != 0 && err == nil {
			err = fmt.Errorf("%s: the pool reserves %d bytes after Close and Trim", mb.name, r)
		}
		return err
	})
	if err != nil {
		return err
	}
	least, err := minimumOf(d, mb)
	if err != nil {
		return err
	}
	if err := f.MakeRoom(ctx, least); err != nil {
		return err
	}
	if err := mb.dev.SetLimit(least); err != nil {
		return err
	}
	o := opts
	o.Live, o.Budget = true, least
	if mb.e, err = engine.New(ctx, d, mb.ks, mb.dev, mb.host, mb.m, o); err != nil {
		return err
	}
	return f.Add(ctx, fleet.Model{Name: mb.name, Engine: mb.e, KeepAlive: -1})
}

// TestFleetRandom: three models share a budget that shrinks and grows at
// random times while three clients send them requests at random and idle
// models are unloaded and loaded again (Remove, MakeRoom, Add); every
// response's tokens equal the model's solo run, the pools together never
// reserve more than the budget (checked at every pool event, against the
// larger of the old and new budget while a change is under way, and
// against the budget after every event), and nothing is left at the end.
func TestFleetRandom(t *testing.T) {
	ctx := context.Background()
	d := simDevice(t)
	ms := models(t)
	var members []*member
	for i, m := range ms {
		mb := &member{name: fmt.Sprintf("m%d", i), m: m}
		for j := range 3 {
			mb.prompts = append(mb.prompts, promptOf(4+5*j+i, m.Config.Vocab, uint64(10*i+j)))
		}
		solo(t, d, mb)
		members = append(members, mb)
	}
	var bound atomic.Uint64 // the most the pools may reserve now
	var violation atomic.Value
	check := func(who string) {
		sum := reserved(members)
		if b := bound.Load(); sum > b && violation.Load() == nil {
			violation.Store(fmt.Sprintf("at an event of %s the pools reserve %d bytes, above the bound %d", who, sum, b))
		}
	}
	// The models' minimums and full budgets, from engines made and
	// closed before the fleet exists.
	var sumMin, sumFull uint64
	bound.Store(1 << 62)
	for _, mb := range members {
		join(t, d, mb, check)
		full, err := mb.e.FullBudget()
		if err != nil {
			t.Fatal(err)
		}
		sumMin, sumFull = sumMin+mb.e.MinimumBudget(), sumFull+full
		if err := mb.e.Close(); err != nil {
			t.Fatal(err)
		}
		mb.dev.Close()
		mb.host.Close()
		mb.ks.Close()
		mb.dev = nil
	}
	rng := rand.New(rand.NewPCG(5, 6))
	budget := sumMin + (sumFull-sumMin)/2
	bound.Store(budget)
	f := fleet.New(budget, fleet.Options{})
	for _, mb := range members {
		if err := f.MakeRoom(ctx, minimum(t, d, mb)); err != nil {
			t.Fatal(err)
		}
		join(t, d, mb, check)
		if err := f.Add(ctx, fleet.Model{Name: mb.name, Engine: mb.e, KeepAlive: -1}); err != nil {
			t.Fatal(err)
		}
		check("add")
	}
	if err := f.SetBudget(ctx, sumMin-1); err == nil {
		t.Fatal("a budget below the minimums accepted")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	var budgetMu sync.Mutex                     // one budget change at a time, so bound is exact
	gates := make([]sync.RWMutex, len(members)) // a client holds its model's from Begin to End; an unload waits for them
	for c := range 3 {
		seed := uint64(c)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, 99))
			for range 8 {
				k := r.IntN(len(members))
				mb := members[k]
				i := r.IntN(len(mb.prompts))
				gates[k].RLock()
				err := f.Begin(ctx, mb.name)
				if err != nil {
					gates[k].RUnlock()
					errs <- err
					return
				}
				e, unlock, err := f.Lock(mb.name)
				if err != nil {
					errs <- err
					return
				}
				res, err := e.Generate(ctx, mb.prompts[i], engine.Sampling{MaxNew: maxNew, IgnoreEOS: true}, nil)
				streamed := len(e.Plan().Streamed())
				unlock()
				if err == nil && !slices.Equal(res.Tokens, mb.want[i]) {
					err = fmt.Errorf("%s prompt %d with %d groups streamed: tokens %v, solo %v", mb.name, i, streamed, res.Tokens, mb.want[i])
				}
				if err == nil {
					err = f.End(ctx, mb.name)
				}
				gates[k].RUnlock()
				if err != nil {
					errs <- err
					return
				}
				check("client")
			}
		})
	}
	wg.Go(func() { // unloads idle models and loads them again
		r := rand.New(rand.NewPCG(7, 8))
		for range 5 {
			k := r.IntN(len(members))
			gates[k].Lock()
			err := unloadReload(ctx, d, f, members[k])
			gates[k].Unlock()
			if err != nil {
				errs <- fmt.Errorf("unload and reload: %w", err)
				return
			}
			check("reload")
		}
	})
	wg.Go(func() {
		for range 12 {
			nb := sumMin + rng.Uint64N(sumFull-sumMin+(sumFull-sumMin)/4)
			budgetMu.Lock()
			old := bound.Load()
			bound.Store(max(old, nb))
			err := f.SetBudget(ctx, nb)
			if err == nil {
				bound.Store(nb)
				check("budget")
			}
			budgetMu.Unlock()
			if err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
	stats, moves := f.Stats()
	var grants uint64
	for _, s := range stats {
		grants += s.Grant
		if s.Grant < s.Minimum || s.Grant > max(s.Full, s.Minimum) {
			t.Errorf("%s: grant %d outside [%d, %d]", s.Name, s.Grant, s.Minimum, s.Full)
		}
	}
	if grants > f.Budget() || moves.Changes == 0 || moves.PromotedBytes == 0 || moves.DemotedBytes == 0 {
		t.Errorf("grants %d of the budget %d; moves %+v", grants, f.Budget(), moves)
	}
	for _, mb := range members {
		if err := mb.e.Close(); err != nil {
			t.Fatal(err)
		}
		if st := mb.dev.Stats(); st.UsedBytes != 0 || st.LiveBlocks != 0 {
			t.Errorf("%s: device pool holds %d bytes in %d blocks after Close", mb.name, st.UsedBytes, st.LiveBlocks)
		}
		if st := mb.host.Stats(); st.UsedBytes != 0 {
			t.Errorf("%s: host pool holds %d bytes after Close", mb.name, st.UsedBytes)
		}
		mb.dev.Close()
		mb.host.Close()
		mb.ks.Close()
	}
}

func promptOf(n, vocab int, seed uint64) []int {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]int, n)
	for i := range out {
		out[i] = 3 + r.IntN(vocab-3)
	}
	return out
}

// TestFollowFree: another process (direct allocations on the device)
// takes memory and gives it back; FollowOnce shrinks the budget to what
// is left, refuses to go below the models' minimums (the budget stays),
// and grows back to the ceiling; the pools never reserve more than the
// budget and the models still generate their solo tokens.
func TestFollowFree(t *testing.T) {
	ctx := context.Background()
	d := simDevice(t)
	ms := models(t)[:2]
	var members []*member
	for i, m := range ms {
		mb := &member{name: fmt.Sprintf("m%d", i), m: m, prompts: [][]int{promptOf(7, m.Config.Vocab, uint64(i))}}
		solo(t, d, mb)
		members = append(members, mb)
	}
	nop := func(string) {}
	var sumMin uint64
	for _, mb := range members {
		sumMin += minimum(t, d, mb)
	}
	ceiling := sumMin + 24<<20
	f := fleet.New(ceiling, fleet.Options{})
	var pools []*pool.Pool
	for _, mb := range members {
		if err := f.MakeRoom(ctx, minimum(t, d, mb)); err != nil {
			t.Fatal(err)
		}
		join(t, d, mb, nop)
		if err := f.Add(ctx, fleet.Model{Name: mb.name, Engine: mb.e, KeepAlive: -1}); err != nil {
			t.Fatal(err)
		}
		pools = append(pools, mb.dev)
		defer func() { mb.e.Close(); mb.dev.Close(); mb.host.Close(); mb.ks.Close() }()
	}
	const margin = 1 << 20
	o := fleet.Follow{Device: d, Pools: pools, Margin: margin, Step: 1 << 20, Ceiling: func() uint64 { return ceiling }}
	reserved := func() (n uint64) {
		for _, p := range pools {
			n += p.ReservedBytes()
		}
		return n
	}
	generate := func(what string) {
		for _, mb := range members {
			e, unlock, _ := f.Lock(mb.name)
			res, err := e.Generate(ctx, mb.prompts[0], engine.Sampling{MaxNew: maxNew, IgnoreEOS: true}, nil)
			unlock()
			if err != nil || !slices.Equal(res.Tokens, mb.want[0]) {
				t.Fatalf("%s: %s: %v %v, solo %v", what, mb.name, err, res, mb.want[0])
			}
		}
	}
	if got, err := f.FollowOnce(ctx, o); err != nil || got != ceiling {
		t.Fatalf("with the device free: budget %d (%v), want the ceiling %d", got, err, ceiling)
	}
	// Another process leaves the models 12 MiB above their minimums.
	free, _, _ := d.MemInfo()
	other, err := d.Alloc(free - (sumMin + 12<<20 - reserved()) - margin)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.FollowOnce(ctx, o)
	free, _, _ = d.MemInfo()
	if err != nil || got >= ceiling || got < sumMin || reserved() > got || got > reserved()+free-margin+1 {
		t.Fatalf("after another process took memory: budget %d (%v), minimums %d, pools %d, free %d", got, err, sumMin, reserved(), free)
	}
	generate("shrunk")
	// It takes nearly everything: the minimums do not fit, the budget stays.
	more, err := d.Alloc(free - 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	var be *fleet.BudgetError
	if kept, err := f.FollowOnce(ctx, o); !errors.As(err, &be) || kept != got || f.Budget() != got {
		t.Fatalf("below the minimums: budget %d (was %d), %v", kept, got, err)
	}
	generate("refused")
	d.Free(more)
	d.Free(other)
	if back, err := f.FollowOnce(ctx, o); err != nil || back != ceiling {
		t.Fatalf("after the other process left: budget %d (%v), want %d", back, err, ceiling)
	}
	generate("grown")
}

// TestKeepAlive: with a clock the test moves, two idle models that both
// hold more than their minimum; once one's keep-alive runs out, Rebalance
// leaves it its minimum and its pool gives the bytes back, while the other
// (kept forever) keeps its share or takes the room; Begin of the expired
// one takes a share again.
func TestKeepAlive(t *testing.T) {
	ctx := context.Background()
	d := simDevice(t)
	members, sumMin := twoMembers(t, d)
	now := time.Unix(100, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := fleet.New(sumMin+64<<20, fleet.Options{Now: clock})
	keep := []time.Duration{time.Second, -1}
	for i, mb := range members {
		if err := f.MakeRoom(ctx, minimum(t, d, mb)); err != nil {
			t.Fatal(err)
		}
		join(t, d, mb, func(string) {})
		defer func() { mb.e.Close(); mb.dev.Close(); mb.host.Close(); mb.ks.Close() }()
		if err := f.Add(ctx, fleet.Model{Name: mb.name, Engine: mb.e, KeepAlive: keep[i]}); err != nil {
			t.Fatal(err)
		}
	}
	share := func() []fleet.ModelStats { st, _ := f.Stats(); return st }
	st := share()
	if st[0].Grant <= st[0].Minimum || st[1].Grant <= st[1].Minimum {
		t.Fatalf("a budget that holds both: %+v", st)
	}
	held := members[0].dev.ReservedBytes()
	mu.Lock()
	now = now.Add(500 * time.Millisecond)
	mu.Unlock()
	if err := f.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	if g := share()[0].Grant; g != st[0].Grant {
		t.Fatalf("within its keep-alive m0's grant moved from %d to %d", st[0].Grant, g)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if err := f.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	after := share()
	if after[0].Grant != after[0].Minimum || after[1].Grant < st[1].Grant {
		t.Fatalf("past m0's keep-alive: %+v (was %+v)", after, st)
	}
	if r := members[0].dev.ReservedBytes(); r >= held || r > after[0].Grant {
		t.Fatalf("m0's pool reserves %d bytes (had %d), its grant %d", r, held, after[0].Grant)
	}
	if err := f.Begin(ctx, "m0"); err != nil {
		t.Fatal(err)
	}
	if g := share()[0].Grant; g <= after[0].Minimum {
		t.Fatalf("Begin of the expired model left it its minimum %d", g)
	}
	if err := f.End(ctx, "m0"); err != nil {
		t.Fatal(err)
	}
}

// TestPromotionPausesStreaming: a promotion waits for the steps of the
// other models that stream weights (their locks), so that its uploads have
// the link alone; once they let go it runs, and the paused model's grant
// is untouched.
func TestPromotionPausesStreaming(t *testing.T) {
	ctx := context.Background()
	d := simDevice(t)
	members, sumMin := twoMembers(t, d)
	f := fleet.New(sumMin+2<<20, fleet.Options{})
	addAll(ctx, t, d, f, members, []float64{2, 1})
	for _, mb := range members {
		if err := f.Begin(ctx, mb.name); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := f.Stats()
	if before[1].Grant != before[1].Minimum || before[1].StreamedGroups == 0 || before[0].Grant >= before[0].Full {
		t.Fatalf("want m0 above its minimum and below whole, m1 at its minimum and streaming: %+v", before)
	}
	_, unlock, err := f.Lock("m1") // m1's step in flight
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.SetBudget(ctx, sumMin+4<<20) }()
	select {
	case err := <-done:
		t.Fatalf("the promotion ran while the streaming model stepped (%v)", err)
	case <-time.After(150 * time.Millisecond):
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after, mv := f.Stats()
	if after[0].Grant <= before[0].Grant || after[1].Grant != before[1].Grant || mv.WaitSeconds < 0.1 {
		t.Fatalf("after the pause: %+v (before %+v), moves %+v", after, before, mv)
	}
	for _, mb := range members {
		if err := f.End(ctx, mb.name); err != nil {
			t.Fatal(err)
		}
	}
}

// twoMembers are the first two test models and their minimums' sum.
func twoMembers(t *testing.T, d device.Device) (members []*member, sumMin uint64) {
	t.Helper()
	for i, m := range models(t)[:2] {
		mb := &member{name: fmt.Sprintf("m%d", i), m: m}
		members = append(members, mb)
		sumMin += minimum(t, d, mb)
	}
	return members, sumMin
}

// addAll makes room for each member's minimum in f, loads it there (join)
// and adds it with priority prio[i] (the default without prio) and no
// keep-alive limit; each is closed when the test ends.
func addAll(ctx context.Context, t *testing.T, d device.Device, f *fleet.Fleet, members []*member, prio []float64) {
	t.Helper()
	for i, mb := range members {
		if err := f.MakeRoom(ctx, minimum(t, d, mb)); err != nil {
			t.Fatal(err)
		}
		join(t, d, mb, func(string) {})
		t.Cleanup(func() { mb.e.Close(); mb.dev.Close(); mb.host.Close(); mb.ks.Close() })
		fm := fleet.Model{Name: mb.name, Engine: mb.e, KeepAlive: -1}
		if prio != nil {
			fm.Priority = prio[i]
		}
		if err := f.Add(ctx, fm); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRemove: a model taken out (its engine closed, its pool trimmed in
// release) reserves nothing and its share goes to the other, the pools
// never reserving more than the budget at any event; it refuses an active
// model and an unknown one; loaded again (MakeRoom, an engine at its
// minimum, Add) it generates its solo tokens; a release that fails keeps
// its grant out of the others' shares.
func TestRemove(t *testing.T) {
	ctx := context.Background()
	d := simDevice(t)
	members, sumMin := twoMembers(t, d)
	for i, mb := range members {
		mb.prompts = [][]int{promptOf(9, mb.m.Config.Vocab, uint64(i))}
		solo(t, d, mb)
	}
	budget := sumMin + 8<<20
	var violation atomic.Value
	check := func(who string) {
		sum := reserved(members)
		if sum > budget && violation.Load() == nil {
			violation.Store(fmt.Sprintf("at an event of %s the pools reserve %d bytes, above the budget %d", who, sum, budget))
		}
	}
	f := fleet.New(budget, fleet.Options{})
	add := func(mb *member) {
		t.Helper()
		if err := f.MakeRoom(ctx, minimum(t, d, mb)); err != nil {
			t.Fatal(err)
		}
		join(t, d, mb, check)
		if err := f.Add(ctx, fleet.Model{Name: mb.name, Engine: mb.e, KeepAlive: -1}); err != nil {
			t.Fatal(err)
		}
	}
	generate := func(mb *member) {
		t.Helper()
		e, unlock, err := f.Lock(mb.name)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Generate(ctx, mb.prompts[0], engine.Sampling{MaxNew: maxNew, IgnoreEOS: true}, nil)
		unlock()
		if err != nil || !slices.Equal(res.Tokens, mb.want[0]) {
			t.Fatalf("%s: %v %v, solo %v", mb.name, err, res, mb.want[0])
		}
	}
	for _, mb := range members {
		add(mb)
		generate(mb)
	}
	a, b := members[0], members[1]
	defer func() {
		for _, mb := range members {
			if mb.e != nil {
				mb.e.Close()
			}
			mb.dev.Close()
			mb.host.Close()
			mb.ks.Close()
		}
	}()
	before, _ := f.Stats()
	if err := f.Begin(ctx, a.name); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx, a.name, func() error { return nil }); err == nil {
		t.Fatal("removed an active model")
	}
	if err := f.End(ctx, a.name); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx, "none", func() error { return nil }); !errors.Is(err, fleet.ErrUnknown) {
		t.Fatalf("removing an unknown model: %v", err)
	}
	release := func(mb *member) func() error {
		return func() error {
			err := mb.e.Close()
			mb.e = nil
			mb.dev.Trim()
			mb.host.Trim()
			if r := mb.dev.ReservedBytes(); r != 0 {
				return fmt.Errorf("%s's pool reserves %d bytes after Close and Trim", mb.name, r)
			}
			return err
		}
	}
	if err := f.Remove(ctx, a.name, release(a)); err != nil {
		t.Fatal(err)
	}
	check("remove")
	after, _ := f.Stats()
	if len(after) != 1 || after[0].Name != b.name || after[0].Grant <= before[1].Grant {
		t.Fatalf("after removing %s: %+v (before %+v)", a.name, after, before)
	}
	if _, _, err := f.Lock(a.name); !errors.Is(err, fleet.ErrUnknown) {
		t.Fatalf("Lock of a removed model: %v", err)
	}
	generate(b)
	a.dev.Close()
	a.host.Close()
	a.ks.Close()
	add(a)
	generate(a)
	generate(b)
	reloaded, _ := f.Stats()
	if err := f.Remove(ctx, a.name, func() error { release(a)(); return errors.New("broken") }); err == nil {
		t.Fatal("a failed release returned nil")
	}
	kept, _ := f.Stats()
	if len(kept) != 1 || len(reloaded) != 2 || reloaded[1].Name != a.name || kept[0].Grant+reloaded[1].Grant > budget {
		t.Fatalf("after a failed release: %+v", kept)
	}
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
}

// reserved is what the members' device pools reserve together.
func reserved(members []*member) (n uint64) {
	for _, mb := range members {
		if mb.dev != nil {
			n += mb.dev.ReservedBytes()
		}
	}
	return n
}

// TestStatsWaitsForNoStep: while a model's lock is held (a step in
// flight), Stats answers at once with the residency's figures of the
// latest move. On the H200, POST /admin/budget answered 27 s late: its
// Stats waited for a model's lock through the steps of a request.
func TestStatsWaitsForNoStep(t *testing.T) {
	ctx := context.Background()
	d := simDevice(t)
	members, sumMin := twoMembers(t, d)
	f := fleet.New(sumMin+8<<20, fleet.Options{})
	addAll(ctx, t, d, f, members, nil)
	a := members[0]
	if err := f.Begin(ctx, a.name); err != nil {
		t.Fatal(err)
	}
	e, unlock, err := f.Lock(a.name)
	if err != nil {
		t.Fatal(err)
	}
	want := e.Residency().Stats()
	done := make(chan []fleet.ModelStats, 1)
	go func() {
		st, _ := f.Stats()
		done <- st
	}()
	select {
	case st := <-done:
		if st[0].ResidentBytes != want.ResidentBytes || st[0].StreamedGroups != want.Groups-want.ResidentGroups || st[0].StreamedBytes != want.PassBytes {
			t.Errorf("Stats %+v, the residency %+v", st[0], want)
		}
	case <-time.After(5 * time.Second):
		t.Error("Stats waited for a model's lock")
	}
	unlock()
	if err := f.End(ctx, a.name); err != nil {
		t.Fatal(err)
	}
}
