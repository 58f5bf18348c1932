package sim_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
)

// FuzzOps runs random sequences of allocations, virtual-memory mappings,
// copies and memsets against a host model of the same memory: every call
// must succeed exactly when the model says the addresses are valid, data read
// back must match the model, and MemInfo must match the model's accounting.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 10, 0, 0, 20, 0, 2, 0, 3, 5, 7, 3, 0, 0, 9, 4, 0, 1, 1})
	f.Add([]byte{6, 1, 6, 2, 7, 0, 0, 7, 1, 1, 2, 8, 0, 0, 100, 200, 3, 8, 0, 0, 0, 255, 8, 0, 1})
	f.Add([]byte{0, 255, 255, 0, 1, 1, 4, 0, 0, 1, 0, 2, 2, 10, 5, 0, 2, 1})
	f.Add([]byte{6, 0, 7, 0, 0, 9, 0, 2, 8, 0, 1, 2, 3, 8, 0, 0, 1, 1, 8, 0, 1})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 4096 {
			return
		}
		newModel(t).run(prog)
	})
}

const (
	fzGran   = 64 << 10 // granularity
	fzSlots  = 8        // granules in the reservation
	fzTotal  = 4 << 20  // device memory
	fzAllocs = 8
)

type fzAlloc struct {
	p   device.Ptr
	mem []byte
}

type fzChunk struct {
	h        device.PhysMem
	mem      []byte
	maps     int
	released bool
}

type model struct {
	t      *testing.T
	d      *sim.Device
	s      device.Stream
	va     device.Ptr
	allocs []*fzAlloc
	chunks []*fzChunk
	slot   [fzSlots]*fzChunk // chunk mapped at each granule
	start  [fzSlots]bool     // the granule starts a mapping
	used   uint64
	prog   []byte
}

func newModel(t *testing.T) *model {
	o := sim.DefaultOptions()
	o.TotalBytes = fzTotal
	o.Granularity = fzGran
	o.MaxPending = 3
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	m := &model{t: t, d: d}
	var err error
	if m.s, err = d.NewStream(); err != nil {
		t.Fatal(err)
	}
	if m.va, err = d.Reserve(fzSlots * fzGran); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *model) u8() int {
	if len(m.prog) == 0 {
		return 0
	}
	b := m.prog[0]
	m.prog = m.prog[1:]
	return int(b)
}

func (m *model) u16() int { return m.u8() | m.u8()<<8 }

// loc picks an address: an allocation's interior, a virtual address, or an
// unmapped one, and returns the model's bytes for [addr, addr+n) when valid.
func (m *model) loc(n int) (device.Ptr, []func() []byte, bool) {
	kind, idx, off := m.u8()%4, m.u8(), m.u16()
	switch kind {
	case 0, 1:
		if len(m.allocs) == 0 {
			return 0x1000, nil, false
		}
		// An offset past the end of one allocation may land in another.
		p := m.allocs[idx%len(m.allocs)].p + device.Ptr(off)
		for _, a := range m.allocs {
			if p >= a.p && uint64(p-a.p) < uint64(len(a.mem)) {
				lo := int(p - a.p)
				if lo+n > len(a.mem) {
					return p, nil, false
				}
				return p, []func() []byte{func() []byte { return a.mem[lo : lo+n] }}, true
			}
		}
		return p, nil, false
	case 2:
		at := max(0, (idx%fzSlots)*fzGran+off%fzGran-fzGran/2)
		p := m.va + device.Ptr(at)
		if at+n > fzSlots*fzGran {
			return p, nil, false
		}
		var parts []func() []byte
		for n > 0 {
			g := at / fzGran
			c := m.slot[g]
			if c == nil {
				return p, nil, false
			}
			// Offset inside the chunk: from the granule where it starts.
			first := g
			for !m.start[first] {
				first--
			}
			lo := at - first*fzGran
			k := min(n, (g+1)*fzGran-at)
			parts = append(parts, func() []byte { return c.mem[lo : lo+k] })
			at += k
			n -= k
		}
		return p, parts, true
	default:
		return device.Ptr(0x100000 + off), nil, false
	}
}

func (m *model) wantErr(what string, err error, valid bool) bool {
	m.t.Helper()
	switch {
	case valid && err != nil:
		m.t.Fatalf("%s: model says valid, device says %v", what, err)
	case !valid && err == nil:
		m.t.Fatalf("%s: model says invalid, device accepted it", what)
	case !valid && !errors.Is(err, device.ErrInvalid) && !errors.Is(err, device.ErrOutOfMemory):
		m.t.Fatalf("%s: error %v wraps neither ErrInvalid nor ErrOutOfMemory", what, err)
	}
	return valid
}

func gather(parts []func() []byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p()...)
	}
	return b
}

func scatter(parts []func() []byte, b []byte) {
	for _, p := range parts {
		b = b[copy(p(), b):]
	}
}

