package engine

import (
	"fmt"
	"time"

	"github.com/memwall/memwall/device"
)

// Op classes of a decode step's profile (Result.DecodeProfile).
const (
	ClassProducts  = "products"  // the weights' matrix products, LM head included
	ClassAttention = "attention" // the KV write and attention
	ClassNorms     = "norms"     // RMSNorm
	ClassOther     = "other"     // embedding, RoPE, rounding, residual adds, SiLU·up, the Q/K permutation, uploads and the logits' download
)

// profileSpin is how long the spin kernel ahead of a profiled step keeps
// the device busy while the host queues the step, so that the step runs
// back to back on the device as if the host were infinitely fast.
const profileSpin = 30 * time.Millisecond

// profiler times one step on the device: with classes, an event at every
// change of op class (mark), else only at its start and end.
type profiler struct {
	classes bool
	events  []device.Event
	class   []string // class[i] runs from events[i] to events[i+1]
	cur     string
	// began is when the spin was queued, queued when the step's last
	// event was (host clock).
	began, queued time.Time
}

// startProfile queues a spin kernel and the step's first event on the
// compute stream.
func (e *Engine) startProfile(classes bool) error {
	began := time.Now()
	if err := e.ks.Spin(profileSpin, e.compute); err != nil {
		return fmt.Errorf("engine: profile: %w", err)
	}
	e.prof = &profiler{classes: classes, began: began}
	return e.record(ClassOther)
}

// record queues an event starting a segment of class on the compute stream.
func (e *Engine) record(class string) error {
	p := e.prof
	ev, err := e.d.NewEvent(true)
	if err != nil {
		return fmt.Errorf("engine: profile event: %w", err)
	}
	p.events = append(p.events, ev)
	if err := e.d.EventRecord(ev, e.compute); err != nil {
		return fmt.Errorf("engine: profile event: %w", err)
	}
	p.class = append(p.class, class)
	p.cur = class
	return nil
}

// mark says that the ops queued from now on are of class; in a profiled
// step with classes it records an event where the class changes.
func (e *Engine) mark(class string) error {
	if e.prof == nil || !e.prof.classes || e.prof.cur == class {
		return nil
	}
	return e.record(class)
}

// endProfile queues the profiled step's last event (step calls it
// before it waits for the stream).
func (e *Engine) endProfile() error {
	if e.prof == nil {
		return nil
	}
	err := e.record("")
	e.prof.queued = time.Now()
	return err
}

// finishProfile waits for the profiled step's last event and returns the
// device seconds per class (ClassOther alone without classes) and in all,
// from the first event to the last. It frees the events.
func (e *Engine) finishProfile() (map[string]float64, float64, error) {
	p := e.prof
	e.prof = nil
	defer func() {
		for _, ev := range p.events {
			e.d.DestroyEvent(ev)
		}
	}()
	n := len(p.events)
	if n < 2 || p.class[n-1] != "" {
		return nil, 0, fmt.Errorf("engine: profile: the step did not end")
	}
	if err := e.d.EventSynchronize(p.events[n-1]); err != nil {
		return nil, 0, fmt.Errorf("engine: profile: %w", err)
	}
	out := map[string]float64{}
	for i, c := range p.class[:n-1] {
		d, err := e.d.EventElapsed(p.events[i], p.events[i+1])
		if err != nil {
			return nil, 0, fmt.Errorf("engine: profile: %w", err)
		}
		out[c] += d.Seconds()
	}
	all, err := e.d.EventElapsed(p.events[0], p.events[n-1])
	if err != nil {
		return nil, 0, fmt.Errorf("engine: profile: %w", err)
	}
	return out, all.Seconds(), nil
}

// productWeightBytes is the weight bytes a decode step's matrix products
// read: every block's seven matrices and the LM head.
func (e *Engine) productWeightBytes() uint64 {
	n := e.model.Tensors.LMHead.Bytes // the embedding when tied
	for _, b := range e.model.Tensors.Blocks {
		n += b.Q.Bytes + b.K.Bytes + b.V.Bytes + b.O.Bytes + b.Gate.Bytes + b.Up.Bytes + b.Down.Bytes
	}
	return n
}
