// Package stream is what remains of the weight streamer: the product
// measurement moved to package bench (MeasureMatmuls), the weights'
// placement to package residency, and the streaming benchmark memwall
// stream runs to bench.Stream. These forwarders keep older callers
// building; the package goes once nothing imports it.
package stream

import (
	"context"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
)

// MatmulTiming is bench.MatmulTiming.
type MatmulTiming = bench.MatmulTiming

// MeasureMatmuls is bench.MeasureMatmuls.
func MeasureMatmuls(ctx context.Context, d device.Device, ks *kernels.Set, groups []plan.WeightGroup, tokens, reps int) ([]MatmulTiming, plan.MatmulCost, error) {
	return bench.MeasureMatmuls(ctx, d, ks, groups, tokens, reps)
}

// CostFromTimings is bench.CostFromTimings.
func CostFromTimings(ts []MatmulTiming) plan.MatmulCost { return bench.CostFromTimings(ts) }
