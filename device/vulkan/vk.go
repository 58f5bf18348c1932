package vulkan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/memwall/memwall/device"
)

// api is the bound Vulkan API: one field per entry point, filled from the
// tables below through vkGetInstanceProcAddr and vkGetDeviceProcAddr. A zero
// field is an entry point the loader or driver does not offer.
type api struct {
	lib  uintptr
	path string

	getInstanceProcAddr, getDeviceProcAddr uintptr

	// Global.
	enumerateInstanceVersion, enumerateInstanceExtensionProperties, createInstance uintptr

	// Instance level.
	destroyInstance, enumeratePhysicalDevices, getPhysicalDeviceProperties2 uintptr
	getPhysicalDeviceFeatures2, getPhysicalDeviceMemoryProperties2          uintptr
	getPhysicalDeviceQueueFamilyProperties                                  uintptr
	enumerateDeviceExtensionProperties, createDevice                        uintptr

	// Device level.
	destroyDevice, getDeviceQueue, queueSubmit, queueBindSparse, deviceWaitIdle uintptr
	allocateMemory, freeMemory, mapMemory, unmapMemory                          uintptr
	createBuffer, destroyBuffer, getBufferMemoryRequirements, bindBufferMemory  uintptr
	getBufferDeviceAddress, getMemoryHostPointerProperties                      uintptr
	createCommandPool, destroyCommandPool, allocateCommandBuffers               uintptr
	beginCommandBuffer, endCommandBuffer, resetCommandBuffer                    uintptr
	cmdCopyBuffer, cmdFillBuffer, cmdPipelineBarrier, cmdWriteTimestamp         uintptr
	cmdResetQueryPool, cmdBindPipeline, cmdPushConstants, cmdDispatch           uintptr
	createSemaphore, destroySemaphore, waitSemaphores, getSemaphoreCounterValue uintptr
	createQueryPool, destroyQueryPool, getQueryPoolResults                      uintptr
	createShaderModule, destroyShaderModule, createPipelineLayout               uintptr
	destroyPipelineLayout, createComputePipelines, destroyPipeline              uintptr
}

// entry names one entry point; the aliases are tried in order (core name
// first, then the extension's).
type entry struct {
	dst      *uintptr
	names    []string
	required bool
}

func (a *api) globalTable() []entry {
	return []entry{
		{&a.enumerateInstanceVersion, []string{"vkEnumerateInstanceVersion"}, false},
		{&a.enumerateInstanceExtensionProperties, []string{"vkEnumerateInstanceExtensionProperties"}, false},
		{&a.createInstance, []string{"vkCreateInstance"}, true},
	}
}

func (a *api) instanceTable() []entry {
	req := func(p *uintptr, n ...string) entry { return entry{p, n, true} }
	return []entry{
		req(&a.destroyInstance, "vkDestroyInstance"),
		req(&a.enumeratePhysicalDevices, "vkEnumeratePhysicalDevices"),
		req(&a.getPhysicalDeviceProperties2, "vkGetPhysicalDeviceProperties2", "vkGetPhysicalDeviceProperties2KHR"),
		req(&a.getPhysicalDeviceFeatures2, "vkGetPhysicalDeviceFeatures2", "vkGetPhysicalDeviceFeatures2KHR"),
		req(&a.getPhysicalDeviceMemoryProperties2, "vkGetPhysicalDeviceMemoryProperties2", "vkGetPhysicalDeviceMemoryProperties2KHR"),
		req(&a.getPhysicalDeviceQueueFamilyProperties, "vkGetPhysicalDeviceQueueFamilyProperties"),
		req(&a.enumerateDeviceExtensionProperties, "vkEnumerateDeviceExtensionProperties"),
		req(&a.createDevice, "vkCreateDevice"),
		req(&a.getDeviceProcAddr, "vkGetDeviceProcAddr"),
	}
}

