// Package fleet shares one device budget among several models loaded in
// one process. Each model is an engine made with engine.Options.Live on a
// device pool of its own; the fleet decides every model's share (its
// grant) and moves the engines to it with engine.SetBudget: a model that
// loses budget streams some of its weights from host memory instead of
// leaving the GPU, one that gains budget pulls weights back in, at the
// link's rate from its pinned or registered source.
//
// Quick start:
//
//	f := fleet.New(budget, fleet.Options{})
//	f.MakeRoom(ctx, minA)                           // minA: engine.Estimate's minimum (a budget of 1 fails with it)
//	f.Add(ctx, fleet.Model{Name: "a", Engine: ea})  // ea made with Options.Live and the budget minA
//	f.MakeRoom(ctx, minB)
//	f.Add(ctx, fleet.Model{Name: "b", Engine: eb})
//	f.Begin(ctx, "a")                 // a serves: it takes what b need not keep
//	e, unlock, _ := f.Lock("a")       // one step or one generation
//	e.Generate(ctx, prompt, s, nil)
//	unlock()
//	f.End("a")
//	f.SetBudget(ctx, budget/2)        // demotes before it confirms
//	f.Remove(ctx, "b", closeB)        // unload b: its share goes to a
//
// # Grants
//
// Every model keeps its minimum (two staging slots, what must stay
// resident, its KV cache and arena: engine.MinimumBudget). What is left
// goes to the models in order, each up to the budget that keeps it whole
// (engine.FullBudget): first the active ones (between Begin and End), then
// the idle ones whose keep-alive has not run out; within each set by
// priority, then the model that holds more now (so that two busy models
// do not trade weights back and forth), then the most recently used. A
// model idle past its keep-alive keeps only its minimum: its weights are
// on host memory, streamed when it serves again. Remove takes an idle model
// off altogether (its engine closed, its KV cache, staging and arena
// freed, its file no longer registered): package serve does so after
// Options.UnloadAfter without requests, and loads it again when one comes.
//
// # Moves
//
// A change of grants (Begin of a model that holds less than its share,
// End, Add, SetBudget, and Rebalance, which RebalanceEvery calls so that
// keep-alives that run out give their shares back) runs decreases first, each engine's pool limit
// lowered after its weights moved, then increases: the pools' limits
// never add up to more than the budget, before, during or after. An
// engine moves only between steps: the fleet takes the model's lock
// (Lock), which a caller holds for a step or a generation. An increase
// also takes the locks of the other models that stream weights, so that
// its uploads do not share the link with their steps' streaming (which
// left a promotion 1.4 GB/s of the link's 55 on the H200): those models
// pause for the upload.
package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/residency"
)

// DefaultKeepAlive is how long an idle model keeps more than its minimum
// (Model.KeepAlive 0), as ollama keeps a model loaded.
const DefaultKeepAlive = 5 * time.Minute

// Model is one member of the fleet.
type Model struct {
	// Name identifies the model (unique in the fleet).
	Name string
	// Engine runs it: made with engine.Options.Live, on a device pool
	// of its own whose limit is the engine's budget.
	Engine *engine.Engine
	// Priority weighs the model against the others of its set (active or
	// idle); 0 means 1.
	Priority float64
	// KeepAlive is how long the model keeps more than its minimum after
	// its last End (0: DefaultKeepAlive; negative: forever).
	KeepAlive time.Duration
}

// Options configure a Fleet. The zero value is usable.
type Options struct {
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Logger receives one debug line per move; nil is silent.
	Logger *slog.Logger
}

// Fleet is a budget shared by models. Its methods are safe for concurrent
// use; a goroutine must not hold one model's lock while it calls Begin,
// End, Add or SetBudget (a move may need that lock).
type Fleet struct {
	o   Options
	now func() time.Time
	log *slog.Logger

	move sync.Mutex // serializes moves

	mu      sync.Mutex
	budget  uint64
	room    uint64 // kept out of the grants for a model about to join (MakeRoom)
	lost    uint64 // the grants of models removed whose release failed
	members []*member
	moves   Moves
}

type member struct {
	m         Model
	eng       sync.Mutex // held by Lock's caller and by a move
	min, full uint64
	grant     uint64 // the engine's budget now
	active    int    // Begin calls not yet ended
	removing  bool   // Remove under way: Begin refuses it
	lastUse   time.Time
	promoted  uint64 // bytes uploaded by moves that raised it
	lastMove  residency.Change
	lastTook  float64 // the last move's SetBudget, seconds
	lastWait  float64 // and the wait for the model's lock before it
	// The residency's figures, read at Add and after each move (they
	// change only then), so that Stats waits for no step.
	placed residency.Stats
}

