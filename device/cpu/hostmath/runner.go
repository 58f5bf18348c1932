package hostmath

import (
	"runtime"
	"sync"
)

// Runner splits work over persistent worker goroutines: Run hands each a
// contiguous part of a range and runs the first part itself, so a call
// starts no goroutine. One Run executes at a time: concurrent calls queue,
// and a part must not call Run on its own Runner (it would wait for
// itself). The zero value is not usable; a nil *Runner runs every part on
// the caller.
type Runner struct {
	mu      sync.Mutex // one Run at a time
	workers []chan part
	done    chan struct{}
	closed  bool
}

// part is one worker's share of a Run.
type part struct {
	fn     func(lo, hi int)
	lo, hi int
}

// NewRunner starts a runner of n workers in all, the caller of Run counted:
// n−1 goroutines. n ≤ 0 means runtime.GOMAXPROCS(0).
func NewRunner(n int) *Runner {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	r := &Runner{done: make(chan struct{}, n)}
	for range n - 1 {
		c := make(chan part, 1)
		r.workers = append(r.workers, c)
		go r.work(c)
	}
	return r
}

func (r *Runner) work(c chan part) {
	for p := range c {
		p.fn(p.lo, p.hi)
		r.done <- struct{}{}
	}
}

// Workers returns how many parts Run splits a range into at most (1 for a
// nil Runner).
func (r *Runner) Workers() int {
	if r == nil {
		return 1
	}
	return len(r.workers) + 1
}

// Run calls fn(lo, hi) over contiguous parts that cover [0, n) exactly
// once, in parallel, and returns when all have returned. Part boundaries
// are multiples of grain (the last part takes the remainder), and no part is
// empty; with n ≤ grain, or a nil Runner, fn(0, n) runs on the caller. fn
// must not panic (a panic on a worker goroutine ends the program). Run
// after Close runs fn(0, n) on the caller.
func (r *Runner) Run(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	units := (n + grain - 1) / grain
	if r == nil || units < 2 || len(r.workers) == 0 {
		fn(0, n)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		fn(0, n)
		return
	}
	parts := min(units, len(r.workers)+1)
	at := func(i int) int { return min(n, units*i/parts*grain) }
	for i := 1; i < parts; i++ {
		r.workers[i-1] <- part{fn: fn, lo: at(i), hi: at(i + 1)}
	}
	fn(0, at(1))
	for i := 1; i < parts; i++ {
		<-r.done
	}
}

// Close stops the workers; Run then runs on the caller. Close waits for a
// Run in progress. Closing twice is a no-op.
func (r *Runner) Close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	for _, c := range r.workers {
		close(c)
	}
}
