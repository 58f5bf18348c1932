package kvcache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/internal/longtest"
)

// model is the test's picture of what the device holds: content[b][slot] is
// the token whose K/V the engine wrote there (-1: never written), and the
// token list of every sequence. Writes follow the engine's contract: after
// Add, positions from cachedTokens on; after Append, the new positions.
type model struct {
	t       testing.TB
	m       *Manager
	B       int
	content [][]int32
	host    [][]int32
	tokens  map[SeqID][]int32
	written map[SeqID]int // positions whose K/V the engine wrote
	extra   map[SeqID]uint64
	rng     *rand.Rand
	next    SeqID
	// prefix families: prompts often start with one of these.
	families [][]int32
	events   int
	stored   map[uint64]bool
}

func newModel(t testing.TB, cfg ManagerConfig, seed uint64) *model {
	md := &model{t: t, tokens: map[SeqID][]int32{}, written: map[SeqID]int{}, extra: map[SeqID]uint64{}, stored: map[uint64]bool{},
		rng: rand.New(rand.NewPCG(seed, 7)), next: 1}
	cfg.OnEvent = md.onEvent
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	md.m, md.B = m, m.Config().BlockTokens
	md.content = make([][]int32, cfg.Blocks)
	for i := range md.content {
		md.content[i] = slices.Repeat([]int32{-1}, md.B)
	}
	md.host = make([][]int32, cfg.HostBlocks)
	for i := range md.host {
		md.host[i] = make([]int32, md.B)
	}
	m.SetCopy(func(src, dst int32) error { copy(md.content[dst], md.content[src]); return nil })
	for range 4 {
		f := make([]int32, md.B*(1+md.rng.IntN(6)))
		for i := range f {
			f[i] = int32(md.rng.IntN(50))
		}
		md.families = append(md.families, f)
	}
	return md
}

// onEvent checks that stored and removed events pair up.
func (md *model) onEvent(e Event) {
	md.events++
	switch e.Kind {
	case BlockStored:
		if md.stored[e.Hash] {
			md.t.Fatalf("block %x stored twice", e.Hash)
		}
		md.stored[e.Hash] = true
	case BlockRemoved:
		if !md.stored[e.Hash] {
			md.t.Fatalf("block %x removed but not stored", e.Hash)
		}
		delete(md.stored, e.Hash)
	case AllCleared:
		clear(md.stored)
	}
}

// compute writes id's positions from the first not written on, as an engine
// step does.
func (md *model) compute(id SeqID) {
	toks := md.tokens[id]
	tab := md.m.Table(id)
	for p := md.written[id]; p < len(toks); p++ {
		b := tab[p/md.B]
		if b == NoBlock {
			continue
		}
		md.content[b][p%md.B] = toks[p]
	}
	md.written[id] = len(toks)
}