// Moves counts what the fleet moved.
type Moves struct {
	// Changes counts engine.SetBudget calls; Promoted and Demoted the
	// weight bytes they uploaded and gave back; Seconds their wall time.
	Changes       int     `json:"changes"`
	PromotedBytes uint64  `json:"promoted_bytes"`
	DemotedBytes  uint64  `json:"demoted_bytes"`
	Seconds       float64 `json:"seconds"`
	// WaitSeconds is the time moves waited for models' locks.
	WaitSeconds float64 `json:"wait_seconds"`
}

// New returns an empty fleet sharing budget bytes of device pool memory.
func New(budget uint64, o Options) *Fleet {
	f := &Fleet{o: o, now: o.Now, log: o.Logger, budget: budget}
	if f.now == nil {
		f.now = time.Now
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	return f
}

// ErrUnknown matches a model name the fleet does not hold.
var ErrUnknown = errors.New("fleet: unknown model")

// BudgetError is a budget below what the fleet's models need at least.
type BudgetError struct {
	Budget, Minimum uint64
	// Minimums per model, by name.
	Minimums map[string]uint64
}

func (e *BudgetError) Error() string {
	names := make([]string, 0, len(e.Minimums))
	for n := range e.Minimums {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := ""
	for i, n := range names {
		if i > 0 {
			parts += " + "
		}
		parts += fmt.Sprintf("%s %.2f MiB", n, float64(e.Minimums[n])/(1<<20))
	}
	return fmt.Sprintf("fleet: budget %d bytes (%.2f MiB) is below the models' minimum %d bytes (%.2f MiB: %s)",
		e.Budget, float64(e.Budget)/(1<<20), e.Minimum, float64(e.Minimum)/(1<<20), parts)
}

// MakeRoom moves the members so that bytes of the budget are free for a
// model about to join, and keeps them free until the next Add: call it
// before making the new engine (at its minimum, engine.BudgetError's
// Minimum from engine.Estimate with a budget of 1), so that the pools
// together never exceed the budget while it loads. It fails, moving
// nothing, when the members' minimums leave less than bytes.
func (f *Fleet) MakeRoom(ctx context.Context, bytes uint64) error {
	f.move.Lock()
	f.mu.Lock()
	var need uint64
	for _, m := range f.members {
		need += m.min
	}
	if need+f.lost+bytes > f.budget {
		f.mu.Unlock()
		f.move.Unlock()
		return fmt.Errorf("fleet: no room for %d bytes: the budget is %d and the members' minimums take %d", bytes, f.budget, need+f.lost)
	}
	f.room = bytes
	f.mu.Unlock()
	f.move.Unlock()
	return f.apply(ctx)
}

// Add joins a model. Its engine's budget is its grant until the fleet
// moves it, so the engines' budgets together must fit the fleet's (make
// it at its minimum after MakeRoom and let the fleet raise it). Then the
// grants are made again and applied.
func (f *Fleet) Add(ctx context.Context, m Model) error {
	if m.Name == "" || m.Engine == nil {
		return errors.New("fleet: a model needs a name and an engine")
	}
	if m.Priority <= 0 {
		m.Priority = 1
	}
	if m.KeepAlive == 0 {
		m.KeepAlive = DefaultKeepAlive
	}
	full, err := m.Engine.FullBudget()
	if err != nil {
		return fmt.Errorf("fleet: %s: %w", m.Name, err)
	}
	mb := &member{m: m, min: m.Engine.MinimumBudget(), full: full, grant: m.Engine.Budget(), lastUse: f.now(), placed: m.Engine.Residency().Stats()}
	// Not during a move: a budget that shrinks is set before the grants
	// follow it.
	f.move.Lock()
	f.mu.Lock()
	var held uint64
	for _, o := range f.members {
		if o.m.Name == m.Name {
			f.mu.Unlock()
			f.move.Unlock()
			return fmt.Errorf("fleet: a model named %q is already in the fleet", m.Name)
		}
		held += o.grant
	}
	if held+mb.grant+f.lost > f.budget {
		f.mu.Unlock()
		f.move.Unlock()
		return fmt.Errorf("fleet: %s: its engine's budget %d bytes with the others' %d exceeds the fleet's %d: make it with its minimum (%d)",
			m.Name, mb.grant, held, f.budget, mb.min)
	}
	f.members = append(f.members, mb)
	f.room = 0
	f.mu.Unlock()
	f.move.Unlock()
	return f.apply(ctx)
}

// SetBudget changes the fleet's budget. A budget below the models'
// minimums together is a *BudgetError and changes nothing. When it
// shrinks, the engines that lose are moved (each waits for its lock: the
// step in flight ends) and their pools' limits lowered before it returns;
// when it grows, the new room is handed out before it returns.
func (f *Fleet) SetBudget(ctx context.Context, budget uint64) error {
	f.move.Lock()
	f.mu.Lock()
	var need uint64
	mins := map[string]uint64{}
	for _, m := range f.members {
		need += m.min
		mins[m.m.Name] = m.min
	}
	if need+f.room+f.lost > budget {
		f.mu.Unlock()
		f.move.Unlock()
		return &BudgetError{Budget: budget, Minimum: need, Minimums: mins}
	}
	f.budget = budget
	f.mu.Unlock()
	f.move.Unlock()
	return f.apply(ctx)
}

// Budget returns the fleet's budget.
func (f *Fleet) Budget() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.budget
}

// Begin marks name active (it has work): if its share grew, the weights
// move before Begin returns, so the work that follows runs on them. Each
// Begin wants an End.
func (f *Fleet) Begin(ctx context.Context, name string) error {
	f.mu.Lock()
	m := f.find(name)
	if m == nil || m.removing {
		f.mu.Unlock()
		return fmt.Errorf("%w %q", ErrUnknown, name)
	}
	m.active++
	m.lastUse = f.now()
	changed := m.active == 1 && f.grantsLocked()[f.index(m)] != m.grant
	f.mu.Unlock()
	if !changed {
		return nil
	}
	return f.applyFor(ctx, name)
}

// applyFor is apply for a Begin or End of name: a failed move of another
// model is logged, not returned, so that it does not fail name's work
// (the model whose move failed fails at its next step or move).
func (f *Fleet) applyFor(ctx context.Context, name string) error {
	err := f.apply(ctx)
	var me *moveError
	if errors.As(err, &me) && me.model != name {
		f.log.Error("fleet: a move failed", "model", me.model, "for", name, "err", err)
		return nil
	}
	return err
}

// moveError is a failed move of one model.
type moveError struct {
	model string
	err   error
}

func (e *moveError) Error() string { return e.err.Error() }
func (e *moveError) Unwrap() error { return e.err }

// End marks the end of a Begin. When the model goes idle and an active
// model holds less than its share, the room it leaves moves now.
func (f *Fleet) End(ctx context.Context, name string) error {
	f.mu.Lock()
	m := f.find(name)
	if m == nil || m.active == 0 {
		f.mu.Unlock()
		return fmt.Errorf("%w %q (or End without Begin)", ErrUnknown, name)
	}
	m.active--
	m.lastUse = f.now()
	changed := false
	if m.active == 0 {
		g := f.grantsLocked()
		for i, o := range f.members {
			if o.active > 0 && g[i] > o.grant {
				changed = true
			}
		}
	}
	f.mu.Unlock()
	if !changed {
		return nil
	}
	return f.applyFor(ctx, name)
}

// Remove takes name out of the fleet, to unload it: holding the model's
// lock it calls release, which must close the model's engine and leave its
// pool reserving nothing (Close, or Trim), then the model's share goes to
// the others. The model must be idle (every Begin ended). The budget holds
// throughout: the others grow only after release returned. If release
// fails the model is gone all the same, but its grant stays out of the
// others' shares (its memory's fate is unknown) and the error is
// returned. To load it again: MakeRoom, an engine at its minimum, Add.
func (f *Fleet) Remove(ctx context.Context, name string, release func() error) error {
	f.move.Lock()
	f.mu.Lock()
	m := f.find(name)
	switch {
	case m == nil || m.removing:
		f.mu.Unlock()
		f.move.Unlock()
		return fmt.Errorf("%w %q", ErrUnknown, name)
	case m.active > 0:
		f.mu.Unlock()
		f.move.Unlock()
		return fmt.Errorf("fleet: remove %s: it is active (%d Begin calls not ended)", name, m.active)
	}
	m.removing = true
	f.mu.Unlock()
	m.eng.Lock()
	err := release()
	m.eng.Unlock()
	f.mu.Lock()
	f.members = slices.DeleteFunc(f.members, func(o *member) bool { return o == m })
	if err != nil {
		f.lost += m.grant
	}
	f.mu.Unlock()
	f.move.Unlock()
	f.log.Info("fleet: removed", "model", name, "grant_bytes", m.grant, "err", err)
	if err != nil {
		return fmt.Errorf("fleet: remove %s: %w", name, err)
	}
	return f.apply(ctx)
}

// Rebalance makes the grants again and applies them: what keep-alives
// that ran out since the last move change.
func (f *Fleet) Rebalance(ctx context.Context) error { return f.apply(ctx) }

// RebalanceEvery calls Rebalance every period until ctx is done, logging
// a failed move. A rebalance that changes no grant moves nothing.
func (f *Fleet) RebalanceEvery(ctx context.Context, period time.Duration) {
	every(ctx, period, func() {
		if err := f.Rebalance(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("fleet: rebalance", "err", err)
		}
	})
}

// every calls fn every period until ctx is done.
func every(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// Lock takes name's engine for one step or generation; unlock gives it
// back. A move of the model waits for it.
func (f *Fleet) Lock(name string) (e *engine.Engine, unlock func(), err error) {
	f.mu.Lock()
	m := f.find(name)
	f.mu.Unlock()
	if m == nil {
		return nil, nil, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	m.eng.Lock()
	if f.gone(m) {
		m.eng.Unlock()
		return nil, nil, fmt.Errorf("%w %q (removed)", ErrUnknown, name)
	}
	return m.m.Engine, m.eng.Unlock, nil
}

// gone reports whether m is being removed or was.
func (f *Fleet) gone(m *member) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m.removing
}

// ModelStats is one model's share.
type ModelStats struct {
	Name string `json:"name"`
	// Priority is Model.Priority (1 where it was given as 0).
	Priority float64 `json:"priority"`
	// Grant is the engine's budget now; Minimum and Full the least it
	// runs in and the budget that keeps every weight resident.
	Grant   uint64 `json:"grant_bytes"`
	Minimum uint64 `json:"minimum_bytes"`
	Full    uint64 `json:"full_bytes"`
	// ResidentBytes are the weight bytes on the device; StreamedGroups
	// and StreamedBytes the weight groups and bytes streamed per step.
	ResidentBytes  uint64 `json:"resident_bytes"`
	StreamedGroups int    `json:"streamed_groups"`
	StreamedBytes  uint64 `json:"streamed_bytes_per_step"`
	Active         bool   `json:"active"`
	// PromotedBytes are the bytes moves that raised it uploaded.
	PromotedBytes uint64 `json:"promoted_bytes"`
	// LastMove is the latest move of this model; LastMoveSeconds its
	// engine.SetBudget's wall time (the residency's move, the pool's limit
	// and trim), LastWaitSeconds the wait for the model's lock (the step
	// in flight) before it.
	LastMove        residency.Change `json:"last_move"`
	LastMoveSeconds float64          `json:"last_move_seconds"`
	LastWaitSeconds float64          `json:"last_wait_seconds"`
}

// Stats returns every model's share, in the order they were added, and
// what the moves did. It waits for no model's step: the residency's
// figures are those of the latest move.
func (f *Fleet) Stats() ([]ModelStats, Moves) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]ModelStats, len(f.members))
	for i, m := range f.members {
		rs := m.placed
		out[i] = ModelStats{Name: m.m.Name, Priority: m.m.Priority, Grant: m.grant, Minimum: m.min, Full: m.full, Active: m.active > 0, PromotedBytes: m.promoted, LastMove: m.lastMove,
			LastMoveSeconds: m.lastTook, LastWaitSeconds: m.lastWait,
			ResidentBytes: rs.ResidentBytes, StreamedGroups: rs.Groups - rs.ResidentGroups, StreamedBytes: rs.PassBytes}
	}
	return out, f.moves
}

