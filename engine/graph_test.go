package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/internal/longtest"
)

// recorder gives a device without graphs (the simulator) device.Grapher's
// contract: work queued on a capturing stream is recorded and replayed by
// LaunchGraph, reading the host buffers of copies as they are at replay;
// what the contract forbids during a capture (synchronizing, allocating,
// freeing, events on the capturing stream) fails the capture. The engine's
// graph path is tested on it as on CUDA.
type recorder struct {
	device.Device
	mu        sync.Mutex
	capturing map[device.Stream]*capture
	graphs    map[device.Graph][]func(device.Stream) error
	next      device.Graph
	launches  int // LaunchGraph calls
	captures  int // EndCapture calls that made a graph
}

type capture struct {
	ops  []func(device.Stream) error
	fail error
}

func newRecorder(d device.Device) *recorder {
	return &recorder{Device: d, capturing: map[device.Stream]*capture{}, graphs: map[device.Graph][]func(device.Stream) error{}}
}

func (r *recorder) CanGraph() bool { return true }

func (r *recorder) BeginCapture(s device.Stream) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.capturing[s] != nil {
		return fmt.Errorf("recorder: stream %d already captures: %w", s, device.ErrInvalid)
	}
	r.capturing[s] = &capture{}
	return nil
}

func (r *recorder) EndCapture(s device.Stream) (device.Graph, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.capturing[s]
	if c == nil {
		return 0, fmt.Errorf("recorder: stream %d does not capture: %w", s, device.ErrInvalid)
	}
	delete(r.capturing, s)
	if c.fail != nil {
		return 0, c.fail
	}
	r.next++
	r.graphs[r.next] = c.ops
	r.captures++
	return r.next, nil
}

func (r *recorder) LaunchGraph(g device.Graph, s device.Stream) error {
	r.mu.Lock()
	ops, ok := r.graphs[g]
	r.launches++
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("recorder: graph %d: %w", g, device.ErrInvalid)
	}
	for _, op := range ops {
		if err := op(s); err != nil {
			return err
		}
	}
	return nil
}

func (r *recorder) DestroyGraph(g device.Graph) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.graphs[g]; !ok {
		return fmt.Errorf("recorder: graph %d: %w", g, device.ErrInvalid)
	}
	delete(r.graphs, g)
	return nil
}

// record appends op when s captures (and reports true).
func (r *recorder) record(s device.Stream, op func(device.Stream) error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.capturing[s]
	if c == nil {
		return false
	}
	c.ops = append(c.ops, op)
	return true
}

// forbid fails every capture when what is called during one (on stream s,
// or on any stream when s is 0), and returns the error to give the caller.
func (r *recorder) forbid(s device.Stream, what string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	for cs, c := range r.capturing {
		if s == 0 || s == cs {
			err = fmt.Errorf("recorder: %s during a capture: %w", what, device.ErrInvalid)
			c.fail = errors.Join(c.fail, err)
		}
	}
	return err
}

func (r *recorder) Launch(f device.Function, grid, block device.Dim3, shared uint32, s device.Stream, args ...any) error {
	args = slices.Clone(args)
	op := func(s device.Stream) error { return r.Device.Launch(f, grid, block, shared, s, args...) }
	if r.record(s, op) {
		return nil
	}
	return op(s)
}

func (r *recorder) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	op := func(s device.Stream) error { return r.Device.CopyHtoD(dst, src, s) }
	if r.record(s, op) {
		return nil
	}
	return op(s)
}

func (r *recorder) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	op := func(s device.Stream) error { return r.Device.CopyDtoH(dst, src, s) }
	if r.record(s, op) {
		return nil
	}
	return op(s)
}

func (r *recorder) CopyDtoD(dst, src device.Ptr, n uint64, s device.Stream) error {
	op := func(s device.Stream) error { return r.Device.CopyDtoD(dst, src, n, s) }
	if r.record(s, op) {
		return nil
	}
	return op(s)
}

func (r *recorder) Memset8(dst device.Ptr, v byte, n uint64, s device.Stream) error {
	op := func(s device.Stream) error { return r.Device.Memset8(dst, v, n, s) }
	if r.record(s, op) {
		return nil
	}
	return op(s)
}

