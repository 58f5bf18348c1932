package llama

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/format/weights"
)

// Block is one transformer block's tensors.
type Block struct {
	AttnNorm, Q, K, V, O, MLPNorm, Gate, Up, Down format.Tensor
}

// Tensors is every tensor of the model by role. LMHead is the embedding
// when the embeddings are tied.
type Tensors struct {
	Embedding format.Tensor
	Blocks    []Block
	FinalNorm format.Tensor
	LMHead    format.Tensor
	// MatrixDType is the dtype every matrix shares ("BF16", "F16", "F32"),
	// or "F32" when any matrix is block-quantized (Quantized): products
	// over quantized weights take and give float32 activations, and each
	// matrix's own type is its Tensor.DType (types may mix in one file).
	MatrixDType string
	// Quantized reports whether any matrix is block-quantized (Q8_0, Q4_0,
	// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
	Quantized bool
}

// Model is an opened Llama-family model: its config, its weights, its
// tensors by role and where its tokenizer is.
type Model struct {
	Config  *Config
	Weights *format.Model
	Tensors *Tensors
	// TokenizerPath is tokenizer.json beside the weights, "" when there is
	// none or when a GGUF file carries its own vocabulary (tokenizer.ggml.*
	// in Weights.Metadata), which wins over a file beside it.
	TokenizerPath string
}

// Close releases the weights' mappings.
func (m *Model) Close() error { return m.Weights.Close() }

// Open opens a model given as a directory (config.json and model.safetensors
// or model.safetensors.index.json, tokenizer.json optional), a .safetensors
// file or sharded index with config.json beside it, or a GGUF file (with
// tokenizer.json beside it when its metadata has no vocabulary). It
// parses the config, opens the weights with format/weights and checks them
// against each other. Errors name the file and the field or tensor.
func Open(path string) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	dir, weightsPath := filepath.Dir(path), path
	if st.IsDir() {
		dir = path
		weightsPath = ""
		for _, name := range []string{"model.safetensors", "model.safetensors.index.json", "model.gguf"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				weightsPath = filepath.Join(dir, name)
				break
			}
		}
		if weightsPath == "" {
			return nil, &Error{File: path, Reason: "no model.safetensors, model.safetensors.index.json or model.gguf in the directory"}
		}
	}
	isGGUF, err := hasGGUFMagic(weightsPath)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	var cfg *Config
	if !isGGUF {
		cfgPath := filepath.Join(dir, "config.json")
		b, err := os.ReadFile(cfgPath)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, &Error{File: cfgPath, Reason: "missing: a safetensors model needs its config.json beside it"}
			}
			return nil, fmt.Errorf("llama: %w", err)
		}
		if cfg, err = ParseHF(cfgPath, b); err != nil {
			return nil, err
		}
	}
	w, err := weights.Open(weightsPath)
	if err != nil {
		return nil, err
	}
	if isGGUF {
		if cfg, err = ParseGGUF(weightsPath, w.Metadata); err != nil {
			w.Close()
			return nil, err
		}
		if err := ropeFreqs(cfg, w); err != nil {
			w.Close()
			return nil, err
		}
	}
	ts, err := Bind(cfg, w)
	if err != nil {
		w.Close()
		return nil, err
	}
	m := &Model{Config: cfg, Weights: w, Tensors: ts}
	if tp := filepath.Join(dir, "tokenizer.json"); !isGGUF || w.Metadata["tokenizer.ggml.tokens"] == nil {
		if _, err := os.Stat(tp); err == nil {
			m.TokenizerPath = tp
		}
	}
	return m, nil
}

