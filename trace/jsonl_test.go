package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestWriterRoundTrip(t *testing.T) {
	evs := []Event{
		{Action: SegmentAlloc, Addr: 1 << 40, Size: 2 << 20, Time: 1},
		{Action: Alloc, Addr: 1 << 40, Size: 512, Stream: 7, Time: 2, Tenant: "llm", Purpose: "kv"},
		{Action: Alloc, Addr: 1<<40 + 512, Size: 0, Device: 3, Time: 3, Tenant: "a \"quoted\" \\ tenant\n\t\x01", Purpose: "активации ✓"},
		{Action: FreeRequested, Addr: 1 << 40, Size: 512, Stream: 7, Time: 4, Tenant: "llm", Purpose: "kv"},
		{Action: FreeCompleted, Addr: 1 << 40, Size: 512, Stream: 7, Time: -5},
		{Action: OOM, Size: 1 << 45, DeviceFree: 12345, Time: 6},
		{Action: SegmentMap, Addr: 1 << 41, Size: 1 << 21, Stream: 1<<64 - 1, Time: 1<<63 - 1},
		{Action: SegmentUnmap, Addr: 1 << 41, Size: 1 << 21, Time: -1 << 63},
		{Action: SegmentFree, Addr: 1 << 40, Size: 2 << 20},
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, ev := range evs {
		if err := w.Write(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	got, r, err := readAll(t, buf.Bytes(), "log.jsonl", Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.Bytes())
	}
	if r.Format() != FormatJSONL || len(got) != len(evs) {
		t.Fatalf("%v: %d events, want %d", r.Format(), len(got), len(evs))
	}
	for i := range evs {
		if got[i] != evs[i] {
			t.Errorf("event %d: read back %+v, wrote %+v", i, got[i], evs[i])
		}
	}
	if !strings.HasPrefix(buf.String(), `{"t":1,"action":"segment_alloc","addr":1099511627776,"size":2097152,"stream":0}`+"\n") {
		t.Errorf("first line %q", strings.SplitN(buf.String(), "\n", 2)[0])
	}
	// Invalid UTF-8 is written as U+FFFD.
	buf.Reset()
	w = NewWriter(&buf)
	if err := w.Write(Event{Action: Alloc, Addr: 1, Tenant: "a\xffb"}); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	if got, _, err := readAll(t, buf.Bytes(), "x.jsonl", Options{}); err != nil || got[0].Tenant != "a\ufffdb" {
		t.Errorf("tenant %q, %v", got[0].Tenant, err)
	}
}

func TestWriterRefuses(t *testing.T) {
	w := NewWriter(&bytes.Buffer{})
	for _, ev := range []Event{{}, {Action: numActions}, {Action: Alloc, Device: -1}} {
		if err := w.Write(ev); err == nil {
			t.Errorf("Write(%+v) succeeded", ev)
		}
	}
	fw := NewWriter(failWriter{})
	for i := 0; i < 2000; i++ { // past the buffer
		if err := fw.Write(Event{Action: Alloc, Addr: uint64(i)}); err != nil {
			if !errors.Is(err, errDiskFull) {
				t.Fatalf("error %v", err)
			}
			if err2 := fw.Flush(); !errors.Is(err2, errDiskFull) {
				t.Errorf("Flush after a failed Write: %v", err2)
			}
			return
		}
	}
	t.Error("no error from a failing writer")
}

var errDiskFull = errors.New("disk full")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errDiskFull }

// Concurrent writers never interleave within a line.
func TestWriterConcurrent(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				addr := uint64(g<<20 | i<<4)
				w.Write(Event{Action: Alloc, Addr: addr, Size: 16, Tenant: fmt.Sprint("tenant", g)})
				w.Write(Event{Action: FreeCompleted, Addr: addr, Size: 16, Tenant: fmt.Sprint("tenant", g)})
			}
		}()
	}
	wg.Wait()
	w.Flush()
	evs, _, err := readAll(t, buf.Bytes(), "x.jsonl", Options{})
	if err != nil || len(evs) != 4000 {
		t.Fatalf("%d events, %v", len(evs), err)
	}
}

func TestWriterNoAllocs(t *testing.T) {
	w := NewWriter(bufio.NewWriterSize(&bytes.Buffer{}, 1<<20))
	ev := Event{Action: Alloc, Addr: 139828359974912, Size: 9568, Time: 1700000000123456789, Tenant: "llm", Purpose: "activations"}
	if allocs := testing.AllocsPerRun(1000, func() { w.Write(ev) }); allocs != 0 {
		t.Errorf("%.1f allocations per Write, want 0", allocs)
	}
}

