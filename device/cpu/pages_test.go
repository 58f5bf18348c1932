//go:build unix

package cpu

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/memwall/memwall/device"
)

func TestParsePages(t *testing.T) {
	for _, p := range []Pages{PagesPopulate, PagesLazy, PagesHuge} {
		got, err := ParsePages(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePages(%q) = %v, %v", p.String(), got, err)
		}
	}
	if p, err := ParsePages(""); err != nil || p != PagesPopulate {
		t.Errorf(`ParsePages("") = %v, %v, want populate`, p, err)
	}
	if _, err := ParsePages("always"); err == nil {
		t.Error(`ParsePages("always") accepted`)
	}
}

func TestAlignedHuge(t *testing.T) {
	buf := make([]byte, 3*hugeBytes+8192)
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		lo := r.IntN(len(buf))
		hi := lo + r.IntN(len(buf)-lo+1)
		b := buf[lo:hi]
		a := alignedHuge(b)
		if len(a) == 0 {
			continue
		}
		start := uint64(addr(a)) - uint64(addr(b))
		if uint64(addr(a))%hugeBytes != 0 || uint64(len(a))%hugeBytes != 0 || start+uint64(len(a)) > uint64(len(b)) {
			t.Fatalf("alignedHuge of [%d,%d): %d bytes at offset %d", lo, hi, len(a), start)
		}
		if start >= hugeBytes || uint64(len(b))-start-uint64(len(a)) >= hugeBytes {
			t.Fatalf("alignedHuge of [%d,%d) left a whole huge page out", lo, hi)
		}
	}
}

// Registering a file's read-only mapping in every mode keeps its bytes as
// they are and the range readable by copies.
func TestRegisterPages(t *testing.T) {
	data := make([]byte, 5*hugeBytes+12345)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	path := filepath.Join(t.TempDir(), "w.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Pages{PagesPopulate, PagesLazy, PagesHuge} {
		t.Run(mode.String(), func(t *testing.T) {
			m := mapFileRO(t, path)
			d, err := New(Options{Pages: mode, Workers: 3})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			off := r.IntN(4096)
			hb, err := d.HostRegister(m[off:], device.RegisterReadOnly)
			if err != nil {
				t.Fatal(err)
			}
			st, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(m)-off)
			if err := d.CopyDtoH(got, hb.DevicePtr, st); err != nil {
				t.Fatal(err)
			}
			if err := d.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if string(got) != string(data[off:]) {
				t.Fatal("registered bytes changed")
			}
			if err := d.HostFree(hb); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// mapFileRO maps the file at path read-only and shared, as the model loader
// does.
func mapFileRO(t *testing.T, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}
