// Package vulkan implements device.Device over Vulkan, bound at run time
// through purego: no cgo, so CGO_ENABLED=0 builds still run on any machine
// with a Vulkan loader and driver (NVIDIA, AMD, Intel, Mesa's lavapipe on a
// CPU, MoltenVK).
//
// Quick start:
//
//	d, err := vulkan.Open(vulkan.Options{})   // MEMWALL_VULKAN_DEVICE picks the GPU
//	if err != nil { ... }                      // wraps ErrNoLoader without Vulkan
//	defer d.Close()
//	p, _ := d.Alloc(1 << 20)                   // a VkDeviceMemory with a buffer bound
//	s, _ := d.NewStream()                      // a timeline semaphore over queues
//	_ = d.CopyHtoD(p, data, s)                 // vkCmdCopyBuffer, staged or from HostAlloc memory
//	_ = d.StreamSynchronize(s)                 // vkWaitSemaphores
//
// # Addresses
//
// Vulkan has no device pointers in its memory API, so every allocation
// (device memory from Alloc, host memory from HostAlloc and HostRegister,
// virtual reservations) gets a synthetic device.Ptr range in an address
// space this package assigns, never reused while the device is open. A Ptr
// anywhere inside a range resolves to (VkBuffer, offset), so p.Add(n) works
// for copies, memsets and kernel arguments within an allocation. Kernels
// receive real addresses: a Ptr argument of Launch is translated to the
// buffer's VK_KHR_buffer_device_address plus the offset.
//
// # Streams and events
//
// A stream is a timeline semaphore. Every operation is one submission that
// waits for the stream's previous value (and for the events the stream was
// told to wait on) and signals the next, so work on a stream runs in order
// with full memory dependencies between operations, whichever queue runs
// it: copies that touch host memory go to a transfer-only queue family when
// the device has one (the copy engines; a large one is split over two of
// its queues, see Options.CopyQueues), kernels, memsets and device-to-device
// copies to a compute queue (a device-to-device copy as a shader on GPUs:
// the copy engines do not reach memory bandwidth). An event captures
// (semaphore, value) of the stream it was recorded on; a timing event also
// writes a timestamp query, on the queue that ran the stream's last work.
// StreamWaitEvent adds a semaphore wait to the stream's next submission:
// the GPU waits for the GPU, the host is never in the loop.
//
// # Kernels
//
// LoadModule takes SPIR-V (one module, or several concatenated), Function
// names an entry point. A kernel's arguments are its push constants, laid
// out in order with natural alignment (std430): a Ptr becomes a 64-bit
// buffer device address, the other scalars keep their size. The block shape
// is bound through specialization constants 0, 1 and 2 (local_size_x_id
// and friends), so one SPIR-V kernel serves every block size. Dynamic
// shared memory is not offered. Package kernels/spirv holds memwall's
// kernels; the device-to-device copy shader is the device's own (shaders/).
//
// # Memory
//
// Alloc takes device-local memory, at VK_EXT_memory_priority 0.5
// (AllocPriority for weights at 1.0); HostAlloc host-visible coherent
// memory, mapped, which copies use in place; HostRegister imports existing
// host memory with VK_EXT_external_memory_host. Copies from and to
// ordinary Go memory go through per-stream staging buffers (the host side
// copied on up to four goroutines); a copy into pageable memory returns
// once the bytes are there, as CUDA's does.
// Virtual memory (Reserve, Map) is sparse residency binding, opt-in with
// Options.Sparse or MEMWALL_VULKAN_SPARSE=1; without it pools grow in
// chunks. Info.Disabled says which optional feature is off and why.
//
// # Ordering tests
//
// Defer and FlushShuffled hold every submission on the host and then hand
// them to the queues in a random order that keeps exactly the stream order
// and the event waits: a program whose correctness rests on a missing
// event wait corrupts data then, where submission order would have hidden
// it. plan/bind's reuse waits are tested that way here.
package vulkan

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// Options configure Open.
type Options struct {
	// Device selects the physical device: a decimal index into the
	// enumeration order, or a case-insensitive substring of the device name.
	// Empty means MEMWALL_VULKAN_DEVICE, and when that is empty too the
	// first discrete GPU, else integrated, else virtual, else a CPU device.
	Device string
	// Getenv reads MEMWALL_LIBVULKAN and MEMWALL_VULKAN_DEVICE; nil means
	// the process environment.
	Getenv func(string) string
	// MaxQueues caps the queues taken from each family (default 4).
	MaxQueues int
	// CopyQueues splits a copy of at least 32 MiB between host memory
	// from HostAlloc or HostRegister and the device into this many parts
	// (at most 8) on as many queues of the copy family, run at once; where
	// the family has fewer queues, parts share them and run in turn. 0
	// means MEMWALL_VULKAN_COPY_QUEUES, and where that is unset too 2 on a
	// device with a copy-only family of two queues or more (the copy
	// engines of a discrete GPU: one alone reaches 0.89 of CUDA's pinned
	// host-to-device rate on an H200, two 0.93), else 1 (no split).
	CopyQueues int
	// Sparse turns on virtual memory over sparse binding where the device
	// has it (MEMWALL_VULKAN_SPARSE=1 does too).
	Sparse bool

	// For tests: leave the driver to the loader's unloading (see
	// pinLibraryOf), and put copies on queue family copyFamily-1 (0: the
	// copy-only family pickFamilies chooses).
	unpinned   bool
	copyFamily int
}

