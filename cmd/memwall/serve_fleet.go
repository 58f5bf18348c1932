package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/fleet"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
	"github.com/memwall/memwall/serve"
	"github.com/memwall/memwall/telemetry"
	"github.com/memwall/memwall/tokenizer"
)

// fleetChunk is the prefill chunk (the most tokens a step holds) of a
// model sharing the budget when --prefill-chunk is not given: the
// automatic rule chooses from a fixed budget, and a shared one moves.
const fleetChunk = 512

// servedModel is one model of a shared-budget serve.
type servedModel struct {
	name      string
	path      string
	m         *llama.Model
	tok       *tokenizer.Tokenizer
	o         engine.Options
	ks        *kernels.Set
	st        device.Stream
	ksDone    func()
	dev, host *pool.Pool
	e         *engine.Engine
	b         *engine.Batch
	s         *serve.Server
	chat      string

	// For unloading and loading again (serve.Unloader).
	d       device.Device
	fl      *fleet.Fleet
	maxSeqs int
	// priority, keepAlive and unloadAfter are its fleetSpec's.
	priority               float64
	keepAlive, unloadAfter time.Duration
	loads                  *sync.Mutex // one load at a time: MakeRoom holds room for one
	log                    *slog.Logger
}

// serveFleetJSON is what `memwall serve --json` prints once it listens
// with models sharing the budget.
type serveFleetJSON struct {
	URL         string `json:"url"`
	Device      string `json:"device"`
	BudgetBytes uint64 `json:"budget_bytes"`
	PoolBytes   uint64 `json:"pool_budget_bytes"`
	FollowFree  bool   `json:"follow_free"`
	// UnloadAfterSeconds is --unload-after (0: never).
	UnloadAfterSeconds float64            `json:"unload_after_seconds"`
	Models             []serveJSON        `json:"models"`
	Shares             []fleet.ModelStats `json:"shares"`
}

// serveFleet serves several models (or one with --follow-free) sharing
// one budget through package fleet: each at its minimum first, then moved
// to its share; requests pick a model by name; /admin/budget reads and
// changes the budget.
func serveFleet(e *env, f *serveFlags, specs []fleetSpec, vram uint64, source residency.Source) (err error) {
	var ms []*servedModel
	so := runSimOptions()
	d, ch, err := e.open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		return err
	}
	defer d.Close()
	defer func() {
		for i := len(ms) - 1; i >= 0; i-- {
			err = errors.Join(err, ms[i].close())
		}
	}()
	for _, sp := range specs {
		sm := &servedModel{name: sp.name, path: sp.path, priority: sp.priority, keepAlive: sp.keepAlive, unloadAfter: sp.unloadAfter}
		ms = append(ms, sm)
		if err := sm.open(e, d, f, source); err != nil {
			return err
		}
	}
	b, err := residency.PlanBudget(d, vram)
	if err != nil {
		return err
	}
	if b.Warning != "" && !f.asJSON {
		fmt.Fprintf(e.stderr, "memwall serve: warning: %s\n", b.Warning)
	}
	fl := fleet.New(b.PoolBytes, fleet.Options{Logger: e.logger()})
	ctl := &fleetBudget{fl: fl, overhead: b.VRAMBytes - b.PoolBytes, vram: b.VRAMBytes, ceiling: b.VRAMBytes}
	var first *serve.Server // whose metrics registry the others share
	var loads sync.Mutex
	for _, sm := range ms {
		sm.d, sm.fl, sm.maxSeqs, sm.loads, sm.log = d, fl, f.maxSeqs, &loads, e.logger()
		if err := sm.load(e, d, f, fl, ctl, first); err != nil {
			return err
		}
		if first == nil {
			first = sm.s
		}
	}
	servers := make([]*serve.Server, len(ms))
	for i, sm := range ms {
		servers[i] = sm.s
	}
	g, err := serve.NewGroup(servers, serve.GroupOptions{APIKey: f.apiKey, Budget: ctl})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	out := serveFleetJSON{URL: "http://" + ln.Addr().String(), Device: ch.Backend + ": " + d.Info().Name, BudgetBytes: b.VRAMBytes,
		PoolBytes: b.PoolBytes, FollowFree: f.followFree, UnloadAfterSeconds: f.unloadAfter.Seconds()}
	out.Shares, _ = fl.Stats()
	for i, sm := range ms {
		kv := sm.b.Cache().Config()
		sh := out.Shares[i]
		out.Models = append(out.Models, serveJSON{URL: out.URL, Model: sm.path, ModelName: sm.name, Device: out.Device, BudgetBytes: sh.Grant,
			MaxSeqs: f.maxSeqs, MaxModelLen: sm.o.MaxTokens, StepTokens: sm.b.MaxTokens(), KVBlocks: kv.Blocks, KVBlockBytes: sm.b.Cache().BlockBytes(),
			ResidentBytes: sh.ResidentBytes, StreamedBytes: sh.StreamedBytes, ChatTemplate: sm.chat,
			Priority: sm.priority, KeepAliveSeconds: ptr(keepAliveSeconds(sm.keepAlive)), UnloadAfterSeconds: ptr(sm.unloadAfter.Seconds())})
	}
	if f.asJSON {
		if err := writeJSON(e.stdout, out); err != nil {
			ln.Close()
			return err
		}
	} else {
		printServeFleet(e, out)
	}
	if f.followFree {
		stop := ctl.follow(e, d, ms)
		defer stop()
	}
	// Keep-alives run out between the requests' moves: a model idle past
	// its own gives its share back (to the device, or to the others).
	rctx, stopRebalance := context.WithCancel(context.Background())
	var rwg sync.WaitGroup
	rwg.Go(func() { fl.RebalanceEvery(rctx, time.Second) })
	defer func() { stopRebalance(); rwg.Wait() }()
	return serveUntilDone(e, servers, g.Handler(), ln, time.Duration(f.drainS)*time.Second)
}