func (r *recorder) Memset32(dst device.Ptr, v uint32, n uint64, s device.Stream) error {
	op := func(s device.Stream) error { return r.Device.Memset32(dst, v, n, s) }
	if r.record(s, op) {
		return nil
	}
	return op(s)
}

func (r *recorder) EventRecord(e device.Event, s device.Stream) error {
	if err := r.forbid(s, "EventRecord"); err != nil {
		return err
	}
	return r.Device.EventRecord(e, s)
}

func (r *recorder) StreamWaitEvent(s device.Stream, e device.Event) error {
	if err := r.forbid(s, "StreamWaitEvent"); err != nil {
		return err
	}
	return r.Device.StreamWaitEvent(s, e)
}

func (r *recorder) StreamSynchronize(s device.Stream) error {
	if err := r.forbid(s, "StreamSynchronize"); err != nil {
		return err
	}
	return r.Device.StreamSynchronize(s)
}

func (r *recorder) Synchronize() error {
	if err := r.forbid(0, "Synchronize"); err != nil {
		return err
	}
	return r.Device.Synchronize()
}

func (r *recorder) Alloc(n uint64) (device.Ptr, error) {
	if err := r.forbid(0, "Alloc"); err != nil {
		return 0, err
	}
	return r.Device.Alloc(n)
}

func (r *recorder) Free(p device.Ptr) error {
	if err := r.forbid(0, "Free"); err != nil {
		return err
	}
	return r.Device.Free(p)
}

// graphDevice is the device the graph tests run on: CUDA on the GPU
// machine, else the simulator behind a recorder.
func graphDevice(t *testing.T) (device.Device, *recorder) {
	d := testDevice(t)
	if onGPU() {
		return d, nil
	}
	rec := newRecorder(d)
	return rec, rec
}

// TestDecodeGraphBitIdentical: a resident decode replayed as a graph gives
// the tokens and logits of plain launches, bit for bit, for both formats,
// both model dtypes, greedy and sampled, over contexts that cross KV
// blocks (and, with long ones, attention splits); the graph is captured
// once per engine and replayed for every later decode step.
func TestDecodeGraphBitIdentical(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	ctx := context.Background()
	type mode struct {
		name            string
		promptLen, news int
		sampling        engine.Sampling
		blockTokens     int
	}
	modes := []mode{
		{"greedy", 5, longtest.Choose(12, 40), engine.Sampling{}, 0},
		{"sampled, 3-token blocks", longtest.Choose(20, 130), longtest.Choose(10, 30), engine.Sampling{Temperature: 0.8, TopK: 20, Seed: 3}, 3},
	}
	for pi, preset := range []string{"tiny", "tiny-f16"} {
		for fi, f := range []string{synth.Safetensors, synth.GGUF} {
			for mi, md := range modes {
				if !longtest.Enabled() && !onGPU() && (pi+fi+mi)%2 == 1 {
					continue // each mode on half the models; -long: all
				}
				t.Run(preset+"/"+f+"/"+md.name, func(t *testing.T) {
					m := open(t, modelPath(t, preset, f))
					var runs [2]*engine.Result
					for i, noGraph := range []bool{true, false} {
						d, rec := graphDevice(t)
						r := newRig(t, d)
						if !r.ks.StepState() {
							t.Skipf("%s has no step-state kernels: set MEMWALL_KERNELS_PTX to PTX built from this kernels.cu", r.ks.Source())
						}
						o := engine.Options{Budget: 256 << 20, MaxTokens: 200, PrefillChunk: 16, BlockTokens: md.blockTokens, NoGraph: noGraph}
						e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
						if err != nil {
							t.Fatal(err)
						}
						on, why := e.GraphStatus()
						if on == noGraph {
							t.Fatalf("NoGraph %v: graph status %v (%s)", noGraph, on, why)
						}
						s := md.sampling
						s.MaxNew, s.IgnoreEOS, s.KeepLogits = md.news, true, true
						p := prompt(md.promptLen, m.Config.Vocab, 11)
						for range 2 { // the second Generate replays the graph the first captured
							if runs[i], err = e.Generate(ctx, p, s, nil); err != nil {
								t.Fatal(err)
							}
						}
						if want := md.news - 1; runs[i].DecodeGraphSteps != map[bool]int{true: 0, false: want}[noGraph] {
							t.Errorf("NoGraph %v: %d decode steps replayed, want %d", noGraph, runs[i].DecodeGraphSteps, map[bool]int{true: 0, false: want}[noGraph])
						}
						if err := e.Close(); err != nil {
							t.Fatal(err)
						}
						r.zero(t)
						if rec != nil && !noGraph && (rec.captures != 1 || rec.launches != 2*(md.news-1)) {
							t.Errorf("%d captures and %d replays, want 1 and %d", rec.captures, rec.launches, 2*(md.news-1))
						}
					}
					a, b := runs[0], runs[1]
					if !slices.Equal(a.Tokens, b.Tokens) {
						t.Fatalf("plain %v, graph %v", a.Tokens, b.Tokens)
					}
					for s := range a.Logits {
						if !slices.Equal(a.Logits[s], b.Logits[s]) {
							t.Fatalf("step %d: the graph's logits differ from plain launches", s)
						}
					}
				})
			}
		}
	}
}

