package vulkan

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/memwall/memwall/device"
)

const (
	spirvMagic      = 0x07230203
	opEntryPoint    = 15
	opFunctionEnd   = 56
	execGLCompute   = 5
	maxPushConstant = 128 // the minimum every device offers
)

// module is one LoadModule call: one VkShaderModule per SPIR-V module in
// the bytes, and the compute entry points they define.
type module struct {
	shaders []uint64
	entries map[string]uint64 // entry point → its shader module
	funcs   []device.Function
}

// function is an entry point with its pipeline layout and one pipeline per
// block shape (the shape is a specialization constant).
type function struct {
	m      *module
	name   string
	shader uint64
	layout uint64

	mu        sync.Mutex
	pipelines map[device.Dim3]uint64
}

// SplitSPIRV splits concatenated SPIR-V modules and returns each with the
// names of its GLCompute entry points. It fails on bytes that are not
// SPIR-V (a bad magic number, a truncated instruction).
func SplitSPIRV(b []byte) (mods [][]byte, entries [][]string, err error) {
	if len(b) == 0 || len(b)%4 != 0 {
		return nil, nil, fmt.Errorf("SPIR-V of %d bytes is not a whole number of words: %w", len(b), device.ErrInvalid)
	}
	words := len(b) / 4
	w := func(i int) uint32 { return binary.LittleEndian.Uint32(b[4*i:]) }
	start := 0
	for start < words {
		if words-start < 5 || w(start) != spirvMagic {
			return nil, nil, fmt.Errorf("SPIR-V module at byte %d: no header (magic %#x, want %#x): %w", 4*start, w(start), uint32(spirvMagic), device.ErrInvalid)
		}
		var names []string
		i, lastOp := start+5, uint32(0)
		for i < words && w(i) != spirvMagic {
			n := int(w(i) >> 16)
			op := w(i) & 0xFFFF
			if n == 0 || i+n > words {
				return nil, nil, fmt.Errorf("SPIR-V instruction at byte %d: %d words run past the end: %w", 4*i, n, device.ErrInvalid)
			}
			if op == opEntryPoint && n >= 4 && w(i+1) == execGLCompute {
				names = append(names, cString(b[4*(i+3):4*(i+n)]))
			}
			i += n
			lastOp = op
		}
		if lastOp != opFunctionEnd {
			return nil, nil, fmt.Errorf("SPIR-V module at byte %d ends with opcode %d, not OpFunctionEnd: truncated: %w", 4*start, lastOp, device.ErrInvalid)
		}
		mods = append(mods, b[4*start:4*i])
		entries = append(entries, names)
		start = i
	}
	return mods, entries, nil
}

// LoadModule creates shader modules from SPIR-V bytes (one module or
// several back to back); Function then finds their compute entry points.
func (d *Device) LoadModule(spirv []byte) (device.Module, error) {
	mods, entries, err := SplitSPIRV(spirv)
	if err != nil {
		return 0, fmt.Errorf("vulkan: LoadModule: %w", err)
	}
	m := &module{entries: map[string]uint64{}}
	for i, code := range mods {
		words := make([]uint32, len(code)/4) // 4-byte aligned copy, as pCode requires
		for j := range words {
			words[j] = binary.LittleEndian.Uint32(code[4*j:])
		}
		var pn pinned
		ci := &shaderModuleCreateInfo{sType: stShaderModuleCreateInfo, codeSize: uintptr(len(code)), code: refSlice(&pn, words)}
		var sm uint64
		r := call(d.vk.createShaderModule, d.dev, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&sm)))
		pn.release()
		if err := check("vkCreateShaderModule", r); err != nil {
			d.unloadShaders(m)
			return 0, fmt.Errorf("vulkan: LoadModule: module %d: %w", i, err)
		}
		m.shaders = append(m.shaders, sm)
		for _, n := range entries[i] {
			m.entries[n] = sm
		}
	}
	d.mu.Lock()
	id := device.Module(d.newID())
	d.modules[id] = m
	d.mu.Unlock()
	return id, nil
}

func (d *Device) unloadShaders(m *module) {
	for _, sm := range m.shaders {
		callVoid(d.vk.destroyShaderModule, d.dev, uintptr(sm), 0)
	}
	m.shaders = nil
}

// UnloadModule destroys a module's pipelines and shaders after the work
// queued so far has completed.
func (d *Device) UnloadModule(id device.Module) error {
	d.mu.Lock()
	m := d.modules[id]
	delete(d.modules, id)
	var fs []*function
	if m != nil {
		for _, f := range m.funcs {
			fs = append(fs, d.funcs[f])
			delete(d.funcs, f)
		}
	}
	d.mu.Unlock()
	if m == nil {
		return fmt.Errorf("vulkan: UnloadModule: unknown module %d: %w", uint64(id), device.ErrInvalid)
	}
	err := d.Synchronize()
	for _, f := range fs {
		d.destroyFunction(f)
	}
	d.unloadShaders(m)
	return err
}