// fleetNames names the models: --model-name's comma-separated names, one
// per MODEL, or their base names (nameDefaults: with their position added
// to names that repeat).
func fleetNames(given string, paths []string) ([]string, error) {
	if given == "" {
		specs := make([]fleetSpec, len(paths))
		for i, p := range paths {
			specs[i].path = p
		}
		nameDefaults(specs, map[string]int{})
		names := make([]string, len(specs))
		for i, s := range specs {
			names[i] = s.name
		}
		return names, nil
	}
	names := strings.Split(given, ",")
	if len(names) != len(paths) {
		return nil, usagef("--model-name %q: %d names for %d models (give one per MODEL, comma-separated)", given, len(names), len(paths))
	}
	seen := map[string]bool{}
	for i, n := range names {
		switch {
		case strings.TrimSpace(n) == "":
			return nil, usagef("--model-name %q: name %d is empty", given, i+1)
		case seen[n]:
			return nil, usagef("--model-name %q: %q names two models", given, n)
		}
		seen[n] = true
	}
	return names, nil
}

// open reads the model and its tokenizer, plans its options, loads its
// kernels on a stream of its own, times its embedding gather
// (measureGather) and warms its products up (before the
// budget is measured, so that their workspace counts).
func (sm *servedModel) open(e *env, d device.Device, f *serveFlags, source residency.Source) error {
	m, codec, err := openRunModel(e, sm.path)
	if err != nil {
		return err
	}
	sm.m = m
	sm.tok, _ = codec.(*tokenizer.Tokenizer)
	if sm.o, err = serveOptions(f, m, source); err != nil {
		return err
	}
	if sm.o.PrefillChunk == 0 {
		sm.o.PrefillChunk = min(sm.o.PromptTokens, fleetChunk)
	}
	sm.o.Live = true
	sm.o.ReserveBytes = engine.BatchBytes(m.Config, sm.o, f.maxSeqs)
	if sm.ks, sm.st, sm.ksDone, err = llamaKernels(e, d); err != nil {
		return err
	}
	sm.o.Stream = sm.st
	if err := measureGather(d, sm.ks, m, &sm.o); err != nil {
		return err
	}
	return engine.WarmProducts(d, sm.ks, m, sm.st, []int{sm.o.PrefillChunk, 1})
}

// load makes room for the model's minimum in the fleet, loads its engine
// and batch there on pools of its own, adds it and makes its server.
func (sm *servedModel) load(e *env, d device.Device, f *serveFlags, fl *fleet.Fleet, ctl *fleetBudget, first *serve.Server) error {
	var err error
	if sm.dev, sm.host, sm.e, err = loadLive(e, d, sm.ks, fl, sm.m, sm.o, "serve "+sm.name); err != nil {
		return err
	}
	if sm.b, err = sm.e.NewBatch(f.maxSeqs); err != nil {
		return fmt.Errorf("%s: %w: lower --max-seqs or raise --prefill-chunk (or --vram)", sm.path, err)
	}
	if err := fl.Add(e.ctx, sm.member(sm.e)); err != nil {
		return err
	}
	chat, chatFrom := serveChat(e, sm.m, sm.tok)
	sm.chat = chatFrom
	name := sm.name
	so := serve.Options{ModelName: name, MaxSeqs: f.maxSeqs, MaxQueue: f.maxQueue, APIKey: f.apiKey, Tokenizer: sm.tok,
		Chat: chat, IsEOS: sm.m.Config.IsEOS, Pools: []telemetry.PoolSource{sm.dev, sm.host}, Sharing: fl,
		MemoryNow: func() serve.Memory { return ctl.memory(name) }}
	if sm.unloadAfter > 0 {
		so.Unloader, so.UnloadAfter, so.Logger = sm, sm.unloadAfter, sm.log
	}
	if first != nil {
		so.Registry = first.Registry()
	}
	sm.s, err = serve.New(sm.b, so)
	return err
}

