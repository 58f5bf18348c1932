package quant

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// QuantizationVersion is ggml's GGML_QNT_VERSION, which llama-quantize
// records as general.quantization_version in the files it writes.
const QuantizationVersion = 2

// FileType is a llama.cpp file type (llama_ftype, stored as GGUF's
// general.file_type): a default tensor type and the rules that give some
// tensors more bits. Only the types this package writes are defined.
type FileType uint32

// File types, numbered as llama.h numbers them.
const (
	MostlyQ4_0   FileType = 2
	MostlyQ8_0   FileType = 7
	MostlyQ4_K_M FileType = 15
	MostlyQ5_K_M FileType = 17
	MostlyQ6_K   FileType = 18
)

var fileTypes = []struct {
	ft   FileType
	name string
	def  Type
}{
	{MostlyQ4_K_M, "Q4_K_M", Q4_K},
	{MostlyQ5_K_M, "Q5_K_M", Q5_K},
	{MostlyQ6_K, "Q6_K", Q6_K},
	{MostlyQ8_0, "Q8_0", Q8_0},
	{MostlyQ4_0, "Q4_0", Q4_0},
}

// FileTypes returns the file types Choose knows, most used first.
func FileTypes() []FileType {
	out := make([]FileType, len(fileTypes))
	for i, f := range fileTypes {
		out[i] = f.ft
	}
	return out
}

// ParseFileType returns the file type llama-quantize calls name
// ("Q4_K_M", any case).
func ParseFileType(name string) (FileType, bool) {
	for _, f := range fileTypes {
		if strings.EqualFold(f.name, name) {
			return f.ft, true
		}
	}
	return 0, false
}

// String is llama-quantize's name for f ("Q4_K_M").
func (f FileType) String() string {
	for _, e := range fileTypes {
		if e.ft == f {
			return e.name
		}
	}
	return "ftype(" + strconv.FormatUint(uint64(f), 10) + ")"
}

// Default is the type of every tensor no rule singles out.
func (f FileType) Default() Type {
	for _, e := range fileTypes {
		if e.ft == f {
			return e.def
		}
	}
	return 0
}

// Model is what Choose needs to know of a model beyond its tensors.
type Model struct {
	Arch    string // GGUF general.architecture; only "llama" is known
	Layers  int    // llama.block_count
	Heads   int    // attention heads
	KVHeads int    // key/value heads
	Experts int    // experts per MoE layer, 0 for a dense model
}

// Tensor is one tensor as Choose sees it: its GGUF name (blk.N.attn_v.weight,
// token_embd.weight, ...), its type in the source and its shape, outermost
// first (so the row length is the last dimension).
type Tensor struct {
	Name  string
	Type  Type
	Shape []uint64
}

// Choose returns the type each tensor gets in a file of type f, in the
// order given, by llama.cpp's rules (llama_tensor_get_type, as
// llama-quantize applies them without an importance matrix or overrides):
// tensors of fewer than two dimensions, norms and names not ending in
// "weight" keep their type; output.weight (and token_embd.weight when there
// is no output.weight) gets Q6_K unless f is Q8_0; Q4_K_M and Q5_K_M give
// Q6_K to attn_v and ffn_down in the first and last eighth of the layers
// and every third layer between (for attn_v, over its own count), and a
// Llama-2-70B-shaped model (80 layers, grouped-query attention) Q5_K to the
// other attn_v of Q4_K_M; the rest get f's default. A type whose block does
// not divide the row length falls back as llama.cpp's does (Q4_K to Q5_0,
// Q5_K to Q5_1, Q6_K to Q8_0, then F16); Q8_0 and Q4_0 rows of a length that
// is not a multiple of 32 are an error, as they are for llama-quantize.
// Counters run in llama.cpp's order (by layer, then by name), whatever the
// order of tensors.
func Choose(f FileType, m Model, tensors []Tensor) ([]Type, error) {
	def := f.Default()
	if def == 0 {
		return nil, fmt.Errorf("quant: file type %v is not one this package writes", f)
	}
	if m.Arch != "llama" {
		return nil, fmt.Errorf("quant: architecture %q: only llama's rules are implemented", m.Arch)
	}
	names := make([]string, len(tensors))
	for i, t := range tensors {
		names[i] = t.Name
	}
	order := Order(names)
	s := mixState{f: f, m: m, tied: true}
	for _, t := range tensors {
		switch category(t.Name) {
		case catAttnV, catAttnQKV:
			s.nAttnV++
		case catOutput:
			s.tied = false
		}
	}
	out := make([]Type, len(tensors))
	for _, i := range order {
		t := tensors[i]
		if !quantizable(t) {
			out[i] = t.Type
			continue
		}
		typ, err := fallback(t, s.choose(t, def))
		if err != nil {
			return nil, err
		}
		out[i] = typ
	}
	return out, nil
}

// Order returns the indices of names in llama-quantize's order: tensors
// outside the blocks first, then block by block (blk.N. with N as a
// number), by name within each. It is the order Choose counts layers in and
// the order llama-quantize writes a file in.
func Order(names []string) []int {
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		la, lb := blockOf(names[a]), blockOf(names[b])
		if la != lb {
			return la - lb
		}
		return strings.Compare(names[a], names[b])
	})
	return order
}

// blockOf is the N of a "blk.N." name, or -1 (llama.cpp's sort key).
func blockOf(name string) int {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return -1
	}
	digits := rest
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		digits = rest[:i]
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