// queue is one VkQueue; vkQueueSubmit on it is externally synchronized.
type queue struct {
	mu        sync.Mutex
	h         uintptr
	family    uint32
	stampBits uint32 // timestampValidBits of the family
}

// family is a queue family memwall uses.
type family struct {
	index         uint32
	flags         uint32
	timestampBits uint32
	queues        []*queue
}

// Device is one Vulkan physical device opened as a logical device. All
// methods are safe for concurrent use.
type Device struct {
	vk     *api
	picked *physicalInfo
	inst   uintptr
	phys   uintptr
	dev    uintptr
	info   device.Info

	compute, transfer *family
	families          []uint32 // distinct family indices, for concurrent sharing

	memProps      physicalDeviceMemoryProperties
	deviceType    uint32 // memory type index for Alloc
	hostType      uint32 // memory type index for HostAlloc and staging
	deviceHeap    uint32
	maxAlloc      uint64
	hostAlign     uint64
	timestampNs   float64
	pushBytes     uint32
	maxGroupSize  [3]uint32
	maxInvocation uint32

	hasBudget, hasPriority, hasHostImport, hasBDA bool
	hasClock                                      bool // VK_KHR_shader_clock's device clock (memwall_spin)
	driverName, driverInfo                        string
	driverLib                                     string // the shared object of the driver's commands
	pinned                                        int    // shared objects this open kept loaded

	copyOnce     sync.Once
	copyK        *copyKernel // nil: CopyDtoD always uses vkCmdCopyBuffer
	noShaderCopy bool        // CPU devices, or MEMWALL_VULKAN_SHADER_COPY=0 (=1 forces it on)
	copyQueues   int         // Options.CopyQueues, 1 to 8
	splitMin     uint64      // the smallest copy split over copyQueues
	splits       atomic.Uint64

	// memset byte table: bytes 4v..4v+3 equal v, for the unaligned ends of
	// Memset8.
	byteTable *allocation

	mu        sync.Mutex
	space     addressSpace
	hostIdx   hostIndex
	used      uint64 // bytes of device-local memory this handle allocated
	streams   map[device.Stream]*stream
	events    map[device.Event]*event
	modules   map[device.Module]*module
	funcs     map[device.Function]*function
	spareSems []uint64 // timeline semaphores of destroyed streams, for reuse

	sparse *sparseState // nil: no virtual memory
	chunks map[device.PhysMem]*physChunk

	deferring atomic.Bool // Defer: submissions wait in deferred
	deferMu   sync.Mutex
	deferred  []*pendingSubmit
	nextID    uint64
	closed    bool
	queueRot  int
}

