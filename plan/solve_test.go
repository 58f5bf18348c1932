package plan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// planner is one offset planner under test.
type planner struct {
	name string
	run  func(bufs []Buffer, align uint64) (Layout, error)
}

var greedyPlanners = []planner{
	{AlgorithmGreedySize, GreedyBySize},
	{AlgorithmFFD, FirstFitDecreasing},
	{AlgorithmGreedyBreadth, GreedyByBreadth},
}

// allPlanners adds the search (minimising, node-limited so the tests do
// not depend on the machine's speed) and the whole portfolio.
func allPlanners() []planner {
	return append(slices.Clone(greedyPlanners),
		planner{AlgorithmSearch, func(bufs []Buffer, align uint64) (Layout, error) {
			return Search(context.Background(), bufs, Options{Alignment: align, NodeLimit: 20000, TimeLimit: time.Minute})
		}},
		planner{AlgorithmPortfolio, func(bufs []Buffer, align uint64) (Layout, error) {
			l, _, err := Solve(context.Background(), bufs, Options{Alignment: align, NodeLimit: 20000, TimeLimit: time.Minute})
			return l, err
		}},
	)
}

// randomInstance returns n buffers over steps [0, steps) with sizes in
// [1, maxSize], and now and then a zero-size one.
func randomInstance(r *rand.Rand, n, steps int, maxSize uint64) []Buffer {
	bufs := make([]Buffer, n)
	for i := range bufs {
		s := r.IntN(steps)
		bufs[i] = Buffer{ID: fmt.Sprint(i), Start: s, End: s + 1 + r.IntN(max(steps/3, 1)), Size: 1 + r.Uint64N(maxSize)}
		if r.IntN(20) == 0 {
			bufs[i].Size = 0
		}
	}
	return bufs
}

