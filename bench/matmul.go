package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
)

// MatmulTiming is the measured device time of one product shape.
type MatmulTiming struct {
	DType   string        `json:"dtype"`
	M       uint64        `json:"m"`
	K       uint64        `json:"k"`
	T       uint64        `json:"t"`
	Time    time.Duration `json:"ns"`
	TFLOPS  float64       `json:"tflops"`
	GBps    float64       `json:"GBps"` // matrix + activation + result bytes over the time
	Samples int           `json:"samples"`
}

// MeasureMatmuls times each distinct product shape of the groups with
// tokens activation rows on d (one untimed launch, then the median of reps
// timed ones, default 3), on scratch buffers it frees before returning. It
// returns the timings and a cost model that answers measured shapes from
// the table and others with a roofline at the best rates measured.
func MeasureMatmuls(ctx context.Context, d device.Device, ks *kernels.Set, groups []plan.WeightGroup, tokens, reps int) ([]MatmulTiming, plan.MatmulCost, error) {
	if tokens < 1 {
		return nil, nil, fmt.Errorf("bench: matmuls: tokens = %d", tokens)
	}
	if reps < 1 {
		reps = 3
	}
	type key struct {
		dt   string
		m, k uint64
	}
	seen := map[key]bool{}
	var shapes []key
	var maxW, maxX, maxY uint64
	for _, g := range groups {
		for _, mm := range g.Matmuls {
			k := key{mm.DType, mm.M, mm.K}
			if seen[k] {
				continue
			}
			seen[k] = true
			shapes = append(shapes, k)
			elt := uint64(dtSize(mm.DType))
			maxW = max(maxW, mm.M*mm.K*elt)
			maxX = max(maxX, uint64(tokens)*mm.K*elt)
			maxY = max(maxY, uint64(tokens)*mm.M*4)
		}
	}
	if len(shapes) == 0 {
		return nil, plan.H200Cost(), nil
	}
	slices.SortFunc(shapes, func(a, b key) int {
		if a.dt != b.dt {
			if a.dt < b.dt {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.m, b.m); c != 0 {
			return c
		}
		return cmp.Compare(a.k, b.k)
	})
	st, err := d.NewStream()
	if err != nil {
		return nil, nil, fmt.Errorf("bench: matmuls: %w", err)
	}
	var bufs []device.Ptr
	var evs []device.Event
	defer func() {
		d.StreamSynchronize(st)
		for _, b := range bufs {
			d.Free(b)
		}
		for _, e := range evs {
			d.DestroyEvent(e)
		}
		d.DestroyStream(st)
	}()
	alloc := func(n uint64) (device.Ptr, error) {
		p, err := d.Alloc(n)
		if err != nil {
			return 0, fmt.Errorf("bench: matmuls: scratch of %d bytes: %w", n, err)
		}
		bufs = append(bufs, p)
		// Small finite values (bf16 0x3c3c ≈ 0.0115): the time does not
		// depend on them, but NaNs from garbage would be slower on some paths.
		return p, d.Memset8(p, 0x3c, n, st)
	}
	W, err := alloc(maxW)
	if err != nil {
		return nil, nil, err
	}
	X, err := alloc(maxX)
	if err != nil {
		return nil, nil, err
	}
	Y, err := alloc(maxY)
	if err != nil {
		return nil, nil, err
	}
	for range 2 {
		e, err := d.NewEvent(true)
		if err != nil {
			return nil, nil, fmt.Errorf("bench: matmuls: %w", err)
		}
		evs = append(evs, e)
	}
	T := uint64(tokens)
	var out []MatmulTiming
	for _, k := range shapes {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		launch := func() error { return ks.Matmul(k.dt, W, X, Y, uint32(k.m), uint32(k.k), uint32(T), st) }
		if err := launch(); err != nil {
			return nil, nil, fmt.Errorf("bench: matmuls: %w", err)
		}
		var times []time.Duration
		for range reps {
			if err := errors.Join(d.EventRecord(evs[0], st), launch(), d.EventRecord(evs[1], st), d.EventSynchronize(evs[1])); err != nil {
				return nil, nil, fmt.Errorf("bench: matmuls: %w", err)
			}
			el, err := d.EventElapsed(evs[0], evs[1])
			if err != nil {
				return nil, nil, fmt.Errorf("bench: matmuls: %w", err)
			}
			times = append(times, el)
		}
		slices.Sort(times)
		t := max(times[len(times)/2], time.Nanosecond)
		elt := float64(dtSize(k.dt))
		by := float64(k.m)*float64(k.k)*elt + float64(T)*float64(k.k)*elt + 4*float64(T)*float64(k.m)
		out = append(out, MatmulTiming{DType: k.dt, M: k.m, K: k.k, T: T, Time: t, Samples: reps,
			TFLOPS: 2 * float64(k.m) * float64(k.k) * float64(T) / t.Seconds() / 1e12,
			GBps:   by / t.Seconds() / 1e9})
	}
	if err := d.StreamSynchronize(st); err != nil {
		return nil, nil, fmt.Errorf("bench: matmuls: %w", err)
	}
	return out, CostFromTimings(out), nil
}

// CostFromTimings returns a cost model that answers a measured (dtype, M,
// K, T) from the table and anything else with a roofline at the best
// FLOP and byte rates of the table (launch overhead 5 µs).
func CostFromTimings(ts []MatmulTiming) plan.MatmulCost {
	type key struct {
		dt      string
		m, k, t uint64
	}
	tab := map[key]time.Duration{}
	var flops, bps float64
	for _, t := range ts {
		tab[key{t.DType, t.M, t.K, t.T}] = t.Time
		flops = max(flops, t.TFLOPS*1e12)
		bps = max(bps, t.GBps*1e9)
	}
	fallback := plan.Roofline(flops, bps, 5*time.Microsecond)
	if len(ts) == 0 {
		fallback = plan.H200Cost()
	}
	return func(dtype string, M, K, T uint64) time.Duration {
		if v, ok := tab[key{dtype, M, K, T}]; ok {
			return v
		}
		return fallback(dtype, M, K, T)
	}
}
