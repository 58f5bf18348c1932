package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/memwall/memwall/trace"
	"github.com/memwall/memwall/viz"
)

// traceOOM is a trace's first out-of-memory event (an OOM snapshot's last)
// with the allocator's memory at that moment as the trace records it: the
// segments it held and the blocks live in them.
type traceOOM struct {
	Requested  uint64 `json:"requested_bytes"`
	DeviceFree uint64 `json:"device_free_bytes"`
	// Reserved is what the trace's segments held (0 when it records
	// none); Live the bytes of LiveBlocks blocks allocated and not freed.
	Reserved   uint64 `json:"reserved_bytes"`
	Live       uint64 `json:"live_bytes"`
	LiveBlocks int    `json:"live_blocks"`
	// Event is the event's index among the trace's events (from 0).
	Event int64 `json:"event"`

	segments, blocks []addrSpan
}

type addrSpan struct{ addr, size uint64 }

// readOOM reads the trace at path (named name: see loadTrace) for its
// first oom event (nil when it has none), keeping the segments and live
// blocks as it goes. Blocks are freed at free_completed; a free of an
// unknown block is ignored (a snapshot's history may begin after the
// allocation).
func readOOM(path, name string, lenient bool) (*traceOOM, error) {
	r, done, err := openTrace(path, name, lenient)
	if err != nil {
		return nil, err
	}
	defer done()
	segs := map[uint64]uint64{}
	live := map[uint64]uint64{}
	for n := int64(0); ; n++ {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		switch ev.Action {
		case trace.SegmentAlloc, trace.SegmentMap:
			segs[ev.Addr] = ev.Size
		case trace.SegmentFree, trace.SegmentUnmap:
			delete(segs, ev.Addr)
		case trace.Alloc:
			live[ev.Addr] = ev.Size
		case trace.FreeCompleted:
			delete(live, ev.Addr)
		case trace.OOM:
			o := &traceOOM{Requested: ev.Size, DeviceFree: ev.DeviceFree, LiveBlocks: len(live), Event: n}
			for a, s := range segs {
				o.Reserved += s
				o.segments = append(o.segments, addrSpan{a, s})
			}
			for a, s := range live {
				o.Live += s
				o.blocks = append(o.blocks, addrSpan{a, s})
			}
			byAddr := func(x, y addrSpan) int { return cmp.Compare(x.addr, y.addr) }
			slices.SortFunc(o.segments, byAddr)
			slices.SortFunc(o.blocks, byAddr)
			return o, nil
		}
	}
}

// note is the line the human report and the page show.
func (o *traceOOM) note() string {
	s := fmt.Sprintf("out of memory at event %d: a request of %s failed with %s free on the device; %s live in %d blocks",
		o.Event, humanBytes(o.Requested), humanBytes(o.DeviceFree), humanBytes(o.Live), o.LiveBlocks)
	if len(o.segments) > 0 {
		s += fmt.Sprintf(", %s reserved in %d segments", humanBytes(o.Reserved), len(o.segments))
	}
	return s + "."
}

// picture is the allocator's memory at the failure as an address map: the
// segments laid end to end in address order (the gaps between them are
// other memory), each live block at its place in its segment. Without
// segments the blocks are laid end to end alike. Spans past what the page
// draws are left out.
func (o *traceOOM) picture() *viz.ReplayMap {
	m := &viz.ReplayMap{Heading: fmt.Sprintf("the allocator's memory when %s was refused (segments end to end; blue: live blocks, orange: free in a segment)", humanBytes(o.Requested))}
	const most = 1 << 19
	segs := o.segments
	if len(segs) == 0 {
		segs = o.blocks
	}
	off := uint64(0)
	bi := 0
	for _, sg := range segs {
		if len(m.Reserved)+len(m.Blocks) >= most {
			break
		}
		m.Reserved = append(m.Reserved, viz.ReplaySpan{Off: off, Size: sg.size})
		for bi < len(o.blocks) && o.blocks[bi].addr < sg.addr {
			bi++ // a block outside every segment: not drawn
		}
		for ; bi < len(o.blocks) && o.blocks[bi].addr < sg.addr+sg.size; bi++ {
			b := o.blocks[bi]
			size := min(b.size, sg.addr+sg.size-b.addr)
			m.Blocks = append(m.Blocks, viz.ReplaySpan{Off: off + b.addr - sg.addr, Size: size})
		}
		off += sg.size
	}
	return m
}

// reportEmptyOOM reports an out-of-memory snapshot that holds no
// allocation (the pool held no block): the failure, and with --html a
// page of it.
func reportEmptyOOM(e *env, path string, events int64, oom *traceOOM, hf *outputFile, asJSON bool) error {
	if hf != nil {
		pic := viz.ReplayPicture{Title: "memwall replay: " + filepath.Base(path),
			Notes: []string{fmt.Sprintf("%d events, no allocation to replay.", events), oom.note()}, Map: oom.picture()}
		var buf bytes.Buffer
		if err := viz.ReplayHTML(&buf, pic); err != nil {
			return fmt.Errorf("html: %w", err)
		}
		if err := hf.write(buf.Bytes()); err != nil {
			return err
		}
	}
	if asJSON {
		return writeJSON(e.stdout, map[string]any{"trace": filepath.Base(path), "events": events, "allocs": 0, "oom": oom})
	}
	fmt.Fprintf(e.stdout, "trace %s: %d events, no allocation to replay\n%s\n", filepath.Base(path), events, oom.note())
	if hf != nil {
		fmt.Fprintf(e.stdout, "\nwrote %s\n", hf)
	}
	return nil
}
