package pool_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/pool"
)

// TestSetLimit: random allocations and frees under a limit that moves at
// random. After every SetLimit that succeeds, and after every allocation,
// the pool reserves at most the limit; a refused lowering leaves the
// limit as it was and names bytes above the new one; an allocation the
// limit refuses is an out-of-memory error, and raising the limit lets the
// same request through when the device has room.
func TestSetLimit(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			o.Limit, o.ReserveBytes = 256<<20, 1<<30
			p, err := pool.New(newSim(t, false, 1<<30), o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			r := rand.New(rand.NewPCG(7, uint64(len(o.Name))))
			limit := uint64(256 << 20)
			var live []pool.Block
			var lowered, refused, ooms int
			check := func(what string) {
				t.Helper()
				if got := p.Options().Limit; got != limit {
					t.Fatalf("%s: Options().Limit %d, want %d", what, got, limit)
				}
				if res := p.ReservedBytes(); res > limit {
					t.Fatalf("%s: reserved %d bytes above the limit %d", what, res, limit)
				}
			}
			for i := range 4000 {
				switch k := r.IntN(10); {
				case k < 4 && len(live) > 0:
					j := r.IntN(len(live))
					if err := p.Free(live[j]); err != nil {
						t.Fatal(err)
					}
					live = append(live[:j], live[j+1:]...)
				case k < 9:
					size := uint64(1 + r.IntN(8<<20))
					if r.IntN(8) == 0 {
						size = uint64(1 + r.IntN(64<<20))
					}
					b, err := p.Alloc(size, pool.AllocOptions{Purpose: pool.Weights})
					if err != nil {
						if !errors.Is(err, pool.ErrOutOfMemory) {
							t.Fatalf("alloc %d: %v", size, err)
						}
						ooms++
						check("refused alloc")
						continue
					}
					live = append(live, b)
					check("alloc")
				default:
					n := uint64(32<<20 + r.IntN(480<<20))
					err := p.SetLimit(n)
					var le *pool.LimitError
					switch {
					case err == nil:
						if n < limit {
							lowered++
						}
						limit = n
					case errors.As(err, &le) && errors.Is(err, pool.ErrLimitBelowReserved):
						if le.Reserved <= n || le.Limit != n {
							t.Fatalf("step %d: refusal of %d names reserved %d, limit %d", i, n, le.Reserved, le.Limit)
						}
						refused++
					default:
						t.Fatalf("SetLimit(%d): %v", n, err)
					}
					check("set limit")
				}
			}
			if lowered == 0 || refused == 0 || ooms == 0 {
				t.Fatalf("the sequence lowered the limit %d times, was refused %d times, met %d refused allocations: want each", lowered, refused, ooms)
			}
			for _, b := range live {
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.SetLimit(1 << 20); err != nil {
				t.Fatalf("an empty pool refuses a 1 MiB limit: %v", err)
			}
			if _, err := p.Alloc(8<<20, pool.AllocOptions{Purpose: pool.Weights}); !errors.Is(err, pool.ErrOutOfMemory) {
				t.Fatalf("8 MiB under a 1 MiB limit: %v", err)
			}
			if err := p.SetLimit(64 << 20); err != nil {
				t.Fatal(err)
			}
			b, err := p.Alloc(8<<20, pool.AllocOptions{Purpose: pool.Weights})
			if err != nil {
				t.Fatalf("8 MiB after raising the limit to 64 MiB: %v", err)
			}
			if err := p.Free(b); err != nil {
				t.Fatal(err)
			}
			if err := p.SetLimit(0); err == nil {
				t.Fatal("SetLimit(0) accepted")
			}
		})
	}
}
