package trace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

const mib = 1 << 20

// The figures the traces' README gives (peak live, reserved) and the
// segment_alloc counts the files hold.
func TestSharedTracesMeta(t *testing.T) {
	tests := []struct {
		file          string
		events        int64
		allocs        int64
		peakLive      float64 // MiB, as the README rounds it
		reserved      uint64
		segmentAllocs int64
	}{
		{"gpt2_medium_generate.csv.gz", 930141, 310030, 545.9, 688 * mib, 51},
		{"bert_base_varlen.csv.gz", 108450, 36145, 227.5, 530 * mib, 15},
		{"bert_base_varlen.pickle.gz", 108450, 36145, 227.5, 530 * mib, 15},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := Open(filepath.Join("..", "testdata", "traces", tt.file), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			for {
				if _, err := r.Next(); err == io.EOF {
					break
				} else if err != nil {
					t.Fatal(err)
				}
			}
			m, s := r.Meta(), r.Stats()
			if s.Events != tt.events || m.Allocs != tt.allocs {
				t.Errorf("events %d, allocs %d; want %d, %d", s.Events, m.Allocs, tt.events, tt.allocs)
			}
			if got := float64(m.PeakLive) / mib; got < tt.peakLive-0.05 || got >= tt.peakLive+0.05 {
				t.Errorf("peak live %.3f MiB, want %.1f", got, tt.peakLive)
			}
			if m.Reserved != tt.reserved || m.PeakReserved != tt.reserved || m.SegmentAllocs != tt.segmentAllocs {
				t.Errorf("reserved %d (peak %d) in %d segment_allocs; want %d in %d",
					m.Reserved, m.PeakReserved, m.SegmentAllocs, tt.reserved, tt.segmentAllocs)
			}
			if m.Live != 0 || s.Skipped != 0 || s.Ignored != 0 {
				t.Errorf("live %d at the end, %d skipped, %d ignored; want 0, 0, 0", m.Live, s.Skipped, s.Ignored)
			}
		})
	}
}

// The snapshot made from the bert CSV must yield exactly the CSV's events.
func TestSnapshotMatchesCSV(t *testing.T) {
	csv, _ := openAll(t, "../testdata/traces/bert_base_varlen.csv.gz", Options{})
	snap, r := openAll(t, "../testdata/traces/bert_base_varlen.pickle.gz", Options{})
	if len(csv) != len(snap) {
		t.Fatalf("%d events from the CSV, %d from the snapshot", len(csv), len(snap))
	}
	for i := range csv {
		want := csv[i]
		want.Time = int64(i) * 1000 // mksnapshot.py sets time_us to the line index
		if snap[i] != want {
			t.Fatalf("event %d: snapshot %+v, CSV %+v", i, snap[i], want)
		}
	}
	if m := r.Meta(); !m.HasSegments || m.Segments != 0 || m.Devices != 1 {
		t.Errorf("meta %+v, want an empty segments list and 1 device", m)
	}
}

// The synthetic snapshot, pickled with protocols 2, 4 and 5, yields the
// golden events; so does the golden file itself through the JSONL reader.
func TestSnapshotGolden(t *testing.T) {
	golden, gr := openAll(t, "testdata/snapshot.golden.jsonl", Options{})
	if len(golden) != 1207 {
		t.Fatalf("%d golden events, want 1207", len(golden))
	}
	for _, proto := range []string{"2", "4", "5"} {
		t.Run("protocol"+proto, func(t *testing.T) {
			evs, r := openAll(t, "testdata/snapshot_p"+proto+".pickle", Options{})
			if len(evs) != len(golden) {
				t.Fatalf("%d events, want %d", len(evs), len(golden))
			}
			for i := range evs {
				if evs[i] != golden[i] {
					t.Fatalf("event %d: %+v, want %+v", i, evs[i], golden[i])
				}
			}
			m, gm := r.Meta(), gr.Meta()
			if m.PeakLive != gm.PeakLive || m.PeakReserved != gm.PeakReserved || m.OOMs != 1 || m.SegmentFrees != 1 {
				t.Errorf("meta %+v; golden %+v", m, gm)
			}
			if !m.HasSegments || m.Segments != 2 || m.SegmentsReserved != 22*mib || m.Devices != 3 {
				t.Errorf("snapshot meta: %d segments, %d bytes, %d devices; want 2, 22 MiB, 3", m.Segments, m.SegmentsReserved, m.Devices)
			}
			if s := r.Stats(); s.Ignored != 1 {
				t.Errorf("ignored %d, want the one snapshot marker", s.Ignored)
			}
		})
	}
}

