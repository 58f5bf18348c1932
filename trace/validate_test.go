package trace

import (
	"errors"
	"testing"
)

func TestValidator(t *testing.T) {
	ev := func(a Action, addr, size uint64) Event { return Event{Action: a, Addr: addr, Size: size} }
	tests := []struct {
		name   string
		events []Event
		bad    int   // index of the event that must fail, -1 for none
		err    error // its sentinel
	}{
		{"lifecycle", []Event{ev(Alloc, 1, 8), ev(FreeRequested, 1, 8), ev(FreeCompleted, 1, 8), ev(Alloc, 1, 16)}, -1, nil},
		{"free completed without request", []Event{ev(Alloc, 1, 8), ev(FreeCompleted, 1, 8)}, -1, nil},
		{"zero size", []Event{ev(Alloc, 1, 0), ev(FreeCompleted, 1, 0)}, -1, nil},
		{"max size", []Event{ev(Alloc, 1, MaxSize)}, -1, nil},
		{"over max size", []Event{ev(Alloc, 1, MaxSize+1)}, 0, ErrBadSize},
		{"oom may ask for anything", []Event{ev(OOM, 0, 1<<60)}, -1, nil},
		{"double alloc", []Event{ev(Alloc, 1, 8), ev(Alloc, 1, 8)}, 1, ErrDoubleAlloc},
		{"unknown free", []Event{ev(Alloc, 1, 8), ev(FreeCompleted, 2, 8)}, 1, ErrUnknownAddress},
		{"free after free", []Event{ev(Alloc, 1, 8), ev(FreeCompleted, 1, 8), ev(FreeCompleted, 1, 8)}, 2, ErrUnknownAddress},
		{"double free request", []Event{ev(Alloc, 1, 8), ev(FreeRequested, 1, 8), ev(FreeRequested, 1, 8)}, 2, ErrDoubleFree},
		{"size mismatch", []Event{ev(Alloc, 1, 8), ev(FreeRequested, 1, 9)}, 1, ErrSizeMismatch},
		{"segments", []Event{ev(SegmentAlloc, 1, 8), ev(SegmentFree, 1, 8), ev(SegmentAlloc, 1, 8)}, -1, nil},
		{"double segment", []Event{ev(SegmentAlloc, 1, 8), ev(SegmentAlloc, 1, 8)}, 1, ErrDoubleAlloc},
		{"unknown segment", []Event{ev(SegmentFree, 1, 8)}, 0, ErrUnknownAddress},
		{"segment size mismatch", []Event{ev(SegmentAlloc, 1, 8), ev(SegmentFree, 1, 4)}, 1, ErrSizeMismatch},
		{"maps are size-checked only", []Event{ev(SegmentUnmap, 1, 8), ev(SegmentMap, 1, 8), ev(SegmentMap, 1, 8)}, -1, nil},
		{"invalid action", []Event{ev(ActionInvalid, 1, 8)}, 0, ErrUnknownAction},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := NewValidator()
			for i, e := range tt.events {
				blocks, bytes := v.Live()
				segs := v.Segments()
				err := v.Check(&e)
				if i != tt.bad {
					if err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
					continue
				}
				if !errors.Is(err, tt.err) {
					t.Fatalf("event %d: error %v, want %v", i, err, tt.err)
				}
				// A refused event leaves the state as it was.
				if b2, by2 := v.Live(); b2 != blocks || by2 != bytes || v.Segments() != segs {
					t.Errorf("state changed by a refused event: %d/%d blocks, %d/%d bytes", blocks, b2, bytes, by2)
				}
			}
		})
	}
	v := NewValidator()
	for _, e := range []Event{ev(Alloc, 1, 8), ev(Alloc, 2, 16), ev(FreeCompleted, 1, 8)} {
		if err := v.Check(&e); err != nil {
			t.Fatal(err)
		}
	}
	if blocks, bytes := v.Live(); blocks != 1 || bytes != 16 {
		t.Errorf("Live() = %d, %d; want 1, 16", blocks, bytes)
	}
}

func TestActionNames(t *testing.T) {
	for a := Alloc; a < numActions; a++ {
		got, ok, ignored := ParseAction(a.String())
		if got != a || !ok || ignored {
			t.Errorf("ParseAction(%q) = %v %v %v", a.String(), got, ok, ignored)
		}
	}
	for _, s := range []string{"snapshot", "annotate"} {
		if _, ok, ignored := ParseAction(s); ok || !ignored {
			t.Errorf("ParseAction(%q): ok %v ignored %v, want an ignored marker", s, ok, ignored)
		}
	}
	if _, ok, ignored := ParseAction("invalid"); ok || ignored {
		t.Error(`ParseAction("invalid") accepted`)
	}
	if Action(200).String() != "invalid" {
		t.Error("out-of-range action has a name")
	}
}