func (d *Device) destroyFunction(f *function) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.pipelines {
		callVoid(d.vk.destroyPipeline, d.dev, uintptr(p), 0)
	}
	f.pipelines = nil
	if f.layout != 0 {
		callVoid(d.vk.destroyPipelineLayout, d.dev, uintptr(f.layout), 0)
		f.layout = 0
	}
}

// Function finds a compute entry point of the module by name.
func (d *Device) Function(mid device.Module, name string) (device.Function, error) {
	d.mu.Lock()
	m := d.modules[mid]
	d.mu.Unlock()
	if m == nil {
		return 0, fmt.Errorf("vulkan: Function(%q): unknown module %d: %w", name, uint64(mid), device.ErrInvalid)
	}
	sm, ok := m.entries[name]
	if !ok {
		return 0, fmt.Errorf("vulkan: Function: module %d has no compute entry point %q: %w", uint64(mid), name, device.ErrInvalid)
	}
	if !d.hasBDA {
		return 0, fmt.Errorf("vulkan: Function(%q): kernels take buffer device addresses, which this device lacks: %w", name, device.ErrUnsupported)
	}
	var pn pinned
	defer pn.release()
	rng := &pushConstantRange{stages: shaderStageCompute, size: min(d.pushBytes, maxPushConstant)}
	ci := &pipelineLayoutCreateInfo{sType: stPipelineLayoutCreateInfo, pushCount: 1, pushRanges: ref(&pn, rng)}
	f := &function{m: m, name: name, shader: sm, pipelines: map[device.Dim3]uint64{}}
	if err := check("vkCreatePipelineLayout", call(d.vk.createPipelineLayout, d.dev, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&f.layout)))); err != nil {
		return 0, fmt.Errorf("vulkan: Function(%q): %w", name, err)
	}
	d.mu.Lock()
	id := device.Function(d.newID())
	d.funcs[id] = f
	m.funcs = append(m.funcs, id)
	d.mu.Unlock()
	return id, nil
}

// pipeline returns f's pipeline for a block shape, creating it once.
func (d *Device) pipeline(f *function, block device.Dim3) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.pipelines[block]; ok {
		return p, nil
	}
	var pn pinned
	defer pn.release()
	entries := []specializationMapEntry{{0, 0, 4}, {1, 4, 4}, {2, 8, 4}}
	data := []uint32{block.X, block.Y, block.Z}
	spec := &specializationInfo{count: 3, entries: refSlice(&pn, entries), dataSize: 12, data: refSlice(&pn, data)}
	ci := &computePipelineCreateInfo{sType: stComputePipelineCreateInfo, layout: f.layout, baseIndex: -1,
		stage: pipelineShaderStageCreateInfo{sType: stPipelineShaderStageCreateInfo, stage: shaderStageCompute,
			module: f.shader, name: pn.cstr(f.name), spec: ref(&pn, spec)}}
	var p uint64
	if err := check("vkCreateComputePipelines", call(d.vk.createComputePipelines, d.dev, 0, 1, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&p)))); err != nil {
		return 0, err
	}
	f.pipelines[block] = p
	return p, nil
}

// packArgs lays the arguments out as the kernel's push constants: in
// order, each aligned to its size; a Ptr becomes its buffer device address.
func (d *Device) packArgs(args []any) ([]byte, error) {
	var b []byte
	put := func(size int, v uint64) {
		for len(b)%size != 0 {
			b = append(b, 0)
		}
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], v)
		b = append(b, w[:size]...)
	}
	for i, a := range args {
		switch v := a.(type) {
		case device.Ptr:
			addr, err := d.deviceAddress(v)
			if err != nil {
				return nil, fmt.Errorf("argument %d: %w", i, err)
			}
			put(8, addr)
		case uint32:
			put(4, uint64(v))
		case int32:
			put(4, uint64(uint32(v)))
		case uint64:
			put(8, v)
		case int64:
			put(8, uint64(v))
		case float32:
			put(4, uint64(math.Float32bits(v)))
		case float64:
			put(8, math.Float64bits(v))
		default:
			return nil, fmt.Errorf("argument %d: unsupported type %T: %w", i, a, device.ErrInvalid)
		}
	}
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b, nil
}