func (a *api) deviceTable() []entry {
	req := func(p *uintptr, n ...string) entry { return entry{p, n, true} }
	opt := func(p *uintptr, n ...string) entry { return entry{p, n, false} }
	return []entry{
		req(&a.destroyDevice, "vkDestroyDevice"),
		req(&a.getDeviceQueue, "vkGetDeviceQueue"),
		req(&a.queueSubmit, "vkQueueSubmit"),
		opt(&a.queueBindSparse, "vkQueueBindSparse"),
		req(&a.deviceWaitIdle, "vkDeviceWaitIdle"),
		req(&a.allocateMemory, "vkAllocateMemory"),
		req(&a.freeMemory, "vkFreeMemory"),
		req(&a.mapMemory, "vkMapMemory"),
		req(&a.unmapMemory, "vkUnmapMemory"),
		req(&a.createBuffer, "vkCreateBuffer"),
		req(&a.destroyBuffer, "vkDestroyBuffer"),
		req(&a.getBufferMemoryRequirements, "vkGetBufferMemoryRequirements"),
		req(&a.bindBufferMemory, "vkBindBufferMemory"),
		opt(&a.getBufferDeviceAddress, "vkGetBufferDeviceAddress", "vkGetBufferDeviceAddressKHR"),
		opt(&a.getMemoryHostPointerProperties, "vkGetMemoryHostPointerPropertiesEXT"),
		req(&a.createCommandPool, "vkCreateCommandPool"),
		req(&a.destroyCommandPool, "vkDestroyCommandPool"),
		req(&a.allocateCommandBuffers, "vkAllocateCommandBuffers"),
		req(&a.beginCommandBuffer, "vkBeginCommandBuffer"),
		req(&a.endCommandBuffer, "vkEndCommandBuffer"),
		req(&a.resetCommandBuffer, "vkResetCommandBuffer"),
		req(&a.cmdCopyBuffer, "vkCmdCopyBuffer"),
		req(&a.cmdFillBuffer, "vkCmdFillBuffer"),
		req(&a.cmdPipelineBarrier, "vkCmdPipelineBarrier"),
		req(&a.cmdWriteTimestamp, "vkCmdWriteTimestamp"),
		req(&a.cmdResetQueryPool, "vkCmdResetQueryPool"),
		req(&a.cmdBindPipeline, "vkCmdBindPipeline"),
		req(&a.cmdPushConstants, "vkCmdPushConstants"),
		req(&a.cmdDispatch, "vkCmdDispatch"),
		req(&a.createSemaphore, "vkCreateSemaphore"),
		req(&a.destroySemaphore, "vkDestroySemaphore"),
		req(&a.waitSemaphores, "vkWaitSemaphores", "vkWaitSemaphoresKHR"),
		req(&a.getSemaphoreCounterValue, "vkGetSemaphoreCounterValue", "vkGetSemaphoreCounterValueKHR"),
		req(&a.createQueryPool, "vkCreateQueryPool"),
		req(&a.destroyQueryPool, "vkDestroyQueryPool"),
		req(&a.getQueryPoolResults, "vkGetQueryPoolResults"),
		req(&a.createShaderModule, "vkCreateShaderModule"),
		req(&a.destroyShaderModule, "vkDestroyShaderModule"),
		req(&a.createPipelineLayout, "vkCreatePipelineLayout"),
		req(&a.destroyPipelineLayout, "vkDestroyPipelineLayout"),
		req(&a.createComputePipelines, "vkCreateComputePipelines"),
		req(&a.destroyPipeline, "vkDestroyPipeline"),
	}
}

// resolve fills a table through getProcAddr(handle, name); it returns the
// missing required names and the missing optional ones.
func resolve(getProcAddr, handle uintptr, table []entry) (missingRequired, missingOptional []string) {
	for _, e := range table {
		for _, n := range e.names {
			name := append([]byte(n), 0)
			p, _, _ := purego.SyscallN(getProcAddr, handle, uintptr(unsafe.Pointer(&name[0])))
			runtime.KeepAlive(name)
			if p != 0 {
				*e.dst = p
				break
			}
		}
		if *e.dst == 0 {
			if e.required {
				missingRequired = append(missingRequired, e.names[0])
			} else {
				missingOptional = append(missingOptional, e.names[0])
			}
		}
	}
	return missingRequired, missingOptional
}

// LibraryCandidates returns the paths tried for the Vulkan loader, in order.
// When MEMWALL_LIBVULKAN is set (through getenv) it is the only candidate.
func LibraryCandidates(getenv func(string) string) []string {
	if getenv != nil {
		if p := getenv("MEMWALL_LIBVULKAN"); p != "" {
			return []string{p}
		}
	}
	return []string{
		"libvulkan.so.1",
		"/usr/lib/x86_64-linux-gnu/libvulkan.so.1",
		"/usr/lib/aarch64-linux-gnu/libvulkan.so.1",
		"/usr/lib64/libvulkan.so.1",
		"/usr/local/lib/libvulkan.so.1",
		"libvulkan.so",
		"libvulkan.1.dylib", // macOS through MoltenVK's loader
	}
}

// ErrNoLoader is wrapped by Open when no usable Vulkan loader could be loaded.
var ErrNoLoader = errors.New("no usable Vulkan loader library")