// TestPlannersHandExample checks a small instance whose optimum is known:
// a chain where the lower bound can be reached only by reusing the bytes of
// dead buffers.
func TestPlannersHandExample(t *testing.T) {
	// Lower bound 12 (steps 0-2 hold b1+b3+b5 = 4+4+4); MiniMalloc's
	// README example with capacity 12.
	bufs := []Buffer{
		{ID: "b1", Start: 0, End: 3, Size: 4},
		{ID: "b2", Start: 3, End: 9, Size: 4},
		{ID: "b3", Start: 0, End: 9, Size: 4},
		{ID: "b4", Start: 9, End: 21, Size: 4},
		{ID: "b5", Start: 0, End: 21, Size: 4},
	}
	if lb := LowerBound(bufs); lb != 12 {
		t.Fatalf("LowerBound = %d, want 12", lb)
	}
	for _, p := range allPlanners() {
		t.Run(p.name, func(t *testing.T) {
			l, err := p.run(bufs, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := Verify(bufs, l); err != nil {
				t.Fatal(err)
			}
			if l.ArenaBytes != 12 {
				t.Errorf("arena %d, want 12 (offsets %v)", l.ArenaBytes, l.Offsets)
			}
		})
	}
}

// TestGreedyHardInstance pins the greedy planners on an instance where
// largest-first cannot reach the lower bound but the search can: the big
// buffer placed first splits the space the small ones need.
func TestGreedyHardInstance(t *testing.T) {
	// Steps 0-1: A(2) B(2); steps 1-2: B(2) C(1) D(1); steps 2-3: C D E(2).
	// Lower bound 4. Largest first places A, B, E before C and D.
	bufs := []Buffer{
		{ID: "A", Start: 0, End: 1, Size: 2},
		{ID: "B", Start: 0, End: 2, Size: 2},
		{ID: "C", Start: 1, End: 3, Size: 1},
		{ID: "D", Start: 1, End: 3, Size: 1},
		{ID: "E", Start: 2, End: 3, Size: 2},
	}
	lb := LowerBound(bufs)
	l, err := Search(context.Background(), bufs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l.ArenaBytes != lb {
		t.Errorf("search arena %d, want the lower bound %d", l.ArenaBytes, lb)
	}
	for _, p := range greedyPlanners {
		g, err := p.run(bufs, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(bufs, g); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		t.Logf("%s: arena %d (lower bound %d)", p.name, g.ArenaBytes, lb)
		if p.name == AlgorithmGreedySize && g.ArenaBytes != 6 {
			t.Errorf("greedy by size: arena %d, want 6 (A, B, E placed first push C and D above B)", g.ArenaBytes)
		}
	}
}

// TestPlannersRandom is the property test: on random instances, with and
// without alignment, every planner's layout verifies and is at least the
// lower bound, and the portfolio is never worse than any greedy planner.
func TestPlannersRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for it := range 150 {
		n := 1 + r.IntN(60)
		bufs := randomInstance(r, n, 1+r.IntN(40), uint64(1+r.IntN(5000)))
		align := []uint64{0, 1, 8, 256}[r.IntN(4)]
		lb := LowerBound(Padded(bufs, align))
		bestGreedy := uint64(1<<64 - 1)
		for _, p := range allPlanners() {
			l, err := p.run(bufs, align)
			if err != nil {
				t.Fatalf("instance %d (n=%d, align %d): %s: %v", it, n, align, p.name, err)
			}
			if err := Verify(bufs, l); err != nil {
				t.Fatalf("instance %d: %s: %v", it, p.name, err)
			}
			if l.ArenaBytes < lb {
				t.Fatalf("instance %d: %s: arena %d below the lower bound %d", it, p.name, l.ArenaBytes, lb)
			}
			switch p.name {
			case AlgorithmGreedySize, AlgorithmFFD, AlgorithmGreedyBreadth:
				bestGreedy = min(bestGreedy, l.ArenaBytes)
			case AlgorithmPortfolio:
				if l.ArenaBytes > bestGreedy {
					t.Fatalf("instance %d: portfolio %d worse than greedy %d", it, l.ArenaBytes, bestGreedy)
				}
			}
		}
	}
}

// bruteForce returns the smallest arena over all placement orders, each
// buffer at the lowest offset above the earlier ones it meets: every
// pushed-down layout arises so, so this is the optimum.
func bruteForce(bufs []Buffer) uint64 {
	n := len(bufs)
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	off := make([]uint64, n)
	best := uint64(1<<64 - 1)
	var rec func(k int, top uint64)
	rec = func(k int, top uint64) {
		if top >= best {
			return
		}
		if k == n {
			best = top
			return
		}
		for i := k; i < n; i++ {
			perm[k], perm[i] = perm[i], perm[k]
			b := bufs[perm[k]]
			var o uint64
			for _, j := range perm[:k] {
				if bufs[j].Overlaps(b) {
					o = max(o, off[j]+bufs[j].Size)
				}
			}
			off[perm[k]] = o
			rec(k+1, max(top, o+b.Size))
			perm[k], perm[i] = perm[i], perm[k]
		}
	}
	rec(0, 0)
	return best
}

// TestSearchOptimal checks the search's pruning rules against brute force
// on small instances: it must find the optimum, every time.
func TestSearchOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for it := range 400 {
		bufs := make([]Buffer, 1+r.IntN(7))
		for i := range bufs {
			s := r.IntN(10)
			bufs[i] = Buffer{Start: s, End: s + 1 + r.IntN(6), Size: uint64(1 + r.IntN(8))}
		}
		want := bruteForce(bufs)
		l, err := Search(context.Background(), bufs, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if l.ArenaBytes != want {
			t.Fatalf("instance %d %+v: search %d, optimum %d", it, bufs, l.ArenaBytes, want)
		}
		// The decision form agrees: the optimum fits, one byte less does not.
		if _, err := Search(context.Background(), bufs, Options{Capacity: want}); err != nil {
			t.Fatalf("instance %d: capacity %d: %v", it, want, err)
		}
		if want > 1 {
			if _, err := Search(context.Background(), bufs, Options{Capacity: want - 1}); !errors.Is(err, ErrInfeasible) {
				t.Fatalf("instance %d: capacity %d: got %v, want ErrInfeasible", it, want-1, err)
			}
		}
	}
}

func TestSolveGoals(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	bufs := randomInstance(r, 40, 30, 1000)
	ctx := context.Background()

	t.Run("capacity met by greedy skips the search", func(t *testing.T) {
		l, rep, err := Solve(ctx, bufs, Options{Capacity: 1 << 40})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Fits || l.ArenaBytes > 1<<40 {
			t.Fatalf("report %+v", rep)
		}
		last := rep.Runs[len(rep.Runs)-1]
		if last.Algorithm != AlgorithmSearch || last.Outcome != "skipped: goal already met" {
			t.Errorf("last run %+v, want a skipped search", last)
		}
	})
	t.Run("capacity below the lower bound", func(t *testing.T) {
		lb := LowerBound(bufs)
		l, rep, err := Solve(ctx, bufs, Options{Capacity: lb - 1})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Fits || l.ArenaBytes < lb {
			t.Fatalf("report %+v", rep)
		}
		if last := rep.Runs[len(rep.Runs)-1]; last.Outcome != "no layout fits" {
			t.Errorf("search outcome %q, want %q", last.Outcome, "no layout fits")
		}
	})
	t.Run("one algorithm", func(t *testing.T) {
		l, rep, err := Solve(ctx, bufs, Options{Algorithms: []string{AlgorithmFFD}})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Runs) != 1 || l.Algorithm != AlgorithmFFD || rep.Algorithm != AlgorithmFFD {
			t.Errorf("runs %+v, layout by %s", rep.Runs, l.Algorithm)
		}
	})
	t.Run("search alone", func(t *testing.T) {
		l, rep, err := Solve(ctx, bufs, Options{Algorithms: []string{AlgorithmSearch}, NodeLimit: 5000})
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(bufs, l); err != nil {
			t.Fatal(err)
		}
		if rep.ArenaBytes < rep.LowerBoundBytes {
			t.Fatalf("report %+v", rep)
		}
	})
	t.Run("unknown algorithm", func(t *testing.T) {
		if _, _, err := Solve(ctx, bufs, Options{Algorithms: []string{"magic"}}); !errors.Is(err, ErrInvalid) {
			t.Errorf("err = %v, want ErrInvalid", err)
		}
	})
	t.Run("invalid buffers", func(t *testing.T) {
		bad := []Buffer{{ID: "x", Start: 1, End: 1, Size: 1}}
		if _, _, err := Solve(ctx, bad, Options{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("err = %v, want ErrInvalid", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		l, rep, err := Solve(ctx, nil, Options{})
		if err != nil || l.ArenaBytes != 0 || !rep.AtLowerBound {
			t.Errorf("Solve(nil) = %+v, %+v, %v", l, rep, err)
		}
	})
	t.Run("no search", func(t *testing.T) {
		_, rep, err := Solve(ctx, bufs, Options{TimeLimit: -1})
		if err != nil {
			t.Fatal(err)
		}
		if last := rep.Runs[len(rep.Runs)-1]; last.Algorithm == AlgorithmSearch && last.Nodes > 0 {
			t.Errorf("search ran: %+v", last)
		}
	})
}

// TestSolveCancel checks that a cancelled context stops the search and that
// Solve still hands back the best layout it has.
func TestSolveCancel(t *testing.T) {
	bufs := readInstance(t, "E.1048576.csv")
	lb := LowerBound(bufs)
	t.Run("before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		l, rep, err := Solve(ctx, bufs, Options{Capacity: lb})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if err := Verify(bufs, l); err != nil {
			t.Fatalf("layout returned with the error: %v", err)
		}
		for _, r := range rep.Runs {
			if r.Algorithm == AlgorithmSearch {
				t.Errorf("search ran after cancellation: %+v", r)
			}
		}
	})
	t.Run("during the search", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		// Greedy first, so the search is what the deadline interrupts.
		l, rep, err := Solve(ctx, bufs, Options{Capacity: lb, Algorithms: []string{AlgorithmGreedySize, AlgorithmSearch}})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded (runs %+v)", err, rep.Runs)
		}
		if err := Verify(bufs, l); err != nil {
			t.Fatal(err)
		}
		if last := rep.Runs[len(rep.Runs)-1]; last.Algorithm != AlgorithmSearch || last.Outcome != "cancelled" {
			t.Errorf("last run %+v, want a cancelled search", last)
		}
	})
}

