package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

// Host is a device the engine computes blocks on besides the main one: the
// host's cores (device/cpu with kernels.CPU()), or a second simulator in
// tests. Pool is its memory (weights, K/V, arena of the hosted blocks) and
// Pinned its host pool (the staging of step inputs).
type Host struct {
	D      device.Device
	KS     *kernels.Set
	Pool   *pool.Pool
	Pinned *pool.Pool
}

// runsHere reports whether block l runs on this engine's device.
func (e *Engine) runsHere(l int) bool {
	if e.opt.part != nil {
		return e.opt.part[l]
	}
	return e.opt.HostLayers == nil || !e.opt.HostLayers[l]
}

// kvLayers numbers the blocks that run here in order: idx[l] is block l's
// layer in this device's KV cache (-1 when it runs elsewhere), n how many
// there are (at least 1, so that a cache exists).
func kvLayers(layers int, here func(int) bool) (idx []int, n int) {
	idx = make([]int, layers)
	for l := range idx {
		idx[l] = -1
		if here(l) {
			idx[l] = n
			n++
		}
	}
	return idx, max(n, 1)
}

// crossing is the pinned buffer of the main device through which the
// residual stream goes to the host device and back.
type crossing struct {
	pool *pool.Pool
	buf  pool.Block
}

func (c *crossing) close() error {
	if c.buf.Size == 0 {
		return nil
	}
	b := c.buf
	c.buf = pool.Block{}
	return c.pool.Free(b)
}

// openHost makes the engine of the hosted blocks (Options.HostLayers) on
// Options.Host, every one of their weights resident there, with a KV
// cache of as many blocks as this one's so that a sequence's block table
// indexes both, and the pinned buffer the residual stream crosses by.
func (e *Engine) openHost(ctx context.Context) error {
	o := e.opt
	if o.HostLayers == nil || o.part != nil {
		return nil
	}
	h := o.Host
	if h == nil || h.D == nil || h.KS == nil || h.Pool == nil || h.Pinned == nil {
		return errors.New("engine: blocks are placed on the host but Options.Host lacks its device, kernels or pools")
	}
	so := o
	so.Budget = math.MaxUint64 / 4
	so.HostLayers, so.Host, so.part = nil, nil, o.HostLayers
	so.Stream, so.Profile, so.Timing, so.ReserveBytes = 0, false, false, 0
	so.Slots, so.Prefetch = 2, 0
	sub, err := New(ctx, h.D, h.KS, h.Pool, h.Pinned, e.model, so)
	if err != nil {
		return fmt.Errorf("engine: hosted blocks: %w", err)
	}
	e.sub = sub
	e.hostX.pool = e.host
	n := 4 * uint64(o.PrefillChunk) * uint64(e.cfg.Hidden)
	if e.hostX.buf, err = e.host.Alloc(n, pool.AllocOptions{Purpose: pool.Staging}); err != nil {
		return fmt.Errorf("engine: pinned buffer of %d bytes for the residual stream: %w", n, err)
	}
	return nil
}

// hostRun runs blocks [a, b), all hosted, over T tokens at positions
// start..: the residual stream goes to the host device once, the blocks
// run there one after the other, and it comes back once. The main compute
// stream is waited for before the copy out (the host reads what it
// wrote); the copy back is queued on it, behind which the next ops wait.
func (e *Engine) hostRun(c *cursor, a, b, T, start int) error {
	s := e.sub
	n := 4 * uint64(T) * uint64(e.cfg.Hidden)
	x := e.hostX.buf.Bytes()[:n]
	if err := e.d.CopyDtoH(x, e.at[bX], e.compute); err != nil {
		return fmt.Errorf("engine: residual stream to the host before block %d: %w", a, err)
	}
	if err := e.d.StreamSynchronize(e.compute); err != nil {
		return fmt.Errorf("engine: residual stream to the host before block %d: %w", a, err)
	}
	if err := s.d.CopyHtoD(s.at[bX], x, s.compute); err != nil {
		return fmt.Errorf("engine: residual stream onto the host device before block %d: %w", a, err)
	}
	s.normed = -1
	for l := a; l < b; l++ {
		if err := s.block(c, l, T, start); err != nil {
			return err
		}
	}
	if err := s.d.CopyDtoH(x, s.at[bX], s.compute); err != nil {
		return fmt.Errorf("engine: residual stream back after block %d: %w", b-1, err)
	}
	if err := s.d.StreamSynchronize(s.compute); err != nil {
		return fmt.Errorf("engine: hosted blocks %d..%d: %w", a, b-1, err)
	}
	if err := e.d.CopyHtoD(e.at[bX], x, e.compute); err != nil {
		return fmt.Errorf("engine: residual stream back after block %d: %w", b-1, err)
	}
	return nil
}