func (m *model) run(prog []byte) {
	m.prog = prog
	t, d, s := m.t, m.d, m.s
	for len(m.prog) > 0 {
		switch op := m.u8() % 11; op {
		case 0: // alloc
			n := 1 + m.u16()*16
			p, err := d.Alloc(uint64(n))
			charge := uint64(n+511) &^ 511
			if !m.wantErr("alloc", err, m.used+charge <= fzTotal) {
				if !errors.Is(err, device.ErrOutOfMemory) {
					t.Fatalf("alloc failure %v is not ErrOutOfMemory", err)
				}
				break
			}
			if len(m.allocs) >= fzAllocs {
				m.wantErr("free", d.Free(p), true)
				break
			}
			m.allocs = append(m.allocs, &fzAlloc{p: p, mem: make([]byte, n)})
			m.used += charge
		case 1: // free, or a bad free
			i := m.u8()
			if len(m.allocs) == 0 {
				m.wantErr("free of nothing", d.Free(0x7f0000000000+device.Ptr(i)), false)
				break
			}
			a := m.allocs[i%len(m.allocs)]
			if i&128 != 0 {
				m.wantErr("interior free", d.Free(a.p+1+device.Ptr(i%7)), false)
				break
			}
			m.wantErr("free", d.Free(a.p), true)
			m.allocs = append(m.allocs[:i%len(m.allocs)], m.allocs[i%len(m.allocs)+1:]...)
			m.used -= uint64(len(a.mem)+511) &^ 511
		case 2: // H2D
			n := 1 + m.u16()%20000
			p, parts, valid := m.loc(n)
			src := bytes.Repeat([]byte{byte(m.u8() | 1)}, n)
			if m.wantErr("H2D", d.CopyHtoD(p, src, s), valid) {
				scatter(parts, src)
			}
		case 3: // D2H, checked at once
			n := 1 + m.u16()%20000
			p, parts, valid := m.loc(n)
			out := make([]byte, n)
			if m.wantErr("D2H", d.CopyDtoH(out, p, s), valid) {
				if err := d.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				if want := gather(parts); !bytes.Equal(out, want) {
					t.Fatalf("D2H of %d bytes at %#x differs from the model", n, uint64(p))
				}
			}
		case 4: // D2D
			n := 1 + m.u16()%20000
			sp, sparts, sok := m.loc(n)
			dp, dparts, dok := m.loc(n)
			if m.wantErr("D2D", d.CopyDtoD(dp, sp, uint64(n), s), sok && dok) {
				scatter(dparts, gather(sparts))
			}
		case 5: // memset8 / memset32
			n := 1 + m.u16()%20000
			v := byte(m.u8())
			p, parts, valid := m.loc(n)
			if p%4 == 0 && n%4 == 0 && v&1 == 0 {
				if m.wantErr("memset32", d.Memset32(p, uint32(v)*0x01010101, uint64(n/4), s), valid) {
					scatter(parts, bytes.Repeat([]byte{v}, n))
				}
			} else if m.wantErr("memset8", d.Memset8(p, v, uint64(n), s), valid) {
				scatter(parts, bytes.Repeat([]byte{v}, n))
			}
		case 6: // create a chunk of 1 or 2 granules
			size := uint64(1+m.u8()%2) * fzGran
			h, err := d.CreatePhysical(size)
			if m.wantErr("create physical", err, m.used+size <= fzTotal) {
				if len(m.chunks) >= 8 {
					m.wantErr("release", d.ReleasePhysical(h), true)
					break
				}
				m.chunks = append(m.chunks, &fzChunk{h: h, mem: make([]byte, size)})
				m.used += size
			}
		case 7: // map a chunk at a granule
			ci, g := m.u8(), m.u8()%fzSlots
			if len(m.chunks) == 0 {
				m.wantErr("map nothing", d.Map(m.va, fzGran, 12345), false)
				break
			}
			c := m.chunks[ci%len(m.chunks)]
			k := len(c.mem) / fzGran
			valid := !c.released && g+k <= fzSlots
			for i := g; valid && i < g+k; i++ {
				valid = m.slot[i] == nil
			}
			if m.wantErr("map", d.Map(m.va+device.Ptr(g*fzGran), uint64(len(c.mem)), c.h), valid) {
				for i := g; i < g+k; i++ {
					m.slot[i] = c
				}
				m.start[g] = true
				c.maps++
			}
		case 8: // unmap granules [g, g+k)
			g, k := m.u8()%fzSlots, 1+m.u8()%3
			valid := g+k <= fzSlots && m.start[g] && (g+k == fzSlots || m.slot[g+k] == nil || m.start[g+k])
			for i := g; valid && i < g+k; i++ {
				valid = m.slot[i] != nil
			}
			if m.wantErr("unmap", d.Unmap(m.va+device.Ptr(g*fzGran), uint64(k*fzGran)), valid) {
				for i := g; i < g+k; i++ {
					if m.start[i] {
						c := m.slot[i]
						c.maps--
						if c.released && c.maps == 0 {
							m.used -= uint64(len(c.mem))
						}
					}
					m.slot[i], m.start[i] = nil, false
				}
			}
		case 9: // release a chunk
			ci := m.u8()
			if len(m.chunks) == 0 {
				break
			}
			c := m.chunks[ci%len(m.chunks)]
			if m.wantErr("release", d.ReleasePhysical(c.h), !c.released) {
				c.released = true
				if c.maps == 0 {
					m.used -= uint64(len(c.mem))
				}
			}
		case 10: // synchronize
			if err := d.Synchronize(); err != nil {
				t.Fatalf("synchronize: %v", err)
			}
		}
		free, total, err := d.MemInfo()
		if err != nil || total != fzTotal || free != fzTotal-m.used {
			t.Fatalf("MemInfo = %d, %d, %v; model has %d of %d used", free, total, err, m.used, fzTotal)
		}
	}
	if err := d.Synchronize(); err != nil {
		t.Fatalf("final synchronize: %v", err)
	}
}