// Open loads the Vulkan loader, creates an instance and a logical device on
// the chosen physical device. It fails with an error wrapping ErrNoLoader
// when no loader can be loaded, and device.ErrUnsupported when no device
// offers Vulkan 1.2 with timeline semaphores.
//
// The shared objects of the driver stay loaded after Close, for the rest
// of the process (on Linux): the loader would unload and reload them with
// every instance, which some drivers (NVIDIA's) survive only a few dozen
// times. MEMWALL_VULKAN_KEEP_DRIVER=0 leaves them to the loader.
func Open(o Options) (*Device, error) {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Device == "" {
		o.Device = o.Getenv("MEMWALL_VULKAN_DEVICE")
	}
	if o.MaxQueues <= 0 {
		o.MaxQueues = 4
	}
	vk, err := loadAPI(LibraryCandidates(o.Getenv))
	if err != nil {
		return nil, fmt.Errorf("vulkan: %w", err)
	}
	d := &Device{
		vk:      vk,
		streams: map[device.Stream]*stream{},
		events:  map[device.Event]*event{},
		modules: map[device.Module]*module{},
		funcs:   map[device.Function]*function{},
		chunks:  map[device.PhysMem]*physChunk{},
		nextID:  1,
	}
	d.space.next = spaceBase
	var before map[string]bool
	if !o.unpinned && o.Getenv("MEMWALL_VULKAN_KEEP_DRIVER") != "0" {
		before = mappedLibraries()
	}
	if err := d.createInstance(); err != nil {
		return nil, err
	}
	if err := d.choosePhysical(o.Device); err != nil {
		d.destroyInstance()
		return nil, err
	}
	wantSparse := o.Sparse || o.Getenv("MEMWALL_VULKAN_SPARSE") == "1"
	if err := d.createDevice(o.MaxQueues, wantSparse, o.copyFamily-1); err != nil {
		d.destroyInstance()
		return nil, err
	}
	d.pinned = pinNewLibraries(before)
	d.driverLib = libraryOf(d.vk.cmdCopyBuffer)
	// Shader copies pay on GPUs; a CPU driver copies faster by itself.
	switch o.Getenv("MEMWALL_VULKAN_SHADER_COPY") {
	case "0":
		d.noShaderCopy = true
	case "1":
	default:
		d.noShaderCopy = d.picked.props.deviceType == deviceTypeCPU
	}
	if o.CopyQueues <= 0 {
		o.CopyQueues, _ = strconv.Atoi(o.Getenv("MEMWALL_VULKAN_COPY_QUEUES"))
	}
	if o.CopyQueues <= 0 && d.transfer != d.compute && len(d.transfer.queues) >= 2 {
		o.CopyQueues = 2 // two copy engines: 0.93 of CUDA's pinned H2D on an H200, one gives 0.89
	}
	d.copyQueues = min(max(o.CopyQueues, 1), 8)
	d.splitMin = splitMinBytes
	if err := d.initMemory(); err != nil {
		d.Close()
		return nil, err
	}
	if why := d.initSparse(wantSparse); why != "" {
		d.info.Disabled = append([]string{"virtual memory: " + why}, d.info.Disabled...)
	}
	return d, nil
}

// LoaderPath is the path the Vulkan loader was opened from.
func (d *Device) LoaderPath() string { return d.vk.path }

const apiVersion12 = 1<<22 | 2<<12

// noDriverHint follows vkCreateInstance's VK_ERROR_INCOMPATIBLE_DRIVER: the
// loader found no driver that gives an instance. On the H200 machine
// NVIDIA's manifest names libGLX_nvidia.so.0, whose
// vk_icdGetInstanceProcAddr returns no vkCreateInstance there (no
// display), while libEGL_nvidia.so.0 of the same driver gives one.
const noDriverHint = "no Vulkan driver gave an instance (VK_LOADER_DEBUG=driver says why); " +
	"where NVIDIA's manifest names libGLX_nvidia.so.0 on a machine without a display, " +
	"a copy naming libEGL_nvidia.so.0 in VK_DRIVER_FILES starts the same driver"

