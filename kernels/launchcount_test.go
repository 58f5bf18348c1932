package kernels

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/memwall/memwall/device"
)

// launchCounter is a device that counts the kernel launches made through
// it, plain and overlapped, by kernel name. It has the optional
// capabilities of the device it wraps (overlapped launches, a matrix
// library and its workspace) and reports them as that device does, so a Set
// loaded on it takes the paths it would take on that device.
type launchCounter struct {
	device.Device
	mu    sync.Mutex
	names map[device.Function]string
	n     map[string]int
}

// countLaunches wraps d in a launchCounter that prints, at t's cleanup,
// one line per kernel of the module (Names, launched or not) and per other
// name launched:
//
//	KRAN <target> <kernel> <launches>
//
// scripts/gpu/kernels.sh sums them over the check step's tests to show
// that every kernel of every module ran against its twin or reference.
func countLaunches(t testing.TB, d device.Device, target string) *launchCounter {
	c := newLaunchCounter(d)
	t.Cleanup(func() {
		n := c.counts()
		for _, k := range Names() {
			fmt.Printf("KRAN %s %s %d\n", target, k, n[k])
			delete(n, k)
		}
		for _, k := range slices.Sorted(maps.Keys(n)) {
			fmt.Printf("KRAN %s %s %d\n", target, k, n[k])
		}
	})
	return c
}

func newLaunchCounter(d device.Device) *launchCounter {
	return &launchCounter{Device: d, names: map[device.Function]string{}, n: map[string]int{}}
}

// counts returns a copy of the launches per kernel name.
func (c *launchCounter) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *launchCounter) Function(m device.Module, name string) (device.Function, error) {
	f, err := c.Device.Function(m, name)
	if err == nil {
		c.mu.Lock()
		c.names[f] = name
		c.mu.Unlock()
	}
	return f, err
}

func (c *launchCounter) count(f device.Function) {
	c.mu.Lock()
	c.n[c.names[f]]++
	c.mu.Unlock()
}

func (c *launchCounter) Launch(f device.Function, grid, block device.Dim3, shared uint32, s device.Stream, args ...any) error {
	err := c.Device.Launch(f, grid, block, shared, s, args...)
	if err == nil {
		c.count(f)
	}
	return err
}

// LaunchOverlapped and CanOverlap are the wrapped device's
// (ErrUnsupported and false without it).
func (c *launchCounter) LaunchOverlapped(f device.Function, grid, block device.Dim3, shared uint32, s device.Stream, args ...any) error {
	ol, ok := c.Device.(device.OverlapLauncher)
	if !ok {
		return device.ErrUnsupported
	}
	err := ol.LaunchOverlapped(f, grid, block, shared, s, args...)
	if err == nil {
		c.count(f)
	}
	return err
}

func (c *launchCounter) CanOverlap() bool {
	ol, ok := c.Device.(device.OverlapLauncher)
	return ok && ol.CanOverlap()
}

// Gemm, GemmName and GemmWorkspaceBytes are the wrapped device's (a
// library named "", which Load ignores, without it); Gemm counts as
// "(library-gemm)".
func (c *launchCounter) Gemm(dtype string, W, X, Y device.Ptr, M, K, T uint32, s device.Stream) error {
	lib, ok := c.Device.(device.MatmulLibrary)
	if !ok {
		return device.ErrUnsupported
	}
	err := lib.Gemm(dtype, W, X, Y, M, K, T, s)
	if err == nil {
		c.mu.Lock()
		c.n["(library-gemm)"]++
		c.mu.Unlock()
	}
	return err
}

func (c *launchCounter) GemmName() string {
	if lib, ok := c.Device.(device.MatmulLibrary); ok {
		return lib.GemmName()
	}
	return ""
}

func (c *launchCounter) GemmWorkspaceBytes() uint64 {
	if w, ok := c.Device.(interface{ GemmWorkspaceBytes() uint64 }); ok {
		return w.GemmWorkspaceBytes()
	}
	return 0
}

// A Set on a launchCounter counts each launch once under its kernel's
// name, overlapped ones too, and takes the wrapped device's capabilities:
// overlapped launches only where the device offers them.
func TestLaunchCounter(t *testing.T) {
	for _, can := range []bool{false, true} {
		f := &overlapFake{fakeDevice: newFake("cuda"), can: can}
		c := newLaunchCounter(f)
		s, err := Load(c, env(writePTX(t, Names())))
		must(t, err)
		if s.Overlap() != can {
			t.Errorf("device overlaps %v: Set.Overlap %v", can, s.Overlap())
		}
		if c.GemmName() != "" || c.GemmWorkspaceBytes() != 0 || s.GemmWorkspaceBytes() != 0 {
			t.Errorf("no library below: GemmName %q, workspace %d", c.GemmName(), c.GemmWorkspaceBytes())
		}
		before, below, over := c.counts(), len(f.launches), len(f.overlapped)
		st, p := device.Stream(3), device.Ptr(1<<20)
		for range 3 {
			must(t, s.Fill(p, 1000, 7, st))
		}
		must(t, s.Spin(0, st))
		must(t, s.MatmulGroup(BF16, p, 64, 1, []MatmulOp{{p, p, 10}, {p, p, 20}}, st)) // overlapped where the others are
		got := c.counts()
		for k, v := range before {
			got[k] -= v
		}
		want := map[string]int{NameFill: 3, NameSpin: 1, gemvGroupName(BF16): 1}
		for k, v := range got {
			if v != want[k] {
				t.Errorf("overlap %v: %d launches of %s counted, want %d", can, v, k, want[k])
			}
		}
		if n := len(f.launches) - below; n != 5 {
			t.Errorf("overlap %v: %d launches below, want 5", can, n)
		}
		if n := len(f.overlapped) - over; can && n != 5 || !can && n != 0 {
			t.Errorf("overlap %v: %d overlapped launches below", can, n)
		}
		s.Close()
	}
}
