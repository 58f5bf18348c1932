package trace

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestPickleRefusesCode(t *testing.T) {
	// The hostile fixtures pickle a __reduce__ that calls builtins.print.
	for _, tt := range []struct{ file, op, offset string }{
		{"testdata/hostile_reduce_p2.pickle", "GLOBAL (0x63)", "offset 50"},
		{"testdata/hostile_reduce_p4.pickle", "STACK_GLOBAL (0x93)", "offset 66"},
	} {
		data, err := os.ReadFile(tt.file)
		if err != nil {
			t.Fatal(err)
		}
		for _, lenient := range []bool{false, true} {
			_, _, err = readAll(t, data, tt.file, Options{Lenient: lenient})
			wantError(t, err, ErrForbidden, tt.file, tt.op, tt.offset)
		}
	}
	for _, op := range []byte{'c', 0x93, 'R', 'b', 'i', 'o', 0x81, 0x92, 'P', 'Q', 0x82, 0x83, 0x84} {
		src := []byte{0x80, 4, op, 0, 0, 0, 0, 0, 0, 0, 0}
		_, _, err := readAll(t, src, "x.pickle", Options{})
		wantError(t, err, ErrForbidden, "offset 2: ", opNames[op])
	}
}

func TestPickleBadInput(t *testing.T) {
	base := snapshotPickle(alloc(4096, 16), alloc(8192, 16))
	cut := func(n int) []byte { return base[:n] }
	u64 := func(op byte, n uint64) []byte {
		return binary.LittleEndian.AppendUint64([]byte{0x80, 4, op}, n)
	}
	nested := []byte{0x80, 4}
	for range maxPickleDepth + 1 {
		nested = append(nested, '(')
	}
	memoBomb := []byte{0x80, 4}
	for range 200 {
		memoBomb = append(memoBomb, ']', 0x94)
	}
	tests := []struct {
		name     string
		src      []byte
		opts     Options
		sentinel error
		parts    []string
	}{
		{"unsupported opcode", []byte{0x80, 4, 'I', '1', '\n', '.'}, Options{}, ErrCorrupt, []string{"offset 2", "INT (0x49) is not used by snapshots"}},
		{"DUP", []byte{0x80, 4, ']', '2', '.'}, Options{}, ErrCorrupt, []string{"offset 3", "DUP"}},
		{"not an opcode", []byte{0x80, 4, 0xff}, Options{}, ErrCorrupt, []string{"offset 2", "0xff is not a pickle opcode"}},
		{"protocol 6", []byte{0x80, 6, '}', '.'}, Options{Format: FormatSnapshot}, ErrCorrupt, []string{"offset 0", "protocol 6"}},
		{"protocol 1", []byte{0x80, 1, '}', '.'}, Options{Format: FormatSnapshot}, ErrCorrupt, []string{"offset 0", "protocol 1"}},
		{"truncated in a string", cut(20), Options{}, ErrTruncated, []string{"offset 17", "data ends inside SHORT_BINUNICODE"}},
		{"truncated between opcodes", cut(len(base) - 1), Options{}, ErrTruncated, []string{"no STOP"}},
		{"truncated gzip", gzipBytes(t, base)[:40], Options{}, ErrTruncated, []string{"offset ", "gzip stream ends early"}},
		{"huge string length", u64(0x8d, 1<<62), Options{}, ErrTruncated, []string{"offset 2", "BINUNICODE8"}},
		{"huge bytes length", u64(0x8e, 1<<62), Options{}, ErrTruncated, []string{"offset 2", "BINBYTES8"}},
		{"huge long", []byte{0x80, 4, 0x8b, 0xff, 0xff, 0xff, 0x7f}, Options{}, ErrLimit, []string{"offset 2", "LONG4"}},
		{"nesting", nested, Options{}, ErrLimit, []string{"nested MARKs"}},
		{"memo bomb", memoBomb, Options{MaxObjects: 100}, ErrLimit, []string{"more than 100 pickle objects"}},
		{"sparse memo", []byte{0x80, 4, ']', 'r', 0xff, 0xff, 0xff, 0xff}, Options{MaxObjects: 1}, ErrLimit, []string{"offset 3", "pickle objects"}},
		{"get before put", []byte{0x80, 4, 'h', 3}, Options{}, ErrCorrupt, []string{"offset 2", "BINGET of memo entry 3"}},
		{"appends without mark", []byte{0x80, 4, ']', 'K', 1, 'e'}, Options{}, ErrCorrupt, []string{"offset 5", "APPENDS without MARK"}},
		{"append without a list", []byte{0x80, 4, 'K', 1, 'a'}, Options{}, ErrCorrupt, []string{"offset 4", "APPEND needs 2"}},
		{"append to a dict", []byte{0x80, 4, '}', 'K', 1, 'a'}, Options{}, ErrCorrupt, []string{"APPEND to a dict"}},
		{"setitem into a list", []byte{0x80, 4, ']', 'K', 1, 'K', 2, 's'}, Options{}, ErrCorrupt, []string{"SETITEM into a list"}},
		{"odd setitems", []byte{0x80, 4, '}', '(', 'K', 1, 'u'}, Options{}, ErrCorrupt, []string{"odd number"}},
		{"unhashable key", []byte{0x80, 4, '}', ']', 'K', 1, 's'}, Options{}, ErrCorrupt, []string{"unhashable"}},
		{"setitems below a mark", []byte{0x80, 4, '(', '(', 'K', 1, 'K', 2, 'u'}, Options{}, ErrCorrupt, []string{"nothing below its MARK"}},
		{"stop with two items", []byte{0x80, 4, '}', '}', '.'}, Options{}, ErrCorrupt, []string{"STOP with 2 stack items"}},
		{"stop with nothing", []byte{0x80, 4, '.'}, Options{}, ErrCorrupt, []string{"STOP with 0"}},
		{"a list, not a dict", []byte{0x80, 4, ']', '.'}, Options{}, ErrFormat, []string{"holds a list, not a snapshot dict"}},
		{"no device_traces", newPK(4).dict().str("segments").list().op('s').stop(), Options{}, ErrFormat, []string{"no \"device_traces\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.opts.Format == FormatAuto {
				tt.opts.Format = FormatSnapshot
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, _, err := readAll(t, tt.src, "x.pickle", tt.opts)
			runtime.ReadMemStats(&after)
			wantError(t, err, tt.sentinel, append([]string{"trace x.pickle: "}, tt.parts...)...)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
				t.Errorf("allocated %d bytes for a %d-byte input", n, len(tt.src))
			}
			// Lenient mode does not skip structural errors.
			tt.opts.Lenient = true
			_, _, err = readAll(t, tt.src, "x.pickle", tt.opts)
			wantError(t, err, tt.sentinel)
		})
	}
}

