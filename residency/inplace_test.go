package residency

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
)

// TestInPlaceOnHostMemory: on a device whose memory is host memory, every
// resident tensor's view is the address of its bytes in the model's
// mapping (nothing allocated or copied for it), streamed groups still
// cycle and read back right, and Close leaves the pools empty.
func TestInPlaceOnHostMemory(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			d, err := cpu.New(cpu.Options{Workers: 2, TotalBytes: 1 << 30})
			if err != nil {
				t.Skip(err)
			}
			t.Cleanup(func() { d.Close() })
			m := randomModel(t, rng, 1+rng.IntN(6), 1<<uint(10+rng.IntN(8)))
			p := randomPlan(t, rng, m, 2+rng.IntN(2))
			dev, host := pools(t, d)
			r, err := New(context.Background(), d, dev, host, m, p, Options{})
			if err != nil {
				t.Fatal(err)
			}
			var want uint64
			for g, gp := range p.Groups {
				if !gp.Resident {
					continue
				}
				views, _, err := r.Acquire(g)
				if err != nil {
					t.Fatalf("acquire resident %d: %v", g, err)
				}
				for _, v := range views {
					b := m.Data(v.Tensor)
					if len(b) > 0 && v.Ptr != device.Ptr(uintptr(unsafe.Pointer(&b[0]))) {
						t.Errorf("group %d tensor %s at %#x, its mapped bytes at %p", g, v.Tensor.Name, uint64(v.Ptr), &b[0])
					}
				}
				if err := r.Release(g, 0); err != nil {
					t.Fatal(err)
				}
				for _, e := range gp.Extents {
					want += e.Bytes
				}
			}
			st := r.Stats()
			if st.InPlaceBytes != want || st.ResidentBytes != 0 {
				t.Errorf("stats %+v, want %d bytes in place and none resident", st, want)
			}
			rd := newReader(t, d, r, m)
			for range 2 {
				for g := range p.Groups {
					if err := rd.acquire(g); err != nil {
						t.Fatal(err)
					}
					if err := rd.release(g); err != nil {
						t.Fatal(err)
					}
				}
			}
			rd.verify()
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			checkEmpty(t, "after Close", dev, host)
		})
	}
}
