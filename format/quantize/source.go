package quantize

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/mmap"
	"github.com/memwall/memwall/format/quant"
)

// FromModel makes a Source of an opened Llama model, for Write.
//
// From a GGUF file the tensors keep their names and the metadata is the
// file's, in its order. From a Hugging Face checkpoint (safetensors and
// config.json) the tensors are named, ordered and laid out as llama.cpp's
// converter writes them — GGUF names, Q and K rows permuted per head, norms
// in F32 — and the metadata is what the converter derives from config.json:
// general.architecture and general.name (name), llama.context_length,
// embedding_length, block_count, feed_forward_length, rope.dimension_count,
// rope.freq_base, attention.head_count, head_count_kv,
// layer_norm_rms_epsilon, key_length and value_length when the head
// dimension is not hidden/heads, vocab_size, and the BOS and EOS ids. The
// keys of extra (a tokenizer's tokenizer.ggml.*) are set last, replacing
// any of the same name.
//
// Either way, a model without tokenizer.ggml.model gets gguf.NoVocab, and
// Llama-3 rope scaling is written as llama.cpp writes it, a
// rope_freqs.weight tensor (gguf.Llama3RopeFactors), with no
// llama.rope.scaling.* keys: llama.cpp does not know the "llama3" scaling
// type memwall's reader accepts.
func FromModel(m *llama.Model, name string, extra []gguf.KV) (*Source, error) {
	cfg := m.Config
	src := &Source{Model: quant.Model{Arch: "llama", Layers: cfg.Layers, Heads: cfg.Heads, KVHeads: cfg.KVHeads}}
	w := m.Weights
	gg := w.Format == gguf.FormatName
	if gg {
		kvs, err := ggufMetadata(w.Path)
		if err != nil {
			return nil, err
		}
		src.Metadata = kvs
		if n, ok := w.Metadata["llama.expert_count"]; ok {
			if v, ok := n.(uint32); ok {
				src.Model.Experts = int(v)
			}
		}
	} else {
		src.Metadata = hfMetadata(cfg, name)
	}
	for _, kv := range extra {
		src.Metadata = gguf.Set(src.Metadata, kv.Key, kv.Value)
	}
	if _, ok := lookup(src.Metadata, gguf.KeyTokenizerModel); !ok {
		src.Metadata = append(src.Metadata, gguf.KV{Key: gguf.KeyTokenizerModel, Value: gguf.NoVocab})
	}
	haveFreqs := false
	for _, t := range w.Tensors {
		st, ok, err := sourceTensor(w, t, cfg, gg)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		haveFreqs = haveFreqs || st.Name == gguf.RopeFactorsName
		src.Tensors = append(src.Tensors, st)
	}
	if s := cfg.RopeScaling; s != nil {
		src.Metadata = gguf.Delete(src.Metadata, func(k string) bool { return strings.HasPrefix(k, "llama.rope.scaling.") })
		if !haveFreqs {
			f := gguf.Llama3RopeFactors(cfg.RopeTheta, cfg.HeadDim, s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalContext)
			b := make([]byte, 4*len(f))
			for i, v := range f {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
			}
			src.Tensors = append(src.Tensors, SourceTensor{Tensor: quant.Tensor{Name: gguf.RopeFactorsName, Type: quant.F32, Shape: []uint64{uint64(len(f))}}, Data: b, AsF32: true})
		}
	}
	return src, nil
}

func lookup(kvs []gguf.KV, key string) (any, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// ggufMetadata rereads a GGUF file's key/values in their order (a
// format.Model keeps them in a map).
func ggufMetadata(path string) ([]gguf.KV, error) {
	mp, err := mmap.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf %s: %w", path, err)
	}
	defer mp.Close()
	f, err := gguf.Parse(path, mp.Bytes())
	if err != nil {
		return nil, err
	}
	return f.Metadata, nil // Parse copies every value out of the mapping
}