// Bad trace entries are record errors: named by offset and index, skipped
// in lenient mode.
func TestPickleBadEntries(t *testing.T) {
	good := alloc(4096, 16)
	tests := []struct {
		name     string
		entry    []any
		sentinel error
		parts    []string
	}{
		{"unknown action", []any{"action", "malloc", "addr", 8192, "size", 16}, ErrUnknownAction, []string{`"malloc"`}},
		{"action named like a key", []any{"action", "addr", "addr", 8192, "size", 16}, ErrUnknownAction, []string{`"addr"`}},
		{"long unknown action", []any{"action", strings.Repeat("x", 100), "addr", 8192, "size", 16}, ErrUnknownAction, []string{"not one of PyTorch's action names"}},
		{"negative size", []any{"action", "alloc", "addr", 8192, "size", -16}, ErrBadSize, []string{"negative size -16"}},
		{"absurd size", []any{"action", "alloc", "addr", 8192, "size", int64(1) << 41}, ErrBadSize, []string{"exceeds"}},
		{"no action", []any{"addr", 8192, "size", 16}, ErrMalformed, []string{"no \"action\""}},
		{"no addr", []any{"action", "alloc", "size", 16}, ErrMalformed, []string{"no \"addr\""}},
		{"no size", []any{"action", "alloc", "addr", 8192}, ErrMalformed, []string{"no \"size\""}},
		{"addr is a str", []any{"action", "alloc", "addr", "0x2000", "size", 16}, ErrMalformed, []string{`"addr" is a str, want an int`}},
		{"action is an int", []any{"action", 3, "addr", 8192, "size", 16}, ErrMalformed, []string{`"action" is a int`}},
		{"negative addr", []any{"action", "alloc", "addr", -8192, "size", 16}, ErrMalformed, []string{"negative addr"}},
		{"double alloc", []any{"action", "alloc", "addr", 4096, "size", 16}, ErrDoubleAlloc, []string{"already live"}},
		{"size of 2^63", []any{"action", "alloc", "addr", 8192, "size", []byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0}}, ErrBadSize, []string{"9223372036854775808 exceeds"}},
		{"addr beyond 64 bits", []any{"action", "alloc", "addr", []byte{0, 0, 0, 0, 0, 0, 0, 0, 1}, "size", 16}, ErrMalformed, []string{"addr does not fit in 64 bits"}},
		{"time_us of 2^63", []any{"action", "alloc", "addr", 8192, "size", 16, "time_us", []byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0}}, ErrMalformed, []string{"time_us out of range"}},
		{"time_us overflowing ns", []any{"action", "alloc", "addr", 8192, "size", 16, "time_us", int64(1) << 62}, ErrMalformed, []string{"time_us 4611686018427387904 out of range"}},
		{"stream is a float", []any{"action", "alloc", "addr", 8192, "size", 16, "stream", 1.5}, ErrMalformed, []string{`"stream" is a float`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := snapshotPickle(good, tt.entry, alloc(16384, 8))
			evs, r, err := readAll(t, src, "x.pickle", Options{})
			wantError(t, err, tt.sentinel, append([]string{"(device_traces[0][1])"}, tt.parts...)...)
			if len(evs) != 1 || r.Pos().Entry != 2 || r.Pos().Offset == 0 {
				t.Errorf("%d events before the error at %+v; want 1, at entry 2", len(evs), r.Pos())
			}
			evs, r, err = readAll(t, src, "x.pickle", Options{Lenient: true})
			if err != nil || len(evs) != 2 || r.Stats().Skipped != 1 {
				t.Errorf("lenient: %d events, %v, stats %+v; want 2 and one skipped", len(evs), err, r.Stats())
			}
		})
	}
	t.Run("entry is not a dict", func(t *testing.T) {
		p := newPK(4).dict().mark().str("device_traces").list().list().mark()
		p.entry(good...).int(7).appends().op('a').setitems()
		_, _, err := readAll(t, p.stop(), "x.pickle", Options{})
		wantError(t, err, ErrMalformed, "(device_traces[0][1])", "trace entry is a int, want a dict")
	})
}

