//lint:file-ignore U1000 the structures mirror their C declarations field for field: unused fields hold the offsets of the used ones

package vulkan

// Vulkan structures laid out by hand. Go lays out these field types (32- and
// 64-bit integers, float32, uintptr) exactly as the C ABI of the platforms
// Vulkan runs on, so each struct mirrors its C declaration in
// vulkan_core.h field for field; TestStructSizes holds the sizes. Pointer
// fields are uintptr: what they point at is pinned for the duration of the
// call (see pinned), never a Go pointer the collector could move or free.

// sType values.
const (
	stApplicationInfo                   = 0
	stInstanceCreateInfo                = 1
	stDeviceQueueCreateInfo             = 2
	stDeviceCreateInfo                  = 3
	stSubmitInfo                        = 4
	stMemoryAllocateInfo                = 5
	stBindSparseInfo                    = 7
	stSemaphoreCreateInfo               = 9
	stQueryPoolCreateInfo               = 11
	stBufferCreateInfo                  = 12
	stShaderModuleCreateInfo            = 16
	stPipelineShaderStageCreateInfo     = 18
	stComputePipelineCreateInfo         = 29
	stPipelineLayoutCreateInfo          = 30
	stCommandPoolCreateInfo             = 39
	stCommandBufferAllocateInfo         = 40
	stCommandBufferBeginInfo            = 42
	stMemoryBarrier                     = 46
	stPhysicalDeviceVulkan11Properties  = 50
	stPhysicalDeviceVulkan12Features    = 51
	stPhysicalDeviceFeatures2           = 1000059000
	stPhysicalDeviceProperties2         = 1000059001
	stPhysicalDeviceMemoryProperties2   = 1000059006
	stMemoryAllocateFlagsInfo           = 1000060000
	stExternalMemoryBufferCreateInfo    = 1000072000
	stImportMemoryHostPointerInfo       = 1000178000
	stMemoryHostPointerProperties       = 1000178001
	stPhysicalDeviceExternalMemoryHost  = 1000178002
	stPhysicalDeviceDriverProperties    = 1000196000
	stSemaphoreTypeCreateInfo           = 1000207002
	stTimelineSemaphoreSubmitInfo       = 1000207003
	stSemaphoreWaitInfo                 = 1000207004
	stPhysicalDevicePCIBusInfo          = 1000212000
	stPhysicalDeviceMemoryBudget        = 1000237000
	stPhysicalDeviceMemoryPriorityFeats = 1000238000
	stPhysicalDeviceShaderClockFeatures = 1000181000
	stPhysicalDeviceShaderSMBuiltinsNV  = 1000154001
	stMemoryPriorityAllocateInfo        = 1000238001
	stBufferDeviceAddressInfo           = 1000244001
)

// Flags and enums.
const (
	queueGraphics      = 0x1
	queueCompute       = 0x2
	queueTransfer      = 0x4
	queueSparseBinding = 0x8
	queueProtected     = 0x10

	memDeviceLocal  = 0x1
	memHostVisible  = 0x2
	memHostCoherent = 0x4
	memHostCached   = 0x8
	memLazily       = 0x10
	memProtected    = 0x20
	memAMDCoherent  = 0x40 // DEVICE_COHERENT_BIT_AMD and the uncached bit after it
	memAMDUncached  = 0x80
	heapDeviceLocal = 0x1

	bufferUsageTransferSrc   = 0x1
	bufferUsageTransferDst   = 0x2
	bufferUsageStorage       = 0x20
	bufferUsageDeviceAddress = 0x20000
	bufferCreateSparse       = 0x1

	sharingExclusive  = 0
	sharingConcurrent = 1

	memoryAllocateDeviceAddress = 0x2
	externalHostAllocation      = 0x80

	stageTopOfPipe   = 0x1
	stageCompute     = 0x800
	stageTransfer    = 0x1000
	stageBottom      = 0x2000
	stageAllCommands = 0x10000

	accessShaderRead  = 0x20
	accessShaderWrite = 0x40
	accessMemRead     = 0x8000
	accessMemWrite    = 0x10000

	shaderStageCompute  = 0x20
	bindPointCompute    = 1
	queryTypeTimestamp  = 2
	queryResult64       = 0x1
	poolResetCommandBuf = 0x2
	oneTimeSubmit       = 0x1
	semaphoreTimeline   = 1

	deviceTypeIntegrated = 1
	deviceTypeDiscrete   = 2
	deviceTypeVirtual    = 3
	deviceTypeCPU        = 4

	instanceEnumeratePortability = 0x1
)

type applicationInfo struct {
	sType         uint32
	pNext         uintptr
	appName       uintptr
	appVersion    uint32
	engineName    uintptr
	engineVersion uint32
	apiVersion    uint32
}

type instanceCreateInfo struct {
	sType          uint32
	pNext          uintptr
	flags          uint32
	appInfo        uintptr
	layerCount     uint32
	layers         uintptr
	extensionCount uint32
	extensions     uintptr
}

