package cuda_test

import (
	"errors"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/pool"
)

// TestWrapRunsThePool: a Device wrapped around another's context (here,
// a primary context opened first, standing for an engine's own) runs the
// pool, whose stream-ordered frees follow a stream the wrapped Device
// adopted; closing the wrapped Device leaves the context and the stream
// to their owner.
func TestWrapRunsThePool(t *testing.T) {
	if _, err := cuda.Wrap(0, 0, cuda.Options{}); !errors.Is(err, device.ErrInvalid) {
		t.Fatalf("Wrap of a nil context: %v", err)
	}
	owner := open(t).(*cuda.Device)
	raw, err := owner.NewStream() // the engine's stream
	if err != nil {
		t.Fatal(err)
	}
	defer owner.DestroyStream(raw)
	w, err := cuda.Wrap(owner.Context(), 0, cuda.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Context() != owner.Context() || w.Info().TotalBytes != owner.Info().TotalBytes {
		t.Fatalf("wrapped device: context %#x, %d bytes; owner %#x, %d bytes", w.Context(), w.Info().TotalBytes, owner.Context(), owner.Info().TotalBytes)
	}
	if _, err := w.AdoptStream(0); !errors.Is(err, device.ErrInvalid) {
		t.Fatalf("adopting the default stream: %v", err)
	}
	s, err := w.AdoptStream(uintptr(raw))
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(w, pool.Options{Name: "wrapped"})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for i := 0; i < 64; i++ {
		b, err := p.Alloc(4<<20, pool.AllocOptions{Stream: s})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.CopyHtoD(b.Ptr, buf, s); err != nil {
			t.Fatal(err)
		}
		if err := p.FreeAsync(b, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.ForgetStream(s); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// The owner's context and stream still work.
	if err := owner.StreamSynchronize(raw); err != nil {
		t.Fatalf("the owner's stream after the wrapped device closed: %v", err)
	}
	if _, _, err := owner.MemInfo(); err != nil {
		t.Fatalf("the owner's context after the wrapped device closed: %v", err)
	}
}
