package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/viz"
)

// FuzzReplayOOM reads arbitrary event logs for their out-of-memory
// event: no panic; when there is one, its picture draws (viz accepts it)
// and lays every block inside a segment of the map, the segments end to
// end, and its figures add up (live bytes the sum of the blocks').
func FuzzReplayOOM(f *testing.F) {
	f.Add([]byte(`{"action":"segment_alloc","addr":4096,"size":8192}
{"action":"alloc","addr":4096,"size":100}
{"action":"alloc","addr":8192,"size":4096}
{"action":"free_requested","addr":4096,"size":100}
{"action":"free_completed","addr":4096,"size":100}
{"action":"oom","size":1048576,"device_free":0}
`))
	f.Add([]byte(`{"action":"oom","size":1,"device_free":5}
`))
	f.Add([]byte(`{"action":"segment_alloc","addr":0,"size":10}
{"action":"segment_alloc","addr":5,"size":10}
{"action":"alloc","addr":3,"size":20}
{"action":"alloc","addr":100,"size":1}
{"action":"oom","size":7}
`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "oom.jsonl")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, lenient := range []bool{false, true} {
			oom, err := readOOM(path, path, lenient)
			if err != nil || oom == nil {
				continue
			}
			var live uint64
			for _, b := range oom.blocks {
				live += b.size
			}
			if live != oom.Live || len(oom.blocks) != oom.LiveBlocks {
				t.Fatalf("live %d in %d blocks, the blocks sum to %d in %d", oom.Live, oom.LiveBlocks, live, len(oom.blocks))
			}
			m := oom.picture()
			var end uint64
			for _, r := range m.Reserved {
				if r.Off != end {
					t.Fatalf("segment at %d, want the last one's end %d", r.Off, end)
				}
				end += r.Size
			}
			for _, b := range m.Blocks {
				inside := false
				for _, r := range m.Reserved {
					inside = inside || b.Off >= r.Off && b.Off+b.Size <= r.Off+r.Size
				}
				if !inside {
					t.Fatalf("block %+v outside every segment of %+v", b, m.Reserved)
				}
			}
			var buf bytes.Buffer
			if err := viz.ReplayHTML(&buf, viz.ReplayPicture{Title: "t", Notes: []string{oom.note()}, Map: m}); err != nil {
				t.Fatalf("the picture does not draw: %v", err)
			}
		}
	})
}
