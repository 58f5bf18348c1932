package plan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// DefaultTimeLimit is the search budget Solve and Search use when
// Options.TimeLimit is zero.
const DefaultTimeLimit = 5 * time.Second

// Options steers Solve and Search. The zero value plans with no alignment
// and no capacity (smallest arena wanted), runs the whole portfolio and
// gives the search DefaultTimeLimit.
type Options struct {
	// Alignment is the multiple every offset must be of; sizes are rounded
	// up to it. 0 or 1: none.
	Alignment uint64
	// Capacity, when non-zero, is the arena size to fit in: planning stops
	// at the first layout that fits. Zero means "as small as possible,
	// ideally the lower bound".
	Capacity uint64
	// TimeLimit bounds the whole call, search included; 0 means
	// DefaultTimeLimit, negative means no search at all.
	TimeLimit time.Duration
	// NodeLimit, when non-zero, caps the search nodes visited, so that the
	// result does not depend on the machine's speed.
	NodeLimit int64
	// Algorithms lists the planners to run, in order; nil or
	// {AlgorithmPortfolio} means every greedy planner, then the search.
	Algorithms []string
	// Logger receives a debug line per planner run; nil means silence.
	Logger *slog.Logger
}

func (o Options) timeLimit() time.Duration {
	if o.TimeLimit == 0 {
		return DefaultTimeLimit
	}
	return max(o.TimeLimit, 0)
}

// Algorithms lists the planner names Options.Algorithms accepts.
func Algorithms() []string {
	return []string{AlgorithmPortfolio, AlgorithmGreedySize, AlgorithmFFD, AlgorithmGreedyBreadth, AlgorithmSearch}
}

// Run is one planner's result within a Solve call.
type Run struct {
	Algorithm  string        `json:"algorithm"`
	ArenaBytes uint64        `json:"arena_bytes"` // 0 when it produced no layout
	Elapsed    time.Duration `json:"elapsed_ns"`
	Nodes      int64         `json:"nodes,omitempty"` // search nodes visited
	// Outcome says how the run ended: "layout", "lower bound" (its layout
	// reached it), "fits" (the capacity); for a search that found nothing
	// "time limit", "node limit", "no layout fits" (it exhausted the
	// capacity), "no smaller layout exists" (it exhausted every arena below
	// the best greedy one), "cancelled"; or "skipped: <why>".
	Outcome string `json:"outcome"`
}

// Report describes a Solve call.
type Report struct {
	LowerBoundBytes uint64 `json:"lower_bound_bytes"` // of the padded sizes
	CapacityBytes   uint64 `json:"capacity_bytes"`    // 0: none asked
	ArenaBytes      uint64 `json:"arena_bytes"`
	Algorithm       string `json:"algorithm"` // the planner whose layout won
	// Fits is ArenaBytes <= CapacityBytes (true without a capacity).
	Fits bool `json:"fits"`
	// AtLowerBound is ArenaBytes == LowerBoundBytes: the layout is optimal.
	AtLowerBound bool          `json:"at_lower_bound"`
	Runs         []Run         `json:"runs"`
	Elapsed      time.Duration `json:"elapsed_ns"`
}