type deviceQueueCreateInfo struct {
	sType      uint32
	pNext      uintptr
	flags      uint32
	family     uint32
	count      uint32
	priorities uintptr
}

type deviceCreateInfo struct {
	sType          uint32
	pNext          uintptr
	flags          uint32
	queueInfoCount uint32
	queueInfos     uintptr
	layerCount     uint32
	layers         uintptr
	extensionCount uint32
	extensions     uintptr
	features       uintptr
}

// physicalDeviceProperties is VkPhysicalDeviceProperties; the limits are
// read by offset from the raw bytes (limitsAt and the constants below).
type physicalDeviceProperties struct {
	apiVersion    uint32
	driverVersion uint32
	vendorID      uint32
	deviceID      uint32
	deviceType    uint32
	deviceName    [256]byte
	pipelineUUID  [16]byte
	limits        [63]uint64 // VkPhysicalDeviceLimits (504 bytes), 8-aligned at offset 296
	sparse        [5]uint32
}

// Offsets within VkPhysicalDeviceLimits.
const (
	limSparseAddressSpaceSize  = 56
	limMaxPushConstantsSize    = 32
	limMaxComputeWorkGroupCnt  = 220
	limMaxComputeInvocations   = 232
	limMaxComputeWorkGroupSize = 236
	limMinStorageBufferAlign   = 328
	limTimestampComputeGfx     = 420
	limTimestampPeriod         = 424
	limNonCoherentAtomSize     = 496
)

type physicalDeviceProperties2 struct {
	sType uint32
	pNext uintptr
	props physicalDeviceProperties
}

type physicalDeviceVulkan11Properties struct {
	sType                   uint32
	pNext                   uintptr
	deviceUUID              [16]byte
	driverUUID              [16]byte
	deviceLUID              [8]byte
	deviceNodeMask          uint32
	deviceLUIDValid         uint32
	subgroupSize            uint32
	subgroupStages          uint32
	subgroupOps             uint32
	subgroupQuadAllStages   uint32
	pointClipping           uint32
	maxMultiviewViewCount   uint32
	maxMultiviewInstance    uint32
	protectedNoFault        uint32
	maxPerSetDescriptors    uint32
	maxMemoryAllocationSize uint64
}

type physicalDeviceDriverProperties struct {
	sType       uint32
	pNext       uintptr
	driverID    uint32
	driverName  [256]byte
	driverInfo  [256]byte
	conformance [4]byte
}

type physicalDeviceExternalMemoryHostProperties struct {
	sType                uint32
	pNext                uintptr
	minImportedAlignment uint64
}

type physicalDeviceShaderSMBuiltinsNV struct {
	sType      uint32
	pNext      uintptr
	smCount    uint32
	warpsPerSM uint32
}

type physicalDevicePCIBusInfo struct {
	sType    uint32
	pNext    uintptr
	domain   uint32
	bus      uint32
	device   uint32
	function uint32
}

// physicalDeviceFeatures is VkPhysicalDeviceFeatures: 55 VkBool32s.
type physicalDeviceFeatures [55]uint32

// Indexes into physicalDeviceFeatures (byte offset / 4).
const (
	featShaderInt64           = 160 / 4
	featSparseBinding         = 176 / 4
	featSparseResidencyBuffer = 180 / 4
	featSparseResidencyAlias  = 208 / 4
)

type physicalDeviceFeatures2 struct {
	sType    uint32
	pNext    uintptr
	features physicalDeviceFeatures
}

// physicalDeviceVulkan12Features is VkPhysicalDeviceVulkan12Features: 47
// VkBool32s after the header.
type physicalDeviceVulkan12Features struct {
	sType uint32
	pNext uintptr
	b     [48]uint32
}

// Indexes into physicalDeviceVulkan12Features.b ((offset - 16) / 4).
const (
	f12HostQueryReset      = (160 - 16) / 4
	f12TimelineSemaphore   = (164 - 16) / 4
	f12BufferDeviceAddress = (168 - 16) / 4
)

type physicalDeviceMemoryPriorityFeatures struct {
	sType          uint32
	pNext          uintptr
	memoryPriority uint32
}

type physicalDeviceShaderClockFeatures struct {
	sType         uint32
	pNext         uintptr
	subgroupClock uint32
	deviceClock   uint32
}

type memoryType struct {
	flags uint32
	heap  uint32
}

type memoryHeap struct {
	size  uint64
	flags uint32
}

type physicalDeviceMemoryProperties struct {
	typeCount uint32
	types     [32]memoryType
	heapCount uint32
	heaps     [16]memoryHeap
}

type physicalDeviceMemoryProperties2 struct {
	sType uint32
	pNext uintptr
	props physicalDeviceMemoryProperties
}

type physicalDeviceMemoryBudget struct {
	sType  uint32
	pNext  uintptr
	budget [16]uint64
	usage  [16]uint64
}

