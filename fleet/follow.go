package fleet

import (
	"context"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// Follow configures FollowFree and FollowOnce: the fleet's budget after
// the device's free memory, as other processes take and release it.
type Follow struct {
	// Device is polled (MemInfo: cuMemGetInfo on CUDA, which counts every
	// process's allocations).
	Device device.Device
	// Pools are the models' device pools: their reserved bytes are the
	// process's, not another's.
	Pools []*pool.Pool
	// Overhead is what the process holds on the device outside the pools
	// (its context, modules, library workspaces).
	Overhead uint64
	// Ceiling returns the most the budget may be (the pools' share of
	// --vram, or of the latest budget set by hand).
	Ceiling func() uint64
	// Margin is left free for other processes (default 512 MiB, as
	// residency.PlanBudget leaves without a budget).
	Margin uint64
	// Step is the least growth made (default 64 MiB); a shrink is made
	// whatever its size.
	Step uint64
	// Every is FollowFree's polling period (default 500 ms).
	Every time.Duration
	// OnMove, when set, hears every change tried: the budgets before and
	// after, and the error (a *BudgetError when the models' minimums do
	// not fit what is free; the budget then stays).
	OnMove func(from, to uint64, err error)
}

func (o *Follow) defaults() {
	if o.Margin == 0 {
		o.Margin = 512 << 20
	}
	if o.Step == 0 {
		o.Step = 64 << 20
	}
	if o.Every <= 0 {
		o.Every = 500 * time.Millisecond
	}
}

// FollowOnce reads the device's free memory once and moves the budget to
// what the process holds (the pools' reserved bytes and the overhead) plus
// what is free, less the margin and the overhead, at most the ceiling:
// down whenever that is below the budget, up when it is at least Step
// above. It returns the budget after.
func (f *Fleet) FollowOnce(ctx context.Context, o Follow) (uint64, error) {
	o.defaults()
	cur := f.Budget()
	free, _, err := o.Device.MemInfo()
	if err != nil {
		return cur, err
	}
	held := o.Overhead
	for _, p := range o.Pools {
		held += p.ReservedBytes()
	}
	avail := held + free
	if avail <= o.Margin+o.Overhead {
		return cur, nil
	}
	target := avail - o.Margin - o.Overhead
	if o.Ceiling != nil {
		target = min(target, o.Ceiling())
	}
	if target >= cur && target < cur+o.Step {
		return cur, nil
	}
	err = f.SetBudget(ctx, target)
	if o.OnMove != nil {
		o.OnMove(cur, target, err)
	}
	if err != nil {
		return cur, err
	}
	return target, nil
}

// FollowFree calls FollowOnce every o.Every until ctx is done. A move
// refused (the minimums do not fit) is reported through o.OnMove and
// tried again at the next poll.
func (f *Fleet) FollowFree(ctx context.Context, o Follow) {
	o.defaults()
	every(ctx, o.Every, func() { f.FollowOnce(ctx, o) })
}