func (f *Fleet) find(name string) *member {
	for _, m := range f.members {
		if m.m.Name == name {
			return m
		}
	}
	return nil
}

func (f *Fleet) index(m *member) int { return slices.Index(f.members, m) }

// grantsLocked is every member's share under the rules of the package
// documentation, by member index. Called with f.mu held.
func (f *Fleet) grantsLocked() []uint64 {
	now := f.now()
	g := make([]uint64, len(f.members))
	left := f.budget - min(f.budget, f.room+f.lost)
	for i, m := range f.members {
		g[i] = m.min
		left -= min(left, m.min)
	}
	kept := func(m *member) bool {
		return m.active > 0 || m.m.KeepAlive < 0 || now.Sub(m.lastUse) < m.m.KeepAlive
	}
	order := make([]int, 0, len(f.members))
	for i, m := range f.members {
		if kept(m) {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ma, mb := f.members[a], f.members[b]
		if c := boolOrder(ma.active > 0, mb.active > 0); c != 0 {
			return c
		}
		if c := cmp.Compare(mb.m.Priority, ma.m.Priority); c != 0 {
			return c
		}
		if c := cmp.Compare(mb.grant, ma.grant); c != 0 {
			return c
		}
		return mb.lastUse.Compare(ma.lastUse)
	})
	for _, i := range order {
		more := min(left, f.members[i].full-min(f.members[i].full, g[i]))
		g[i] += more
		left -= more
	}
	return g
}