type queueFamilyProperties struct {
	flags          uint32
	count          uint32
	timestampBits  uint32
	minGranularity [3]uint32
}

type extensionProperties struct {
	name    [256]byte
	version uint32
}

type memoryAllocateInfo struct {
	sType   uint32
	pNext   uintptr
	size    uint64
	typeIdx uint32
}

type memoryAllocateFlagsInfo struct {
	sType      uint32
	pNext      uintptr
	flags      uint32
	deviceMask uint32
}

type memoryPriorityAllocateInfo struct {
	sType    uint32
	pNext    uintptr
	priority float32
}

type importMemoryHostPointerInfo struct {
	sType      uint32
	pNext      uintptr
	handleType uint32
	host       uintptr
}

type memoryHostPointerProperties struct {
	sType    uint32
	pNext    uintptr
	typeBits uint32
}

type externalMemoryBufferCreateInfo struct {
	sType       uint32
	pNext       uintptr
	handleTypes uint32
}

type bufferCreateInfo struct {
	sType       uint32
	pNext       uintptr
	flags       uint32
	size        uint64
	usage       uint32
	sharing     uint32
	familyCount uint32
	families    uintptr
}

type memoryRequirements struct {
	size      uint64
	alignment uint64
	typeBits  uint32
}

type bufferDeviceAddressInfo struct {
	sType  uint32
	pNext  uintptr
	buffer uint64
}

type commandPoolCreateInfo struct {
	sType  uint32
	pNext  uintptr
	flags  uint32
	family uint32
}

type commandBufferAllocateInfo struct {
	sType uint32
	pNext uintptr
	pool  uint64
	level uint32
	count uint32
}

type commandBufferBeginInfo struct {
	sType       uint32
	pNext       uintptr
	flags       uint32
	inheritance uintptr
}

type bufferCopy struct {
	srcOffset uint64
	dstOffset uint64
	size      uint64
}

type memoryBarrier struct {
	sType     uint32
	pNext     uintptr
	srcAccess uint32
	dstAccess uint32
}

type submitInfo struct {
	sType            uint32
	pNext            uintptr
	waitCount        uint32
	waitSemaphores   uintptr
	waitStages       uintptr
	cmdCount         uint32
	cmds             uintptr
	signalCount      uint32
	signalSemaphores uintptr
}

type timelineSemaphoreSubmitInfo struct {
	sType        uint32
	pNext        uintptr
	waitCount    uint32
	waitValues   uintptr
	signalCount  uint32
	signalValues uintptr
}

type semaphoreCreateInfo struct {
	sType uint32
	pNext uintptr
	flags uint32
}

type semaphoreTypeCreateInfo struct {
	sType   uint32
	pNext   uintptr
	kind    uint32
	initial uint64
}

type semaphoreWaitInfo struct {
	sType      uint32
	pNext      uintptr
	flags      uint32
	count      uint32
	semaphores uintptr
	values     uintptr
}

type queryPoolCreateInfo struct {
	sType      uint32
	pNext      uintptr
	flags      uint32
	queryType  uint32
	count      uint32
	statistics uint32
}

type shaderModuleCreateInfo struct {
	sType    uint32
	pNext    uintptr
	flags    uint32
	codeSize uintptr
	code     uintptr
}

type specializationMapEntry struct {
	id     uint32
	offset uint32
	size   uintptr
}

type specializationInfo struct {
	count    uint32
	entries  uintptr
	dataSize uintptr
	data     uintptr
}

type pipelineShaderStageCreateInfo struct {
	sType  uint32
	pNext  uintptr
	flags  uint32
	stage  uint32
	module uint64
	name   uintptr
	spec   uintptr
}

type computePipelineCreateInfo struct {
	sType     uint32
	pNext     uintptr
	flags     uint32
	stage     pipelineShaderStageCreateInfo
	layout    uint64
	base      uint64
	baseIndex int32
}

type pushConstantRange struct {
	stages uint32
	offset uint32
	size   uint32
}

type pipelineLayoutCreateInfo struct {
	sType      uint32
	pNext      uintptr
	flags      uint32
	setCount   uint32
	sets       uintptr
	pushCount  uint32
	pushRanges uintptr
}

type sparseMemoryBind struct {
	resourceOffset uint64
	size           uint64
	memory         uint64
	memoryOffset   uint64
	flags          uint32
}

type sparseBufferMemoryBindInfo struct {
	buffer    uint64
	bindCount uint32
	binds     uintptr
}

type bindSparseInfo struct {
	sType            uint32
	pNext            uintptr
	waitCount        uint32
	waitSemaphores   uintptr
	bufferBindCount  uint32
	bufferBinds      uintptr
	opaqueBindCount  uint32
	opaqueBinds      uintptr
	imageBindCount   uint32
	imageBinds       uintptr
	signalCount      uint32
	signalSemaphores uintptr
}
