package vulkan

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/memwall/memwall/device"
)

var _ device.Device = (*Device)(nil)

// pickFamilies chooses the compute family (timestamps wanted, an
// async-compute family without graphics preferred) and a transfer-only
// family (-1 when the device has none).
func pickFamilies(qs []queueFamilyProperties) (compute, transfer int) {
	compute, transfer = -1, -1
	score := func(q queueFamilyProperties) int {
		s := 0
		if q.timestampBits > 0 {
			s += 2
		}
		if q.flags&queueGraphics == 0 {
			s++
		}
		return s
	}
	for i, q := range qs {
		if q.count == 0 {
			continue
		}
		if q.flags&queueCompute != 0 && (compute < 0 || score(q) > score(qs[compute])) {
			compute = i
		}
		// A copy-only family: no graphics, compute, video or optical flow.
		if q.flags&queueTransfer != 0 && q.flags&^(queueTransfer|queueSparseBinding|queueProtected) == 0 && transfer < 0 {
			transfer = i
		}
	}
	return compute, transfer
}

// createDevice creates the logical device with queues of the compute
// family and of the copy family (copyFamily when it is >= 0).
func (d *Device) createDevice(maxQueues int, sparse bool, copyFamily int) error {
	p := d.picked
	ci, ti := pickFamilies(p.queues)
	if ci < 0 {
		return fmt.Errorf("vulkan: device %q has no compute queue: %w", p.name(), device.ErrUnsupported)
	}
	if copyFamily >= 0 {
		if copyFamily >= len(p.queues) || p.queues[copyFamily].flags&queueTransfer == 0 && p.queues[copyFamily].flags&queueCompute == 0 {
			return fmt.Errorf("vulkan: queue family %d cannot copy: %w", copyFamily, device.ErrInvalid)
		}
		ti = copyFamily
		if ti == ci {
			ti = -1
		}
	}
	var pn pinned
	defer pn.release()
	prio := make([]float32, maxQueues)
	for i := range prio {
		prio[i] = 1
	}
	var qinfos []deviceQueueCreateInfo
	fams := []int{ci}
	if ti >= 0 {
		fams = append(fams, ti)
	}
	for _, f := range fams {
		n := min(int(p.queues[f].count), maxQueues)
		qinfos = append(qinfos, deviceQueueCreateInfo{sType: stDeviceQueueCreateInfo, family: uint32(f), count: uint32(n), priorities: refSlice(&pn, prio)})
	}

	var exts []string
	d.hasBudget = p.exts["VK_EXT_memory_budget"]
	d.hasPriority = p.exts["VK_EXT_memory_priority"] && p.prio.memoryPriority != 0
	d.hasHostImport = p.exts["VK_EXT_external_memory_host"]
	d.hasBDA = p.f12.b[f12BufferDeviceAddress] != 0
	d.hasClock = p.exts["VK_KHR_shader_clock"] && p.clock.deviceClock != 0
	for _, e := range []struct {
		on   bool
		name string
	}{{d.hasBudget, "VK_EXT_memory_budget"}, {d.hasPriority, "VK_EXT_memory_priority"}, {d.hasHostImport, "VK_EXT_external_memory_host"},
		{d.hasClock, "VK_KHR_shader_clock"}} {
		if e.on {
			exts = append(exts, e.name)
		}
	}
	if p.exts["VK_KHR_portability_subset"] { // must be enabled where offered
		exts = append(exts, "VK_KHR_portability_subset")
	}
	extPtrs := make([]uintptr, len(exts))
	for i, e := range exts {
		extPtrs[i] = pn.cstr(e)
	}
	var feats physicalDeviceFeatures
	feats[featShaderInt64] = p.feat.features[featShaderInt64]
	if sparse {
		feats[featSparseBinding] = p.feat.features[featSparseBinding]
		feats[featSparseResidencyBuffer] = p.feat.features[featSparseResidencyBuffer]
	}
	f12 := &physicalDeviceVulkan12Features{sType: stPhysicalDeviceVulkan12Features}
	f12.b[f12TimelineSemaphore] = 1
	f12.b[f12BufferDeviceAddress] = p.f12.b[f12BufferDeviceAddress]
	ftail := &f12.pNext
	if d.hasPriority {
		pf := &physicalDeviceMemoryPriorityFeatures{sType: stPhysicalDeviceMemoryPriorityFeats, memoryPriority: 1}
		*ftail = ref(&pn, pf)
		ftail = &pf.pNext
	}
	if d.hasClock {
		*ftail = ref(&pn, &physicalDeviceShaderClockFeatures{sType: stPhysicalDeviceShaderClockFeatures, deviceClock: 1})
	}
	info := &deviceCreateInfo{
		sType: stDeviceCreateInfo, pNext: ref(&pn, f12),
		queueInfoCount: uint32(len(qinfos)), queueInfos: refSlice(&pn, qinfos),
		extensionCount: uint32(len(exts)), extensions: refSlice(&pn, extPtrs),
		features: ref(&pn, &feats),
	}
	if err := check("vkCreateDevice", call(d.vk.createDevice, d.phys, uintptr(unsafe.Pointer(info)), 0, uintptr(unsafe.Pointer(&d.dev)))); err != nil {
		return fmt.Errorf("vulkan: device %q: %w", p.name(), err)
	}
	req, missing := resolve(d.vk.getDeviceProcAddr, d.dev, d.vk.deviceTable())
	if len(req) > 0 {
		callVoid(d.vk.destroyDevice, d.dev, 0)
		d.dev = 0
		return fmt.Errorf("vulkan: device %q lacks %s: %w", p.name(), strings.Join(req, ", "), device.ErrUnsupported)
	}
	if d.vk.getBufferDeviceAddress == 0 {
		d.hasBDA = false
	}
	if d.vk.getMemoryHostPointerProperties == 0 {
		d.hasHostImport = false
	}
	for i, qi := range qinfos {
		f := &family{index: qi.family, flags: p.queues[qi.family].flags, timestampBits: p.queues[qi.family].timestampBits}
		for j := range qi.count {
			q := &queue{family: qi.family, stampBits: f.timestampBits}
			callVoid(d.vk.getDeviceQueue, d.dev, uintptr(qi.family), uintptr(j), uintptr(unsafe.Pointer(&q.h)))
			f.queues = append(f.queues, q)
		}
		d.families = append(d.families, qi.family)
		if i == 0 {
			d.compute = f
		} else {
			d.transfer = f
		}
	}
	if d.transfer == nil {
		d.transfer = d.compute
	}
	d.fillInfo(missing)
	return nil
}

