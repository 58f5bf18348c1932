package engine

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

// SetBudget re-places the weights under a new budget while the engine
// runs (Options.Live): the weight plan is made again for budget less what
// the KV cache, the arena and the rest take (unchanged: they were sized at
// New), and the residency moves to it, giving back the regions of the
// groups that now stream before taking those of the groups that now stay
// resident (residency.Retarget). The engine's device pool's limit follows
// (pool.SetLimit: raised before the move, lowered after it), so the pool
// must be the engine's own. A budget below the minimum is a *BudgetError
// and changes nothing. It must be called between steps (no Generate or
// Batch step running); it waits for the compute stream, drops the decode
// graph (captured again at the next all-resident decode step) and
// returns what moved. An error after the move began leaves the engine
// unusable (close it).
func (e *Engine) SetBudget(ctx context.Context, budget uint64) (residency.Change, error) {
	var ch residency.Change
	switch {
	case e.closed:
		return ch, errors.New("engine: SetBudget on a closed engine")
	case !e.opt.Live:
		return ch, errors.New("engine: SetBudget needs an engine made with Options.Live")
	case e.sub != nil:
		return ch, errors.New("engine: SetBudget with blocks computed on the host is not supported: their placement is fixed at New")
	case budget == 0:
		return ch, errors.New("engine: budget is 0")
	}
	old := e.opt.Budget
	e.opt.Budget = budget
	p, err := e.planWeights(e.foot.reserve, e.foot.KVBytes, e.foot.ArenaBytes, e.opt.Slots)
	if err == nil {
		err = e.checkTied(p)
	}
	if err != nil {
		e.opt.Budget = old
		return ch, err
	}
	if budget > old {
		if err := e.dev.SetLimit(budget); err != nil {
			e.opt.Budget = old
			return ch, fmt.Errorf("engine: %w", err)
		}
	}
	if err := e.d.StreamSynchronize(e.compute); err != nil {
		return ch, fmt.Errorf("engine: SetBudget: %w", err)
	}
	if err := e.dropGraph(); err != nil {
		return ch, err
	}
	if ch, err = e.retarget(ctx, p); err != nil {
		return ch, err
	}
	if budget < old {
		if err := e.lowerLimit(ctx, budget, &ch); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// retarget moves the residency to p and the engine's plan with it.
func (e *Engine) retarget(ctx context.Context, p *plan.WeightPlan) (residency.Change, error) {
	ch, err := e.res.Retarget(ctx, p)
	if err != nil {
		return ch, fmt.Errorf("engine: %w", err)
	}
	e.plan = p
	f := *e.foot
	f.Plan = p
	f.peak(e.d.Info(), e.cfg.HeadDim)
	e.foot = &f
	e.groupProducts()
	e.graphReason = e.graphWhy()
	return ch, nil
}

// lowerLimit lowers the device pool's limit to budget after a move down.
// The plan counts the bytes of live blocks; free space left inside chunks
// that still hold live blocks cannot be given back, so the pool may still
// reserve more than budget (seen after a model was loaded at its minimum,
// promoted and demoted again). Then the plan is made again under budget
// less what the pool keeps over it, and more each time (16 MiB, doubling),
// until a demoted group's chunks free the difference: the engine streams
// a little more than budget alone would make it, and its pool stays
// within budget. ch gathers every move's figures.
func (e *Engine) lowerLimit(ctx context.Context, budget uint64, ch *residency.Change) error {
	planned := budget
	for try := 0; ; try++ {
		err := e.dev.SetLimit(budget)
		var le *pool.LimitError
		if err == nil {
			return nil
		}
		slack := uint64(16<<20) << try
		if !errors.As(err, &le) || try == 8 || planned < e.MinimumBudget()+le.Reserved-le.Limit+slack {
			return fmt.Errorf("engine: after moving to the budget's plan: %w", err)
		}
		planned -= le.Reserved - le.Limit + slack
		e.opt.Budget = planned
		p, perr := e.planWeights(e.foot.reserve, e.foot.KVBytes, e.foot.ArenaBytes, e.opt.Slots)
		e.opt.Budget = budget
		if perr == nil {
			perr = e.checkTied(p)
		}
		if perr != nil {
			return fmt.Errorf("engine: after moving to the budget's plan: %w (and planning under %d bytes: %v)", err, planned, perr)
		}
		more, rerr := e.retarget(ctx, p)
		ch.Demoted += more.Demoted
		ch.Promoted += more.Promoted
		ch.DemotedBytes += more.DemotedBytes
		ch.PromotedBytes += more.PromotedBytes
		ch.UploadedBytes += more.UploadedBytes
		ch.UploadSeconds += more.UploadSeconds
		ch.Seconds += more.Seconds
		ch.Slots, ch.SlotBytes = more.Slots, more.SlotBytes
		if rerr != nil {
			return rerr
		}
	}
}

// Budget returns the budget the engine runs under (Options.Budget, or
// SetBudget's latest).
func (e *Engine) Budget() uint64 { return e.opt.Budget }

// MinimumBudget is the smallest budget SetBudget accepts: the weight
// plan's minimum (two staging slots and what must stay resident) plus
// what the KV cache, the arena and the rest planned at New take.
func (e *Engine) MinimumBudget() uint64 { return e.plan.MinimumBytes + e.foot.reserve }

// FullBudget is the smallest budget under which every weight stays
// resident (SetBudget then streams nothing).
func (e *Engine) FullBudget() (uint64, error) {
	saved := e.opt.Budget
	defer func() { e.opt.Budget = saved }()
	e.opt.Budget = math.MaxUint64 / 4
	p, err := e.planWeights(e.foot.reserve, e.foot.KVBytes, e.foot.ArenaBytes, e.opt.Slots)
	if err != nil {
		return 0, err
	}
	return p.PeakBytes + e.foot.reserve, nil
}