func versionString(v uint32) string {
	return fmt.Sprintf("%d.%d.%d", v>>22&0x7F, v>>12&0x3FF, v&0xFFF)
}

func (d *Device) createInstance() error {
	ver := uint32(1 << 22) // 1.0 when vkEnumerateInstanceVersion is absent
	if d.vk.enumerateInstanceVersion != 0 {
		if err := check("vkEnumerateInstanceVersion", call(d.vk.enumerateInstanceVersion, uintptr(unsafe.Pointer(&ver)))); err != nil {
			return fmt.Errorf("vulkan: %w", err)
		}
	}
	if ver < apiVersion12 {
		return fmt.Errorf("vulkan: loader %s offers Vulkan %s, memwall needs 1.2 (timeline semaphores): %w",
			d.vk.path, versionString(ver), device.ErrUnsupported)
	}
	var pn pinned
	defer pn.release()
	app := &applicationInfo{sType: stApplicationInfo, appName: pn.cstr("memwall"), engineName: pn.cstr("memwall"),
		apiVersion: min(ver&^0xFFF, 1<<22|3<<12)}
	ci := &instanceCreateInfo{sType: stInstanceCreateInfo, appInfo: ref(&pn, app)}
	// Portability drivers (MoltenVK on Apple GPUs) are enumerated only when
	// the instance asks for them.
	if d.instanceExtensions()["VK_KHR_portability_enumeration"] {
		names := []uintptr{pn.cstr("VK_KHR_portability_enumeration")}
		ci.flags, ci.extensionCount, ci.extensions = instanceEnumeratePortability, 1, refSlice(&pn, names)
	}
	if err := check("vkCreateInstance", call(d.vk.createInstance, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&d.inst)))); err != nil {
		var ve *Error
		if errors.As(err, &ve) && ve.Code == int32(vkErrorIncompatibleDriver) {
			return fmt.Errorf("vulkan: %w: %s", err, noDriverHint)
		}
		return fmt.Errorf("vulkan: %w", err)
	}
	if req, _ := resolve(d.vk.getInstanceProcAddr, d.inst, d.vk.instanceTable()); len(req) > 0 {
		d.destroyInstance()
		return fmt.Errorf("vulkan: instance lacks %s: %w", strings.Join(req, ", "), device.ErrUnsupported)
	}
	return nil
}

// instanceExtensions lists the loader's instance extensions.
func (d *Device) instanceExtensions() map[string]bool {
	out := map[string]bool{}
	if d.vk.enumerateInstanceExtensionProperties == 0 {
		return out
	}
	var n uint32
	if call(d.vk.enumerateInstanceExtensionProperties, 0, uintptr(unsafe.Pointer(&n)), 0) != vkSuccess || n == 0 {
		return out
	}
	exts := make([]extensionProperties, n)
	if r := call(d.vk.enumerateInstanceExtensionProperties, 0, uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&exts[0]))); r < 0 {
		return out
	}
	for _, e := range exts[:n] {
		out[cString(e.name[:])] = true
	}
	return out
}

func (d *Device) destroyInstance() {
	if d.inst != 0 && d.vk.destroyInstance != 0 {
		callVoid(d.vk.destroyInstance, d.inst, 0)
	}
	d.inst = 0
}

// physicalInfo is what choosePhysical learns about one device.
type physicalInfo struct {
	h      uintptr
	props  physicalDeviceProperties
	v11    physicalDeviceVulkan11Properties
	drv    physicalDeviceDriverProperties
	hostP  physicalDeviceExternalMemoryHostProperties
	pci    physicalDevicePCIBusInfo
	sm     physicalDeviceShaderSMBuiltinsNV
	exts   map[string]bool
	feat   physicalDeviceFeatures2
	f12    physicalDeviceVulkan12Features
	prio   physicalDeviceMemoryPriorityFeatures
	clock  physicalDeviceShaderClockFeatures
	queues []queueFamilyProperties
}