// Snapshots recorded by scripts/record-snapshot.py on an H200.
func TestRealSnapshots(t *testing.T) {
	tests := []struct {
		file             string
		events           int64
		segments         int
		segmentsReserved uint64
		maps             bool
	}{
		{"tx_python.pickle.gz", 1083, 7, 110 * mib, false},
		{"tx_expandable.pickle.gz", 1085, 4, 106 * mib, true},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := Open(filepath.Join("..", "testdata", "traces", tt.file), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			// The segments list precedes device_traces: known before any event.
			if m := r.Meta(); m.Segments != tt.segments || m.SegmentsReserved != tt.segmentsReserved {
				t.Errorf("before the first event: %d segments, %d bytes; want %d, %d", m.Segments, m.SegmentsReserved, tt.segments, tt.segmentsReserved)
			}
			var maps int
			for {
				ev, err := r.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if ev.Time <= 0 || ev.Device != 0 {
					t.Fatalf("event %+v: want a timestamp and device 0", ev)
				}
				if ev.Action == SegmentMap || ev.Action == SegmentUnmap {
					maps++
				}
			}
			if s := r.Stats(); s.Events != tt.events {
				t.Errorf("%d events, want %d", s.Events, tt.events)
			}
			if (maps > 0) != tt.maps {
				t.Errorf("%d segment_map/unmap events", maps)
			}
		})
	}
}

// A snapshot whose ring buffer dropped its first events: strict reading
// stops at the first free of an unknown block, lenient reading counts them.
func TestRingBufferSnapshot(t *testing.T) {
	const file = "../testdata/traces/tx_ring.pickle"
	r, err := Open(file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Next()
	wantError(t, err, ErrUnknownAddress, file, "offset 2641 (device_traces[0][0])", "free_completed of 0x")
	if p := r.Pos(); p.Offset != 2641 || p.Entry != 1 {
		t.Errorf("Pos %+v, want offset 2641 entry 1", p)
	}
	if _, again := r.Next(); again != err {
		t.Errorf("Next after the error returned %v, want the same error", again)
	}
	r.Close()

	evs, r := openAll(t, file, Options{Lenient: true})
	s := r.Stats()
	if s.Events != int64(len(evs)) || s.Events+s.Skipped != 500 || s.UnknownAddress != s.Skipped || s.Skipped == 0 {
		t.Errorf("stats %+v: want 500 entries, the dropped ones unknown addresses", s)
	}
	if !errors.Is(s.FirstSkipped, ErrUnknownAddress) {
		t.Errorf("FirstSkipped %v", s.FirstSkipped)
	}
}

func TestDetect(t *testing.T) {
	csv := []byte("action,addr,size,stream\nalloc,4096,16,0\n")
	jsonl := []byte(`{"action":"alloc","addr":4096,"size":16}` + "\n")
	snap := snapshotPickle(alloc(4096, 16))
	tests := []struct {
		name   string
		data   []byte
		opts   Options
		format Format
		err    error
	}{
		{"trace.csv", csv, Options{}, FormatCSV, nil},
		{"anything", csv, Options{}, FormatCSV, nil},
		{"trace.csv.gz", gzipBytes(t, csv), Options{}, FormatCSV, nil},
		{"events.log", jsonl, Options{}, FormatJSONL, nil},
		{"events.jsonl.gz", gzipBytes(t, jsonl), Options{}, FormatJSONL, nil},
		{"dump", snap, Options{}, FormatSnapshot, nil},
		{"dump.pickle.gz", gzipBytes(t, snap), Options{}, FormatSnapshot, nil},
		{"empty.jsonl", nil, Options{}, FormatJSONL, nil},
		{"forced", jsonl, Options{Format: FormatJSONL}, FormatJSONL, nil},
		{"empty", nil, Options{}, FormatAuto, ErrFormat},
		{"notes.txt", []byte("hello"), Options{}, FormatAuto, ErrFormat},
		{"bad.gz", []byte{0x1f, 0x8b, 1}, Options{}, FormatAuto, ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewReader(bytes.NewReader(tt.data), tt.name, tt.opts)
			if tt.err != nil {
				wantError(t, err, tt.err, tt.name)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Format() != tt.format {
				t.Errorf("format %v, want %v", r.Format(), tt.format)
			}
			if _, err := r.Next(); err != nil && err != io.EOF {
				t.Errorf("Next: %v", err)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open("testdata/no-such-file.csv", Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open of a missing file: %v", err)
	}
	if _, err := Open("testdata", Options{}); err == nil || errors.Is(err, ErrFormat) {
		t.Errorf("Open of a directory: %v, want a read error", err)
	}
	r, err := Open("testdata/snapshot.golden.jsonl", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err == nil || err == io.EOF {
		t.Errorf("Next after Close: %v, want an error", err)
	}
}

func TestNoValidate(t *testing.T) {
	src := []byte("action,addr,size,stream\nfree_completed,4096,16,0\nalloc,4096,32,0\nalloc,4096,32,0\n")
	evs, r, err := readAll(t, src, "t.csv", Options{NoValidate: true})
	if err != nil || len(evs) != 3 {
		t.Fatalf("%d events, %v; want all 3 without validation", len(evs), err)
	}
	if m := r.Meta(); m.Live != 64 || m.PeakLive != 64 {
		t.Errorf("live %d peak %d, want 64 64 (sizes as given, frees saturating)", m.Live, m.PeakLive)
	}
	_, _, err = readAll(t, src, "t.csv", Options{})
	wantError(t, err, ErrUnknownAddress, "t.csv: line 2")
}