// TestSolveTimeLimit checks that the time limit bounds the call on an
// instance where the search cannot succeed quickly.
func TestSolveTimeLimit(t *testing.T) {
	bufs := readInstance(t, "E.1048576.csv")
	start := time.Now()
	_, rep, err := Solve(context.Background(), bufs, Options{TimeLimit: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Solve took %v with a 30ms limit", took)
	}
	t.Logf("30ms: arena %d (lower bound %d), runs %+v", rep.ArenaBytes, rep.LowerBoundBytes, rep.Runs)
}

// TestSolveDeterministic checks that the same input gives the same layout
// when a node limit, not the clock, bounds the search.
func TestSolveDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	bufs := randomInstance(r, 80, 40, 4096)
	opts := Options{NodeLimit: 30000, TimeLimit: time.Minute}
	a, _, err := Solve(context.Background(), bufs, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := Solve(context.Background(), bufs, opts)
	if err != nil {
		t.Fatal(err)
	}
	if a.ArenaBytes != b.ArenaBytes || a.Algorithm != b.Algorithm || !slices.Equal(a.Offsets, b.Offsets) {
		t.Errorf("two runs differ: %d by %s vs %d by %s", a.ArenaBytes, a.Algorithm, b.ArenaBytes, b.Algorithm)
	}
}

// TestSearchParallelSameResult checks that running a round's preorders at
// once gives the layout running them one after another gives.
func TestSearchParallelSameResult(t *testing.T) {
	bufs := readInstance(t, "E.1048576.csv")
	opts := Options{Capacity: LowerBound(bufs), TimeLimit: time.Minute}
	var layouts []Layout
	for _, procs := range []int{1, 4} {
		prev := runtime.GOMAXPROCS(procs)
		l, err := Search(context.Background(), bufs, opts)
		runtime.GOMAXPROCS(prev)
		if err != nil {
			t.Fatalf("GOMAXPROCS=%d: %v", procs, err)
		}
		layouts = append(layouts, l)
	}
	if !slices.Equal(layouts[0].Offsets, layouts[1].Offsets) {
		t.Error("layouts differ between one and four CPUs")
	}
}

// TestSearchGraphShaped runs the search on a long chain of the shape an
// inference graph gives (each tensor read by the next few ops), where the
// lower bound is reachable: it must get there without blowing up.
func TestSearchGraphShaped(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 2))
	var bufs []Buffer
	for i := range 1500 {
		bufs = append(bufs, Buffer{ID: fmt.Sprint(i), Start: i, End: i + 1 + r.IntN(4), Size: 256 * (1 + r.Uint64N(64))})
		if r.IntN(50) == 0 { // a skip connection
			bufs = append(bufs, Buffer{ID: fmt.Sprint("skip", i), Start: i, End: i + 20 + r.IntN(60), Size: 256 * (1 + r.Uint64N(16))})
		}
	}
	start := time.Now()
	l, rep, err := Solve(context.Background(), bufs, Options{Alignment: 256, TimeLimit: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(bufs, l); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Solve took %v with a 2 s limit", took)
	}
	t.Logf("%d buffers: lower bound %d, arena %d by %s in %v; runs %+v", len(bufs), rep.LowerBoundBytes, rep.ArenaBytes, rep.Algorithm, time.Since(start), rep.Runs)
}

