package kvcache_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/pool"
)

// openDevice returns the GPU when MEMWALL_TEST_DEVICE=cuda, else a backed
// simulator that runs ready work of different streams in a random order, so
// that a missing dependency between the cache's streams shows as bad bytes.
func openDevice(t *testing.T, seed uint64) device.Device {
	if os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" {
		d, err := cuda.Open(cuda.Options{})
		if err != nil {
			t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	o := sim.DefaultOptions()
	o.Shuffle, o.Seed = true, seed
	return sim.New(o)
}

func pools(t *testing.T, d device.Device) (*pool.Pool, *pool.Pool) {
	dev, err := pool.New(d, pool.Options{Name: "kv-dev"})
	if err != nil {
		t.Fatal(err)
	}
	host, err := pool.NewHost(d, pool.Options{Name: "kv-host"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close(); host.Close() })
	return dev, host
}

var small = kvcache.Config{Layers: 3, KVHeads: 2, HeadDim: 8, ElemBytes: 2, BlockTokens: 4, Blocks: 16}

// fill writes random bytes into every block of id's table and returns them,
// keyed by table index.
func fill(t *testing.T, d device.Device, c *kvcache.Cache, id kvcache.SeqID, rng *rand.Rand) [][]byte {
	var out [][]byte
	for _, b := range c.Table(id) {
		buf := make([]byte, c.BlockBytes())
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		if err := d.CopyHtoD(c.Base().Add(uint64(b)*c.BlockBytes()), buf, c.Stream()); err != nil {
			t.Fatal(err)
		}
		out = append(out, buf)
	}
	if err := d.StreamSynchronize(c.Stream()); err != nil {
		t.Fatal(err)
	}
	return out
}

func readBlock(t *testing.T, d device.Device, c *kvcache.Cache, b int32) []byte {
	buf := make([]byte, c.BlockBytes())
	if err := d.CopyDtoH(buf, c.Base().Add(uint64(b)*c.BlockBytes()), c.Stream()); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamSynchronize(c.Stream()); err != nil {
		t.Fatal(err)
	}
	return buf
}

func TestConfigOffset(t *testing.T) {
	// The layout formula of docs/DESIGN.md, against a direct count: walk
	// every (layer, kv, slot, head) of a block in layout order.
	c := kvcache.Config{Layers: 3, KVHeads: 2, HeadDim: 5, ElemBytes: 2, BlockTokens: 4, Blocks: 2}
	if got, want := c.BlockBytes(), uint64(3*2*4*2*5*2); got != want {
		t.Fatalf("BlockBytes %d, want %d", got, want)
	}
	off := uint64(0)
	for b := int32(0); b < 2; b++ {
		for layer := range 3 {
			for kv := range 2 {
				for slot := range 4 {
					for head := range 2 {
						if got := c.Offset(b, layer, kv, slot, head); got != off {
							t.Fatalf("Offset(%d,%d,%d,%d,%d) = %d, want %d", b, layer, kv, slot, head, got, off)
						}
						off += 5 * 2
					}
				}
			}
		}
	}
}

func TestCacheForkCopiesOnDevice(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		d := openDevice(t, seed)
		dev, host := pools(t, d)
		s, _ := d.NewStream()
		defer d.DestroyStream(s)
		c, err := kvcache.New(d, dev, host, small, kvcache.Options{Stream: s})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 1))
		if _, err := c.Add(1, []int32{1, 2, 3, 4, 5, 6}, 0); err != nil {
			t.Fatal(err)
		}
		want := fill(t, d, c, 1, rng)
		if err := c.Fork(1, 2); err != nil {
			t.Fatal(err)
		}
		if err := c.Append(2, 7); err != nil {
			t.Fatal(err)
		}
		t1, t2 := c.Table(1), c.Table(2)
		if t1[0] != t2[0] || t1[1] == t2[1] {
			t.Fatalf("tables %v %v: want block 0 shared and block 1 copied", t1, t2)
		}
		// The copy is on the compute stream: read it back on that stream.
		if got := readBlock(t, d, c, t2[1]); !bytes.Equal(got, want[1]) {
			t.Fatalf("seed %d: the copied block differs from its source", seed)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if u := dev.Stats().UsedBytes + host.Stats().UsedBytes; u != 0 {
			t.Fatalf("after Close the pools hold %d bytes", u)
		}
	}
}

func TestCacheSwapRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		d := openDevice(t, seed)
		dev, host := pools(t, d)
		c, err := kvcache.New(d, dev, host, small, kvcache.Options{HostBlocks: 8})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 2))
		prompt := make([]int32, 10+rng.IntN(12))
		for i := range prompt {
			prompt[i] = int32(rng.IntN(1000))
		}
		if _, err := c.Add(1, prompt, 0); err != nil {
			t.Fatal(err)
		}
		want := fill(t, d, c, 1, rng)
		if _, err := c.SwapOut(1); err != nil {
			t.Fatal(err)
		}
		if c.Table(1) != nil {
			t.Fatal("a swapped-out sequence still has a table")
		}
		// Another sequence takes the released blocks and overwrites them
		// on the compute stream: after the swap-out's copies.
		if _, err := c.Add(2, make([]int32, 4*small.Blocks), 0); err != nil {
			t.Fatal(err)
		}
		for _, b := range c.Table(2) {
			if err := d.Memset8(c.Base().Add(uint64(b)*c.BlockBytes()), 0xee, c.BlockBytes(), c.Stream()); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.SwapIn(1); !errors.Is(err, kvcache.ErrOutOfBlocks) {
			t.Fatalf("swap in with no free block: %v", err)
		}
		if err := c.Free(2); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SwapIn(1); err != nil {
			t.Fatal(err)
		}
		for j, b := range c.Table(1) {
			if got := readBlock(t, d, c, b); !bytes.Equal(got, want[j]) {
				t.Fatalf("seed %d: block %d of the sequence differs after a swap round trip", seed, j)
			}
		}
		out, in := c.SwappedBytes()
		if out != in || out != uint64(len(want))*c.BlockBytes() {
			t.Fatalf("swapped %d out, %d in; want %d each way", out, in, uint64(len(want))*c.BlockBytes())
		}
		st := c.Stats()
		if st.Blocks != small.Blocks || st.SwapOutBytes != out || st.SwapInBytes != in ||
			st.UsedBlocks != len(want) || st.Sequences != 1 || st.BlockBytes != c.BlockBytes() {
			t.Fatalf("stats %+v", st)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if u := dev.Stats().UsedBytes + host.Stats().UsedBytes; u != 0 {
			t.Fatalf("after Close the pools hold %d bytes", u)
		}
	}
}

func TestCacheNewFailures(t *testing.T) {
	cfg := &fault.Config{}
	d := fault.Wrap(sim.New(sim.DefaultOptions()), cfg)
	dev, host := pools(t, d)
	for _, tc := range []struct {
		name  string
		rules fault.Rules
		cfg   kvcache.Config
	}{
		{"device memory", fault.Rules{Alloc: fault.Always(), CreatePhysical: fault.Always(), Map: fault.Always()}, small},
		{"host memory", fault.Rules{HostAlloc: fault.Always()}, small},
		{"too large", fault.Rules{}, kvcache.Config{Layers: 32, KVHeads: 32, HeadDim: 128, ElemBytes: 2, Blocks: 1 << 20}},
		{"bad element", fault.Rules{}, kvcache.Config{Layers: 1, KVHeads: 1, HeadDim: 1, ElemBytes: 3, Blocks: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg.Set(tc.rules)
			defer cfg.Set(fault.Rules{})
			c, err := kvcache.New(d, dev, host, tc.cfg, kvcache.Options{HostBlocks: 4})
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			if u := dev.Stats().UsedBytes + host.Stats().UsedBytes; u != 0 {
				t.Fatalf("after a failed New the pools hold %d bytes", u)
			}
		})
	}
}

// A sequence whose blocks are adjacent on the device moves in one copy each
// way.
func TestCacheSwapCoalesces(t *testing.T) {
	cfg := &fault.Config{}
	d := fault.Wrap(sim.New(sim.DefaultOptions()), cfg)
	dev, host := pools(t, d)
	c, err := kvcache.New(d, dev, host, small, kvcache.Options{HostBlocks: 8, NoPrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Add(1, make([]int32, 4*6), 0); err != nil {
		t.Fatal(err)
	}
	before := cfg.Counts()
	if _, err := c.SwapOut(1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SwapIn(1); err != nil {
		t.Fatal(err)
	}
	after := cfg.Counts()
	if n := after.CopyDtoH - before.CopyDtoH; n != 1 {
		t.Errorf("6 adjacent blocks swapped out in %d copies, want 1", n)
	}
	if n := after.CopyHtoD - before.CopyHtoD; n != 1 {
		t.Errorf("6 blocks swapped back in %d copies, want 1 (table %v)", n, c.Table(1))
	}
}

// Swaps stay ordered when every copy is slow (the compute stream's memset
// must wait for the swap-out's delayed copies), and a dropped event fails
// the swap with an error while Close still returns every byte.
func TestCacheSwapFaults(t *testing.T) {
	cfg := &fault.Config{}
	o := sim.DefaultOptions()
	o.Shuffle = true
	d := fault.Wrap(sim.New(o), cfg)
	dev, host := pools(t, d)
	c, err := kvcache.New(d, dev, host, small, kvcache.Options{HostBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	if _, err := c.Add(1, make([]int32, 4*small.Blocks/2), 0); err != nil {
		t.Fatal(err)
	}
	want := fill(t, d, c, 1, rng)
	cfg.Set(fault.Rules{SlowCopies: fault.Always(), CopyDelay: 5 * time.Millisecond})
	if _, err := c.SwapOut(1); err != nil {
		t.Fatal(err)
	}
	if err := d.Memset8(c.Base(), 0x11, uint64(small.Blocks)*c.BlockBytes(), c.Stream()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SwapIn(1); err != nil {
		t.Fatal(err)
	}
	cfg.Set(fault.Rules{})
	for j, b := range c.Table(1) {
		if got := readBlock(t, d, c, b); !bytes.Equal(got, want[j]) {
			t.Fatalf("block %d differs after a slow swap round trip", j)
		}
	}
	cfg.Set(fault.Rules{StreamWaitEvent: fault.Always()})
	if _, err := c.SwapOut(1); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("swap out with dropped events: %v", err)
	}
	cfg.Set(fault.Rules{})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if u := dev.Stats().UsedBytes + host.Stats().UsedBytes; u != 0 {
		t.Fatalf("after Close the pools hold %d bytes", u)
	}
}