// ggufNames are the GGUF names of the roles in a block.
var ggufNames = map[llama.Role]string{
	llama.RoleAttnNorm: "attn_norm.weight", llama.RoleQ: "attn_q.weight", llama.RoleK: "attn_k.weight",
	llama.RoleV: "attn_v.weight", llama.RoleO: "attn_output.weight", llama.RoleMLPNorm: "ffn_norm.weight",
	llama.RoleGate: "ffn_gate.weight", llama.RoleUp: "ffn_up.weight", llama.RoleDown: "ffn_down.weight",
	llama.RoleEmbedding: "token_embd.weight", llama.RoleFinalNorm: "output_norm.weight", llama.RoleLMHead: "output.weight",
}

// sourceTensor is t as Write reads it; ok is false for a tensor the
// converter drops (rotary caches).
func sourceTensor(w *format.Model, t format.Tensor, cfg *llama.Config, gg bool) (SourceTensor, bool, error) {
	typ, known := quant.TypeByName(t.DType)
	if !known {
		return SourceTensor{}, false, fmt.Errorf("%s %s: tensor %q: dtype %s cannot be read (BF16, F16, F32 and %s can)", w.Format, w.Path, t.Name, t.DType, typeList(quant.Quantized()))
	}
	st := SourceTensor{Tensor: quant.Tensor{Name: t.Name, Type: typ, Shape: t.Shape}, Data: w.Data(t)}
	if gg {
		return st, true, nil
	}
	layer, role, ok := llama.RoleOf(t.Name)
	if !ok {
		if strings.HasSuffix(t.Name, "rotary_emb.inv_freq") {
			return SourceTensor{}, false, nil
		}
		return SourceTensor{}, false, fmt.Errorf("%s %s: tensor %q: not a Llama tensor llama.cpp's converter would write", w.Format, w.Path, t.Name)
	}
	st.Name = ggufNames[role]
	if layer >= 0 {
		st.Name = "blk." + strconv.Itoa(layer) + "." + st.Name
	}
	if role == llama.RoleQ || role == llama.RoleK {
		st.HeadRows = cfg.HeadDim
	}
	if len(t.Shape) == 1 {
		st.AsF32 = true // the converter stores every 1-dimensional tensor in F32
	}
	return st, true, nil
}

func typeList(ts []quant.Type) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return strings.Join(s, ", ")
}

// hfMetadata is what llama.cpp's converter writes for a Llama config.json.
func hfMetadata(c *llama.Config, name string) []gguf.KV {
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: name},
		{Key: "llama.block_count", Value: uint32(c.Layers)},
		{Key: "llama.context_length", Value: uint32(c.Context)},
		{Key: "llama.embedding_length", Value: uint32(c.Hidden)},
		{Key: "llama.feed_forward_length", Value: uint32(c.Intermediate)},
		{Key: "llama.attention.head_count", Value: uint32(c.Heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(c.KVHeads)},
		{Key: "llama.rope.freq_base", Value: float32(c.RopeTheta)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(c.RMSNormEps)},
	}
	if c.HeadDim != c.Hidden/c.Heads {
		kv = append(kv, gguf.KV{Key: "llama.attention.key_length", Value: uint32(c.HeadDim)},
			gguf.KV{Key: "llama.attention.value_length", Value: uint32(c.HeadDim)})
	}
	kv = append(kv, gguf.KV{Key: "llama.vocab_size", Value: uint32(c.Vocab)},
		gguf.KV{Key: "llama.rope.dimension_count", Value: uint32(c.HeadDim)})
	if c.BOS >= 0 {
		kv = append(kv, gguf.KV{Key: "tokenizer.ggml.bos_token_id", Value: uint32(c.BOS)})
	}
	if len(c.EOS) > 0 {
		kv = append(kv, gguf.KV{Key: "tokenizer.ggml.eos_token_id", Value: uint32(c.EOS[0])})
	}
	return kv
}