// TestSolveCancelInGreedy: the greedy planners and the check of their
// layouts look at the context too, so that a cancelled Solve on the
// largest instance, whose greedy passes are quadratic (every buffer live
// at once: seconds each), returns within a fraction of a second, saying
// where it stopped and what it had done, with every buffer apart as the
// layout when no planner had finished.
func TestSolveCancelInGreedy(t *testing.T) {
	instance := func(n int) []Buffer {
		bufs := make([]Buffer, n)
		for i := range bufs {
			bufs[i] = Buffer{ID: strconv.Itoa(i), Start: 0, End: 1 + i%7, Size: uint64(1 + i%4093)}
		}
		return bufs
	}
	for _, c := range []struct {
		name  string
		bufs  []Buffer
		algs  []string
		after time.Duration
		want  string
	}{
		{"first planner", instance(MaxBuffers), nil, 400 * time.Millisecond, // (past the set-up, which took over 100 ms on a loaded machine)
			"plan: stopped in greedy-size, before any planner finished: "},
		// Fewer buffers: the first planner runs to its end.
		{"second planner", instance(MaxBuffers / 8), []string{AlgorithmGreedyBreadth, AlgorithmFFD}, 0, "plan: stopped before ffd, after greedy-breadth (best arena "},
	} {
		t.Run(c.name, func(t *testing.T) {
			bufs := c.bufs
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opts := Options{Algorithms: c.algs, TimeLimit: -1}
			if c.after > 0 {
				time.AfterFunc(c.after, cancel)
			} else {
				// Cancelled as the first planner's layout is logged.
				opts.Logger = slog.New(cancelHandler{cancel})
			}
			began := time.Now()
			l, _, err := Solve(ctx, bufs, opts)
			took := time.Since(began)
			if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("err %v, want %q… wrapping context.Canceled", err, c.want)
			}
			if len(l.Offsets) != len(bufs) {
				t.Fatalf("%d offsets returned for %d buffers", len(l.Offsets), len(bufs))
			}
			if limit := c.after + time.Second; took > limit {
				t.Errorf("Solve returned %v after it began, want within %v", took, limit)
			}
		})
	}
}

// cancelHandler is a slog handler that cancels a context at the first
// record.
type cancelHandler struct{ cancel context.CancelFunc }

func (h cancelHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h cancelHandler) Handle(context.Context, slog.Record) error {
	h.cancel()
	return nil
}
func (h cancelHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h cancelHandler) WithGroup(string) slog.Handler      { return h }
