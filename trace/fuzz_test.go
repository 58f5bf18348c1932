package trace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// fuzzRead reads data to the end and checks what any reader must hold on
// any input: no panic; every error is io.EOF or a *Error with a position;
// the error sticks; the event count is bounded by the input consumed;
// Stats add up. It returns the events.
func fuzzRead(t *testing.T, data []byte, opts Options) []Event {
	opts.MaxObjects = 1 << 16 // keep each run small
	r, err := NewReader(bytes.NewReader(data), "fuzz", opts)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("NewReader error %v is not a *Error", err)
		}
		return nil
	}
	var evs []Event
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not a *Error", err)
			}
			if e.Pos.Line == 0 && r.Format() != FormatSnapshot {
				t.Fatalf("error %v has no line", err)
			}
			if _, again := r.Next(); again != err {
				t.Fatalf("error did not stick: %v then %v", err, again)
			}
			break
		}
		if ev.Action == ActionInvalid || ev.Action >= numActions {
			t.Fatalf("event with invalid action %+v", ev)
		}
		if ev.Size > MaxSize && ev.Action != OOM && !opts.NoValidate {
			t.Fatalf("event with size %d above MaxSize", ev.Size)
		}
		evs = append(evs, ev)
	}
	s := r.Stats()
	if s.Events != int64(len(evs)) {
		t.Fatalf("Stats.Events %d, returned %d", s.Events, len(evs))
	}
	if s.Events+s.Skipped+s.Ignored > s.Bytes+1 {
		t.Fatalf("%d records from %d bytes", s.Events+s.Skipped+s.Ignored, s.Bytes)
	}
	sum := s.Malformed + s.UnknownAction + s.BadSize + s.UnknownAddress + s.DoubleAlloc + s.DoubleFree + s.SizeMismatch
	if sum != s.Skipped || (s.Skipped > 0) != (s.FirstSkipped != nil) {
		t.Fatalf("skip counts %+v", s)
	}
	m := r.Meta()
	if m.Live > m.PeakLive || m.Reserved > m.PeakReserved {
		t.Fatalf("meta %+v: current above peak", m)
	}
	return evs
}

// addFiles adds the files matching pattern as seeds, each with both modes.
func addFiles(f *testing.F, pattern string) {
	names, _ := filepath.Glob(pattern)
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		if len(data) > 4<<10 {
			data = data[:4<<10] // a truncated copy: large seeds slow the fuzzer
		}
		f.Add(data, false)
		f.Add(data, true)
	}
}

func FuzzCSV(f *testing.F) {
	addFiles(f, "testdata/fuzz-seeds/*.csv")
	src := []byte(hdr + "segment_alloc,1048576,2097152,0\nalloc,1048576,512,0\nsnapshot,0,0,0\n" +
		"free_requested,1048576,512,0\nfree_completed,1048576,512,0\nsegment_free,1048576,2097152,0\n")
	f.Add(src, false)
	f.Add(src, true)
	f.Add(gzipBytes(f, src), false)
	f.Add(gzipBytes(f, src)[:30], true)
	f.Add([]byte(hdr+"alloc,1,-1,0\nalloc,1,1,0\nalloc,1,1,0\nfree_completed,2,1,0\nbogus,1,1,1\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, lenient bool) {
		fuzzRead(t, data, Options{Format: FormatCSV, Lenient: lenient})
	})
}

func FuzzJSONL(f *testing.F) {
	addFiles(f, "testdata/fuzz-seeds/*.jsonl")
	f.Add([]byte(`{"t":1,"action":"alloc","addr":4096,"size":16,"stream":2,"device":1,"tenant":"a\u00e9\n","purpose":"kv","x":[1,{"y":null}]}`+"\n"+
		`{"action":"oom","size":99,"device_free":5}`+"\n"+`{"action":"free_completed","addr":4096,"size":16}`), false)
	f.Add([]byte(`{"action":"snapshot","addr":0,"size":0}`+"\n"+`{"action":"alloc","addr":1,"size":-1}`), true)
	f.Fuzz(func(t *testing.T, data []byte, lenient bool) {
		evs := fuzzRead(t, data, Options{Format: FormatJSONL, Lenient: lenient, NoValidate: lenient})
		// What was read writes back to the same events.
		var buf bytes.Buffer
		w := NewWriter(&buf)
		for _, ev := range evs {
			if err := w.Write(ev); err != nil {
				t.Fatalf("writing %+v: %v", ev, err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		back, _, err := readAll(t, buf.Bytes(), "back.jsonl", Options{NoValidate: true})
		if err != nil || len(back) != len(evs) {
			t.Fatalf("read back %d of %d events: %v\n%s", len(back), len(evs), err, buf.Bytes())
		}
		for i := range evs {
			if !utf8.ValidString(evs[i].Tenant) || !utf8.ValidString(evs[i].Purpose) {
				continue // the writer replaces invalid UTF-8
			}
			if back[i] != evs[i] {
				t.Fatalf("event %d: read back %+v, wrote %+v", i, back[i], evs[i])
			}
		}
	})
}

func FuzzPickle(f *testing.F) {
	addFiles(f, "testdata/*.pickle")
	addFiles(f, "testdata/fuzz-seeds/*.pickle")
	addFiles(f, "../testdata/traces/tx_ring.pickle")
	f.Add(snapshotPickle(alloc(4096, 16), []any{"action", "free_completed", "addr", 4096, "size", 16}), false)
	f.Add(snapshotPickle(alloc(4096, 16), []any{"action", "oom", "device_free", 4096, "size", -1}), true)
	f.Add(newPK(2).dict().str("device_traces").list().list().entry(alloc(1<<40, 1<<20)...).op('a', 'a', 's').stop(), false)
	f.Fuzz(func(t *testing.T, data []byte, lenient bool) {
		fuzzRead(t, data, Options{Format: FormatSnapshot, Lenient: lenient})
	})
}