// deviceAddress translates a Ptr to the shader-visible address of its
// byte; the null Ptr stays 0.
func (d *Device) deviceAddress(p device.Ptr) (uint64, error) {
	if p == 0 {
		return 0, nil
	}
	sp, err := d.resolve("kernel argument", p, 0)
	if err != nil {
		return 0, err
	}
	if sp.a.bda == 0 {
		return 0, fmt.Errorf("address %#x has no buffer device address: %w", uint64(p), device.ErrUnsupported)
	}
	return sp.a.bda + sp.off, nil
}

// Launch queues f over grid workgroups of block invocations on the
// stream's compute queue. Dynamic shared memory is not supported.
func (d *Device) Launch(fid device.Function, grid, block device.Dim3, sharedBytes uint32, sid device.Stream, args ...any) error {
	d.mu.Lock()
	f := d.funcs[fid]
	d.mu.Unlock()
	if f == nil {
		return fmt.Errorf("vulkan: Launch: unknown function %d: %w", uint64(fid), device.ErrInvalid)
	}
	if sharedBytes > 0 {
		return fmt.Errorf("vulkan: Launch(%s): %d bytes of dynamic shared memory: %w", f.name, sharedBytes, device.ErrUnsupported)
	}
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 || block.X == 0 || block.Y == 0 || block.Z == 0 {
		return fmt.Errorf("vulkan: Launch(%s): empty grid %v or block %v: %w", f.name, grid, block, device.ErrInvalid)
	}
	if uint64(block.X)*uint64(block.Y)*uint64(block.Z) > uint64(d.maxInvocation) ||
		block.X > d.maxGroupSize[0] || block.Y > d.maxGroupSize[1] || block.Z > d.maxGroupSize[2] {
		return fmt.Errorf("vulkan: Launch(%s): block %v over the device's limits %v (%d invocations): %w",
			f.name, block, d.maxGroupSize, d.maxInvocation, device.ErrInvalid)
	}
	push, err := d.packArgs(args)
	if err != nil {
		return fmt.Errorf("vulkan: Launch(%s): %w", f.name, err)
	}
	if len(push) > int(min(d.pushBytes, maxPushConstant)) {
		return fmt.Errorf("vulkan: Launch(%s): %d bytes of arguments, over the %d-byte push constant limit: %w",
			f.name, len(push), min(d.pushBytes, maxPushConstant), device.ErrInvalid)
	}
	pipe, err := d.pipeline(f, block)
	if err != nil {
		return fmt.Errorf("vulkan: Launch(%s): %w", f.name, err)
	}
	return d.op("Launch("+f.name+")", sid, func(s *stream) error {
		_, err := d.submit(s, s.cq, func(cb uintptr) {
			callVoid(d.vk.cmdBindPipeline, cb, bindPointCompute, uintptr(pipe))
			if len(push) > 0 {
				callVoid(d.vk.cmdPushConstants, cb, uintptr(f.layout), shaderStageCompute, 0, uintptr(len(push)), uintptr(unsafe.Pointer(&push[0])))
			}
			callVoid(d.vk.cmdDispatch, cb, uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z))
		})
		return err
	})
}

// destroyAll releases every object the device still holds (Close, after
// the device went idle).
func (d *Device) destroyAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.funcs {
		d.destroyFunction(f)
	}
	for _, m := range d.modules {
		d.unloadShaders(m)
	}
	for _, e := range d.events {
		if e.qpool != 0 {
			callVoid(d.vk.destroyQueryPool, d.dev, uintptr(e.qpool), 0)
		}
	}
	for _, s := range d.streams {
		d.releaseStream(s)
		d.spareSems = append(d.spareSems, s.sem)
		for _, a := range s.aux {
			d.spareSems = append(d.spareSems, a.sem)
		}
	}
	for _, sem := range d.spareSems {
		callVoid(d.vk.destroySemaphore, d.dev, uintptr(sem), 0)
	}
	chunks := map[*physChunk]bool{}
	for _, c := range d.chunks {
		chunks[c] = true
	}
	for _, a := range d.space.list {
		if a.res != nil {
			for _, c := range a.res.maps {
				chunks[c] = true
			}
		}
		d.destroy(a)
	}
	for c := range chunks {
		callVoid(d.vk.freeMemory, d.dev, uintptr(c.mem), 0)
	}
	if d.sparse != nil {
		callVoid(d.vk.destroySemaphore, d.dev, uintptr(d.sparse.sem), 0)
	}
	if d.byteTable != nil {
		d.destroy(d.byteTable)
	}
	d.funcs, d.modules, d.events, d.streams, d.spareSems, d.space.list = nil, nil, nil, nil, nil, nil
}