func (d *Device) physicalDevices() ([]uintptr, error) {
	var n uint32
	if err := check("vkEnumeratePhysicalDevices", call(d.vk.enumeratePhysicalDevices, d.inst, uintptr(unsafe.Pointer(&n)), 0)); err != nil {
		return nil, fmt.Errorf("vulkan: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("vulkan: the loader %s found no Vulkan device (no driver installed? VK_DRIVER_FILES names the ICD): %w",
			d.vk.path, device.ErrUnsupported)
	}
	hs := make([]uintptr, n)
	if err := check("vkEnumeratePhysicalDevices", call(d.vk.enumeratePhysicalDevices, d.inst, uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&hs[0])))); err != nil {
		return nil, fmt.Errorf("vulkan: %w", err)
	}
	return hs[:n], nil
}

func (d *Device) query(h uintptr) (*physicalInfo, error) {
	p := &physicalInfo{h: h, exts: map[string]bool{}}
	var n uint32
	if err := check("vkEnumerateDeviceExtensionProperties", call(d.vk.enumerateDeviceExtensionProperties, h, 0, uintptr(unsafe.Pointer(&n)), 0)); err != nil {
		return nil, fmt.Errorf("vulkan: %w", err)
	}
	if n > 0 {
		exts := make([]extensionProperties, n)
		if err := check("vkEnumerateDeviceExtensionProperties", call(d.vk.enumerateDeviceExtensionProperties, h, 0,
			uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&exts[0])))); err != nil {
			return nil, fmt.Errorf("vulkan: %w", err)
		}
		for _, e := range exts[:n] {
			p.exts[cString(e.name[:])] = true
		}
	}
	var pn pinned
	defer pn.release()
	p.v11.sType = stPhysicalDeviceVulkan11Properties
	p.drv.sType = stPhysicalDeviceDriverProperties
	p.v11.pNext = ref(&pn, &p.drv)
	tail := &p.drv.pNext
	if p.exts["VK_EXT_external_memory_host"] {
		p.hostP.sType = stPhysicalDeviceExternalMemoryHost
		*tail = ref(&pn, &p.hostP)
		tail = &p.hostP.pNext
	}
	if p.exts["VK_EXT_pci_bus_info"] {
		p.pci.sType = stPhysicalDevicePCIBusInfo
		*tail = ref(&pn, &p.pci)
		tail = &p.pci.pNext
	}
	if p.exts["VK_NV_shader_sm_builtins"] {
		p.sm.sType = stPhysicalDeviceShaderSMBuiltinsNV
		*tail = ref(&pn, &p.sm)
	}
	// Vulkan 1.1/1.2 property structs are only valid on a 1.2 device: ask
	// for the plain properties first.
	p2 := &physicalDeviceProperties2{sType: stPhysicalDeviceProperties2}
	callVoid(d.vk.getPhysicalDeviceProperties2, h, uintptr(unsafe.Pointer(p2)))
	p.props = p2.props
	if p.props.apiVersion >= apiVersion12 {
		p2.pNext = ref(&pn, &p.v11)
		callVoid(d.vk.getPhysicalDeviceProperties2, h, uintptr(unsafe.Pointer(p2)))
		p.props = p2.props
		p.feat.sType = stPhysicalDeviceFeatures2
		p.f12.sType = stPhysicalDeviceVulkan12Features
		p.feat.pNext = ref(&pn, &p.f12)
		ftail := &p.f12.pNext
		if p.exts["VK_EXT_memory_priority"] {
			p.prio.sType = stPhysicalDeviceMemoryPriorityFeats
			*ftail = ref(&pn, &p.prio)
			ftail = &p.prio.pNext
		}
		if p.exts["VK_KHR_shader_clock"] {
			p.clock.sType = stPhysicalDeviceShaderClockFeatures
			*ftail = ref(&pn, &p.clock)
		}
		callVoid(d.vk.getPhysicalDeviceFeatures2, h, uintptr(unsafe.Pointer(&p.feat)))
	}
	p.v11.pNext, p.drv.pNext, p.hostP.pNext, p.pci.pNext, p.feat.pNext, p.f12.pNext = 0, 0, 0, 0, 0, 0
	p.prio.pNext, p.clock.pNext, p.sm.pNext = 0, 0, 0
	callVoid(d.vk.getPhysicalDeviceQueueFamilyProperties, h, uintptr(unsafe.Pointer(&n)), 0)
	p.queues = make([]queueFamilyProperties, n)
	if n > 0 {
		callVoid(d.vk.getPhysicalDeviceQueueFamilyProperties, h, uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&p.queues[0])))
	}
	return p, nil
}

