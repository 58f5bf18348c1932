package cuda

import (
	"fmt"
	"unsafe"

	"github.com/memwall/memwall/device"
)

var _ device.Grapher = (*Device)(nil)

// CUstreamCaptureMode: CU_STREAM_CAPTURE_MODE_RELAXED lets other threads
// (other goroutines' driver calls, on their own streams) go on while one
// stream captures; the global mode would fail their cuMemAlloc.
const captureModeRelaxed = 2

// CUstreamCaptureStatus values.
const (
	captureStatusNone        = 0
	captureStatusActive      = 1
	captureStatusInvalidated = 2
)

// graphSymbols reports whether the driver exports what BeginCapture,
// EndCapture, LaunchGraph and DestroyGraph call.
func (c *Device) graphSymbols() bool {
	d := c.d
	return d.cuStreamBeginCapture != 0 && d.cuStreamEndCapture != 0 && d.cuStreamIsCapturing != 0 &&
		(d.cuGraphInstantiateWithFlags != 0 || d.cuGraphInstantiate != 0) &&
		d.cuGraphLaunch != 0 && d.cuGraphExecDestroy != 0 && d.cuGraphDestroy != 0
}

// CanGraph reports whether stream capture and graph launches are bound
// (CUDA 11.4 and newer drivers export every symbol; see device.Grapher).
func (c *Device) CanGraph() bool { return c.kernelsOK("graph") == nil && c.graphSymbols() }

// BeginCapture starts capturing s in relaxed mode (cuStreamBeginCapture_v2,
// CU_STREAM_CAPTURE_MODE_RELAXED): the calls device.Grapher forbids on s
// fail or invalidate the capture, and other streams keep running.
func (c *Device) BeginCapture(s device.Stream) error {
	if !c.CanGraph() {
		return fmt.Errorf("cuda: begin capture: the driver lacks the graph API: %w", device.ErrUnsupported)
	}
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.capturing == nil {
		c.capturing = map[device.Stream]struct{}{}
	}
	if _, busy := c.capturing[s]; busy {
		c.mu.Unlock()
		return fmt.Errorf("cuda: begin capture: stream %#x is already capturing: %w", uint64(s), device.ErrInvalid)
	}
	c.capturing[s] = struct{}{}
	c.mu.Unlock()
	if err := c.call("cuStreamBeginCapture_v2", c.d.cuStreamBeginCapture, h, captureModeRelaxed); err != nil {
		c.endCapturing(s)
		return fmt.Errorf("cuda: %w", err)
	}
	return nil
}

func (c *Device) endCapturing(s device.Stream) {
	c.mu.Lock()
	delete(c.capturing, s)
	c.mu.Unlock()
}

// Capturing reports whether s is capturing now, as the driver sees it
// (cuStreamIsCapturing); an invalidated capture reports true with an error.
func (c *Device) Capturing(s device.Stream) (bool, error) {
	if !c.CanGraph() {
		return false, nil
	}
	h, err := c.stream(s)
	if err != nil {
		return false, err
	}
	var st int32
	if err := c.call("cuStreamIsCapturing", c.d.cuStreamIsCapturing, h, uintptr(unsafe.Pointer(&st))); err != nil {
		return false, fmt.Errorf("cuda: %w", err)
	}
	switch st {
	case captureStatusNone:
		return false, nil
	case captureStatusActive:
		return true, nil
	}
	return true, fmt.Errorf("cuda: stream %#x: capture invalidated (status %d): %w", uint64(s), st, device.ErrInvalid)
}

// EndCapture ends the capture on s (cuStreamEndCapture), instantiates the
// graph (cuGraphInstantiateWithFlags, else cuGraphInstantiate_v2) and frees
// the graph template: the returned handle is the executable graph.
func (c *Device) EndCapture(s device.Stream) (device.Graph, error) {
	h, err := c.stream(s)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	_, ok := c.capturing[s]
	c.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("cuda: end capture: stream %#x is not capturing: %w", uint64(s), device.ErrInvalid)
	}
	defer c.endCapturing(s)
	var g uintptr
	if err := c.call("cuStreamEndCapture", c.d.cuStreamEndCapture, h, uintptr(unsafe.Pointer(&g))); err != nil {
		if g != 0 {
			_ = c.call("cuGraphDestroy", c.d.cuGraphDestroy, g)
		}
		return 0, fmt.Errorf("cuda: %w", err)
	}
	if g == 0 {
		return 0, fmt.Errorf("cuda: end capture: the driver returned no graph: %w", device.ErrInvalid)
	}
	var exec uintptr
	if c.d.cuGraphInstantiateWithFlags != 0 {
		err = c.call("cuGraphInstantiateWithFlags", c.d.cuGraphInstantiateWithFlags, uintptr(unsafe.Pointer(&exec)), g, 0)
	} else {
		err = c.call("cuGraphInstantiate_v2", c.d.cuGraphInstantiate, uintptr(unsafe.Pointer(&exec)), g, 0, 0, 0)
	}
	if derr := c.call("cuGraphDestroy", c.d.cuGraphDestroy, g); derr != nil && err == nil && exec != 0 {
		_ = c.call("cuGraphExecDestroy", c.d.cuGraphExecDestroy, exec)
		return 0, fmt.Errorf("cuda: %w", derr)
	}
	if err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	c.mu.Lock()
	if c.graphs == nil {
		c.graphs = map[device.Graph]struct{}{}
	}
	c.graphs[device.Graph(exec)] = struct{}{}
	c.mu.Unlock()
	return device.Graph(exec), nil
}

func (c *Device) graph(g device.Graph) (uintptr, error) {
	c.mu.Lock()
	_, ok := c.graphs[g]
	c.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("cuda: unknown graph %#x: %w", uint64(g), device.ErrInvalid)
	}
	return uintptr(g), nil
}

// LaunchGraph queues a replay of g on s (cuGraphLaunch).
func (c *Device) LaunchGraph(g device.Graph, s device.Stream) error {
	hg, err := c.graph(g)
	if err != nil {
		return err
	}
	hs, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("cuGraphLaunch", c.d.cuGraphLaunch, hg, hs)
}

// DestroyGraph frees g (cuGraphExecDestroy); queued replays complete.
func (c *Device) DestroyGraph(g device.Graph) error {
	hg, err := c.graph(g)
	if err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.graphs, g)
	c.mu.Unlock()
	return c.call("cuGraphExecDestroy", c.d.cuGraphExecDestroy, hg)
}