// member is the model with engine eng as the fleet holds it.
func (sm *servedModel) member(eng *engine.Engine) fleet.Model {
	return fleet.Model{Name: sm.name, Engine: eng, Priority: sm.priority, KeepAlive: sm.keepAlive}
}

// Unload is serve.Unloader's: the model leaves the fleet (its share goes
// to the others) once its batch and engine are closed and its pools hold
// nothing; its kernels and file stay open for the next Load.
func (sm *servedModel) Unload(ctx context.Context, b *engine.Batch) error {
	return sm.fl.Remove(ctx, sm.name, func() error {
		err := errors.Join(b.Close(), sm.e.Close())
		sm.b, sm.e = nil, nil
		sm.dev.Trim()
		sm.host.Trim()
		if r := sm.dev.ReservedBytes(); r != 0 && err == nil {
			err = fmt.Errorf("%s: its device pool still reserves %s after its engine closed", sm.name, humanBytes(r))
		}
		return err
	})
}

// Load is serve.Unloader's: room for the model's minimum, its engine there
// on its own pools again, its batch, and its place in the fleet. On error
// nothing is left held and the room is given back.
func (sm *servedModel) Load(ctx context.Context) (_ *engine.Batch, err error) {
	sm.loads.Lock()
	defer sm.loads.Unlock()
	least, err := liveRoom(ctx, sm.d, sm.fl, sm.m, sm.o, sm.name)
	if err != nil {
		return nil, err
	}
	var eng *engine.Engine
	var b *engine.Batch
	defer func() {
		if err == nil {
			return
		}
		if b != nil {
			b.Close()
		}
		if eng != nil {
			eng.Close()
		}
		sm.dev.Trim()
		sm.host.Trim()
		sm.fl.MakeRoom(context.Background(), 0)
	}()
	if err := sm.dev.SetLimit(least); err != nil {
		return nil, err
	}
	o := sm.o
	o.Budget = least
	if eng, err = engine.New(ctx, sm.d, sm.ks, sm.dev, sm.host, sm.m, o); err != nil {
		return nil, fmt.Errorf("%s: %w", sm.name, err)
	}
	if b, err = eng.NewBatch(sm.maxSeqs); err != nil {
		return nil, fmt.Errorf("%s: %w", sm.name, err)
	}
	if err := sm.fl.Add(ctx, sm.member(eng)); err != nil {
		return nil, err
	}
	sm.e, sm.b = eng, b
	return b, nil
}

func (sm *servedModel) close() error {
	var errs []error
	if sm.b != nil {
		errs = append(errs, sm.b.Close())
	}
	if sm.e != nil {
		errs = append(errs, sm.e.Close())
	}
	if sm.dev != nil {
		errs = append(errs, sm.dev.Close())
	}
	if sm.host != nil {
		errs = append(errs, sm.host.Close())
	}
	if sm.ksDone != nil {
		sm.ksDone()
	}
	if sm.m != nil {
		errs = append(errs, sm.m.Close())
	}
	return errors.Join(errs...)
}

// fleetBudget is serve's /admin/budget over the fleet: budgets in the
// process's device bytes (--vram's terms), the pools' share being that
// less the context's and loaded modules' overhead measured at start.
type fleetBudget struct {
	fl       *fleet.Fleet
	overhead uint64

	mu      sync.Mutex
	vram    uint64 // the budget now
	ceiling uint64 // the most --follow-free returns to: --vram, or the latest POST
}

// budgetJSON is GET /admin/budget's answer and POST's.
type budgetJSON struct {
	VRAMBytes    uint64             `json:"vram_bytes"`
	PoolBytes    uint64             `json:"pool_budget_bytes"`
	OverheadByte uint64             `json:"overhead_bytes"`
	Moves        fleet.Moves        `json:"moves"`
	Models       []fleet.ModelStats `json:"models"`
}

func (c *fleetBudget) Budget() any {
	c.mu.Lock()
	v := c.vram
	c.mu.Unlock()
	st, mv := c.fl.Stats()
	return budgetJSON{VRAMBytes: v, PoolBytes: c.fl.Budget(), OverheadByte: c.overhead, Moves: mv, Models: st}
}

