package pool_test

import (
	"errors"
	"testing"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// FuzzPoolOps drives a pool through an operation sequence read from the
// input — allocations of any size, alignment and purpose, frees, double and
// stale frees, tenant allocations over a quota, trims — under a
// configuration also read from it, and checks after every few operations
// that live blocks do not overlap and the accounting matches the blocks
// held; at the end, freeing everything and trimming must give all memory
// back. Misuse must be refused with an error, never a panic.
func FuzzPoolOps(f *testing.F) {
	f.Add([]byte{0, 0, 10, 1, 0, 20, 2, 3, 0, 0, 5, 0, 0, 6, 0, 0})
	f.Add([]byte{1, 0, 26, 9, 0, 26, 9, 3, 1, 0, 4, 0, 0, 7, 3, 1, 7, 0, 0})
	f.Add([]byte{2, 2, 12, 0, 2, 12, 0, 3, 0, 0, 2, 12, 0, 5, 0, 0, 6, 0, 0})
	f.Add([]byte{7, 1, 25, 255, 1, 25, 255, 1, 25, 255, 1, 25, 255, 4, 0, 0, 6, 0, 0})
	f.Add([]byte{64, 0, 10, 1, 0, 20, 2, 3, 0, 0, 5, 0, 0, 6, 0, 0, 0, 24, 3, 0, 22, 1, 3, 1, 0})
	f.Fuzz(runPoolOps)
}

func runPoolOps(t *testing.T, data []byte) {
	{
		if len(data) == 0 {
			return
		}
		cfg, data := data[0], data[1:]
		d := fuzzDevice()
		o := pool.Options{Strategy: []string{"bestfit", "tlsf"}[cfg&1]}
		if cfg&64 != 0 {
			// A strategy without handles: pages of a virtual arena are
			// tracked by reference counts instead.
			o.Strategy = "buddy"
		}
		if cfg&2 != 0 {
			o.Growth = pool.GrowChunks
		}
		if cfg&4 != 0 {
			o.Cache = pool.CacheOff
		} else if cfg&8 != 0 {
			o.Cache = pool.CacheShared
		}
		if cfg&16 != 0 {
			o.TargetRatio = pool.NoTarget
		}
		if cfg&32 != 0 {
			o.Limit = 256 << 20
		}
		if cfg&128 != 0 {
			o.Placement = pool.PlaceStrategy
		}
		p, err := pool.New(d, o)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		tn, err := p.Tenant("t", 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		live := map[device.Ptr]pool.Block{}
		owner := map[device.Ptr]*pool.Tenant{}
		var order []device.Ptr
		var dead []pool.Block
		for i := 0; i+3 <= len(data) && i < 3*400; i += 3 {
			op, a, b := data[i]%8, data[i+1], data[i+2]
			switch op {
			case 0, 1, 2, 7:
				size := uint64(1)<<(a%27) + uint64(b)*uint64(a%13)
				ao := pool.AllocOptions{Purpose: pool.Purpose(b % 7)}
				if a&0x80 != 0 {
					ao.Align = 4096
				}
				var blk pool.Block
				var err error
				var who *pool.Tenant
				if op == 7 {
					who = tn
					blk, err = tn.Alloc(size, ao)
				} else {
					blk, err = p.Alloc(size, ao)
				}
				if err != nil {
					if !errors.Is(err, pool.ErrOutOfMemory) && !errors.Is(err, alloc.ErrInvalidArgument) {
						t.Fatalf("alloc %d: %v", size, err)
					}
					continue
				}
				if blk.Size < size || (ao.Align != 0 && uint64(blk.Ptr)%ao.Align != 0) {
					t.Fatalf("block %#x size %d for %d bytes aligned %d", blk.Ptr, blk.Size, size, ao.Align)
				}
				if _, dup := live[blk.Ptr]; dup {
					t.Fatalf("%#x handed out twice", blk.Ptr)
				}
				live[blk.Ptr], owner[blk.Ptr] = blk, who
				order = append(order, blk.Ptr)
			case 3, 4:
				if len(order) == 0 {
					continue
				}
				k := int(a) % len(order)
				ptr := order[k]
				order[k] = order[len(order)-1]
				order = order[:len(order)-1]
				blk := live[ptr]
				var err error
				if owner[ptr] != nil {
					if b&1 == 1 {
						// Freed through the pool, not its tenant: refused.
						if p.Free(blk) == nil {
							t.Fatal("a tenant's block freed through the pool")
						}
					}
					err = owner[ptr].Free(blk)
				} else {
					err = p.Free(blk)
				}
				if err != nil {
					t.Fatalf("free %#x: %v", ptr, err)
				}
				delete(live, ptr)
				delete(owner, ptr)
				dead = append(dead, blk)
			case 5:
				if len(dead) == 0 {
					continue
				}
				if err := p.Free(dead[int(a)%len(dead)]); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("second free of a freed block: %v", err)
				}
			case 6:
				p.Trim()
			}
			if (i/3)%16 == 15 {
				checkPool(t, p, live)
			}
		}
		checkPool(t, p, live)
		for ptr, blk := range live {
			var err error
			if owner[ptr] != nil {
				err = owner[ptr].Free(blk)
			} else {
				err = p.Free(blk)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if tn.Used() != 0 {
			t.Fatalf("tenant holds %d bytes after every block was freed", tn.Used())
		}
		p.Trim()
		if st := p.Stats(); st.UsedBytes != 0 || st.LiveBlocks != 0 || st.ReservedBytes != 0 || st.CachedBytes != 0 {
			t.Fatalf("after freeing everything and Trim: %+v", st)
		}
	}
}

// fuzzDevice is the fuzz targets' device: 1 GiB, simulated, no bytes behind
// its memory.
func fuzzDevice() device.Device {
	so := sim.DefaultOptions()
	so.Backing = false
	so.TotalBytes = 1 << 30
	return sim.New(so)
}