func loadAPI(candidates []string) (*api, error) {
	var tried, missing []string
	for _, p := range candidates {
		if strings.ContainsRune(p, '/') {
			if _, err := os.Stat(p); err != nil {
				missing = append(missing, p)
				continue
			}
		}
		lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			if strings.Contains(err.Error(), "cannot open shared object file") || strings.Contains(err.Error(), "no such file") {
				missing = append(missing, p)
			} else {
				tried = append(tried, fmt.Sprintf("%s: %v", p, err))
			}
			continue
		}
		a := &api{lib: lib, path: p}
		if gipa, err := purego.Dlsym(lib, "vkGetInstanceProcAddr"); err == nil && gipa != 0 {
			a.getInstanceProcAddr = gipa
		} else {
			_ = purego.Dlclose(lib)
			tried = append(tried, fmt.Sprintf("%s: not a Vulkan loader: no vkGetInstanceProcAddr", p))
			continue
		}
		if req, _ := resolve(a.getInstanceProcAddr, 0, a.globalTable()); len(req) > 0 {
			_ = purego.Dlclose(lib)
			tried = append(tried, fmt.Sprintf("%s: missing %s", p, strings.Join(req, ", ")))
			continue
		}
		return a, nil
	}
	if len(missing) > 0 {
		tried = append(tried, "not found: "+strings.Join(missing, ", "))
	}
	return nil, fmt.Errorf("%w (set MEMWALL_LIBVULKAN to its path): %s", ErrNoLoader, strings.Join(tried, "; "))
}

// call invokes a Vulkan entry point that returns a VkResult.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) vkResult {
	r, _, _ := purego.SyscallN(fn, args...)
	return vkResult(int32(uint32(r)))
}