func TestJSONLBadInput(t *testing.T) {
	line := func(s string) string { return `{"action":"alloc","addr":4096,"size":16}` + "\n" + s + "\n" }
	tests := []struct {
		name     string
		src      string
		sentinel error
		parts    []string
	}{
		{"unknown action", line(`{"action":"grow","addr":1,"size":2}`), ErrUnknownAction, []string{"line 2", `"grow"`}},
		{"negative size", line(`{"action":"alloc","addr":8192,"size":-5}`), ErrBadSize, []string{"line 2", "negative size"}},
		{"absurd size", line(`{"action":"alloc","addr":8192,"size":1099511627777}`), ErrBadSize, []string{"line 2", "exceeds"}},
		{"free of unknown address", line(`{"action":"free_completed","addr":8192,"size":16}`), ErrUnknownAddress, []string{"line 2"}},
		{"double alloc", line(`{"action":"alloc","addr":4096,"size":16}`), ErrDoubleAlloc, []string{"line 2"}},
		{"missing action", line(`{"addr":8192,"size":16}`), ErrMalformed, []string{"line 2", `missing "action"`}},
		{"missing addr", line(`{"action":"alloc","size":16}`), ErrMalformed, []string{"line 2", `missing "addr"`}},
		{"missing size", line(`{"action":"alloc","addr":8192}`), ErrMalformed, []string{"line 2", `missing "size"`}},
		{"not an object", line(`["alloc",8192,16]`), ErrMalformed, []string{"line 2", "want a JSON object", "column 1"}},
		{"fraction", line(`{"action":"alloc","addr":8192.5,"size":16}`), ErrMalformed, []string{"line 2", "not a fraction"}},
		{"string number", line(`{"action":"alloc","addr":"8192","size":16}`), ErrMalformed, []string{"line 2", "want an integer"}},
		{"negative addr", line(`{"action":"alloc","addr":-1,"size":16}`), ErrMalformed, []string{"line 2", "negative addr"}},
		{"overflow", line(`{"action":"alloc","addr":18446744073709551616,"size":16}`), ErrMalformed, []string{"line 2", "overflows"}},
		{"t overflow", line(`{"t":9223372036854775808,"action":"alloc","addr":8192,"size":16}`), ErrMalformed, []string{"line 2", "t overflows"}},
		{"unterminated", line(`{"action":"alloc","addr":8192,"size":16,"tenant":"a`), ErrMalformed, []string{"line 2", "unterminated"}},
		{"trailing data", line(`{"action":"alloc","addr":8192,"size":16} x`), ErrMalformed, []string{"line 2", "after the object"}},
		{"missing comma", line(`{"action":"alloc" "addr":8192,"size":16}`), ErrMalformed, []string{"line 2", "want ',' or '}'"}},
		{"bad escape", line(`{"action":"alloc","addr":8192,"size":16,"tenant":"\q"}`), ErrMalformed, []string{"line 2", `bad escape \q`}},
		{"deep unknown value", line(`{"x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `,"action":"alloc","addr":8192,"size":16}`), ErrMalformed, []string{"line 2", "nested deeper"}},
		{"control character", line("{\"action\":\"alloc\",\"addr\":8192,\"size\":16,\"tenant\":\"a\x01\"}"), ErrMalformed, []string{"line 2", "control character"}},
		{"device out of range", line(`{"action":"alloc","addr":8192,"size":16,"device":4294967296}`), ErrMalformed, []string{"line 2", "device"}},
		{"long line", line(`{"action":"alloc","addr":8192,"size":16,"x":"` + strings.Repeat("y", maxLine) + `"}`), ErrLimit, []string{"line 2", "longer than"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := []byte(tt.src + `{"action":"alloc","addr":65536,"size":16}` + "\n")
			evs, _, err := readAll(t, src, "log.jsonl", Options{})
			wantError(t, err, tt.sentinel, append([]string{"trace log.jsonl: "}, tt.parts...)...)
			if len(evs) != 1 {
				t.Errorf("%d events before the error, want 1", len(evs))
			}
			if errors.Is(err, ErrLimit) {
				return
			}
			evs, r, err := readAll(t, src, "log.jsonl", Options{Lenient: true})
			if err != nil || len(evs) != 2 || r.Stats().Skipped != 1 {
				t.Errorf("lenient: %d events, %v, %+v; want 2, one skipped", len(evs), err, r.Stats())
			}
		})
	}
}

func TestJSONLAccepts(t *testing.T) {
	src := " \n" + `{ "t" : -7 , "action" : "alloc" , "addr" : 4096 , "size" : 16 , "extra" : {"a":[1,-2.5e3,true,false,null,"s"]} , "tenant" : "\u00e9\"\/" }` + "\r\n" +
		`{"action":"snapshot","addr":0,"size":0}` + "\n" +
		`{"action":"oom","size":99,"device_free":5}` + "\n" +
		`{"action":"free_completed","addr":4096,"size":16}`
	evs, r, err := readAll(t, []byte(src), "x.jsonl", Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{Action: Alloc, Addr: 4096, Size: 16, Time: -7, Tenant: "é\"/"},
		{Action: OOM, Size: 99, DeviceFree: 5},
		{Action: FreeCompleted, Addr: 4096, Size: 16},
	}
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d", len(evs), len(want))
	}
	for i := range want {
		if evs[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, evs[i], want[i])
		}
	}
	if r.Stats().Ignored != 1 {
		t.Errorf("stats %+v: want the snapshot marker ignored", r.Stats())
	}
}
