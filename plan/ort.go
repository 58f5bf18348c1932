package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DefaultORTWorkspace is the margin NewORTSettings adds when none is given:
// 64 MiB plus three times the arena, so that the limit leaves ONNX Runtime
// four times memwall's arena, half as much again as the most it was seen to
// need. It covers what memwall's plan does not see of an
// ORT session: ORT plans its activations itself, on the graph it has
// transformed (blocked-layout reorders, fused and decomposed operators,
// their own scratch buffers), and on the CPU provider that took up to 2.6
// times memwall's arena on the exported graphs of testdata/onnx/dynamo
// (BERT at 512 tokens, a UNet block at 256×256; with a 1 MiB margin both
// failed to run); plus the graph's inputs and outputs, convolution and GEMM
// workspaces, and the arena's own rounding and fragmentation.
func DefaultORTWorkspace(arenaBytes uint64) uint64 { return 64<<20 + 3*arenaBytes }

// ORT arena extension strategies, by the names the CUDA provider options
// take (OrtArenaCfg takes the numbers: kNextPowerOfTwo 0, kSameAsRequested
// 1).
const (
	ORTNextPowerOfTwo  = "kNextPowerOfTwo"
	ORTSameAsRequested = "kSameAsRequested"
)

// ORTArenaCfg is an OrtArenaCfg: ONNX Runtime's arena (BFC allocator)
// configuration, with the keys of CreateArenaCfgV2. -1 leaves a field to
// ORT's default.
type ORTArenaCfg struct {
	MaxMem                uint64 `json:"max_mem"`
	ArenaExtendStrategy   int    `json:"arena_extend_strategy"`
	InitialChunkSizeBytes int64  `json:"initial_chunk_size_bytes"`
	MaxDeadBytesPerChunk  int64  `json:"max_dead_bytes_per_chunk"`
}

// ORTSessionOptions are the SessionOptions fields that concern memory.
type ORTSessionOptions struct {
	EnableCPUMemArena bool `json:"enable_cpu_mem_arena"`
	EnableMemPattern  bool `json:"enable_mem_pattern"`
	EnableMemReuse    bool `json:"enable_mem_reuse"`
}

// ORTSettings are the ONNX Runtime settings that fit a planned model:
// memory limits from the model's weights, its planned activation arena and
// a stated workspace margin.
//
// The rule: TotalBytes = WeightBytes + ArenaBytes + WorkspaceBytes, rounded
// up to a MiB, caps the arena: the CUDA provider's gpu_mem_limit and the CPU
// arena's max_mem. The CUDA provider extends its arena by exactly what is
// requested (kSameAsRequested: no power-of-two overshoot past the model's
// need; its options take no initial chunk). The CPU arena (ArenaCfg) grows
// by powers of two from an initial chunk of TotalBytes, so that its first
// extension holds the whole model and there is no second, when TotalBytes
// fits the field (an int: below 2 GiB); above that it extends by exactly
// what is requested and the initial chunk is left to ORT (-1). C and C++
// callers may give ArenaCfg to the CUDA provider too, as its
// default_memory_arena_cfg. Memory patterns and reuse stay on (ORT plans
// its own activations once shapes are static), and so does the CPU arena.
type ORTSettings struct {
	WeightBytes    uint64 `json:"weights_bytes"`
	ArenaBytes     uint64 `json:"arena_bytes"`
	WorkspaceBytes uint64 `json:"workspace_bytes"`
	TotalBytes     uint64 `json:"total_bytes"`
	// CUDAProviderOptions are the CUDAExecutionProvider's options, as the
	// strings the Python API takes.
	CUDAProviderOptions map[string]string `json:"cuda_provider_options"`
	// ArenaCfg configures the CPU provider's arena (through an allocator
	// registered with the environment and session.use_env_allocators=1).
	ArenaCfg             ORTArenaCfg       `json:"arena_cfg"`
	SessionOptions       ORTSessionOptions `json:"session_options"`
	SessionConfigEntries map[string]string `json:"session_config_entries"`
}

