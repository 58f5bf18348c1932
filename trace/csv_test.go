package trace

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

const hdr = "action,addr,size,stream\n"

func TestCSVBadInput(t *testing.T) {
	tests := []struct {
		name     string
		src      string
		sentinel error
		parts    []string // the message must hold these (with the line)
		lenient  bool     // a lenient read skips the record and goes on
	}{
		{"unknown action", hdr + "alloc,4096,16,0\nmalloc,8192,16,0\n", ErrUnknownAction, []string{"line 3", `"malloc"`}, true},
		{"negative size", hdr + "alloc,4096,-16,0\n", ErrBadSize, []string{"line 2", "negative size"}, true},
		{"absurd size", hdr + "alloc,4096,2199023255552,0\n", ErrBadSize, []string{"line 2", "2199023255552", "exceeds"}, true},
		{"free of unknown address", hdr + "alloc,4096,16,0\nfree_completed,8192,16,0\n", ErrUnknownAddress, []string{"line 3", "0x2000", "not live"}, true},
		{"free requested of unknown address", hdr + "free_requested,8192,16,0\n", ErrUnknownAddress, []string{"line 2", "free_requested"}, true},
		{"double alloc", hdr + "alloc,4096,16,0\nalloc,4096,32,0\n", ErrDoubleAlloc, []string{"line 3", "already live"}, true},
		{"double free", hdr + "alloc,4096,16,0\nfree_requested,4096,16,0\nfree_requested,4096,16,0\n", ErrDoubleFree, []string{"line 4", "twice"}, true},
		{"size mismatch", hdr + "alloc,4096,16,0\nfree_completed,4096,32,0\n", ErrSizeMismatch, []string{"line 3", "allocated with 16"}, true},
		{"segment free of unknown segment", hdr + "segment_free,4096,2097152,0\n", ErrUnknownAddress, []string{"line 2", "segment_free"}, true},
		{"double segment alloc", hdr + "segment_alloc,4096,2097152,0\nsegment_alloc,4096,2097152,0\n", ErrDoubleAlloc, []string{"line 3", "segment_alloc"}, true},
		{"too few fields", hdr + "alloc,4096,16\n", ErrMalformed, []string{"line 2", "missing stream"}, true},
		{"no comma", hdr + "alloc\n", ErrMalformed, []string{"line 2", "want 4 fields"}, true},
		{"extra field", hdr + "alloc,4096,16,0,7\n", ErrMalformed, []string{"line 2", "more than 4 fields"}, true},
		{"not a number", hdr + "alloc,0x1000,16,0\n", ErrMalformed, []string{"line 2", "addr is not a decimal number"}, true},
		{"negative addr", hdr + "alloc,-4096,16,0\n", ErrMalformed, []string{"line 2", "addr"}, true},
		{"overflow", hdr + "alloc,18446744073709551616,16,0\n", ErrMalformed, []string{"line 2", "overflows"}, true},
		{"bad header", "action,address,size,stream\nalloc,4096,16,0\n", ErrFormat, []string{"line 1", "header"}, false},
		{"no header", "", ErrFormat, []string{"line 1", "no header"}, false},
		{"long line", hdr + "alloc," + strings.Repeat("1", maxLine) + "\n", ErrLimit, []string{"line 2", "longer than"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, r, err := readAll(t, []byte(tt.src), "t.csv", Options{Format: FormatCSV})
			wantError(t, err, tt.sentinel, append([]string{"trace t.csv: "}, tt.parts...)...)
			if r != nil && r.Pos().Line == 0 {
				t.Errorf("Pos %+v has no line", r.Pos())
			}
			// Lenient: record errors are skipped and counted, the rest end
			// the read as before.
			evs, r, err := readAll(t, []byte(tt.src+"alloc,1048576,8,0\n"), "t.csv", Options{Format: FormatCSV, Lenient: true})
			if !tt.lenient {
				wantError(t, err, tt.sentinel)
				return
			}
			if err != nil {
				t.Fatalf("lenient: %v", err)
			}
			s := r.Stats()
			if s.Skipped != 1 || s.FirstSkipped == nil || len(evs) == 0 || evs[len(evs)-1].Addr != 1048576 {
				t.Errorf("lenient: %d events, stats %+v; want one skipped and the read to go on", len(evs), s)
			}
		})
	}
}

func TestCSVTruncatedGzip(t *testing.T) {
	data, err := os.ReadFile("../testdata/traces/bert_base_varlen.csv.gz")
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{len(data) / 2, len(data) - 4} {
		for _, lenient := range []bool{false, true} {
			evs, r, err := readAll(t, data[:cut], "bert.csv.gz", Options{Lenient: lenient})
			wantError(t, err, ErrTruncated, "bert.csv.gz: line ", "gzip stream ends early")
			if r.Pos().Line < int64(len(evs))+1 || len(evs) == 0 {
				t.Errorf("cut at %d: %d events, error at %v", cut, len(evs), r.Pos())
			}
		}
	}
	// A flipped byte in the data: a corrupt stream or a checksum mismatch.
	bad := bytes.Clone(data)
	bad[len(bad)/2] ^= 0xff
	_, _, err = readAll(t, bad, "bert.csv.gz", Options{NoValidate: true})
	if err == nil {
		t.Fatal("no error for a corrupted gzip stream")
	}
}

func TestCSVFormatDetails(t *testing.T) {
	src := "\xef\xbb\xbfaction,addr,size,stream\r\nalloc,4096,16,7\r\n\nsnapshot,0,0,0\nannotate,4096,0,0\nfree_requested,4096,16,7\nfree_completed,4096,16,7"
	evs, r, err := readAll(t, []byte(src), "t.csv", Options{Format: FormatCSV})
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{Action: Alloc, Addr: 4096, Size: 16, Stream: 7},
		{Action: FreeRequested, Addr: 4096, Size: 16, Stream: 7},
		{Action: FreeCompleted, Addr: 4096, Size: 16, Stream: 7},
	}
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d", len(evs), len(want))
	}
	for i := range want {
		if evs[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, evs[i], want[i])
		}
	}
	if s := r.Stats(); s.Ignored != 2 || s.Bytes != int64(len(src)) {
		t.Errorf("stats %+v: want the two markers ignored and %d bytes", s, len(src))
	}
	if p := r.Pos(); p.Line != 7 {
		t.Errorf("Pos at the end %+v, want line 7", p)
	}
}

// Reading a CSV record allocates nothing.
func TestCSVNoAllocs(t *testing.T) {
	var src bytes.Buffer
	src.WriteString(hdr)
	for range 2000 {
		src.WriteString("alloc,139828359974912,9568,0\nfree_completed,139828359974912,9568,0\n")
	}
	r, err := NewReader(bytes.NewReader(src.Bytes()), "t.csv", Options{NoValidate: true})
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := r.Next(); err != nil && err != io.EOF {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per event, want 0", allocs)
	}
}
