package trace

// Action is what an allocation-trace event records. The names (String,
// ParseAction) are PyTorch's TraceEntry action names, shared by all three
// formats.
type Action uint8

// Actions a Reader returns. ActionInvalid is the zero value and never
// returned.
const (
	ActionInvalid Action = iota
	// Alloc: the program received the block [Addr, Addr+Size).
	Alloc
	// FreeRequested: the program dropped the block; its memory may still be
	// in use by work queued on other streams.
	FreeRequested
	// FreeCompleted: the block's memory can be reused. Alloc and
	// FreeCompleted bracket a block's life.
	FreeCompleted
	// SegmentAlloc: the allocator reserved device memory (cudaMalloc).
	SegmentAlloc
	// SegmentFree: the allocator returned a segment to the driver.
	SegmentFree
	// SegmentMap: an expandable segment mapped Size more bytes at Addr.
	SegmentMap
	// SegmentUnmap: an expandable segment unmapped Size bytes at Addr.
	SegmentUnmap
	// OOM: an allocation of Size bytes failed; Event.DeviceFree holds what
	// the driver still reported free. Addr is 0.
	OOM
	numActions
)

var actionNames = [numActions]string{
	ActionInvalid: "invalid",
	Alloc:         "alloc",
	FreeRequested: "free_requested",
	FreeCompleted: "free_completed",
	SegmentAlloc:  "segment_alloc",
	SegmentFree:   "segment_free",
	SegmentMap:    "segment_map",
	SegmentUnmap:  "segment_unmap",
	OOM:           "oom",
}

// String returns PyTorch's name for a ("alloc", "free_completed", ...).
func (a Action) String() string {
	if a < numActions {
		return actionNames[a]
	}
	return "invalid"
}

// ParseAction returns the Action named s. ok is false for the ignored
// marker actions and for unknown names; ignored reports which of the two.
func ParseAction(s string) (a Action, ok, ignored bool) {
	return parseActionBytes([]byte(s))
}

// parseActionBytes is ParseAction on bytes without allocating (the switch
// on string(b) does not copy).
func parseActionBytes(b []byte) (a Action, ok, ignored bool) {
	switch string(b) {
	case "alloc":
		return Alloc, true, false
	case "free_requested":
		return FreeRequested, true, false
	case "free_completed":
		return FreeCompleted, true, false
	case "segment_alloc":
		return SegmentAlloc, true, false
	case "segment_free":
		return SegmentFree, true, false
	case "segment_map":
		return SegmentMap, true, false
	case "segment_unmap":
		return SegmentUnmap, true, false
	case "oom":
		return OOM, true, false
	case "snapshot", "annotate":
		return ActionInvalid, false, true
	}
	return ActionInvalid, false, false
}

// Event is one allocation-trace record. Sizes and addresses are bytes.
// Fields a format does not carry are zero: CSV has no Time, Device, Tenant
// or Purpose; a PyTorch snapshot has no Tenant or Purpose.
type Event struct {
	Action Action
	Addr   uint64 // block or segment address; 0 for OOM
	Size   uint64 // bytes
	Stream uint64 // the allocator's stream handle (opaque)
	// Time is nanoseconds on the recorder's clock (a snapshot's time_us
	// times 1000; memwall's "t"); 0 when the format has none.
	Time int64
	// Device is the device index (a snapshot's device_traces index;
	// memwall's "device"); 0 when the format has none.
	Device int
	// DeviceFree is, for OOM only, the bytes the driver still reported free.
	DeviceFree uint64
	// Tenant and Purpose label memwall pool events ("weights",
	// "activations", "kv", ...); empty for PyTorch traces.
	Tenant  string
	Purpose string
}

// MaxSize is the largest Size a Validator accepts (1 TiB): larger sizes in a
// trace are corrupt data, not memory.
const MaxSize = 1 << 40
