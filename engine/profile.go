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

// profiler times one step on the device: with classes, an event before
// every op (mark), else only at its start and end.
type profiler struct {
	classes bool
	events  []device.Event
	seg     []segment // seg[i] runs from events[i] to events[i+1]
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
	return e.record(ClassOther, "upload")
}

// segment is the op class and op name of a profiled segment.
type segment struct {
	class, op string
	bytes     uint64 // weight bytes its products read
}

// ProfileOp is the device time of one kind of op in a profiled decode step,
// how many of them ran and, for products, the weight bytes they read.
type ProfileOp struct {
	Class       string  `json:"class"` // ClassProducts, ClassAttention, ClassNorms or ClassOther
	Seconds     float64 `json:"seconds"`
	Count       int     `json:"count"`
	WeightBytes uint64  `json:"weight_bytes,omitempty"`
}

// record queues an event starting a segment of op (of class) on the
// compute stream.
func (e *Engine) record(class, op string) error {
	p := e.prof
	ev, err := e.d.NewEvent(true)
	if err != nil {
		return fmt.Errorf("engine: profile event: %w", err)
	}
	p.events = append(p.events, ev)
	if err := e.d.EventRecord(ev, e.compute); err != nil {
		return fmt.Errorf("engine: profile event: %w", err)
	}
	p.seg = append(p.seg, segment{class: class, op: op})
	return nil
}

// mark says that op (of class) is queued next; in a profiled step with
// classes it records an event before it.
func (e *Engine) mark(class, op string) error {
	if e.prof == nil || !e.prof.classes {
		return nil
	}
	return e.record(class, op)
}

// readsWeights adds n weight bytes to the op being profiled (a product).
func (e *Engine) readsWeights(n uint64) {
	if e.prof != nil && len(e.prof.seg) > 0 {
		e.prof.seg[len(e.prof.seg)-1].bytes += n
	}
}

// endProfile queues the profiled step's last event (step calls it
// before it waits for the stream).
func (e *Engine) endProfile() error {
	if e.prof == nil {
		return nil
	}
	err := e.record("", "")
	e.prof.queued = time.Now()
	return err
}

// stepProfile is what finishProfile measured of one step.
type stepProfile struct {
	classes map[string]float64   // device seconds per class (ClassOther alone without classes)
	ops     map[string]ProfileOp // per op name (with classes)
	all     float64              // from the first event to the last
	// segments is the number of timed segments (events less one).
	segments int
}

// finishProfile waits for the profiled step's last event and returns its
// times. It frees the events.
func (e *Engine) finishProfile() (stepProfile, error) {
	p := e.prof
	e.prof = nil
	defer func() {
		for _, ev := range p.events {
			e.d.DestroyEvent(ev)
		}
	}()
	n := len(p.events)
	if n < 2 || p.seg[n-1].class != "" {
		return stepProfile{}, fmt.Errorf("engine: profile: the step did not end")
	}
	if err := e.d.EventSynchronize(p.events[n-1]); err != nil {
		return stepProfile{}, fmt.Errorf("engine: profile: %w", err)
	}
	out := stepProfile{classes: map[string]float64{}, segments: n - 1}
	if p.classes {
		out.ops = map[string]ProfileOp{}
	}
	for i, sg := range p.seg[:n-1] {
		d, err := e.d.EventElapsed(p.events[i], p.events[i+1])
		if err != nil {
			return stepProfile{}, fmt.Errorf("engine: profile: %w", err)
		}
		out.classes[sg.class] += d.Seconds()
		if out.ops != nil {
			o := out.ops[sg.op]
			o.Class = sg.class
			o.Seconds += d.Seconds()
			o.Count++
			o.WeightBytes += sg.bytes
			out.ops[sg.op] = o
		}
	}
	all, err := e.d.EventElapsed(p.events[0], p.events[n-1])
	if err != nil {
		return stepProfile{}, fmt.Errorf("engine: profile: %w", err)
	}
	out.all = all.Seconds()
	return out, nil
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