// ropeFreqs reads a GGUF file's rope_freqs.weight (HeadDim/2 float32
// factors, llama.cpp's form of Llama-3 rope scaling) into the config, unless
// the metadata already gives the scaling.
func ropeFreqs(cfg *Config, w *format.Model) error {
	t, ok := w.Tensor("rope_freqs.weight")
	if !ok || cfg.RopeScaling != nil {
		return nil
	}
	half := cfg.HeadDim / 2
	if t.DType != "F32" || t.Elements() != uint64(half) {
		return &Error{File: w.Path, Tensor: t.Name, Field: "shape", Reason: fmt.Sprintf("%s %v, want F32 [%d] (head_dim/2)", t.DType, t.Shape, half)}
	}
	b := w.Data(t)
	if len(b) != 4*half {
		return &Error{File: w.Path, Tensor: t.Name, Reason: fmt.Sprintf("%d bytes, want %d", len(b), 4*half)}
	}
	cfg.RopeFreqFactors = make([]float32, half)
	for i := range half {
		v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if !(v > 0) || math.IsInf(float64(v), 0) {
			return &Error{File: w.Path, Tensor: t.Name, Reason: fmt.Sprintf("factor %d is %v, want a positive number", i, v)}
		}
		cfg.RopeFreqFactors[i] = v
	}
	return nil
}

func hasGGUFMagic(path string) (bool, error) {
	if strings.HasSuffix(path, ".json") {
		return false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return false, nil // too short for GGUF: let the safetensors parser say what is wrong
	}
	return string(magic[:]) == gguf.Magic, nil
}

// Check reports whether model's tensors are what cfg implies: every role
// present once with the shape the config gives, dtypes the kernels
// multiply (BF16, F16, F32; one dtype for every matrix; norms any of the
// three), no block beyond num_hidden_layers. With tied embeddings the LM
// head is the embedding (a GGUF file without output.weight is tied).
func Check(cfg *Config, model *format.Model) error {
	_, err := Bind(cfg, model)
	return err
}

// Bind is Check returning the tensors by role. For a GGUF model it sets
// cfg.TiedEmbeddings when output.weight is absent.
func Bind(cfg *Config, model *format.Model) (*Tensors, error) {
	file := model.Path
	bad := func(tensor, field, f string, a ...any) error {
		return &Error{File: file, Tensor: tensor, Field: field, Reason: fmt.Sprintf(f, a...)}
	}
	ts := &Tensors{Blocks: make([]Block, cfg.Layers)}
	seen := map[[2]int]string{}
	var lmHead, embedding, finalNorm *format.Tensor
	for i := range model.Tensors {
		t := &model.Tensors[i]
		layer, role, ok := RoleOf(t.Name)
		if !ok {
			continue
		}
		if layer >= cfg.Layers {
			return nil, bad(t.Name, "num_hidden_layers", "block %d, but the config has %d layers", layer, cfg.Layers)
		}
		key := [2]int{layer, int(role)}
		if other, dup := seen[key]; dup {
			return nil, bad(t.Name, "", "role %s of block %d is also tensor %q", role, layer, other)
		}
		seen[key] = t.Name
		if layer >= 0 {
			b := &ts.Blocks[layer]
			*[...]*format.Tensor{RoleAttnNorm: &b.AttnNorm, RoleQ: &b.Q, RoleK: &b.K, RoleV: &b.V, RoleO: &b.O,
				RoleMLPNorm: &b.MLPNorm, RoleGate: &b.Gate, RoleUp: &b.Up, RoleDown: &b.Down}[role] = *t
			continue
		}
		switch role {
		case RoleEmbedding:
			embedding = t
		case RoleFinalNorm:
			finalNorm = t
		case RoleLMHead:
			lmHead = t
		}
	}
	if model.Format == "gguf" && lmHead == nil {
		cfg.TiedEmbeddings = true
	}
	hd := uint64(cfg.HeadDim)
	h, in, v := uint64(cfg.Hidden), uint64(cfg.Intermediate), uint64(cfg.Vocab)
	q, kv := uint64(cfg.Heads)*hd, uint64(cfg.KVHeads)*hd
	type want struct {
		t      *format.Tensor
		name   string
		shape  []uint64
		matrix bool
	}
	var wants []want
	if embedding == nil {
		return nil, bad("model.embed_tokens.weight", "", "missing (token_embd.weight in GGUF)")
	}
	wants = append(wants, want{embedding, embedding.Name, []uint64{v, h}, true})
	for l := range ts.Blocks {
		b := &ts.Blocks[l]
		for _, w := range []want{
			{&b.AttnNorm, "input_layernorm.weight", []uint64{h}, false},
			{&b.Q, "self_attn.q_proj.weight", []uint64{q, h}, true},
			{&b.K, "self_attn.k_proj.weight", []uint64{kv, h}, true},
			{&b.V, "self_attn.v_proj.weight", []uint64{kv, h}, true},
			{&b.O, "self_attn.o_proj.weight", []uint64{h, q}, true},
			{&b.MLPNorm, "post_attention_layernorm.weight", []uint64{h}, false},
			{&b.Gate, "mlp.gate_proj.weight", []uint64{in, h}, true},
			{&b.Up, "mlp.up_proj.weight", []uint64{in, h}, true},
			{&b.Down, "mlp.down_proj.weight", []uint64{h, in}, true},
		} {
			if w.t.Name == "" {
				return nil, bad(fmt.Sprintf("model.layers.%d.%s", l, w.name), "", "missing")
			}
			w.name = w.t.Name
			wants = append(wants, w)
		}
	}
	if finalNorm == nil {
		return nil, bad("model.norm.weight", "", "missing (output_norm.weight in GGUF)")
	}
	wants = append(wants, want{finalNorm, finalNorm.Name, []uint64{h}, false})
	switch {
	case cfg.TiedEmbeddings:
		ts.LMHead = *embedding
	case lmHead == nil:
		return nil, bad("lm_head.weight", "tie_word_embeddings", "missing, and the embeddings are not tied")
	default:
		wants = append(wants, want{lmHead, lmHead.Name, []uint64{v, h}, true})
		ts.LMHead = *lmHead
	}
	for _, w := range wants {
		if !slices.Equal(w.t.Shape, w.shape) {
			return nil, bad(w.name, "shape", "%v, but the config implies %v (%s)", w.t.Shape, w.shape, shapeSource(cfg, w.shape, len(w.shape)))
		}
		if err := checkDType(w.t, w.matrix); err != nil {
			return nil, bad(w.name, "dtype", "%s", err)
		}
		if !w.matrix {
			continue
		}
		if typ, ok := quant.TypeByName(w.t.DType); ok && typ.IsQuantized() {
			ts.Quantized = true
			continue
		}
		if ts.MatrixDType == "" {
			ts.MatrixDType = w.t.DType
		} else if w.t.DType != ts.MatrixDType {
			return nil, bad(w.name, "dtype", "%s, but %s is %s: mixed matrix dtypes unsupported", w.t.DType, embedding.Name, ts.MatrixDType)
		}
	}
	if ts.Quantized {
		ts.MatrixDType = "F32"
	}
	ts.Embedding, ts.FinalNorm = *embedding, *finalNorm
	return ts, nil
}