// callVoid invokes an entry point that returns void (or a value that is
// not a VkResult) and returns its raw result register.
//
//go:uintptrescapes
func callVoid(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// vkResult is a VkResult.
type vkResult int32

// VkResult codes memwall names and branches on.
const (
	vkSuccess                     vkResult = 0
	vkNotReady                    vkResult = 1
	vkTimeout                     vkResult = 2
	vkIncomplete                  vkResult = 5
	vkErrorOutOfHostMemory        vkResult = -1
	vkErrorOutOfDeviceMemory      vkResult = -2
	vkErrorInitializationFailed   vkResult = -3
	vkErrorDeviceLost             vkResult = -4
	vkErrorMemoryMapFailed        vkResult = -5
	vkErrorLayerNotPresent        vkResult = -6
	vkErrorExtensionNotPresent    vkResult = -7
	vkErrorFeatureNotPresent      vkResult = -8
	vkErrorIncompatibleDriver     vkResult = -9
	vkErrorTooManyObjects         vkResult = -10
	vkErrorFormatNotSupported     vkResult = -11
	vkErrorFragmentedPool         vkResult = -12
	vkErrorUnknown                vkResult = -13
	vkErrorOutOfPoolMemory        vkResult = -1000069000
	vkErrorInvalidExternalHandle  vkResult = -1000072003
	vkErrorFragmentation          vkResult = -1000161000
	vkErrorInvalidOpaqueCaptureAd vkResult = -1000257000
)

var resultNames = map[vkResult]string{
	vkSuccess: "VK_SUCCESS", vkNotReady: "VK_NOT_READY", vkTimeout: "VK_TIMEOUT", vkIncomplete: "VK_INCOMPLETE",
	vkErrorOutOfHostMemory: "VK_ERROR_OUT_OF_HOST_MEMORY", vkErrorOutOfDeviceMemory: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
	vkErrorInitializationFailed: "VK_ERROR_INITIALIZATION_FAILED", vkErrorDeviceLost: "VK_ERROR_DEVICE_LOST",
	vkErrorMemoryMapFailed: "VK_ERROR_MEMORY_MAP_FAILED", vkErrorLayerNotPresent: "VK_ERROR_LAYER_NOT_PRESENT",
	vkErrorExtensionNotPresent: "VK_ERROR_EXTENSION_NOT_PRESENT", vkErrorFeatureNotPresent: "VK_ERROR_FEATURE_NOT_PRESENT",
	vkErrorIncompatibleDriver: "VK_ERROR_INCOMPATIBLE_DRIVER", vkErrorTooManyObjects: "VK_ERROR_TOO_MANY_OBJECTS",
	vkErrorFormatNotSupported: "VK_ERROR_FORMAT_NOT_SUPPORTED", vkErrorFragmentedPool: "VK_ERROR_FRAGMENTED_POOL",
	vkErrorUnknown: "VK_ERROR_UNKNOWN", vkErrorOutOfPoolMemory: "VK_ERROR_OUT_OF_POOL_MEMORY",
	vkErrorInvalidExternalHandle: "VK_ERROR_INVALID_EXTERNAL_HANDLE", vkErrorFragmentation: "VK_ERROR_FRAGMENTATION",
	vkErrorInvalidOpaqueCaptureAd: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS",
}

// Error is a failed Vulkan call: the entry point and the VkResult.
type Error struct {
	Func string
	Code int32
}

func (e *Error) Error() string {
	name, ok := resultNames[vkResult(e.Code)]
	if !ok {
		name = fmt.Sprintf("VkResult %d", e.Code)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Func, name, e.Code)
}

// Is maps VkResults onto the device package's error kinds.
func (e *Error) Is(target error) bool {
	switch vkResult(e.Code) {
	case vkErrorOutOfDeviceMemory, vkErrorOutOfHostMemory, vkErrorOutOfPoolMemory, vkErrorFragmentation, vkErrorTooManyObjects:
		return target == device.ErrOutOfMemory
	case vkErrorExtensionNotPresent, vkErrorFeatureNotPresent, vkErrorIncompatibleDriver,
		vkErrorLayerNotPresent, vkErrorFormatNotSupported:
		return target == device.ErrUnsupported
	case vkErrorInvalidExternalHandle, vkErrorInvalidOpaqueCaptureAd:
		return target == device.ErrInvalid
	case vkNotReady, vkTimeout:
		return target == device.ErrNotReady
	}
	return false
}

// check turns a VkResult into nil or an *Error naming the call. Positive
// results other than the ones the caller handles are successes.
func check(fn string, r vkResult) error {
	if r >= 0 {
		return nil
	}
	return &Error{Func: fn, Code: int32(r)}
}

// cString copies a NUL-terminated string out of a fixed-size char array.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// pinned collects the Go memory that a Vulkan call reads through pointers
// nested in structures: every object is pinned so the collector neither
// moves nor frees it until release.
type pinned struct{ p runtime.Pinner }

// ref pins x and returns its address for a struct field.
func ref[T any](pn *pinned, x *T) uintptr {
	pn.p.Pin(x)
	return uintptr(unsafe.Pointer(x))
}

// refSlice pins the backing array of s and returns its address (0 when empty).
func refSlice[T any](pn *pinned, s []T) uintptr {
	if len(s) == 0 {
		return 0
	}
	pn.p.Pin(&s[0])
	return uintptr(unsafe.Pointer(&s[0]))
}

// cstr pins a NUL-terminated copy of s and returns its address.
func (pn *pinned) cstr(s string) uintptr {
	b := append([]byte(s), 0)
	return refSlice(pn, b)
}

func (pn *pinned) release() { pn.p.Unpin() }

// libraryOf returns the path of the shared object that holds the code at
// fn ("" when it cannot tell): for a device command, the driver's.
func libraryOf(fn uintptr) string {
	if fn == 0 {
		return ""
	}
	dladdr, err := purego.Dlsym(purego.RTLD_DEFAULT, "dladdr")
	if err != nil || dladdr == 0 {
		return ""
	}
	var info struct{ fname, fbase, sname, saddr uintptr } // Dl_info
	if r, _, _ := purego.SyscallN(dladdr, fn, uintptr(unsafe.Pointer(&info))); r == 0 || info.fname == 0 {
		return ""
	}
	return cStringAt(info.fname)
}

// mappedLibraries returns the paths of the shared objects mapped into the
// process, from /proc/self/maps (nil where there is no such file).
func mappedLibraries() map[string]bool {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		i := strings.IndexByte(line, '/')
		if i < 0 || strings.HasSuffix(line, " (deleted)") {
			continue
		}
		p := line[i:]
		if base := filepath.Base(p); strings.HasSuffix(base, ".so") || strings.Contains(base, ".so.") {
			out[p] = true
		}
	}
	return out
}

// pinNewLibraries keeps loaded, for the rest of the process, every shared
// object mapped now that was not in before (the driver the loader opened
// for this instance and what the driver loaded), and returns how many it
// pinned. The loader dlopens the driver in every vkCreateInstance (and in
// vkEnumerateInstanceExtensionProperties) and dlcloses it in
// vkDestroyInstance; NVIDIA's driver takes glibc's static TLS space each
// time it is loaded (libnvidia-tls), which runs out after about 30 opens,
// and vkCreateInstance then finds no driver (VK_ERROR_INCOMPATIBLE_DRIVER)
// for good. Keeping a part of the driver loaded is no cure (its other
// libraries are unloaded and reloaded around it, which corrupted the
// heap): the whole set stays, by one reference each that is never dropped.
func pinNewLibraries(before map[string]bool) int {
	if before == nil {
		return 0
	}
	n := 0
	for p := range mappedLibraries() {
		if before[p] {
			continue
		}
		if _, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL); err == nil {
			n++
		}
	}
	return n
}

// cStringAt copies the NUL-terminated string at p (at most 4 KiB).
func cStringAt(p uintptr) string {
	var b []byte
	for i := uintptr(0); i < 4096; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(nil), p+i)) // C memory, not Go's
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
