package fault_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/fault"
)

// copyModel is the test's own statement of CopyRule: which matching copy
// fails.
type copyModel struct {
	r            fault.CopyRule
	calls, bytes uint64
	fired        bool
}

func (m *copyModel) fails(k fault.CopyKind, s device.Stream, n uint64) bool {
	if m.r.Kinds != 0 && m.r.Kinds&k == 0 || m.r.Stream != 0 && m.r.Stream != s {
		return false
	}
	m.calls++
	fail := m.r.Call.Nth != 0 && (m.calls == m.r.Call.Nth || m.r.Call.AndAfter && m.calls > m.r.Call.Nth)
	if m.r.Bytes != 0 {
		if m.fired && m.r.AfterBytes || !m.fired && m.bytes+n > m.r.Bytes {
			m.fired, fail = true, true
		}
	}
	if !fail {
		m.bytes += n
	}
	return fail
}

// TestCopyRules: random rules over random sequences of copies of every
// kind on two streams: exactly the copies the rule selects fail, with an
// error wrapping ErrInjected and ErrCopy that names the copy; a failed
// copy moves nothing (its destination keeps its bytes) and the others
// move theirs; Injected counts the failures.
func TestCopyRules(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	d := newSim(t, nil)
	aux, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	// direct copies on the unwrapped device, to read and set the buffers.
	direct := func(f func() error) {
		t.Helper()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		if err := d.StreamSynchronize(aux); err != nil {
			t.Fatal(err)
		}
	}
	for iter := range 60 {
		cfg := &fault.Config{}
		w := fault.Wrap(d, cfg)
		s1, _ := w.NewStream()
		s2, _ := w.NewStream()
		streams := []device.Stream{s1, s2}
		const size = 4096
		a, _ := w.Alloc(size)
		b, _ := w.Alloc(size)
		r := fault.CopyRule{Kinds: fault.CopyKind(rng.IntN(8))}
		if rng.IntN(2) == 0 {
			r.Stream = streams[rng.IntN(2)]
		}
		switch rng.IntN(4) {
		case 0:
			r.Call = fault.Nth(1 + rng.Uint64N(30))
		case 1:
			r.Call = fault.From(1 + rng.Uint64N(30))
		case 2:
			r.Bytes, r.AfterBytes = rng.Uint64N(40*size), rng.IntN(2) == 0
		}
		cfg.Set(fault.Rules{FailCopies: r})
		m := copyModel{r: r}
		failed := uint64(0)
		for i := range 80 {
			n := 1 + rng.Uint64N(size)
			s := streams[rng.IntN(2)]
			k := fault.CopyKind(1 << rng.IntN(3))
			src := make([]byte, n)
			for j := range src {
				src[j] = byte(rng.Uint32())
			}
			before := make([]byte, size)
			direct(func() error { return d.CopyDtoH(before, a, aux) })
			var err error
			switch k {
			case fault.HtoD:
				err = w.CopyHtoD(a, src, s)
			case fault.DtoH:
				err = w.CopyDtoH(src, a, s)
			case fault.DtoD:
				direct(func() error { return d.CopyHtoD(b, src, aux) })
				err = w.CopyDtoD(a, b, n, s)
			}
			want := m.fails(k, s, n)
			if got := err != nil; got != want {
				t.Fatalf("iteration %d, copy %d (%s, %d bytes, stream %d), rule %+v: failed %v, want %v (%v)", iter, i, k, n, s, r, got, want, err)
			}
			if err := w.StreamSynchronize(s); err != nil {
				t.Fatal(err)
			}
			after := make([]byte, size)
			direct(func() error { return d.CopyDtoH(after, a, aux) })
			if want {
				failed++
				if !errors.Is(err, fault.ErrInjected) || !errors.Is(err, fault.ErrCopy) || !bytes.Contains([]byte(err.Error()), []byte(fmt.Sprintf("%d bytes", n))) {
					t.Fatalf("error %v", err)
				}
				if k != fault.DtoH && !bytes.Equal(before, after) {
					t.Fatalf("a failed %s copy wrote the destination", k)
				}
				continue
			}
			if k != fault.DtoH && !bytes.Equal(after[:n], src) || k == fault.DtoH && !bytes.Equal(src, before[:n]) {
				t.Fatalf("copy %d (%s) did not move its bytes", i, k)
			}
		}
		if c := cfg.Counts(); c.Injected != failed || c.Copies != 80 {
			t.Errorf("rule %+v: Injected %d, Copies %d; want %d, 80", r, c.Injected, c.Copies, failed)
		}
		cfg.Set(fault.Rules{})
		if err := w.CopyHtoD(a, make([]byte, 16), s1); err != nil {
			t.Errorf("after clearing the rules: %v", err)
		}
		w.Synchronize()
		w.Free(a)
		w.Free(b)
		w.DestroyStream(s1)
		w.DestroyStream(s2)
	}
}