type tensorCategory int

const (
	catOther tensorCategory = iota
	catTokenEmbd
	catOutput
	catAttnQ
	catAttnK
	catAttnV
	catAttnQKV
	catAttnKVB
	catAttnOutput
	catFFNUp
	catFFNGate
	catFFNDown
)

// category is llama.cpp's tensor_get_category.
func category(name string) tensorCategory {
	switch {
	case name == "output.weight":
		return catOutput
	case name == "token_embd.weight" || name == "per_layer_token_embd.weight":
		return catTokenEmbd
	case strings.Contains(name, "attn_qkv.weight"):
		return catAttnQKV
	case strings.Contains(name, "attn_kv_b.weight"):
		return catAttnKVB
	case strings.Contains(name, "attn_v.weight"):
		return catAttnV
	case strings.Contains(name, "attn_k.weight"):
		return catAttnK
	case strings.Contains(name, "attn_q.weight"):
		return catAttnQ
	case strings.Contains(name, "attn_output.weight"):
		return catAttnOutput
	case strings.Contains(name, "ffn_up"):
		return catFFNUp
	case strings.Contains(name, "ffn_gate"):
		return catFFNGate
	case strings.Contains(name, "ffn_down"):
		return catFFNDown
	}
	return catOther
}

// notQuantized are the name fragments llama.cpp never quantizes (norms,
// routers, positional tables, small special-purpose matrices).
var notQuantized = []string{
	"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
	"ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
	"time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
	"time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
	"time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
	"time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
	"attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
	".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
}

// quantizable is llama.cpp's tensor_allows_quantization.
func quantizable(t Tensor) bool {
	if dims(t.Shape) < 2 || !strings.HasSuffix(t.Name, "weight") {
		return false
	}
	if t.Name == "position_embd.weight" || t.Name == "token_types.weight" {
		return false
	}
	for _, s := range notQuantized {
		if strings.Contains(t.Name, s) {
			return false
		}
	}
	return true
}

// dims is ggml_n_dims: the dimensions up to the last one (outermost) that
// is longer than 1, at least 1.
func dims(shape []uint64) int {
	for i, d := range shape {
		if d > 1 {
			return len(shape) - i
		}
	}
	return 1
}

// rowLen is ne[0], the row length.
func rowLen(shape []uint64) uint64 {
	if len(shape) == 0 {
		return 1
	}
	return shape[len(shape)-1]
}

type mixState struct {
	f        FileType
	m        Model
	tied     bool // no output.weight: token_embd is the LM head too
	nAttnV   int
	iAttnV   int
	iFFNDown int
}

// moreBits is llama.cpp's use_more_bits: the first and last eighth of the
// layers and every third one between.
func moreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// choose is llama_tensor_get_type_impl for the file types defined here.
func (s *mixState) choose(t Tensor, typ Type) Type {
	f := s.f
	kmix := f == MostlyQ4_K_M || f == MostlyQ5_K_M
	cat := category(t.Name)
	switch {
	case cat == catOutput || s.tied && cat == catTokenEmbd:
		if rowLen(t.Shape)%uint64(typ.BlockElems()) != 0 {
			return Q8_0
		}
		if typ != Q8_0 {
			return Q6_K
		}
	case cat == catTokenEmbd:
	case cat == catAttnV || cat == catAttnQKV || cat == catAttnKVB:
		if kmix && moreBits(s.iAttnV, s.nAttnV) {
			typ = Q6_K
		}
		if s.m.Layers == 80 && s.m.Heads != s.m.KVHeads && typ == Q4_K {
			// llama.cpp's LLM_TYPE_70B: V is 8 times smaller than Q there.
			typ = Q5_K
		}
		if s.m.Experts == 8 {
			typ = Q8_0
		}
		s.iAttnV++
	case cat == catAttnK:
		if s.m.Experts == 8 {
			typ = Q8_0
		}
	case cat == catFFNDown:
		i := s.layer(t.Name, s.iFFNDown)
		if kmix && moreBits(i, s.m.Layers) {
			typ = Q6_K
		}
		s.iFFNDown++
	case cat == catAttnOutput:
		if s.m.Experts == 8 && f == MostlyQ4_K_M {
			typ = Q5_K
		}
	}
	return typ
}

// layer is llama.cpp's layer_info: the running count for a dense model,
// the block number in the name for a mixture of experts.
func (s *mixState) layer(name string, count int) int {
	if s.m.Experts > 1 {
		if b := blockOf(name); b >= 0 {
			return b
		}
	}
	return count
}

// fallback is llama.cpp's tensor_type_fallback: a type whose blocks do not
// divide the row length gives way to a 32-element one, or to F16.
func fallback(t Tensor, typ Type) (Type, error) {
	n := rowLen(t.Shape)
	if n%uint64(typ.BlockElems()) == 0 {
		return typ, nil
	}
	var next Type
	switch typ {
	case Q4_K:
		next = Q5_0
	case Q5_K:
		next = Q5_1
	case Q6_K:
		next = Q8_0
	default:
		return 0, fmt.Errorf("quant: tensor %q: row length %d is not a multiple of the %v block size %d, and llama.cpp defines no fallback for %v", t.Name, n, typ, typ.BlockElems(), typ)
	}
	if n%uint64(next.BlockElems()) != 0 {
		next = F16
	}
	return next, nil
}