// Solve plans offsets for bufs with a portfolio: every greedy planner, then,
// unless the goal is already met, the search until the time limit. The goal
// is to fit opts.Capacity when it is set, else to reach the lower bound.
// It keeps the smallest layout (the earliest planner wins ties, so the
// result is deterministic when the search finishes within its limits or
// opts.NodeLimit bounds it) and verifies it. The returned layout's offsets
// are indexed like bufs; bufs is not modified or retained.
//
// Errors: invalid input or an unknown algorithm name wrap ErrInvalid and no
// layout is returned. When ctx is done (it is looked at every few dozen
// buffers placed or checked, and throughout the search), Solve returns
// the best layout found so far, or every buffer apart, with an error that
// wraps ctx's and says where it stopped and after which planners
// ("plan: stopped in ffd, after greedy-size (best arena ...): context
// canceled"; "stopped before ffd" between two planners). A layout that does not
// fit opts.Capacity is not an error: Report.Fits says so.
func Solve(ctx context.Context, bufs []Buffer, opts Options) (Layout, Report, error) {
	began := time.Now()
	deadline := began.Add(opts.timeLimit())
	if err := Validate(bufs, opts.Alignment); err != nil {
		return Layout{}, Report{}, err
	}
	algs := opts.Algorithms
	if len(algs) == 0 || slices.Equal(algs, []string{AlgorithmPortfolio}) {
		algs = []string{AlgorithmGreedySize, AlgorithmFFD, AlgorithmGreedyBreadth, AlgorithmSearch}
	}
	for _, a := range algs {
		if !slices.Contains(Algorithms(), a) || a == AlgorithmPortfolio {
			return Layout{}, Report{}, fmt.Errorf("plan: unknown algorithm %q (want one of %v): %w", a, Algorithms(), ErrInvalid)
		}
	}
	a := max(opts.Alignment, 1)
	rep := Report{LowerBoundBytes: LowerBound(Padded(bufs, a)), CapacityBytes: opts.Capacity}
	var best Layout
	have := false
	goalMet := func() bool {
		if !have {
			return false
		}
		if opts.Capacity > 0 {
			return best.ArenaBytes <= opts.Capacity
		}
		return best.ArenaBytes <= rep.LowerBoundBytes
	}
	consider := func(l Layout) {
		if !have || l.ArenaBytes < best.ArenaBytes {
			best, have = l, true
		}
	}
	outcome := func(arena uint64) string {
		switch {
		case arena <= rep.LowerBoundBytes:
			return "lower bound"
		case opts.Capacity > 0 && arena <= opts.Capacity:
			return "fits"
		}
		return "layout"
	}
	// report is rep with the layout returned.
	report := func(l Layout) Report {
		rep.ArenaBytes = l.ArenaBytes
		rep.Algorithm = l.Algorithm
		rep.Fits = opts.Capacity == 0 || l.ArenaBytes <= opts.Capacity
		rep.AtLowerBound = l.ArenaBytes <= rep.LowerBoundBytes
		rep.Elapsed = time.Since(began)
		return rep
	}
	// stopped is Solve's error when ctx is done: where it stopped ("in
	// ffd", "before ffd", "" after the last planner) and what was done
	// ("plan: stopped in ffd, after greedy-size (best arena ...)"),
	// with the best layout so far (every buffer apart when no planner
	// finished).
	stopped := func(at string, cause error) (Layout, Report, error) {
		var ran []string
		for _, r := range rep.Runs {
			if r.Outcome != "cancelled" {
				ran = append(ran, r.Algorithm)
			}
		}
		where := "stopped"
		if at != "" {
			where += " " + at + ","
		}
		if len(ran) == 0 {
			where += " before any planner finished"
		} else {
			where += " after " + strings.Join(ran, ", ")
		}
		if !have {
			best = stacked(bufs, a)
		} else {
			where += fmt.Sprintf(" (best arena %d bytes, by %s)", best.ArenaBytes, best.Algorithm)
		}
		return best, report(best), fmt.Errorf("plan: %s: %w", where, cause)
	}
	for _, alg := range algs {
		if err := ctx.Err(); err != nil {
			return stopped("before "+alg, err)
		}
		t0 := time.Now()
		run := Run{Algorithm: alg}
		var l Layout
		var err error
		switch alg {
		case AlgorithmGreedySize:
			l, err = greedyBySize(ctx, bufs, a)
		case AlgorithmFFD:
			l, err = firstFitDecreasing(ctx, bufs, a)
		case AlgorithmGreedyBreadth:
			l, err = greedyByBreadth(ctx, bufs, a)
		case AlgorithmSearch:
			if goalMet() {
				run.Outcome = "skipped: goal already met"
				rep.Runs = append(rep.Runs, run)
				continue
			}
			var ok bool
			l, ok, run = solveSearch(ctx, bufs, a, opts, rep.LowerBoundBytes, best, have, deadline)
			if !ok {
				run.Elapsed = time.Since(t0)
				rep.Runs = append(rep.Runs, run)
				opts.log(run)
				if run.Outcome == "cancelled" {
					return stopped("in "+alg, ctx.Err())
				}
				continue
			}
		}
		if err != nil {
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
				return stopped("in "+alg, err)
			}
			return Layout{}, Report{}, err
		}
		if err := verify(ctx, bufs, l); err != nil {
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
				return stopped("in the check of "+alg+"'s layout", err)
			}
			return Layout{}, Report{}, fmt.Errorf("plan %s: internal error: %w", alg, err)
		}
		run.Elapsed = time.Since(t0)
		run.ArenaBytes = l.ArenaBytes
		if run.Outcome == "" {
			run.Outcome = outcome(l.ArenaBytes)
		}
		rep.Runs = append(rep.Runs, run)
		opts.log(run)
		consider(l)
	}
	if err := ctx.Err(); err != nil {
		return stopped("", err)
	}
	if !have {
		// Only the search ran and it found nothing: every buffer apart.
		best = stacked(bufs, a)
		if err := verify(ctx, bufs, best); err != nil {
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
				return stopped("in the check of every buffer apart", err)
			}
			return Layout{}, Report{}, fmt.Errorf("plan: internal error: %w", err)
		}
	}
	return best, report(best), nil
}

// solveSearch runs the search part of Solve: a fit at the capacity, or a
// bisection below the best greedy arena. ok is false when it found no
// layout (run.Outcome says why).
func solveSearch(ctx context.Context, bufs []Buffer, a uint64, opts Options, lb uint64, best Layout, have bool, deadline time.Time) (Layout, bool, Run) {
	run := Run{Algorithm: AlgorithmSearch}
	if opts.timeLimit() == 0 {
		run.Outcome = "skipped: search disabled (negative time limit)"
		return Layout{}, false, run
	}
	sb, err := newSearchBase(bufs, a)
	if err != nil {
		run.Outcome = "skipped: " + err.Error()
		return Layout{}, false, run
	}
	insts := searchers(sb)
	var res searchRun
	if opts.Capacity > 0 {
		res = searchFit(insts, bufs, a, opts.Capacity, opts.NodeLimit, deadline, ctx.Done())
	} else {
		hi := stacked(bufs, a).ArenaBytes
		if have {
			hi = best.ArenaBytes
		}
		res = searchMin(insts, bufs, a, lb, hi, opts.NodeLimit, deadline, ctx.Done())
	}
	run.Nodes = res.nodes
	if res.offsets != nil {
		return Layout{Offsets: res.offsets, ArenaBytes: res.arena, Alignment: a, Algorithm: AlgorithmSearch}, true, run
	}
	switch {
	case ctx.Err() != nil:
		run.Outcome = "cancelled"
	case res.status == statusDeadline:
		run.Outcome = "time limit"
	case res.status == statusBudget:
		run.Outcome = "node limit"
	default:
		run.Outcome = "no smaller layout exists"
		if opts.Capacity > 0 {
			run.Outcome = "no layout fits"
		}
	}
	return Layout{}, false, run
}

func (o Options) log(r Run) {
	if o.Logger == nil {
		return
	}
	o.Logger.Debug("plan run", "algorithm", r.Algorithm, "arena_bytes", r.ArenaBytes,
		"elapsed", r.Elapsed, "nodes", r.Nodes, "outcome", r.Outcome)
}