// HostWeightBytes is the weight bytes the hosted blocks' products read
// per decode step (0 without hosted blocks).
func (e *Engine) HostWeightBytes() uint64 {
	return hostedBytes(e)
}

func hostedBytes(e *Engine) uint64 {
	var n uint64
	for l, b := range e.model.Tensors.Blocks {
		if e.opt.HostLayers != nil && e.opt.HostLayers[l] {
			n += b.Q.Bytes + b.K.Bytes + b.V.Bytes + b.O.Bytes + b.Gate.Bytes + b.Up.Bytes + b.Down.Bytes
		}
	}
	return n
}

// Rates are measured bandwidths the decode placement is chosen from: the
// link's host-to-device copies and the host's products (weight bytes read
// per second) each alone, and each while the other runs (the host's memory
// feeds both: measured, they are lower). A zero rate means that path is
// not used: LinkGBps 0 hosts whatever does not fit, HostGBps 0 hosts
// nothing.
type Rates struct {
	LinkGBps     float64 `json:"link_gbps"`
	HostGBps     float64 `json:"host_gbps"`
	LinkBothGBps float64 `json:"link_both_gbps"`
	HostBothGBps float64 `json:"host_both_gbps"`
}

// Placement is PlaceHost's answer: which blocks the host computes, the
// device footprint for them, and the decode step it predicts.
type Placement struct {
	HostLayers []bool
	Footprint  *Footprint
	// StreamedBytes and HostBytes are the weight bytes a decode step
	// copies over the link and reads on the host.
	StreamedBytes, HostBytes uint64
	// DecodeSeconds is the predicted weight time of one decode step:
	// max(streamed/link, hosted/host) at the rates of both at once, or the
	// one that runs at its rate alone (resident products not counted).
	DecodeSeconds float64
}

// spread hosts n of L blocks spaced evenly over the depth (S C S C … for
// n = L/2), so that while the host computes one the link fills the next
// streamed block's slot.
func spread(L, n int) []bool {
	h := make([]bool, L)
	for l := range h {
		h[l] = (l+1)*n/L > l*n/L
	}
	return h
}

// PlaceHost chooses how many blocks the host computes, from 0 to all,
// spread evenly, under o's budget: the count whose plan fits and predicts
// the shortest decode step at rates r (ties: fewer hosted). o.HostLayers
// is ignored. The footprint is Estimate's for the chosen blocks, so New
// with Options.HostLayers set to the answer runs that plan.
func PlaceHost(ctx context.Context, m *llama.Model, o Options, info device.Info, r Rates) (*Placement, error) {
	L := m.Config.Layers
	var best *Placement
	var firstErr error
	maxHosted := L
	if r.HostGBps <= 0 {
		maxHosted = 0
	}
	for n := 0; n <= maxHosted; n++ {
		po := o
		po.HostLayers = spread(L, n)
		f, err := Estimate(ctx, m, po, info)
		if err != nil {
			if !errors.Is(err, ErrBudget) {
				return nil, err
			}
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		p := &Placement{HostLayers: po.HostLayers, Footprint: f}
		for _, g := range f.Plan.Groups {
			if !g.Resident {
				p.StreamedBytes += g.Bytes
			}
		}
		sh, err := newShell(m, po)
		if err != nil {
			return nil, err
		}
		p.HostBytes = hostedBytes(sh)
		p.DecodeSeconds = predict(p.StreamedBytes, p.HostBytes, r)
		if best == nil || p.DecodeSeconds < best.DecodeSeconds {
			best = p
		}
	}
	if best == nil {
		return nil, firstErr
	}
	if !slices.Contains(best.HostLayers, true) {
		best.HostLayers = nil
	}
	return best, nil
}

// predict is the weight time of a decode step that streams s bytes and
// reads h on the host.
func predict(s, h uint64, r Rates) float64 {
	sec := func(b uint64, gbps float64) float64 {
		if b == 0 {
			return 0
		}
		if gbps <= 0 {
			return math.Inf(1)
		}
		return float64(b) / (gbps * 1e9)
	}
	if s == 0 || h == 0 {
		return sec(s, r.LinkGBps) + sec(h, r.HostGBps)
	}
	lb, hb := r.LinkBothGBps, r.HostBothGBps
	if lb <= 0 {
		lb = r.LinkGBps
	}
	if hb <= 0 {
		hb = r.HostGBps
	}
	return max(sec(s, lb), sec(h, hb))
}
