//go:build linux

package vulkan

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// xferResult is one measured transfer candidate.
type xferResult struct {
	Family int     `json:"family"`
	Flags  string  `json:"family_flags"`
	Host   string  `json:"host"` // cached, uncached, imported ("" for d2d)
	Mode   string  `json:"mode"`
	Dir    string  `json:"dir"`
	Timing string  `json:"timing"` // events (timestamps) or wall (host clock)
	Bytes  uint64  `json:"bytes"`
	GBps   float64 `json:"GBps"` // median
	Best   float64 `json:"best_GBps"`
}

// TestTransferCandidates measures the ways to copy between host and device
// memory that the default copy path could take, so that one GPU run picks
// it from numbers: every queue family that can copy; host memory of the
// cached type, the uncached one and imported with
// VK_EXT_external_memory_host; one region, 16 regions in one command, 16
// submissions, the copy split over 2 or 4 queues of the family; timed by
// timestamps on the copying queue and by the host clock. D2D runs on the
// family's queue with vkCmdCopyBuffer. MEMWALL_VULKAN_XFER=1 runs it
// (MEMWALL_VULKAN_XFER_MIB sets the size, 256 by default;
// MEMWALL_VULKAN_XFER_OUT a JSON file for the results).
func TestTransferCandidates(t *testing.T) {
	if os.Getenv("MEMWALL_VULKAN_XFER") == "" {
		t.Skip("MEMWALL_VULKAN_XFER=1 runs the transfer candidates (a GPU measurement)")
	}
	mib := 256
	if v := os.Getenv("MEMWALL_VULKAN_XFER_MIB"); v != "" {
		var err error
		if mib, err = strconv.Atoi(v); err != nil || mib < 16 || mib%16 != 0 {
			t.Fatalf("MEMWALL_VULKAN_XFER_MIB=%q: want a multiple of 16", v)
		}
	}
	n := uint64(mib) << 20
	probe, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	fams := probe.picked.queues
	probe.Close()
	var all []xferResult
	for f, q := range fams {
		if q.count == 0 || q.flags&(queueTransfer|queueCompute|queueGraphics) == 0 {
			continue
		}
		rs, err := measureFamily(f, n)
		if err != nil {
			t.Errorf("family %d: %v", f, err)
			continue
		}
		all = append(all, rs...)
	}
	for _, r := range all {
		t.Logf("family %d %-40s %-8s %-11s %-3s %-6s %8.2f GB/s (best %.2f)", r.Family, r.Flags, r.Host, r.Mode, r.Dir, r.Timing, r.GBps, r.Best)
	}
	if p := os.Getenv("MEMWALL_VULKAN_XFER_OUT"); p != "" {
		b, _ := json.MarshalIndent(all, "", "  ")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Error(err)
		}
	}
}