func (p *physicalInfo) name() string { return cString(p.props.deviceName[:]) }

// limit reads a 32-bit field of VkPhysicalDeviceLimits by byte offset.
func (p *physicalInfo) limit32(off uintptr) uint32 {
	return *(*uint32)(unsafe.Add(unsafe.Pointer(&p.props.limits), off))
}

// usable says why a device cannot be used, or "".
func (p *physicalInfo) usable() string {
	if p.props.apiVersion < apiVersion12 {
		return fmt.Sprintf("Vulkan %s (memwall needs 1.2)", versionString(p.props.apiVersion))
	}
	if p.f12.b[f12TimelineSemaphore] == 0 {
		return "no timeline semaphores"
	}
	return ""
}

var typeRank = map[uint32]int{deviceTypeDiscrete: 0, deviceTypeIntegrated: 1, deviceTypeVirtual: 2, deviceTypeCPU: 3}

func rank(t uint32) int {
	if r, ok := typeRank[t]; ok {
		return r
	}
	return 4
}

func (d *Device) choosePhysical(sel string) error {
	hs, err := d.physicalDevices()
	if err != nil {
		return err
	}
	var all []*physicalInfo
	var names []string
	for i, h := range hs {
		p, err := d.query(h)
		if err != nil {
			return err
		}
		all = append(all, p)
		names = append(names, fmt.Sprintf("%d %q", i, p.name()))
	}
	var pick *physicalInfo
	ordinal := -1
	switch idx, err := strconv.Atoi(sel); {
	case sel == "":
		for i, p := range all {
			if p.usable() == "" && (pick == nil || rank(p.props.deviceType) < rank(pick.props.deviceType)) {
				pick, ordinal = p, i
			}
		}
		if pick == nil {
			var why []string
			for i, p := range all {
				why = append(why, fmt.Sprintf("%d %q: %s", i, p.name(), p.usable()))
			}
			return fmt.Errorf("vulkan: no usable device: %s: %w", strings.Join(why, "; "), device.ErrUnsupported)
		}
	case err == nil:
		if idx < 0 || idx >= len(all) {
			return fmt.Errorf("vulkan: MEMWALL_VULKAN_DEVICE=%s: no device %d (devices: %s): %w", sel, idx, strings.Join(names, ", "), device.ErrInvalid)
		}
		pick, ordinal = all[idx], idx
	default:
		for i, p := range all {
			if strings.Contains(strings.ToLower(p.name()), strings.ToLower(sel)) {
				pick, ordinal = p, i
				break
			}
		}
		if pick == nil {
			return fmt.Errorf("vulkan: MEMWALL_VULKAN_DEVICE=%q names no device (devices: %s): %w", sel, strings.Join(names, ", "), device.ErrInvalid)
		}
	}
	if why := pick.usable(); why != "" {
		return fmt.Errorf("vulkan: device %d %q: %s: %w", ordinal, pick.name(), why, device.ErrUnsupported)
	}
	d.phys = pick.h
	d.info.Ordinal = ordinal
	d.picked = pick
	return nil
}
