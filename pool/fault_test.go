package pool_test

import (
	"errors"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// TestDeviceRefusesMemory makes the device refuse the pool's next growth
// (a page for the virtual arena, a chunk otherwise): the allocation fails
// with an OOMError that says the device refused, wraps the device's error,
// leaves every live block intact and the pool usable once the device
// recovers. The fault wrapper also counts the pool's driver calls, which
// must match the pool's own accounting.
func TestDeviceRefusesMemory(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			so := sim.DefaultOptions()
			so.Backing = false
			cfg := &fault.Config{}
			d := fault.Wrap(sim.New(so), cfg)
			o.Cache = pool.CacheOff
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var held []pool.Block
			for i := 0; i < 8; i++ {
				b, err := p.Alloc(8<<20, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, b)
			}
			before := p.Stats()
			cfg.Set(fault.Rules{Alloc: fault.Always(), CreatePhysical: fault.Always()})
			_, err = p.Alloc(64<<20, pool.AllocOptions{})
			var oom *pool.OOMError
			if !errors.As(err, &oom) || oom.Cause != pool.CauseDevice {
				t.Fatalf("want a device OOMError, got %v", err)
			}
			if !errors.Is(err, device.ErrOutOfMemory) || !errors.Is(err, fault.ErrInjected) || !errors.Is(err, pool.ErrOutOfMemory) {
				t.Fatalf("error %v does not wrap the device's error", err)
			}
			if len(oom.Tried) == 0 {
				t.Fatalf("error %v does not say what was tried", err)
			}
			after := p.Stats()
			if after.UsedBytes != before.UsedBytes || after.LiveBlocks != before.LiveBlocks || after.ReservedBytes != before.ReservedBytes {
				t.Fatalf("a refused growth changed the pool: %+v → %+v", before, after)
			}
			cfg.Set(fault.Rules{})
			b, err := p.Alloc(64<<20, pool.AllocOptions{})
			if err != nil {
				t.Fatalf("after the device recovered: %v", err)
			}
			held = append(held, b)
			for _, b := range held {
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			p.Trim()
			st := p.Stats()
			c := cfg.Counts()
			if o.Growth == pool.GrowVirtual {
				if st.Maps != c.Map {
					t.Fatalf("pool counted %d maps, the device saw %d", st.Maps, c.Map)
				}
				if st.Unmaps != c.Unmap {
					t.Fatalf("pool counted %d unmaps, the device saw %d", st.Unmaps, c.Unmap)
				}
			} else if st.DeviceFrees != c.Free {
				t.Fatalf("pool counted %d frees, the device saw %d", st.DeviceFrees, c.Free)
			}
			if st.ReservedBytes != 0 {
				t.Fatalf("%d bytes still reserved after Trim", st.ReservedBytes)
			}
		})
	}
}