// NewORTSettings returns the settings for a model of weightBytes of weights
// whose activations plan into arenaBytes, with workspaceBytes of margin (0:
// DefaultORTWorkspace). The sum must stay below 2^63.
func NewORTSettings(weightBytes, arenaBytes, workspaceBytes uint64) (ORTSettings, error) {
	if workspaceBytes == 0 {
		workspaceBytes = DefaultORTWorkspace(arenaBytes)
	}
	const mib = 1 << 20
	total := weightBytes + arenaBytes + workspaceBytes
	if weightBytes > math.MaxInt64 || arenaBytes > math.MaxInt64 || workspaceBytes > math.MaxInt64 || total > math.MaxInt64-mib {
		return ORTSettings{}, fmt.Errorf("plan: ORT settings: weights %d + arena %d + workspace %d bytes overflow", weightBytes, arenaBytes, workspaceBytes)
	}
	total = (total + mib - 1) / mib * mib
	s := ORTSettings{WeightBytes: weightBytes, ArenaBytes: arenaBytes, WorkspaceBytes: workspaceBytes, TotalBytes: total,
		SessionOptions:       ORTSessionOptions{EnableCPUMemArena: true, EnableMemPattern: true, EnableMemReuse: true},
		SessionConfigEntries: map[string]string{"session.use_env_allocators": "1"}}
	s.CUDAProviderOptions = map[string]string{
		"gpu_mem_limit":         strconv.FormatUint(total, 10),
		"arena_extend_strategy": ORTSameAsRequested,
	}
	s.ArenaCfg = ORTArenaCfg{MaxMem: total, ArenaExtendStrategy: 1, InitialChunkSizeBytes: -1, MaxDeadBytesPerChunk: -1}
	if total <= math.MaxInt32 {
		s.ArenaCfg.ArenaExtendStrategy, s.ArenaCfg.InitialChunkSizeBytes = 0, int64(total)
	}
	return s, nil
}

// Python returns the lines to paste into a Python program that opens model
// with these settings: the session options, the CPU arena registered with
// the environment, and the CUDA provider's options (the CPU provider
// follows it, so the lines also run where only the CPU provider exists).
func (s ORTSettings) Python(model string) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	pyBool := func(v bool) string {
		if v {
			return "True"
		}
		return "False"
	}
	w("import onnxruntime as ort")
	w("")
	w("# weights %d + planned arena %d + workspace %d bytes = %d (rounded up to a MiB)", s.WeightBytes, s.ArenaBytes, s.WorkspaceBytes, s.TotalBytes)
	w("so = ort.SessionOptions()")
	w("so.enable_cpu_mem_arena = %s", pyBool(s.SessionOptions.EnableCPUMemArena))
	w("so.enable_mem_pattern = %s", pyBool(s.SessionOptions.EnableMemPattern))
	w("so.enable_mem_reuse = %s", pyBool(s.SessionOptions.EnableMemReuse))
	w("# the CPU provider's arena: max_mem, arena_extend_strategy, initial_chunk_size_bytes, max_dead_bytes_per_chunk")
	w("ort.create_and_register_allocator(")
	w("    ort.OrtMemoryInfo(\"Cpu\", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT),")
	w("    ort.OrtArenaCfg(%d, %d, %d, %d))", s.ArenaCfg.MaxMem, s.ArenaCfg.ArenaExtendStrategy, s.ArenaCfg.InitialChunkSizeBytes, s.ArenaCfg.MaxDeadBytesPerChunk)
	w("so.add_session_config_entry(\"session.use_env_allocators\", \"1\")")
	w("providers = [")
	w("    (\"CUDAExecutionProvider\", {\"gpu_mem_limit\": %q, \"arena_extend_strategy\": %q}),",
		s.CUDAProviderOptions["gpu_mem_limit"], s.CUDAProviderOptions["arena_extend_strategy"])
	w("    \"CPUExecutionProvider\",")
	w("]")
	w("sess = ort.InferenceSession(%q, sess_options=so, providers=providers)", model)
	return b.String()
}
