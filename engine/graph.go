package engine

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/memwall/memwall/device"
)

// The resident decode step as a device graph (device.Grapher): captured
// once, at the first decode step it can run, and replayed per token with
// one launch. Nothing that changes per token is a kernel argument: the
// token id, the position and the block table are uploaded into the step's
// buffers by captured copies from the pinned staging buffer, which the host
// writes before each replay, and the KV write and attention read the
// position from the positions buffer (kernels.Set.KVWriteAt, AttentionAt).
// The plain step queues the same kernels' plain forms, which compute the
// same bits, so a run gives the same tokens with and without the graph.
//
// Only a step whose every weight is resident and whose every block runs on
// the engine's device is captured; streamed weights (events and waits per
// group), hosted blocks, prefill chunks, profiled steps and devices without
// the capability keep plain launches (graphWhy says why).

// graphWhy returns "" when decode steps can run as a graph, else the
// reason they run plainly.
func (e *Engine) graphWhy() string {
	g, ok := e.d.(device.Grapher)
	switch {
	case e.opt.NoGraph:
		return "turned off (Options.NoGraph)"
	case !ok || !g.CanGraph():
		return fmt.Sprintf("the %s device cannot capture graphs", e.d.Info().Backend)
	case !e.ks.StepState():
		return "the kernel module lacks the step-state kernels (" + e.ks.Source() + ")"
	case e.sub != nil:
		return "blocks run on the host"
	case len(e.plan.Streamed()) > 0:
		return fmt.Sprintf("%d weight groups stream", len(e.plan.Streamed()))
	}
	return ""
}

// GraphStatus reports whether decode steps replay a captured graph (or
// will, at the first decode step) and, when not, why.
func (e *Engine) GraphStatus() (on bool, why string) {
	return e.graphReason == "", e.graphReason
}

// decodeGraph is the captured step and what it baked in that can change:
// the attention partials' address.
type decodeGraph struct {
	exec    device.Graph
	scratch device.Ptr
}

// graphStep runs one decode step of tok at pos through the graph,
// capturing it first when there is none (or the attention scratch moved).
// ok false with a nil error: capture failed and graphReason now says why;
// the caller runs the step plainly. With timed, the replay is queued behind
// a spin kernel between two timing events and its device time stored there.
func (e *Engine) graphStep(tok int32, pos int, table []int32, timed *float64) (logits []float32, ok bool, err error) {
	g := e.d.(device.Grapher)
	if e.graph != nil && e.ks.AttentionScratch(e.compute) != e.graph.scratch {
		if err := e.dropGraph(); err != nil {
			return nil, false, err
		}
	}
	if e.graph == nil {
		if err := e.capture(g); err != nil {
			var ce *captureError
			if errors.As(err, &ce) {
				e.graphReason = "capture failed: " + ce.Error()
				e.opt.Logger.Warn("engine: decode graph not captured; plain launches", "err", ce.err)
				return nil, false, nil
			}
			return nil, false, err
		}
	}
	e.stageDecode(tok, pos, table)
	if timed != nil {
		err = e.timeReplay(g, timed)
	} else {
		err = g.LaunchGraph(e.graph.exec, e.compute)
	}
	if err != nil {
		return nil, false, fmt.Errorf("engine: launch the decode graph: %w", err)
	}
	if err := e.d.StreamSynchronize(e.compute); err != nil {
		return nil, false, fmt.Errorf("engine: decode graph: %w", err)
	}
	e.graphSteps++
	return e.readLogits(), true, nil
}

// timeReplay launches the graph behind a spin kernel (so that the host's
// launch does not show) between two timing events and stores the device
// time between them in *seconds.
func (e *Engine) timeReplay(g device.Grapher, seconds *float64) (err error) {
	var evs [2]device.Event
	defer func() {
		for _, ev := range evs {
			if ev != 0 {
				err = errors.Join(err, e.d.DestroyEvent(ev))
			}
		}
	}()
	for i := range evs {
		if evs[i], err = e.d.NewEvent(true); err != nil {
			return err
		}
	}
	if err := e.ks.Spin(profileSpin, e.compute); err != nil {
		return err
	}
	if err := e.d.EventRecord(evs[0], e.compute); err != nil {
		return err
	}
	if err := g.LaunchGraph(e.graph.exec, e.compute); err != nil {
		return err
	}
	if err := e.d.EventRecord(evs[1], e.compute); err != nil {
		return err
	}
	if err := e.d.EventSynchronize(evs[1]); err != nil {
		return err
	}
	d, err := e.d.EventElapsed(evs[0], evs[1])
	if err != nil {
		return err
	}
	*seconds = d.Seconds()
	return nil
}