// measureFamily opens the device with copies on family f and measures
// every candidate on it.
func measureFamily(f int, n uint64) ([]xferResult, error) {
	d, err := Open(Options{copyFamily: f + 1})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	d.copyQueues = 1 // the plain streams copy on one queue; CopyQueues streams below
	flags := strings.Join(flagNames(d.picked.queues[f].flags, queueFlagNames), "|")
	devA, err := d.Alloc(n)
	if err != nil {
		return nil, err
	}
	devB, err := d.Alloc(n)
	if err != nil {
		return nil, err
	}
	hosts, release, err := candidateHosts(d, n)
	defer release()
	if err != nil {
		return nil, err
	}
	nq := len(d.transfer.queues)
	var streams []device.Stream
	for range max(nq, 1) {
		s, err := d.NewStream()
		if err != nil {
			return nil, err
		}
		streams = append(streams, s)
	}
	e0, _ := d.NewEvent(true)
	e1, _ := d.NewEvent(true)
	// Streams whose copies CopyHtoD and CopyDtoH split over 2 and 4 queues.
	splitStreams := map[int]device.Stream{}
	for _, k := range []int{2, 4} {
		if nq >= k {
			d.copyQueues = k
			s, err := d.NewStream()
			if err != nil {
				return nil, err
			}
			splitStreams[k] = s
		}
	}
	d.copyQueues = 1
	var out []xferResult
	add := func(host, mode, dir string, op func() error, split bool) error {
		ss := streams
		if k := strings.TrimPrefix(mode, "CopyQueues "); k != mode {
			kk, _ := strconv.Atoi(k)
			ss = []device.Stream{splitStreams[kk]}
		}
		ev, wall, err := timeOp(d, ss, e0, e1, op, split, n)
		if err != nil {
			return fmt.Errorf("%s %s %s: %w", host, mode, dir, err)
		}
		for _, m := range []struct {
			timing string
			gbps   []float64
		}{{"events", ev}, {"wall", wall}} {
			if len(m.gbps) == 0 {
				continue
			}
			slices.Sort(m.gbps)
			out = append(out, xferResult{Family: f, Flags: flags, Host: host, Mode: mode, Dir: dir, Timing: m.timing, Bytes: n,
				GBps: m.gbps[len(m.gbps)/2], Best: m.gbps[len(m.gbps)-1]})
		}
		return nil
	}
	for _, h := range hosts {
		for _, dir := range []string{"h2d", "d2h"} {
			for _, m := range copyModes(d, streams, h.buf, devA, dir, n) {
				if err := add(h.name, m.name, dir, m.op, m.split); err != nil {
					return out, err
				}
			}
			for _, k := range []int{2, 4} {
				s, ok := splitStreams[k]
				if !ok {
					continue
				}
				buf := h.buf
				op := func() error {
					if dir == "h2d" {
						return d.CopyHtoD(devA, buf, s)
					}
					return d.CopyDtoH(buf, devA, s)
				}
				if err := add(h.name, fmt.Sprintf("CopyQueues %d", k), dir, op, false); err != nil {
					return out, err
				}
			}
		}
	}
	s := streams[0]
	for _, q := range []struct {
		name string
		q    func(*stream) *queue
	}{{"copy queue", func(s *stream) *queue { return s.tq }}, {"compute queue", func(s *stream) *queue { return s.cq }}} {
		op := func() error {
			return d.op("d2d", s, func(st *stream) error {
				from, _ := d.resolve("d2d", devA, n)
				to, _ := d.resolve("d2d", devB, n)
				_, err := d.submit(st, q.q(st), d.copyCmd(from.buf, to.buf, from.off, to.off, n))
				return err
			})
		}
		if err := add("", "1 region, "+q.name, "d2d", op, false); err != nil {
			return out, err
		}
	}
	if !d.hasBDA {
		return out, nil
	}
	m, err := d.LoadModule(copyModule)
	if err != nil {
		return out, err
	}
	fn, err := d.Function(m, copyEntry)
	if err != nil {
		return out, err
	}
	if err := add("", "CopyDtoD (the default)", "d2d", func() error { return d.CopyDtoD(devB, devA, n, s) }, false); err != nil {
		return out, err
	}
	for _, g := range []uint32{1056, 4224, 16896, 65536} {
		op := func() error {
			return d.Launch(fn, device.Dim3{X: g, Y: 1, Z: 1}, device.Dim3{X: 256, Y: 1, Z: 1}, 0, s, devB, devA, n/16)
		}
		if err := add("", fmt.Sprintf("shader copy, %d groups", g), "d2d", op, false); err != nil {
			return out, err
		}
	}
	return out, nil
}

type hostCandidate struct {
	name string
	buf  []byte
}

// candidateHosts allocates n bytes of host memory four ways: HostAlloc's
// type (cached where offered), the coherent type without host caching,
// and anonymous pages imported with VK_EXT_external_memory_host, of 4 KiB
// and of transparent huge pages.
func candidateHosts(d *Device, n uint64) ([]hostCandidate, func(), error) {
	var frees []func()
	release := func() { // last taken, first given back
		for i := len(frees) - 1; i >= 0; i-- {
			frees[i]()
		}
	}
	var out []hostCandidate
	hb, err := d.HostAlloc(n)
	if err != nil {
		return nil, release, err
	}
	frees = append(frees, func() { d.HostFree(hb) })
	out = append(out, hostCandidate{"cached", hb.Bytes})
	m := &d.memProps
	for i := range m.typeCount {
		fl := m.types[i].flags
		if i != d.hostType && fl&(memHostVisible|memHostCoherent) == memHostVisible|memHostCoherent && fl&(memHostCached|memDeviceLocal) == 0 {
			keep := d.hostType
			d.hostType = i
			hb, err := d.HostAlloc(n)
			d.hostType = keep
			if err == nil {
				frees = append(frees, func() { d.HostFree(hb) })
				out = append(out, hostCandidate{"uncached", hb.Bytes})
			}
			break
		}
	}
	for _, huge := range []bool{false, true} {
		if !d.hasHostImport {
			break
		}
		mem, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			continue
		}
		frees = append(frees, func() { syscall.Munmap(mem) })
		name := "imported"
		if huge { // transparent huge pages: 2 MiB pieces of contiguous memory
			if syscall.Madvise(mem, 14 /* MADV_HUGEPAGE */) != nil {
				continue
			}
			name = "imp-thp"
		}
		for i := range mem {
			mem[i] = byte(i)
		}
		hb, err := d.HostRegister(mem, 0)
		if err == nil {
			frees = append(frees, func() { d.HostFree(hb) })
			out = append(out, hostCandidate{name, mem})
		}
	}
	return out, release, nil
}

