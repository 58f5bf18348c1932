package hostmath

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Runner splits work over persistent worker goroutines. Run cuts a range
// into chunks (several per worker, whole grains) that the workers and the
// caller take in turn from a shared counter, so a worker the scheduler
// started late, or one reading slower memory, takes fewer chunks instead of
// holding everyone up; a call starts no goroutine. Between calls a worker
// spins for SpinFor, yielding to other goroutines, before it sleeps: the
// products of one decode step follow each other microseconds apart, and
// waking sleeping goroutines one after another would cost more than a
// small product. One Run executes at a time: concurrent calls queue, and a
// part must not call Run on its own Runner (it would wait for itself). The
// zero value is not usable; a nil *Runner runs every part on the caller.
type Runner struct {
	mu      sync.Mutex // one Run at a time
	workers []*worker
	seq     atomic.Uint64       // bumped for each job published
	job     atomic.Pointer[job] // the latest job
	closed  atomic.Bool
	spin    time.Duration
}

// SpinFor is how long an idle worker keeps looking for the next job before
// it sleeps.
const SpinFor = 200 * time.Microsecond

// chunksPerWorker is how many chunks Run cuts a range into per worker: enough
// that a late worker's share is taken by the others, few enough that each
// chunk of a product still streams a long contiguous run of weight rows.
const chunksPerWorker = 4

// job is one Run: chunks of chunk units (grain-aligned) of [0, n).
type job struct {
	fn       func(lo, hi int)
	n, chunk int
	next     atomic.Int64 // first unit not yet taken
	done     atomic.Int64 // units finished
}

// worker is one worker goroutine's parking place.
type worker struct {
	parked atomic.Bool
	wake   chan struct{} // one token when parked is cleared by a waker
}

// NewRunner starts a runner of n workers in all, the caller of Run counted:
// n−1 goroutines. n ≤ 0 means runtime.GOMAXPROCS(0).
func NewRunner(n int) *Runner {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	r := &Runner{spin: SpinFor}
	for range n - 1 {
		w := &worker{wake: make(chan struct{}, 1)}
		r.workers = append(r.workers, w)
		go r.work(w, 0)
	}
	return r
}

// work takes chunks of each job published after sequence seen, until
// Close.
func (r *Runner) work(w *worker, seen uint64) {
	for {
		s := r.waitJob(w, seen)
		if r.closed.Load() {
			return
		}
		seen = s
		if j := r.job.Load(); j != nil {
			j.take()
		}
	}
}

// waitJob returns the job sequence once it differs from seen (or the
// runner is closed): spinning for r.spin, then parked until woken.
func (r *Runner) waitJob(w *worker, seen uint64) uint64 {
	start := time.Now()
	for i := 0; ; i++ {
		if s := r.seq.Load(); s != seen || r.closed.Load() {
			return s
		}
		// Yielding takes the scheduler's lock: 15 workers doing it every
		// few dozen loads spent an eighth of a decode step's CPU time
		// there (profiled on 16 cores), so look at the clock and yield
		// only every thousand loads or so (microseconds).
		if i&1023 == 1023 {
			if time.Since(start) > r.spin {
				break
			}
			runtime.Gosched()
		}
	}
	for {
		w.parked.Store(true)
		if s := r.seq.Load(); s != seen || r.closed.Load() {
			if !w.parked.Swap(false) {
				<-w.wake // a waker cleared it and sent a token: take it
			}
			return s
		}
		<-w.wake
		if s := r.seq.Load(); s != seen || r.closed.Load() {
			return s
		}
	}
}

// take runs chunks of j until none is left.
func (j *job) take() {
	for {
		lo := int(j.next.Add(int64(j.chunk))) - j.chunk
		if lo >= j.n {
			return
		}
		hi := min(j.n, lo+j.chunk)
		j.fn(lo, hi)
		j.done.Add(int64(hi - lo))
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
	if r.closed.Load() {
		fn(0, n)
		return
	}
	chunks := min(units, (len(r.workers)+1)*chunksPerWorker)
	j := &job{fn: fn, n: n, chunk: (units + chunks - 1) / chunks * grain}
	r.job.Store(j)
	r.seq.Add(1)
	for _, w := range r.workers {
		if w.parked.Load() && w.parked.Swap(false) {
			w.wake <- struct{}{}
		}
	}
	j.take()
	for i := 0; j.done.Load() < int64(n); i++ {
		if i&255 == 255 {
			runtime.Gosched()
		}
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
	if r.closed.Swap(true) {
		return
	}
	r.seq.Add(1)
	for _, w := range r.workers {
		if w.parked.Swap(false) {
			w.wake <- struct{}{}
		}
	}
}