// boolOrder sorts true before false.
func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// apply makes the grants and moves the engines to them: decreases, then
// increases. A failed move stops the rest and is returned; the engine
// that failed must be closed (engine.SetBudget), the others keep their
// grants.
func (f *Fleet) apply(ctx context.Context) error {
	f.move.Lock()
	defer f.move.Unlock()
	f.mu.Lock()
	g := f.grantsLocked()
	ms := slices.Clone(f.members)
	f.mu.Unlock()
	for _, down := range []bool{true, false} {
		for i, m := range ms {
			if down != (g[i] < m.grant) || g[i] == m.grant {
				continue
			}
			var paused []*member
			p0 := time.Now()
			if !down {
				paused = f.pauseStreaming(ms, i)
			}
			err := f.moveTo(ctx, m, g[i], len(paused), time.Since(p0))
			for _, o := range paused {
				o.eng.Unlock()
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// pauseStreaming takes the locks of the members other than ms[up] that
// stream weights (a grant below their full budget), in member order, so
// that a promotion's uploads have the link to themselves: a streaming
// model's steps read its weights over the same link, and measured on the
// H200 the two together left the promotion 1.4 GB/s of 55. The paused
// models wait one upload (about 0.12 s per 6.7 GB) instead of every step
// of theirs slowing it. No deadlock: moves are serialized by f.move, and a
// Lock caller holds one model's lock and calls no fleet method meanwhile.
func (f *Fleet) pauseStreaming(ms []*member, up int) []*member {
	f.mu.Lock()
	var ps []*member
	for j, o := range ms {
		if j != up && o.grant < o.full {
			ps = append(ps, o)
		}
	}
	f.mu.Unlock()
	for _, o := range ps {
		o.eng.Lock()
	}
	return ps
}

// moveTo moves one engine to its grant, between its steps; the other
// paused models (pauseStreaming) were waited for first, for pausing.
func (f *Fleet) moveTo(ctx context.Context, m *member, grant uint64, paused int, pausing time.Duration) error {
	w0 := time.Now().Add(-pausing)
	m.eng.Lock()
	t0 := time.Now()
	ch, err := m.m.Engine.SetBudget(ctx, grant)
	took := time.Since(t0)
	placed := m.m.Engine.Residency().Stats()
	m.eng.Unlock()
	waited := t0.Sub(w0)
	if err != nil {
		return &moveError{model: m.m.Name, err: fmt.Errorf("fleet: %s to %d bytes: %w", m.m.Name, grant, err)}
	}
	f.mu.Lock()
	m.grant, m.lastMove, m.lastTook, m.lastWait, m.placed = grant, ch, took.Seconds(), waited.Seconds(), placed
	m.promoted += ch.PromotedBytes
	f.moves.Changes++
	f.moves.PromotedBytes += ch.PromotedBytes
	f.moves.DemotedBytes += ch.DemotedBytes
	f.moves.Seconds += took.Seconds()
	f.moves.WaitSeconds += waited.Seconds()
	f.mu.Unlock()
	f.log.Info("fleet: moved", "model", m.m.Name, "grant_bytes", grant, "promoted_bytes", ch.PromotedBytes, "demoted_bytes", ch.DemotedBytes,
		"upload_s", ch.UploadSeconds, "retarget_s", ch.Seconds, "took_s", took.Seconds(), "waited_s", waited.Seconds(), "paused", paused)
	return nil
}