// stageDecode writes the pinned staging buffer as the graph's uploads read
// it: the token id, the position and the whole block table (entries past
// the sequence's zero; the kernels read only those of its positions).
func (e *Engine) stageDecode(tok int32, pos int, table []int32) {
	st := e.staging.Bytes()
	binary.LittleEndian.PutUint32(st[0:], uint32(tok))
	binary.LittleEndian.PutUint32(st[4:], uint32(pos))
	tab := st[8 : 8+4*e.tableEntries()]
	for i := range e.tableEntries() {
		v := uint32(0)
		if i < len(table) {
			v = uint32(table[i])
		}
		binary.LittleEndian.PutUint32(tab[4*i:], v)
	}
}

// tableEntries is the block table's length at the longest sequence.
func (e *Engine) tableEntries() int {
	return (e.opt.MaxTokens + e.opt.BlockTokens - 1) / e.opt.BlockTokens
}

// captureError is a failure inside the capture: the step can still run
// plainly.
type captureError struct{ err error }

func (c *captureError) Error() string { return c.err.Error() }
func (c *captureError) Unwrap() error { return c.err }

// capture records one decode step (uploads, the pass, the logits'
// download) into e.graph. The attention scratch for the longest context is
// allocated first, outside the capture. Errors of the capture itself come
// as *captureError, after the capture has ended and the weight walk has
// finished (residency sees a whole step either way).
func (e *Engine) capture(g device.Grapher) error {
	cfg := e.cfg
	if err := e.ks.ReserveAttentionAt(e.compute, uint32(e.opt.MaxTokens), 1, uint32(cfg.Heads), e.layout); err != nil {
		return fmt.Errorf("engine: decode graph: %w", err)
	}
	if err := e.d.StreamSynchronize(e.compute); err != nil {
		return fmt.Errorf("engine: decode graph: %w", err)
	}
	if err := g.BeginCapture(e.compute); err != nil {
		return &captureError{err}
	}
	e.stepState = true
	c := &cursor{e: e}
	qerr := e.queueDecode(c)
	e.stepState = false
	if qerr != nil {
		qerr = errors.Join(qerr, c.drain())
	}
	exec, err := g.EndCapture(e.compute)
	if qerr != nil || err != nil {
		if err == nil {
			err = g.DestroyGraph(exec)
		}
		return &captureError{errors.Join(qerr, err)}
	}
	e.graph = &decodeGraph{exec: exec, scratch: e.ks.AttentionScratch(e.compute)}
	return nil
}

// queueDecode queues the uploads of a one-token step (the whole block
// table) and its pass with the step-state kernels.
func (e *Engine) queueDecode(c *cursor) error {
	st := e.staging.Bytes()
	n := e.tableEntries()
	for _, u := range []struct {
		dst device.Ptr
		src []byte
	}{{e.bufs[bIDs], st[0:4]}, {e.bufs[bPos], st[4:8]}, {e.bufs[bTable], st[8 : 8+4*n]}} {
		if err := e.d.CopyHtoD(u.dst, u.src, e.compute); err != nil {
			return fmt.Errorf("engine: upload step inputs: %w", err)
		}
	}
	e.at = e.addrs(1)
	if err := e.pass(c, nil, 1, 0, true); err != nil {
		return err
	}
	return c.drain()
}

// dropGraph destroys the captured graph (none: nothing to do).
func (e *Engine) dropGraph() error {
	if e.graph == nil {
		return nil
	}
	err := e.d.(device.Grapher).DestroyGraph(e.graph.exec)
	e.graph = nil
	if err != nil {
		return fmt.Errorf("engine: destroy the decode graph: %w", err)
	}
	return nil
}