type copyMode struct {
	name  string
	op    func() error
	split bool // runs on several streams: timed by the host clock only
}

// copyModes are the ways of moving n bytes between host and dev.
func copyModes(d *Device, streams []device.Stream, host []byte, dev device.Ptr, dir string, n uint64) []copyMode {
	cp := func(s device.Stream, off, m uint64) error {
		if dir == "h2d" {
			return d.CopyHtoD(dev.Add(off), host[off:off+m], s)
		}
		return d.CopyDtoH(host[off:off+m], dev.Add(off), s)
	}
	s := streams[0]
	modes := []copyMode{
		{"1 region", func() error { return cp(s, 0, n) }, false},
		{"16 regions", func() error {
			return d.op("regions", s, func(st *stream) error {
				h, _ := d.hostSpan(host)
				g, _ := d.resolve("regions", dev, n)
				src, dst, so, do := h.buf, g.buf, h.off, g.off
				if dir == "d2h" {
					src, dst, so, do = g.buf, h.buf, g.off, h.off
				}
				regions := make([]bufferCopy, 16)
				for i := range regions {
					k := n / 16 * uint64(i)
					regions[i] = bufferCopy{srcOffset: so + k, dstOffset: do + k, size: n / 16}
				}
				_, err := d.submit(st, st.tq, func(cb uintptr) {
					callVoid(d.vk.cmdCopyBuffer, cb, uintptr(src), uintptr(dst), 16, uintptr(unsafe.Pointer(&regions[0])))
				})
				return err
			})
		}, false},
		{"16 submits", func() error {
			for i := uint64(0); i < 16; i++ {
				if err := cp(s, n/16*i, n/16); err != nil {
					return err
				}
			}
			return nil
		}, false},
	}
	for _, k := range []int{2, 4} {
		if len(streams) < k {
			break
		}
		modes = append(modes, copyMode{fmt.Sprintf("%d queues", k), func() error {
			part := n / uint64(k)
			for i := range k {
				if err := cp(streams[i], part*uint64(i), part); err != nil {
					return err
				}
			}
			return nil
		}, true})
	}
	return modes
}

// timeOp runs op once to warm up and then 7 times, timed by events on
// stream 0 (unless split) and by the host clock from the first
// submission to the end of the wait; it returns GB/s of both for n bytes.
func timeOp(d *Device, streams []device.Stream, e0, e1 device.Event, op func() error, split bool, n uint64) (ev, wall []float64, err error) {
	gbps := func(sec float64) float64 { return float64(n) / max(sec, 1e-9) / 1e9 }
	sync := func() error {
		for _, s := range streams {
			if err := d.StreamSynchronize(s); err != nil {
				return err
			}
		}
		return nil
	}
	if err := op(); err != nil {
		return nil, nil, err
	}
	if err := sync(); err != nil {
		return nil, nil, err
	}
	for range 7 {
		if !split {
			if err := d.EventRecord(e0, streams[0]); err != nil {
				return nil, nil, err
			}
		}
		t0 := time.Now()
		if err := op(); err != nil {
			return nil, nil, err
		}
		if !split {
			if err := d.EventRecord(e1, streams[0]); err != nil {
				return nil, nil, err
			}
		}
		if err := sync(); err != nil {
			return nil, nil, err
		}
		w := time.Since(t0)
		wall = append(wall, gbps(w.Seconds()))
		if !split {
			el, err := d.EventElapsed(e0, e1)
			if err != nil {
				return nil, nil, err
			}
			ev = append(ev, gbps(el.Seconds()))
		}
	}
	return ev, wall, nil
}
