package pool_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// liveSet is the blocks the goroutines of a stress test hold, by device
// address: an allocation that overlaps one of them is a wrong block.
type liveSet struct {
	mu     sync.Mutex
	blocks []pool.Block // sorted by Ptr
}

func (s *liveSet) add(b pool.Block) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearchFunc(s.blocks, b.Ptr, func(x pool.Block, p device.Ptr) int { return cmpPtr(x.Ptr, p) })
	if i > 0 {
		if l := s.blocks[i-1]; l.Ptr+device.Ptr(l.Size) > b.Ptr {
			return fmt.Errorf("block [%#x, +%d) overlaps live [%#x, +%d)", uint64(b.Ptr), b.Size, uint64(l.Ptr), l.Size)
		}
	}
	if i < len(s.blocks) {
		if r := s.blocks[i]; b.Ptr+device.Ptr(b.Size) > r.Ptr {
			return fmt.Errorf("block [%#x, +%d) overlaps live [%#x, +%d)", uint64(b.Ptr), b.Size, uint64(r.Ptr), r.Size)
		}
	}
	s.blocks = slices.Insert(s.blocks, i, b)
	return nil
}

func (s *liveSet) remove(b pool.Block) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := slices.BinarySearchFunc(s.blocks, b.Ptr, func(x pool.Block, p device.Ptr) int { return cmpPtr(x.Ptr, p) })
	if ok {
		s.blocks = slices.Delete(s.blocks, i, i+1)
	}
}

// TestShardStress: goroutines allocate and free at once over a pool with
// shards (by contention, and with every central entry sent to the next
// shard), handing a third of their blocks to each other to free (remote
// frees), with a limit that makes shards run out, over chunks and pages.
// After every operation no two live blocks share a device byte, and each
// is as large and as aligned as asked; a refusal is an *OOMError; at the
// end the pool counts nothing used and Trim gives every byte back.
func TestShardStress(t *testing.T) {
	ops := 3000
	switch {
	case testing.Short() && raceOn:
		ops = 300
	case testing.Short():
		ops = 1000
	}
	for _, c := range []struct {
		name   string
		o      pool.Options
		spread bool
	}{
		{"contention", pool.Options{Shards: 4}, false},
		{"spread", pool.Options{Shards: 4}, true},
		{"spread-limit", pool.Options{Shards: 4, Limit: 48 << 20}, true},
		{"spread-tlsf-keep", pool.Options{Shards: 3, Strategy: "tlsf", TargetRatio: pool.NoTarget}, true},
		{"spread-chunks", pool.Options{Shards: 4, Growth: pool.GrowChunks}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newSim(t, false, 8<<30)
			c.o.Name = c.name
			p, err := pool.New(d, c.o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if c.spread {
				pool.SpreadShards(p)
			}
			maxSize := uint64(4 << 20)
			if c.o.Limit > 0 {
				maxSize = c.o.Limit / 16
			}
			stressShards(t, p, 8, ops, maxSize)
			if c.spread && pool.ShardsMade(p) < 2 {
				t.Errorf("spread over shards, %d made", pool.ShardsMade(p))
			}
			if s := p.Stats(); s.UsedBytes != 0 || s.LiveBlocks != 0 || s.RequestedBytes != 0 {
				t.Fatalf("everything freed: used %d bytes (%d requested) in %d blocks", s.UsedBytes, s.RequestedBytes, s.LiveBlocks)
			}
			if err := pool.CheckPages(p); err != nil {
				t.Fatal(err)
			}
			p.Trim()
			if n := pool.QueuedFrees(p); n != 0 {
				t.Fatalf("after Trim, %d frees still queued", n)
			}
			if s := p.Stats(); s.ReservedBytes != 0 {
				t.Fatalf("after Trim with nothing live: %d bytes reserved", s.ReservedBytes)
			}
		})
	}
}