// SetBudget is POST /admin/budget: it also becomes --follow-free's
// ceiling.
func (c *fleetBudget) SetBudget(ctx context.Context, vram uint64) (any, error) {
	if err := c.set(ctx, vram); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.ceiling = vram
	c.mu.Unlock()
	return c.Budget(), nil
}

func (c *fleetBudget) set(ctx context.Context, vram uint64) error {
	if vram <= c.overhead {
		return fmt.Errorf("%w: %s does not cover the context and loaded modules (%s)", serve.ErrBudgetRefused, humanBytes(vram), humanBytes(c.overhead))
	}
	err := c.fl.SetBudget(ctx, vram-c.overhead)
	var be *fleet.BudgetError
	if errors.As(err, &be) {
		return fmt.Errorf("%w: %s is below the models' minimum %s (%v)", serve.ErrBudgetRefused, humanBytes(vram), humanBytes(be.Minimum+c.overhead), err)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.vram = vram
	c.mu.Unlock()
	return nil
}

func (c *fleetBudget) memory(name string) serve.Memory {
	c.mu.Lock()
	v := c.vram
	c.mu.Unlock()
	st, _ := c.fl.Stats()
	for _, s := range st {
		if s.Name == name {
			return serve.Memory{BudgetBytes: v, GrantBytes: s.Grant, ResidentBytes: s.ResidentBytes, StreamedBytes: s.StreamedBytes}
		}
	}
	return serve.Memory{BudgetBytes: v}
}

// follow moves the budget after the device's free memory until stop
// (fleet.FollowFree), never above the ceiling; a budget below the models'
// minimums is logged once per spell and the budget left where it is.
func (c *fleetBudget) follow(e *env, d device.Device, ms []*servedModel) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var pools []*pool.Pool
	for _, sm := range ms {
		pools = append(pools, sm.dev)
	}
	warned := false
	o := fleet.Follow{Device: d, Pools: pools, Overhead: c.overhead, Margin: residency.Margin,
		Ceiling: func() uint64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.ceiling - min(c.ceiling, c.overhead)
		},
		OnMove: func(from, to uint64, err error) {
			if err != nil {
				if !warned {
					e.logger().Warn("memwall serve: --follow-free: the models' minimums do not fit the device's free memory", "target_bytes", to+c.overhead, "err", err)
					warned = true
				}
				return
			}
			warned = false
			c.mu.Lock()
			c.vram = to + c.overhead
			c.mu.Unlock()
			e.logger().Info("memwall serve: --follow-free moved the budget", "from_bytes", from+c.overhead, "to_bytes", to+c.overhead)
		}}
	var wg sync.WaitGroup
	wg.Go(func() { c.fl.FollowFree(ctx, o) })
	return func() {
		cancel()
		wg.Wait()
	}
}

func printServeFleet(e *env, o serveFleetJSON) {
	w := e.stdout
	follow := ""
	if o.FollowFree {
		follow = ", following the device's free memory"
	}
	fmt.Fprintf(w, "memwall serve: %d models on %s sharing %s (pools %s)%s\n", len(o.Models), o.Device, humanBytes(o.BudgetBytes), humanBytes(o.PoolBytes), follow)
	for i, m := range o.Models {
		sh := o.Shares[i]
		fmt.Fprintf(w, "  %s (%s): share %s (minimum %s, whole %s); weights %s resident, %s streamed per step; %d sequences, %d-token steps; chat template: %s\n",
			m.ModelName, m.Model, humanBytes(sh.Grant), humanBytes(sh.Minimum), humanBytes(sh.Full), humanBytes(sh.ResidentBytes), humanBytes(sh.StreamedBytes),
			m.MaxSeqs, m.StepTokens, m.ChatTemplate)
		fmt.Fprintf(w, "    priority %g; idle, keeps more than its minimum %s; %s\n", m.Priority, keepAliveText(*m.KeepAliveSeconds), unloadText(*m.UnloadAfterSeconds))
	}
	fmt.Fprintf(w, "listening on %s (GET/POST /admin/budget)\n", o.URL)
}

func ptr[T any](v T) *T { return &v }

// keepAliveSeconds is fleet.Model.KeepAlive in seconds (-1: forever, 0:
// none).
func keepAliveSeconds(k time.Duration) float64 {
	switch {
	case k < 0:
		return -1
	case k <= time.Nanosecond:
		return 0
	}
	return k.Seconds()
}

func keepAliveText(s float64) string {
	switch s {
	case -1:
		return "forever"
	case 0:
		return "not at all"
	}
	return "for " + (time.Duration(s) * time.Second).String()
}

func unloadText(s float64) string {
	if s == 0 {
		return "never unloaded"
	}
	return "unloaded after " + (time.Duration(s) * time.Second).String() + " without a request, loaded again by the next"
}

// logger is the process's structured logger on stderr.
func (e *env) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
