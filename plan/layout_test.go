package plan

import (
	"errors"
	"strings"
	"testing"
)

func TestLowerBound(t *testing.T) {
	tests := []struct {
		name string
		bufs []Buffer
		want uint64
	}{
		{"empty", nil, 0},
		{"one", []Buffer{{Start: 0, End: 3, Size: 7}}, 7},
		{"disjoint", []Buffer{{Start: 0, End: 2, Size: 5}, {Start: 2, End: 4, Size: 9}}, 9},
		{"overlap", []Buffer{{Start: 0, End: 3, Size: 5}, {Start: 2, End: 4, Size: 9}}, 14},
		{"peak in the middle", []Buffer{
			{Start: 0, End: 10, Size: 1},
			{Start: 1, End: 3, Size: 10},
			{Start: 2, End: 5, Size: 100},
			{Start: 4, End: 6, Size: 1000},
		}, 1101},
		{"zero size and empty lifetime count for nothing", []Buffer{
			{Start: 0, End: 5, Size: 0}, {Start: 3, End: 3, Size: 50}, {Start: 1, End: 2, Size: 4},
		}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := LowerBound(tc.bufs); got != tc.want {
				t.Errorf("LowerBound = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		bufs  []Buffer
		align uint64
		want  string // substring of the error; "" for success
	}{
		{"ok", []Buffer{{ID: "a", Start: 0, End: 1, Size: 1}}, 256, ""},
		{"zero size is fine", []Buffer{{ID: "a", Start: 0, End: 1}}, 0, ""},
		{"empty lifetime", []Buffer{{ID: "a", Start: 2, End: 2, Size: 1}}, 0, `buffer 0 ("a"): lifetime [2, 2) is empty`},
		{"reversed lifetime", []Buffer{{ID: "b", Start: 3, End: 1, Size: 1}}, 0, "lifetime [3, 1)"},
		{"too big", []Buffer{{ID: "c", Start: 0, End: 1, Size: MaxBufferBytes + 1}}, 0, "exceeds the limit"},
		{"alignment", []Buffer{{ID: "c", Start: 0, End: 1, Size: 1}}, MaxAlignment * 2, "alignment"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.bufs, tc.align)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
	if err := Validate(make([]Buffer, MaxBuffers+1), 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("too many buffers: %v", err)
	}
}

func TestVerify(t *testing.T) {
	bufs := []Buffer{
		{ID: "a", Start: 0, End: 2, Size: 100},
		{ID: "b", Start: 1, End: 3, Size: 50},
		{ID: "c", Start: 2, End: 4, Size: 100}, // starts when a ends: may share a's bytes
		{ID: "z", Start: 0, End: 4, Size: 0},
	}
	tests := []struct {
		name   string
		layout Layout
		kind   error // nil: valid
		want   string
	}{
		{"valid", Layout{Offsets: []uint64{0, 100, 0, 0}, ArenaBytes: 150}, nil, ""},
		{"valid aligned", Layout{Offsets: []uint64{0, 256, 0, 0}, ArenaBytes: 306, Alignment: 256}, nil, ""},
		{"live overlap", Layout{Offsets: []uint64{0, 99, 0, 0}, ArenaBytes: 150}, ErrOverlap, `"a"`},
		{"overlap later", Layout{Offsets: []uint64{0, 100, 120, 0}, ArenaBytes: 300}, ErrOverlap, `"c"`},
		{"past the arena", Layout{Offsets: []uint64{0, 100, 0, 0}, ArenaBytes: 149}, ErrOverlap, "past the arena"},
		{"offset past the arena", Layout{Offsets: []uint64{0, 100, 0, 1 << 62}, ArenaBytes: 150}, ErrOverlap, "past the arena"},
		{"misaligned", Layout{Offsets: []uint64{0, 100, 0, 0}, ArenaBytes: 150, Alignment: 64}, ErrInvalid, "not a multiple of 64"},
		{"offset count", Layout{Offsets: []uint64{0}, ArenaBytes: 150}, ErrInvalid, "1 offsets for 4 buffers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(bufs, tc.layout)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify = %v, want %v containing %q", err, tc.kind, tc.want)
			}
		})
	}
}

func TestPadded(t *testing.T) {
	bufs := []Buffer{{Size: 1}, {Size: 256}, {Size: 257}, {Size: 0}}
	p := Padded(bufs, 256)
	want := []uint64{256, 256, 512, 0}
	for i := range p {
		if p[i].Size != want[i] {
			t.Errorf("Padded[%d] = %d, want %d", i, p[i].Size, want[i])
		}
	}
	if bufs[0].Size != 1 {
		t.Error("Padded modified its input")
	}
}
