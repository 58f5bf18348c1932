package llama_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
)

func gen(t *testing.T, cfg synth.Config, name string) string {
	t.Helper()
	dir := t.TempDir()
	f := synth.Safetensors
	if strings.HasSuffix(name, ".gguf") {
		f = synth.GGUF
	}
	res, err := synth.Generate(context.Background(), cfg, filepath.Join(dir, name), synth.Options{Format: f, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	return res.Path
}

func TestOpenSynthFormats(t *testing.T) {
	for _, cfg := range []synth.Config{synth.Tiny(), synth.TinyF16()} {
		st := gen(t, cfg, "model.safetensors")
		gg := gen(t, cfg, "model.gguf")
		for _, path := range []string{filepath.Dir(st), st, gg} {
			m, err := llama.Open(path)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			c := m.Config
			hd := cfg.Hidden / cfg.Heads
			if c.Layers != cfg.Layers || c.Hidden != cfg.Hidden || c.Intermediate != cfg.Inter || c.Heads != cfg.Heads ||
				c.KVHeads != cfg.KVHeads || c.HeadDim != hd || c.Vocab != cfg.Vocab || c.Context != cfg.Context ||
				c.RMSNormEps != float64(float32(1e-5)) && c.RMSNormEps != 1e-5 || c.RopeTheta != 10000 || c.BOS != 1 || !c.IsEOS(2) {
				t.Errorf("%s: config %+v from %+v", path, c, cfg)
			}
			if c.PermutedQK != strings.HasSuffix(path, ".gguf") {
				t.Errorf("%s: PermutedQK %v", path, c.PermutedQK)
			}
			if c.DType != cfg.DType || m.Tensors.MatrixDType != cfg.DType {
				t.Errorf("%s: dtype %s / %s, want %s", path, c.DType, m.Tensors.MatrixDType, cfg.DType)
			}
			if len(m.Tensors.Blocks) != cfg.Layers || m.Tensors.Blocks[cfg.Layers-1].Down.Shape[1] != uint64(cfg.Inter) {
				t.Errorf("%s: blocks %+v", path, m.Tensors.Blocks)
			}
			m.Close()
		}
	}
}

func TestRopeScalingPreset(t *testing.T) {
	cfg := synth.Llama3_8BShape()
	b, err := json.Marshal(cfg.HFConfig())
	if err != nil {
		t.Fatal(err)
	}
	c, err := llama.ParseHF("config.json", b)
	if err != nil {
		t.Fatal(err)
	}
	if c.KVHeads != 8 || c.RopeTheta != 500000 || c.RopeScaling == nil || c.RopeScaling.Factor != 8 || c.RopeScaling.OriginalContext != 8192 {
		t.Fatalf("config %+v scaling %+v", c, c.RopeScaling)
	}
	// transformers' llama3 rule: the highest frequencies are kept, the
	// lowest divided by the factor, a smooth blend between.
	f := c.InvFreq()
	plain := *c
	plain.RopeScaling = nil
	p := plain.InvFreq()
	if f[0] != p[0] || math.Abs(float64(f[len(f)-1])*8-float64(p[len(p)-1])) > 1e-9*float64(p[len(p)-1]) {
		t.Errorf("scaled inv_freq ends %v %v, plain %v %v", f[0], f[len(f)-1], p[0], p[len(p)-1])
	}
	for i := range f {
		if f[i] > p[i] || f[i] < p[i]/8*(1-1e-6) {
			t.Fatalf("inv_freq[%d] = %v outside [%v/8, %v]", i, f[i], p[i], p[i])
		}
	}
	// llama.cpp's rope_freqs factors (plain / scaled) give the same
	// frequencies.
	plain.RopeFreqFactors = make([]float32, len(f))
	for i := range f {
		plain.RopeFreqFactors[i] = float32(float64(p[i]) / float64(f[i]))
	}
	for i, v := range plain.InvFreq() {
		if math.Abs(float64(v-f[i])) > 1e-6*float64(f[i]) {
			t.Fatalf("with factors inv_freq[%d] = %v, want %v", i, v, f[i])
		}
	}
}

func TestHFErrors(t *testing.T) {
	base := synth.Tiny().HFConfig()
	for _, tc := range []struct {
		name  string
		edit  func(m map[string]any)
		field string
	}{
		{"qwen", func(m map[string]any) { m["model_type"] = "qwen2" }, "model_type"},
		{"arch", func(m map[string]any) { m["architectures"] = []string{"MistralForCausalLM"} }, "architectures"},
		{"kvheads", func(m map[string]any) { m["num_key_value_heads"] = 3 }, "num_key_value_heads"},
		{"nolayers", func(m map[string]any) { delete(m, "num_hidden_layers") }, "num_hidden_layers"},
		{"eps", func(m map[string]any) { m["rms_norm_eps"] = -1 }, "rms_norm_eps"},
		{"eos", func(m map[string]any) { m["eos_token_id"] = []int{2, 5000} }, "eos_token_id"},
		{"eosbad", func(m map[string]any) { m["eos_token_id"] = "x" }, "eos_token_id"},
		{"dtype", func(m map[string]any) { m["torch_dtype"] = "int8" }, "torch_dtype"},
		{"rope", func(m map[string]any) { m["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4} }, "rope_scaling.rope_type"},
		{"rope3", func(m map[string]any) { m["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8} }, "rope_scaling"},
		{"bias", func(m map[string]any) { m["attention_bias"] = true }, "attention_bias"},
		{"headdim", func(m map[string]any) { m["head_dim"] = 33 }, "head_dim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]any{}
			for k, v := range base {
				m[k] = v
			}
			tc.edit(m)
			b, _ := json.Marshal(m)
			_, err := llama.ParseHF("dir/config.json", b)
			if err == nil || !errors.Is(err, llama.ErrConfig) || !strings.Contains(err.Error(), "dir/config.json: "+tc.field+":") {
				t.Fatalf("error %v, want one naming dir/config.json and %s", err, tc.field)
			}
		})
	}
}

func TestCheckMismatch(t *testing.T) {
	path := gen(t, synth.Tiny(), "model.safetensors")
	w, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(path), "config.json"))
	for _, tc := range []struct {
		edit func(c *llama.Config)
		want string
	}{
		{func(c *llama.Config) { c.Intermediate = 700 }, `tensor "model.layers.0.mlp.gate_proj.weight": shape:`},
		{func(c *llama.Config) { c.KVHeads = 8 }, `tensor "model.layers.0.self_attn.k_proj.weight": shape:`},
		{func(c *llama.Config) { c.Layers = 5 }, `tensor "model.layers.4.input_layernorm.weight": missing`},
		{func(c *llama.Config) { c.Layers = 3 }, `num_hidden_layers: block 3`},
		{func(c *llama.Config) { c.Vocab = 1000 }, `tensor "model.embed_tokens.weight": shape:`},
	} {
		c, err := llama.ParseHF("config.json", b)
		if err != nil {
			t.Fatal(err)
		}
		tc.edit(c)
		if err := llama.Check(c, w); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("Check: %v, want %q naming %s", err, tc.want, path)
		}
	}
	c, _ := llama.ParseHF("config.json", b)
	c.TiedEmbeddings = true
	ts, err := llama.Bind(c, w)
	if err != nil || ts.LMHead.Name != "model.embed_tokens.weight" {
		t.Errorf("tied: %v, head %q", err, ts.LMHead.Name)
	}
}

func TestGGUFErrors(t *testing.T) {
	path := gen(t, synth.Tiny(), "model.gguf")
	w, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for key, v := range map[string]any{
		"general.architecture":                   "qwen2",
		"llama.block_count":                      "four",
		"llama.attention.head_count_kv":          uint32(3),
		"llama.attention.layer_norm_rms_epsilon": nil,
		"llama.embedding_length":                 nil,
	} {
		meta := map[string]any{}
		for k, x := range w.Metadata {
			meta[k] = x
		}
		if v == nil {
			delete(meta, key)
		} else {
			meta[key] = v
		}
		_, err := llama.ParseGGUF(path, meta)
		if err == nil || !strings.Contains(err.Error(), path+": "+key+":") {
			t.Errorf("%s = %v: %v", key, v, err)
		}
	}
}

func TestRoleOf(t *testing.T) {
	for name, want := range map[string]struct {
		layer int
		role  llama.Role
		ok    bool
	}{
		"model.embed_tokens.weight":                      {-1, llama.RoleEmbedding, true},
		"model.layers.12.self_attn.o_proj.weight":        {12, llama.RoleO, true},
		"model.layers.0.post_attention_layernorm.weight": {0, llama.RoleMLPNorm, true},
		"blk.7.ffn_down.weight":                          {7, llama.RoleDown, true},
		"blk.3.attn_output.weight":                       {3, llama.RoleO, true},
		"output.weight":                                  {-1, llama.RoleLMHead, true},
		"output_norm.weight":                             {-1, llama.RoleFinalNorm, true},
		"model.layers.01.mlp.up_proj.weight":             {-1, llama.RoleNone, false},
		"model.layers.1.self_attn.rotary_emb.inv_freq":   {-1, llama.RoleNone, false},
		"rope_freqs.weight":                              {-1, llama.RoleNone, false},
	} {
		l, r, ok := llama.RoleOf(name)
		if l != want.layer || r != want.role || ok != want.ok {
			t.Errorf("RoleOf(%q) = %d %v %v, want %+v", name, l, r, ok, want)
		}
	}
}

func FuzzParseHF(f *testing.F) {
	for _, c := range []synth.Config{synth.Tiny(), synth.Llama3_8BShape()} {
		b, _ := json.Marshal(c.HFConfig())
		f.Add(b)
	}
	f.Add([]byte(`{"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,"eos_token_id":[1,2]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := llama.ParseHF("config.json", b)
		if err != nil {
			if !errors.Is(err, llama.ErrConfig) {
				t.Fatalf("error %v does not match ErrConfig", err)
			}
			return
		}
		if c.HeadDim < 2 || c.Heads%c.KVHeads != 0 || len(c.InvFreq()) != c.HeadDim/2 {
			t.Fatalf("accepted inconsistent config %+v", c)
		}
	})
}

func FuzzParseGGUF(f *testing.F) {
	f.Add(uint32(4), uint32(256), uint32(8), uint32(4), float32(1e-5), float32(10000), uint32(1024), "llama")
	f.Add(uint32(0), uint32(0), uint32(0), uint32(0), float32(0), float32(-1), uint32(0), "x")
	f.Fuzz(func(t *testing.T, layers, hidden, heads, kv uint32, eps, theta float32, vocab uint32, arch string) {
		meta := map[string]any{"general.architecture": arch, "llama.block_count": layers, "llama.embedding_length": hidden,
			"llama.feed_forward_length": hidden, "llama.attention.head_count": heads, "llama.attention.head_count_kv": kv,
			"llama.attention.layer_norm_rms_epsilon": eps, "llama.rope.freq_base": theta, "llama.vocab_size": vocab}
		c, err := llama.ParseGGUF("m.gguf", meta)
		if err != nil {
			if !errors.Is(err, llama.ErrConfig) {
				t.Fatalf("error %v does not match ErrConfig", err)
			}
			return
		}
		if c.HeadDim*c.Heads != c.Hidden || c.Heads%c.KVHeads != 0 || !c.PermutedQK {
			t.Fatalf("accepted inconsistent config %+v", c)
		}
	})
}

// TestGGUFSameWeights: the GGUF file of a synthetic model holds the
// safetensors file's values — norms widened to F32 exactly, Q and K rows
// permuted as llama.cpp permutes them.
func TestGGUFSameWeights(t *testing.T) {
	for _, cfg := range []synth.Config{synth.Tiny(), synth.TinyF16()} {
		st, err := llama.Open(filepath.Dir(gen(t, cfg, "model.safetensors")))
		if err != nil {
			t.Fatal(err)
		}
		gg, err := llama.Open(gen(t, cfg, "model.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		hd := cfg.Hidden / cfg.Heads
		for l := range cfg.Layers {
			a, b := st.Tensors.Blocks[l], gg.Tensors.Blocks[l]
			for _, p := range []struct {
				a, b    format.Tensor
				permute bool
			}{{a.Q, b.Q, true}, {a.K, b.K, true}, {a.V, b.V, false}, {a.Down, b.Down, false}, {a.AttnNorm, b.AttnNorm, false}, {a.MLPNorm, b.MLPNorm, false}} {
				x, y := values(t, st.Weights, p.a), values(t, gg.Weights, p.b)
				cols := len(x) / int(p.a.Shape[0])
				for r := range int(p.a.Shape[0]) {
					src := r
					if p.permute {
						src = int(synth.SourceRow(uint64(r), hd))
					}
					for c := range cols {
						if y[r*cols+c] != x[src*cols+c] {
							t.Fatalf("%s row %d col %d: gguf %v, safetensors row %d %v", p.b.Name, r, c, y[r*cols+c], src, x[src*cols+c])
						}
					}
				}
			}
		}
		st.Close()
		gg.Close()
	}
}

func values(t *testing.T, m *format.Model, tn format.Tensor) []float32 {
	t.Helper()
	b := m.Data(tn)
	out := make([]float32, tn.Elements())
	for i := range out {
		switch tn.DType {
		case "F32":
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case "BF16":
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		case "F16":
			out[i] = halfToFloat(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return out
}

func halfToFloat(h uint16) float32 {
	e, m := int(h>>10)&0x1F, float64(h&0x3FF)
	v := math.Ldexp(1+m/1024, e-15)
	if e == 0 {
		v = math.Ldexp(m/1024, -14)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return float32(v)
}