func (md *model) ids() []SeqID {
	ids := make([]SeqID, 0, len(md.tokens))
	for id := range md.tokens {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (md *model) pick() (SeqID, bool) {
	ids := md.ids()
	if len(ids) == 0 {
		return 0, false
	}
	return ids[md.rng.IntN(len(ids))], true
}

func (md *model) randTokens(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(md.rng.IntN(50))
	}
	return out
}

// step runs one random operation and checks everything after it.
func (md *model) step(op int) {
	r := md.rng
	m := md.m
	switch op % 8 {
	case 0, 1: // add
		var prompt []int32
		if r.IntN(4) > 0 {
			f := md.families[r.IntN(len(md.families))]
			prompt = append(prompt, f[:r.IntN(len(f)+1)]...)
		}
		prompt = append(prompt, md.randTokens(r.IntN(3*md.B))...)
		extra := uint64(r.IntN(2))
		id := md.next
		md.next++
		before := m.FreeBlocks()
		needs := m.AddNeeds(prompt, extra)
		cached, err := m.Add(id, prompt, extra)
		if errors.Is(err, ErrOutOfBlocks) {
			if m.FreeBlocks() != before || m.Len(id) != 0 {
				md.t.Fatalf("failed add changed the manager")
			}
			if needs <= before {
				md.t.Fatalf("add failed with %d free blocks, AddNeeds said %d", before, needs)
			}
			return
		}
		if err != nil {
			md.t.Fatal(err)
		}
		// (A window releases blocks at once.)
		if took := before - m.FreeBlocks(); took != needs && (m.Config().Window == 0 || took > needs) {
			md.t.Fatalf("add took %d free blocks, AddNeeds said %d", before-m.FreeBlocks(), needs)
		}
		if cached%md.B != 0 && cached != len(prompt)-1 || cached >= len(prompt) && len(prompt) > 0 {
			md.t.Fatalf("add of %d tokens: %d cached", len(prompt), cached)
		}
		md.tokens[id], md.extra[id], md.written[id] = prompt, extra, cached
		// The cached positions must already hold the prompt's tokens.
		md.checkSeq(id, cached)
	case 2, 3: // append
		id, ok := md.pick()
		if !ok || m.Swapped(id) {
			return
		}
		toks := md.randTokens(1 + r.IntN(2*md.B))
		if r.IntN(2) == 0 {
			toks = toks[:1]
		}
		md.compute(id) // the engine appends after the step
		n := len(md.tokens[id])
		err := m.Append(id, toks...)
		if errors.Is(err, ErrOutOfBlocks) {
			if m.Len(id) != n {
				md.t.Fatalf("failed append changed the length")
			}
			return
		}
		if err != nil {
			md.t.Fatal(err)
		}
		md.tokens[id] = append(slices.Clone(md.tokens[id]), toks...)
	case 4: // fork
		id, ok := md.pick()
		if !ok || m.Swapped(id) {
			return
		}
		child := md.next
		md.next++
		if err := m.Fork(id, child); err != nil {
			md.t.Fatal(err)
		}
		md.tokens[child], md.extra[child], md.written[child] = md.tokens[id], md.extra[id], md.written[id]
	case 5: // free
		id, ok := md.pick()
		if !ok {
			return
		}
		if err := m.Free(id); err != nil {
			md.t.Fatal(err)
		}
		delete(md.tokens, id)
		delete(md.written, id)
	case 6: // swap out or in
		id, ok := md.pick()
		if !ok {
			return
		}
		if m.Swapped(id) {
			moves, err := m.SwapIn(id)
			if errors.Is(err, ErrOutOfBlocks) {
				return
			}
			if err != nil {
				md.t.Fatal(err)
			}
			for _, mv := range moves {
				copy(md.content[mv.Block], md.host[mv.Host])
			}
			return
		}
		moves, err := m.SwapOut(id)
		if errors.Is(err, ErrOutOfHostBlocks) {
			return
		}
		if err != nil {
			md.t.Fatal(err)
		}
		for _, mv := range moves {
			copy(md.host[mv.Host], md.content[mv.Block])
		}
	case 7:
		if r.IntN(64) == 0 {
			m.ClearPrefixCache()
			break
		}
		// An engine step over one sequence, which may or may not say so.
		id, ok := md.pick()
		if !ok || m.Swapped(id) {
			return
		}
		md.compute(id)
		if r.IntN(2) == 0 {
			if err := m.Computed(id, len(md.tokens[id])); err != nil {
				md.t.Fatal(err)
			}
		}
	}
	md.check()
}

// checkSeq checks that id's first n positions hold its tokens.
func (md *model) checkSeq(id SeqID, n int) {
	toks := md.tokens[id]
	tab := md.m.Table(id)
	if tab == nil {
		return
	}
	for p := 0; p < n && p < len(toks); p++ {
		b := tab[p/md.B]
		if b == NoBlock {
			continue
		}
		if got := md.content[b][p%md.B]; got != toks[p] {
			md.t.Fatalf("sequence %d position %d: block %d slot %d holds token %d, want %d", id, p, b, p%md.B, got, toks[p])
		}
	}
}

func (md *model) check() {
	if err := md.m.Check(); err != nil {
		md.t.Fatal(err)
	}
	for _, id := range md.ids() {
		toks := md.tokens[id]
		if got := md.m.Len(id); got != len(toks) {
			md.t.Fatalf("sequence %d: Len %d, want %d", id, got, len(toks))
		}
		if md.m.Swapped(id) {
			continue
		}
		md.checkSeq(id, md.written[id])
		// Cached blocks carry the hash of their contents.
		hashes := BlockHashes(toks, md.B, md.extra[id])
		for j, b := range md.m.Table(id) {
			if b == NoBlock || j >= len(hashes) {
				continue
			}
			k := md.m.blocks[b]
			if k.flags&flagCached != 0 && k.hash != hashes[j] {
				md.t.Fatalf("sequence %d block %d (%d): cached under %x, contents hash to %x", id, j, b, k.hash, hashes[j])
			}
		}
	}
}

func TestManagerRandom(t *testing.T) {
	ops := 20_000
	if longtest.Enabled() {
		ops = 1_000_000
	} else if testing.Short() {
		ops = 3000
	}
	configs := []ManagerConfig{
		{Blocks: 8, BlockTokens: 4, HostBlocks: 4},
		{Blocks: 40, BlockTokens: 16, HostBlocks: 16},
		{Blocks: 24, BlockTokens: 1, HostBlocks: 8},
		{Blocks: 32, BlockTokens: 3, HostBlocks: 0},
		{Blocks: 16, BlockTokens: 4, Window: 9, HostBlocks: 8},
		{Blocks: 32, BlockTokens: 2, NoPrefixCache: true, HostBlocks: 8},
	}
	for i, cfg := range configs {
		t.Run(fmt.Sprintf("blocks%d-B%d-host%d-window%d-noprefix%v", cfg.Blocks, cfg.BlockTokens, cfg.HostBlocks, cfg.Window, cfg.NoPrefixCache), func(t *testing.T) {
			md := newModel(t, cfg, uint64(i+1))
			for op := range ops {
				md.step(md.rng.IntN(8))
				// Keep the population moving: free more when full.
				if op%64 == 0 && len(md.tokens) > 12 {
					id, _ := md.pick()
					_ = md.m.Free(id)
					delete(md.tokens, id)
				}
			}
			st := md.m.Stats()
			if !cfg.NoPrefixCache && cfg.Window == 0 && st.PrefixHits == 0 {
				t.Errorf("no prefix hits in %d operations: %+v", ops, st)
			}
			if st.CopyOnWrites == 0 && cfg.BlockTokens > 1 {
				t.Errorf("no copy-on-write in %d operations: %+v", ops, st)
			}
			if cfg.HostBlocks > 0 && st.SwappedIn == 0 {
				t.Errorf("nothing swapped in in %d operations: %+v", ops, st)
			}
			for _, id := range md.ids() {
				if err := md.m.Free(id); err != nil {
					t.Fatal(err)
				}
			}
			if err := md.m.Check(); err != nil {
				t.Fatal(err)
			}
			if md.m.FreeBlocks() != cfg.Blocks || md.m.FreeHostBlocks() != cfg.HostBlocks {
				t.Fatalf("after freeing everything: %d of %d blocks, %d of %d host blocks free", md.m.FreeBlocks(), cfg.Blocks, md.m.FreeHostBlocks(), cfg.HostBlocks)
			}
		})
	}
}

// FuzzManagerOps runs the operation sequence the input spells on a small
// manager whose shape the first bytes choose, with every check after every
// operation.
func FuzzManagerOps(f *testing.F) {
	f.Add([]byte{8, 4, 2, 0, 0, 2, 3, 4, 2, 6, 6, 5, 5})
	f.Add([]byte{2, 1, 0, 0, 1, 2, 2, 2, 4, 3, 6, 7})
	f.Add([]byte{30, 16, 8, 1, 1, 1, 4, 4, 2, 2, 5, 6, 6, 6, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 || len(data) > 4096 {
			return
		}
		cfg := ManagerConfig{Blocks: 1 + int(data[0]%64), BlockTokens: 1 + int(data[1]%17), HostBlocks: int(data[2] % 16)}
		if data[3]&1 != 0 {
			cfg.Window = int(data[3] >> 1)
		}
		md := newModel(t, cfg, uint64(data[3])<<8|uint64(len(data)))
		for _, op := range data[4:] {
			md.step(int(op))
		}
	})
}

func TestManagerPrefixAndEviction(t *testing.T) {
	var events []Event
	m, err := NewManager(ManagerConfig{Blocks: 8, BlockTokens: 4, OnEvent: func(e Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	sys := []int32{1, 2, 3, 4, 5, 6, 7, 8} // two full blocks
	a := append(slices.Clone(sys), 9, 10)
	if c, err := m.Add(1, a, 0); err != nil || c != 0 {
		t.Fatalf("first add: cached %d, %v", c, err)
	}
	if len(events) != 0 {
		t.Fatalf("blocks stored before their K/V was computed: %+v", events)
	}
	// Another request before the first one's prefill ran: no hit.
	if c, err := m.Add(9, a, 0); err != nil || c != 0 {
		t.Fatalf("add before the prefix was computed: cached %d, %v", c, err)
	}
	if err := m.Free(9); err != nil {
		t.Fatal(err)
	}
	_ = m.Computed(1, len(a))
	if len(events) != 2 || events[0].Kind != BlockStored || events[1].Parent != events[0].Hash {
		t.Fatalf("events after the first add: %+v", events)
	}
	b := append(slices.Clone(sys), 11)
	if c, err := m.Add(2, b, 0); err != nil || c != 8 {
		t.Fatalf("second add: cached %d, %v; want 8", c, err)
	}
	if tb, ta := m.Table(2), m.Table(1); tb[0] != ta[0] || tb[1] != ta[1] || tb[2] == ta[2] {
		t.Fatalf("tables %v and %v: want the two prefix blocks shared", ta, tb)
	}
	// Another extra key shares nothing.
	if c, err := m.Add(3, b, 7); err != nil || c != 0 {
		t.Fatalf("add under another extra key: cached %d, %v", c, err)
	}
	_ = m.Computed(3, len(b))
	if err := m.Free(3); err != nil {
		t.Fatal(err)
	}
	// The whole prompt cached: the last token is still computed.
	if c, err := m.Add(4, sys, 0); err != nil || c != 7 {
		t.Fatalf("add of a cached prompt: cached %d, %v; want 7", c, err)
	}
	for _, id := range []SeqID{1, 2, 4} {
		if err := m.Free(id); err != nil {
			t.Fatal(err)
		}
	}
	// Everything free; the prefix stays cached and serves again.
	if c, err := m.Add(5, a, 0); err != nil || c != 8 {
		t.Fatalf("add after free: cached %d, %v; want 8", c, err)
	}
	if err := m.Free(5); err != nil {
		t.Fatal(err)
	}
	// Filling the cache with other prompts evicts in LRU order (the blocks
	// of sequence 3, freed first), and a sequence's blocks tail first: the
	// prefix's second block goes before its first.
	events = events[:0]
	if _, err := m.Add(6, slices.Repeat([]int32{99}, 4*7), 0); err != nil {
		t.Fatal(err)
	}
	_ = m.Computed(6, 4*7)
	var removed []uint64
	for _, e := range events {
		if e.Kind == BlockRemoved {
			removed = append(removed, e.Hash)
		}
	}
	h := BlockHashes(sys, 4, 0)
	if len(removed) != 3 || removed[2] != h[1] {
		t.Fatalf("removed %x, want sequence 3's two blocks, then the prefix's second block %x", removed, h[1])
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Add(7, slices.Repeat([]int32{5}, 100), 0); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("add beyond capacity: %v, want ErrOutOfBlocks", err)
	}
}

func TestManagerForkCopyOnWrite(t *testing.T) {
	m, _ := NewManager(ManagerConfig{Blocks: 8, BlockTokens: 4})
	var copies [][2]int32
	m.SetCopy(func(src, dst int32) error { copies = append(copies, [2]int32{src, dst}); return nil })
	if _, err := m.Add(1, []int32{1, 2, 3, 4, 5, 6}, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Fork(1, 2); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.AppendNeeds(2, 1); n != 1 {
		t.Fatalf("append into a shared partial block needs %d blocks, want 1", n)
	}
	if err := m.Append(2, 7); err != nil {
		t.Fatal(err)
	}
	t1, t2 := m.Table(1), m.Table(2)
	if len(copies) != 1 || copies[0][0] != t1[1] || copies[0][1] != t2[1] || t1[0] != t2[0] {
		t.Fatalf("copies %v, tables %v %v", copies, t1, t2)
	}
	// The parent now holds its block alone: no copy.
	if err := m.Append(1, 8); err != nil || len(copies) != 1 {
		t.Fatalf("append by the parent: %v, %d copies", err, len(copies))
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestManagerWindow(t *testing.T) {
	m, _ := NewManager(ManagerConfig{Blocks: 4, BlockTokens: 4, Window: 6})
	if _, err := m.Add(1, []int32{1, 2, 3}, 0); err != nil {
		t.Fatal(err)
	}
	// 100 tokens through a window of 6 hold at most 3 blocks at any time.
	for i := range 100 {
		if err := m.Append(1, int32(i)); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		if m.Blocks(1) > 3 {
			t.Fatalf("token %d: %d blocks held", i, m.Blocks(1))
		}
	}
	tab := m.Table(1)
	n := m.Len(1)
	for p := n - 6; p < n; p++ {
		if tab[p/4] == NoBlock {
			t.Fatalf("position %d in the window has no block", p)
		}
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestInvalidMessages: a bad configuration names the field once under one
// "kvcache:" prefix (not "kvcache: ...: kvcache: invalid argument") and
// matches ErrInvalid.
func TestInvalidMessages(t *testing.T) {
	_, merr := NewManager(ManagerConfig{Blocks: 0})
	_, cerr := Config{Layers: 2, KVHeads: 2, HeadDim: 8, Blocks: 4, ElemBytes: 3}.validate()
	for _, err := range []error{merr, cerr} {
		if !errors.Is(err, ErrInvalid) || err.Error() == "" || strings.Count(err.Error(), "kvcache:") != 1 {
			t.Errorf("%v: want ErrInvalid under one kvcache: prefix", err)
		}
	}
	if want := "kvcache: invalid argument: 0 blocks, want 1..2^30"; merr == nil || merr.Error() != want {
		t.Errorf("NewManager with no blocks: %v, want %q", merr, want)
	}
}