func (d *Device) fillInfo(missing []string) {
	p := d.picked
	in := &d.info
	in.Backend = "vulkan"
	in.Name = p.name()
	in.ComputeMajor = int(p.props.apiVersion >> 22 & 0x7F)
	in.ComputeMinor = int(p.props.apiVersion >> 12 & 0x3FF)
	in.Multiprocessors = 1 // unknown: Vulkan has no core query
	if p.sm.smCount > 0 {
		in.Multiprocessors = int(p.sm.smCount) // VK_NV_shader_sm_builtins
	}
	u := p.v11.deviceUUID
	in.UUID = fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	d.driverName, d.driverInfo = cString(p.drv.driverName[:]), cString(p.drv.driverInfo[:])
	in.DriverVersion = strings.TrimSpace(d.driverName + " " + d.driverInfo)
	if in.DriverVersion == "" {
		in.DriverVersion = versionString(p.props.driverVersion)
	}
	in.Integrated = p.props.deviceType == deviceTypeIntegrated || p.props.deviceType == deviceTypeCPU
	in.CanMapHostMemory = true
	if d.transfer != d.compute {
		in.CopyEngines = len(d.transfer.queues)
	}
	if p.pci.sType != 0 {
		in.PCIBusID = fmt.Sprintf("%04x:%02x:%02x.%x", p.pci.domain, p.pci.bus, p.pci.device, p.pci.function)
	}
	d.maxAlloc = p.v11.maxMemoryAllocationSize
	d.hostAlign = p.hostP.minImportedAlignment
	d.timestampNs = float64(*(*float32)(unsafe.Add(unsafe.Pointer(&p.props.limits), limTimestampPeriod)))
	d.pushBytes = p.limit32(limMaxPushConstantsSize)
	d.maxInvocation = p.limit32(limMaxComputeInvocations)
	for i := range 3 {
		d.maxGroupSize[i] = p.limit32(limMaxComputeWorkGroupSize + 4*uintptr(i))
	}
	dis := func(what, why string) { in.Disabled = append(in.Disabled, what+": "+why) }
	if !d.hasBudget {
		dis("memory budget", "VK_EXT_memory_budget absent: free memory is the heap size less this handle's allocations, other processes unseen")
	}
	if !d.hasPriority {
		dis("memory priority", "VK_EXT_memory_priority absent or its feature off")
	}
	if !d.hasHostImport {
		dis("host register", "VK_EXT_external_memory_host absent")
	}
	if !d.hasBDA {
		dis("kernels", "no buffer device addresses (bufferDeviceAddress feature off)")
	}
	if !d.hasClock {
		dis("memwall_spin", "VK_KHR_shader_clock's device clock absent")
	}
	if d.compute.timestampBits == 0 {
		dis("timing events", "the compute queue family has no timestamps")
	}
	if p.feat.features[featShaderInt64] == 0 {
		dis("kernels", "no shaderInt64")
	}
	for _, m := range missing {
		dis(m, "entry point not exported by the driver")
	}
}

// Close waits for the device to go idle and destroys the logical device
// and the instance. Memory still allocated is released with the device.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	var err error
	if d.dev != 0 {
		qs := d.allQueues()
		for _, q := range qs {
			q.mu.Lock()
		}
		err = check("vkDeviceWaitIdle", call(d.vk.deviceWaitIdle, d.dev))
		for _, q := range qs {
			q.mu.Unlock()
		}
		d.destroyAll()
		callVoid(d.vk.destroyDevice, d.dev, 0)
		d.dev = 0
	}
	d.destroyInstance()
	if err != nil {
		return fmt.Errorf("vulkan: %w", err)
	}
	return nil
}

// Info describes the device (see device.Info); Backend is "vulkan", the
// compute capability fields hold the Vulkan API version the device offers.
func (d *Device) Info() device.Info {
	in := d.info
	in.Disabled = append([]string(nil), d.info.Disabled...)
	return in
}

// allQueues returns every queue of the device once.
func (d *Device) allQueues() []*queue {
	qs := append([]*queue(nil), d.compute.queues...)
	if d.transfer != d.compute {
		qs = append(qs, d.transfer.queues...)
	}
	return qs
}
