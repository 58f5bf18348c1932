package engine

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/memwall/memwall/device"
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