// TestCopyRuleExamples: the rule's documented cases one by one.
func TestCopyRuleExamples(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rule  fault.CopyRule
		fails string // six host-to-device copies of 100 bytes on stream 1
	}{
		{"zero", fault.CopyRule{}, "......"},
		{"third call", fault.CopyRule{Call: fault.Nth(3)}, "..x..."},
		{"from the fourth", fault.CopyRule{Call: fault.From(4)}, "...xxx"},
		{"past 250 bytes once", fault.CopyRule{Bytes: 250}, "..x..."},
		{"past 250 bytes and after", fault.CopyRule{Bytes: 250, AfterBytes: true}, "..xxxx"},
		{"other kinds only", fault.CopyRule{Kinds: fault.DtoH | fault.DtoD, Call: fault.Always()}, "......"},
		{"this kind among others", fault.CopyRule{Kinds: fault.HtoD | fault.DtoD, Call: fault.Nth(2)}, ".x...."},
		{"another stream", fault.CopyRule{Stream: 999, Call: fault.Always()}, "......"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newSim(t, nil)
			cfg := &fault.Config{}
			w := fault.Wrap(d, cfg)
			s, _ := w.NewStream()
			p, _ := w.Alloc(4096)
			if tc.rule.Stream == 1 {
				tc.rule.Stream = s
			}
			cfg.Set(fault.Rules{FailCopies: tc.rule})
			got := ""
			for range 6 {
				if err := w.CopyHtoD(p, make([]byte, 100), s); err != nil {
					got += "x"
				} else {
					got += "."
				}
			}
			if got != tc.fails {
				t.Errorf("%q, want %q", got, tc.fails)
			}
		})
	}
}

// FuzzCopyRules: any rule over any sequence of copies fails exactly the
// copies the model says, each with an error wrapping ErrInjected and
// ErrCopy, and counts them as injected. The input's first bytes are the
// rule (kinds, stream, call trigger, byte threshold); each later pair a
// copy (kind and stream, size).
func FuzzCopyRules(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0}, []byte{0, 10, 1, 20, 2, 30})
	f.Add([]byte{1, 1, 3, 0, 0, 0}, []byte{0, 10, 3, 20, 0, 30, 4, 40})
	f.Add([]byte{7, 0, 2, 1, 0, 0}, []byte{1, 1, 2, 2, 1, 3, 5, 4})
	f.Add([]byte{6, 2, 0, 0, 100, 1}, []byte{2, 60, 5, 60, 1, 60, 2, 60, 5, 1})
	f.Add([]byte{2, 0, 0, 0, 1, 0}, []byte{1, 0, 1, 1, 1, 255})
	f.Fuzz(func(t *testing.T, rule, ops []byte) {
		if len(rule) < 6 || len(ops) > 400 {
			return
		}
		d := newSim(t, nil)
		cfg := &fault.Config{}
		w := fault.Wrap(d, cfg)
		s1, _ := w.NewStream()
		s2, _ := w.NewStream()
		streams := []device.Stream{s1, s2}
		a, _ := w.Alloc(1024)
		b, _ := w.Alloc(1024)
		r := fault.CopyRule{Kinds: fault.CopyKind(rule[0] & 7), Call: fault.Trigger{Nth: uint64(rule[2] % 16), AndAfter: rule[3]&1 == 1},
			Bytes: uint64(rule[4]) * 4, AfterBytes: rule[5]&1 == 1}
		if rule[1]%3 != 0 {
			r.Stream = streams[rule[1]%3-1]
		}
		cfg.Set(fault.Rules{FailCopies: r})
		m := copyModel{r: r}
		var failed uint64
		buf := make([]byte, 1024)
		for i := 0; i+1 < len(ops); i += 2 {
			k := fault.CopyKind(1 << (ops[i] % 3))
			s := streams[(ops[i]/3)%2]
			n := uint64(ops[i+1]) + 1
			var err error
			switch k {
			case fault.HtoD:
				err = w.CopyHtoD(a, buf[:n], s)
			case fault.DtoH:
				err = w.CopyDtoH(buf[:n], a, s)
			default:
				err = w.CopyDtoD(a, b, n, s)
			}
			want := m.fails(k, s, n)
			if (err != nil) != want {
				t.Fatalf("copy %d (%s, %d bytes, stream %d), rule %+v: error %v, want failure %v", i/2, k, n, s, r, err, want)
			}
			if err != nil {
				failed++
				if !errors.Is(err, fault.ErrInjected) || !errors.Is(err, fault.ErrCopy) {
					t.Fatalf("error %v", err)
				}
			}
		}
		if c := cfg.Counts(); c.Injected != failed {
			t.Fatalf("Injected %d, %d failed", c.Injected, failed)
		}
		w.Synchronize()
	})
}