// The pickle shapes Python writes for lists of one item (APPEND, no MARK),
// empty device lists, and a dict with one key (SETITEM) all place entries
// right.
func TestPickleShapes(t *testing.T) {
	one := newPK(2).dict().str("device_traces").list().list()
	one.entry(alloc(4096, 16)...).op('a').op('a').op('s')
	many := newPK(2).dict().mark().str("device_traces").list().mark().list().list()
	many.entry(alloc(4096, 16)...).op('a').list().appends()
	many.str("segments").list().mark().dict().str("total_size").int(1 << 21).op('s')
	many.dict().str("total_size").int(1 << 22).op('s').appends().setitems()
	tests := []struct {
		name     string
		src      []byte
		devices  []int
		segments int
	}{
		{"single key, single device, single entry", one.stop(), []int{0}, 0},
		{"empty device lists around one with an entry", many.stop(), []int{1}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, r, err := readAll(t, tt.src, "x.pickle", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != len(tt.devices) {
				t.Fatalf("%d events, want %d", len(evs), len(tt.devices))
			}
			for i, d := range tt.devices {
				if evs[i].Device != d || evs[i].Addr != 4096 || evs[i].Time != 5000 {
					t.Errorf("event %d: %+v, want device %d", i, evs[i], d)
				}
			}
			if m := r.Meta(); m.Segments != tt.segments || (tt.segments == 2 && m.SegmentsReserved != 6*mib) {
				t.Errorf("meta %+v", m)
			}
		})
	}
}

func TestDecodeLong(t *testing.T) {
	tests := []struct {
		b    []byte
		kind vkind
		n    int64
	}{
		{nil, kInt, 0},
		{[]byte{0xff}, kInt, -1},
		{[]byte{0x80}, kInt, -128},
		{[]byte{0x00, 0x80}, kInt, -32768},
		{[]byte{0xff, 0x00}, kInt, 255},
		{[]byte{1, 2, 3, 4, 5, 6, 7, 0x7f}, kInt, 0x7f07060504030201},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0}, kUint, -1 << 63},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0xff}, kInt, -1 << 63},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0, 1}, kBig, 0},
		{[]byte{5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, kInt, 5},
	}
	for _, tt := range tests {
		v := decodeLong(tt.b)
		if v.kind != tt.kind || (v.kind != kBig && v.n != tt.n) {
			t.Errorf("decodeLong(% x) = %v %d, want %v %d", tt.b, v.kind, v.n, tt.kind, tt.n)
		}
	}
}

// A snapshot streams: decoding more entries does not hold more memory.
func TestPickleStreams(t *testing.T) {
	entries := make([][]any, 0, 20000)
	for i := range 10000 {
		addr := int64(4096 * (i + 1))
		entries = append(entries, alloc(addr, 16),
			[]any{"action", "free_completed", "addr", addr, "size", 16, "stream", 0, "time_us", 6})
	}
	src := snapshotPickle(entries...)
	r, err := NewReader(bytes.NewReader(src), "x.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := r.dec.(*pickleDecoder)
	maxStack, maxSlots := 0, 0
	n := 0
	for ; ; n++ {
		if _, err := r.Next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		maxStack, maxSlots = max(maxStack, len(d.stack)), max(maxSlots, len(d.slots))
	}
	if n != 20000 {
		t.Fatalf("%d events, want 20000", n)
	}
	// Entries wait on the stack for their batch's APPENDS (1000), then
	// their slots are recycled: nothing grows with the trace but the memo.
	if maxStack > 1100 || maxSlots > 1100 {
		t.Errorf("stack peaked at %d items and %d slots; want about one batch of 1000", maxStack, maxSlots)
	}
	if len(d.memo) < 20000 {
		t.Errorf("memo %d: every entry dict is memoized", len(d.memo))
	}
}
