package cuda

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// Wrap returns a Device over a CUDA context the caller already owns: ctx
// is its CUcontext handle, on the GPU of the given ordinal (an engine
// written with cgo, or another library, that created its context and
// streams itself). memwall's pool then allocates in that context, and the
// engine's streams, adopted with AdoptStream, order its stream-ordered
// frees (pool.FreeAsync). The Device makes ctx current on the OS thread of
// each call, as for its own primary context. Close releases nothing of
// the caller's: the context stays the caller's to destroy, after the
// pools on it are closed.
func Wrap(ctx uintptr, ordinal int, opts Options) (*Device, error) {
	if ctx == 0 {
		return nil, fmt.Errorf("cuda: wrap: a nil context: %w", device.ErrInvalid)
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	d, err := loadDriver(LibraryCandidates(getenv))
	if err != nil {
		return nil, err
	}
	if err := d.err("cuInit", d.raw(d.cuInit, 0)); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", d.path, err)
	}
	var count int32
	if err := d.err("cuDeviceGetCount", d.raw(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&count)))); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if ordinal < 0 || int32(ordinal) >= count {
		return nil, fmt.Errorf("cuda: wrap: device ordinal %d out of range: %d device(s) visible", ordinal, count)
	}
	var dev int32
	if err := d.err("cuDeviceGet", d.raw(d.cuDeviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(ordinal))); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	c := &Device{d: d, dev: dev, ctx: ctx, wrapped: true, getenv: getenv,
		host:    map[uintptr]hostEntry{},
		streams: map[device.Stream]struct{}{},
		events:  map[device.Event]struct{}{},
	}
	if err := c.readInfo(ordinal); err != nil {
		return nil, err
	}
	return c, nil
}

// Context returns the CUcontext handle the Device runs in (its primary
// context, or the one Wrap was given), for code that shares it.
func (c *Device) Context() uintptr { return c.ctx }

// AdoptStream makes s, a CUstream created by the caller in the Device's
// context, usable as a device.Stream: copies, launches, events and the
// pool's stream-ordered frees (FreeAsync) on it. The Device never destroys
// an adopted stream; ForgetStream drops it without destroying it. The
// legacy default stream (0) cannot be adopted: package pool's 0 means no
// stream.
func (c *Device) AdoptStream(s uintptr) (device.Stream, error) {
	if s == 0 {
		return 0, fmt.Errorf("cuda: adopt stream: the default stream (0) cannot be adopted: %w", device.ErrInvalid)
	}
	c.mu.Lock()
	c.streams[device.Stream(s)] = struct{}{}
	c.mu.Unlock()
	return device.Stream(s), nil
}

// ForgetStream drops an adopted stream without destroying it (the caller
// still owns it). It fails with ErrInvalid for a stream the Device does
// not know.
func (c *Device) ForgetStream(s device.Stream) error {
	if _, err := c.stream(s); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.streams, s)
	c.mu.Unlock()
	return nil
}