// stressShards runs the goroutines of TestShardStress.
func stressShards(t *testing.T, p *pool.Pool, goroutines, ops int, maxSize uint64) {
	var live liveSet
	handoff := make(chan pool.Block, 64)
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	free := func(b pool.Block) error {
		live.remove(b)
		return p.Free(b)
	}
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			var mine []pool.Block
			fail := func(err error) { errs <- fmt.Errorf("goroutine %d: %w", g, err) }
			for op := 0; op < ops; op++ {
				k := r.IntN(10)
				switch {
				case k < 4 && len(mine) > 0:
					i := r.IntN(len(mine))
					b := mine[i]
					mine[i] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					if k == 0 {
						select {
						case handoff <- b: // another goroutine frees it
							continue
						default:
						}
					}
					if err := free(b); err != nil {
						fail(err)
						return
					}
				case k == 4:
					select {
					case b := <-handoff:
						if err := free(b); err != nil {
							fail(err)
							return
						}
					default:
					}
				default:
					if len(mine) >= 24 {
						continue
					}
					size := uint64(math.Exp(math.Log(256) + r.Float64()*(math.Log(float64(maxSize))-math.Log(256))))
					var align uint64
					if r.IntN(8) == 0 {
						align = 4096 << r.IntN(9)
					}
					b, err := p.Alloc(size, pool.AllocOptions{Align: align})
					if err != nil {
						var oom *pool.OOMError
						if !errors.As(err, &oom) {
							fail(fmt.Errorf("alloc %d aligned %d: %v", size, align, err))
							return
						}
						continue
					}
					if b.Size < size || (align > 0 && uint64(b.Ptr)%align != 0) {
						fail(fmt.Errorf("alloc %d aligned %d: got %d bytes at %#x", size, align, b.Size, uint64(b.Ptr)))
						return
					}
					if err := live.add(b); err != nil {
						fail(err)
						return
					}
					mine = append(mine, b)
				}
			}
			for _, b := range mine {
				if err := free(b); err != nil {
					fail(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(handoff)
	for b := range handoff {
		if err := free(b); err != nil {
			t.Fatal(err)
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestShardQueuedFree: a block freed while its shard's lock is taken
// waits in the shard's queue, counts as freed, and is what the shard's
// next allocation reuses (no device call); Close with frees still queued
// gives every byte back.
func TestShardQueuedFree(t *testing.T) {
	d := newSim(t, false, 8<<30)
	p, err := pool.New(d, pool.Options{Shards: 4, Limit: 1 << 30, TargetRatio: pool.NoTarget})
	if err != nil {
		t.Fatal(err)
	}
	pool.SpreadShards(p)
	const size = 20 << 20 // above Limit/64: freed to the arenas at once, not parked
	pool.NextShard(p, 1)
	b, err := p.Alloc(size, pool.AllocOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unlock := pool.LockShard(p, 1)
	pool.NextShard(p, 2)
	if err := p.Free(b); err != nil {
		t.Fatal(err)
	}
	if n := pool.QueuedFrees(p); n != 1 {
		t.Fatalf("freed with its shard's lock taken: %d queued, want 1", n)
	}
	unlock()
	if s := p.Stats(); s.UsedBytes != 0 || s.LiveBlocks != 0 {
		t.Fatalf("a queued free still counts %d bytes in %d blocks", s.UsedBytes, s.LiveBlocks)
	}
	calls := p.Stats().DeviceCalls()
	pool.NextShard(p, 1)
	b2, err := p.Alloc(size, pool.AllocOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pool.QueuedFrees(p) != 0 || b2.Ptr != b.Ptr || p.Stats().DeviceCalls() != calls {
		t.Fatalf("shard's next allocation: %d still queued, block at %#x (freed one at %#x), %d device calls", pool.QueuedFrees(p), uint64(b2.Ptr), uint64(b.Ptr), p.Stats().DeviceCalls()-calls)
	}
	unlock = pool.LockShard(p, 1)
	pool.NextShard(p, 3)
	if err := p.Free(b2); err != nil {
		t.Fatal(err)
	}
	unlock()
	if n := pool.QueuedFrees(p); n != 1 {
		t.Fatalf("%d queued, want 1", n)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close with a free queued: %v", err)
	}
	if r := p.ReservedBytes(); r != 0 {
		t.Fatalf("after Close: %d bytes reserved", r)
	}
}

// TestShardOOMTriesOthers: under a limit, memory one shard keeps mapped
// (free pages, and blocks in its queue) serves another shard's request,
// and a request nothing can hold fails saying every shard was tried.
func TestShardOOMTriesOthers(t *testing.T) {
	for _, growth := range []pool.Growth{pool.GrowVirtual, pool.GrowChunks} {
		t.Run(growth.String(), func(t *testing.T) {
			d := newSim(t, false, 8<<30)
			const limit = 64 << 20
			p, err := pool.New(d, pool.Options{Shards: 4, Limit: limit, TargetRatio: pool.NoTarget, Growth: growth, ChunkBytes: 8 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			pool.SpreadShards(p)
			// Shard 1 takes 48 MiB in four blocks and keeps the two it
			// frees mapped; a third free waits in its queue.
			var bs []pool.Block
			for i := 0; i < 4; i++ {
				pool.NextShard(p, 1)
				b, err := p.Alloc(12<<20, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				bs = append(bs, b)
			}
			for _, i := range []int{0, 2} {
				pool.NextShard(p, 1)
				if err := p.Free(bs[i]); err != nil {
					t.Fatal(err)
				}
			}
			unlock := pool.LockShard(p, 1)
			pool.NextShard(p, 2)
			if err := p.Free(bs[3]); err != nil {
				t.Fatal(err)
			}
			unlock()
			// Shard 2 asks for 40 MiB: only 12 MiB are live.
			pool.NextShard(p, 2)
			big, err := p.Alloc(40<<20, pool.AllocOptions{})
			if err != nil {
				t.Fatalf("40 MiB with 12 MiB live under a %d MiB limit: %v", limit>>20, err)
			}
			if r := p.Stats().ReservedBytes; r > limit {
				t.Fatalf("%d bytes reserved over a limit of %d", r, limit)
			}
			if big.Ptr < bs[1].Ptr+device.Ptr(bs[1].Size) && bs[1].Ptr < big.Ptr+device.Ptr(big.Size) {
				t.Fatalf("the 40 MiB block [%#x, +%d) overlaps a live one at %#x", uint64(big.Ptr), big.Size, uint64(bs[1].Ptr))
			}
			pool.NextShard(p, 3)
			_, err = p.Alloc(20<<20, pool.AllocOptions{})
			var oom *pool.OOMError
			if !errors.As(err, &oom) || !strings.Contains(strings.Join(oom.Tried, ", "), "try every shard") {
				t.Fatalf("20 MiB more than the limit holds: %v, want an OOMError that tried every shard", err)
			}
			for _, b := range []pool.Block{bs[1], big} {
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestShardPeakUsed: with the root alone the peak of use is exact at every
// placement, even a peak no Stats call saw; over shards it is the peak of
// the sum of every shard's blocks at the points where the sum is taken
// (Stats, and every page mapping).
func TestShardPeakUsed(t *testing.T) {
	d := newSim(t, false, 8<<30)
	for _, spread := range []bool{false, true} {
		p, err := pool.New(d, pool.Options{Shards: 4, TargetRatio: pool.NoTarget})
		if err != nil {
			t.Fatal(err)
		}
		if spread {
			pool.SpreadShards(p)
		}
		var bs []pool.Block
		var sum uint64
		for i := 0; i < 6; i++ {
			b, err := p.Alloc(uint64(3+i)<<20, pool.AllocOptions{})
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
			sum += b.Size
		}
		if spread {
			if s := p.Stats(); s.PeakUsedBytes < sum || s.UsedBytes != sum {
				t.Fatalf("spread: %d bytes live in %d shards, Stats says used %d, peak %d", sum, pool.ShardsMade(p), s.UsedBytes, s.PeakUsedBytes)
			}
		}
		for _, b := range bs {
			if err := p.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		p.Trim()
		if s := p.Stats(); s.PeakUsedBytes < sum || (!spread && s.PeakUsedBytes != sum) {
			t.Fatalf("spread %v: peak used %d after %d bytes were live at once", spread, s.PeakUsedBytes, sum)
		}
		p.Close()
	}
}

// TestShardBalance: free pages one shard keeps do not stay mapped beside
// the pages another shard maps for the same use: above the soft target
// the pool gives them back (and, with balancing off, keeps both).
func TestShardBalance(t *testing.T) {
	for _, unbalanced := range []bool{false, true} {
		d := newSim(t, false, 8<<30)
		p, err := pool.New(d, pool.Options{Shards: 4, Limit: 512 << 20}) // blocks above 8 MiB go back at once
		if err != nil {
			t.Fatal(err)
		}
		pool.SpreadShards(p)
		if !unbalanced {
			pool.Balanced(p)
		}
		const size, n = 16 << 20, 4
		use := func(shard int) {
			var bs []pool.Block
			for i := 0; i < n; i++ {
				pool.NextShard(p, shard)
				b, err := p.Alloc(size, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				bs = append(bs, b)
			}
			for _, b := range bs {
				pool.NextShard(p, shard)
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
		}
		use(1)
		use(2)
		s := p.Stats()
		ratio := float64(s.PeakReservedBytes) / float64(s.PeakUsedBytes)
		if !unbalanced && s.ReservedBytes > s.PeakUsedBytes*21/20 {
			t.Fatalf("balanced: %d bytes reserved after two shards in turn used %d (peak reserved %.2fx)", s.ReservedBytes, s.PeakUsedBytes, ratio)
		}
		if unbalanced && s.ReservedBytes < 2*size*n {
			t.Fatalf("unbalanced: %d bytes reserved, want both shards' %d", s.ReservedBytes, 2*size*n)
		}
		p.Close()
	}
}

// TestShardsOption: a negative Shards is refused naming the field, and a
// huge one is capped.
func TestShardsOption(t *testing.T) {
	d := newSim(t, false, 1<<30)
	if _, err := pool.New(d, pool.Options{Shards: -1}); err == nil || !strings.Contains(err.Error(), "Shards -1") {
		t.Fatalf("Shards -1: %v, want an error naming it", err)
	}
	p, err := pool.New(d, pool.Options{Shards: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := p.Options().Shards; got != 256 {
		t.Fatalf("Shards 1<<30 in effect: %d, want 256", got)
	}
}