// checkDType accepts BF16, F16 and F32 for every tensor and, for a matrix
// (matrix true), the block-quantized types whose blocks tile its rows: the
// row length (Shape[1]) must be a whole number of the type's 32 or 256
// elements, and Bytes the rows' bytes.
func checkDType(t *format.Tensor, matrix bool) error {
	switch t.DType {
	case "BF16", "F16", "F32":
		return nil
	}
	typ, ok := quant.TypeByName(t.DType)
	if !ok || !typ.IsQuantized() {
		return fmt.Errorf("%s unsupported (want BF16, F16, F32, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K)", t.DType)
	}
	if !matrix {
		return fmt.Errorf("%s: a norm weight must be BF16, F16 or F32", t.DType)
	}
	k := t.Shape[1]
	if be := uint64(typ.BlockElems()); k%be != 0 {
		return fmt.Errorf("%s row of %d elements: not a multiple of the type's %d-element blocks", t.DType, k, be)
	}
	if want := t.Shape[0] * (k / uint64(typ.BlockElems())) * uint64(typ.BlockBytes()); t.Bytes != want {
		return fmt.Errorf("%s %v: %d bytes, want %d (%d-byte blocks of %d)", t.DType, t.Shape, t.Bytes, want, typ.BlockBytes(), typ.BlockElems())
	}
	return nil
}

func shapeSource(cfg *Config, shape []uint64, n int) string {
	if n == 1 {
		return fmt.Sprintf("hidden_size %d", cfg.Hidden)
	}
	return fmt.Sprintf("hidden_size %d, intermediate_size %d, heads %d, kv heads %d, head_dim %d, vocab_size %d",
		cfg.Hidden, cfg.Intermediate, cfg.Heads, cfg.KVHeads, cfg.HeadDim, cfg.Vocab)
}