// TestDecodeGraphFallback: where the step cannot be captured the engine
// says why and runs plain launches: streamed weights, a capture that the
// device refuses (here: the recorder failing every capture as if a call
// inside it were forbidden), a device without graphs; profiled steps run
// plainly between replays, one replay timed.
func TestDecodeGraphFallback(t *testing.T) {
	if onGPU() {
		t.Skip("the recorder stands in for the GPU's graphs on the simulator")
	}
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	p := prompt(6, m.Config.Vocab, 5)
	gen := func(t *testing.T, d device.Device, o engine.Options) (*engine.Result, string) {
		t.Helper()
		r := newRig(t, d)
		o.MaxTokens, o.PrefillChunk = 96, 16
		if o.Budget == 0 {
			o.Budget = 256 << 20
		}
		e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			r.zero(t)
		}()
		res, err := e.Generate(ctx, p, engine.Sampling{MaxNew: 6, IgnoreEOS: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, why := e.GraphStatus()
		return res, why
	}
	plain, _ := gen(t, newRecorder(testDevice(t)), engine.Options{NoGraph: true})
	t.Run("streamed", func(t *testing.T) {
		rec := newRecorder(testDevice(t))
		r := newRig(t, rec)
		res, why := gen(t, rec, engine.Options{Budget: smallBudget(t, r, m, false)})
		if res.DecodeGraphSteps != 0 || rec.captures != 0 || why == "" {
			t.Errorf("streaming: %d graph steps, %d captures, reason %q", res.DecodeGraphSteps, rec.captures, why)
		}
	})
	t.Run("capture refused", func(t *testing.T) {
		rec := &refusing{newRecorder(testDevice(t))}
		res, why := gen(t, rec, engine.Options{})
		if res.DecodeGraphSteps != 0 || why == "" {
			t.Errorf("refused capture: %d graph steps, reason %q", res.DecodeGraphSteps, why)
		}
		if !slices.Equal(res.Tokens, plain.Tokens) {
			t.Errorf("after a refused capture: %v, plain %v", res.Tokens, plain.Tokens)
		}
	})
	t.Run("profile", func(t *testing.T) {
		// Steps 1 and 2 are profiled plain, step 3 is a timed replay.
		res, why := gen(t, newRecorder(testDevice(t)), engine.Options{Profile: true})
		if why != "" || res.DecodeGraphSteps != 3 || !(res.DecodeGraphStepDeviceSeconds > 0) || !(res.DecodeStepDeviceSeconds > 0) {
			t.Errorf("profiled: reason %q, %d graph steps, graph step %g s, plain step %g s", why, res.DecodeGraphSteps,
				res.DecodeGraphStepDeviceSeconds, res.DecodeStepDeviceSeconds)
		}
		if !slices.Equal(res.Tokens, plain.Tokens) {
			t.Errorf("profiled: %v, plain %v", res.Tokens, plain.Tokens)
		}
	})
	t.Run("simulator", func(t *testing.T) {
		res, why := gen(t, testDevice(t), engine.Options{})
		if res.DecodeGraphSteps != 0 || why == "" {
			t.Errorf("plain simulator: %d graph steps, reason %q", res.DecodeGraphSteps, why)
		}
	})
}

// refusing is a recorder whose captures always fail at EndCapture.
type refusing struct{ *recorder }

func (r *refusing) EndCapture(s device.Stream) (device.Graph, error) {
	if _, err := r.recorder.EndCapture(s); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("refusing: capture invalidated: %w", device.ErrUnsupported)
}
