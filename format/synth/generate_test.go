package synth

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/safetensors"
)

func open(t testing.TB, path string) *format.Model {
	t.Helper()
	var m *format.Model
	var err error
	if strings.HasSuffix(path, ".gguf") {
		m, err = gguf.Open(path)
	} else {
		m, err = safetensors.Options{Strict: true}.Open(path)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestLlama7BShape(t *testing.T) {
	c := Llama7B()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// Llama-2-7B's published parameter count.
	if got := c.Params(); got != 6_738_415_616 {
		t.Errorf("Params = %d, want 6738415616", got)
	}
	if got := c.DataBytes(Safetensors); got != 2*6_738_415_616 {
		t.Errorf("bf16 bytes = %d", got)
	}
	ts := c.Tensors(Safetensors)
	if len(ts) != 2+9*32+1 {
		t.Errorf("%d tensors, want 291", len(ts))
	}
	g := c.Tensors(GGUF)
	for i, want := range []struct{ hf, gg string }{
		{"model.embed_tokens.weight", "token_embd.weight"},
		{"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"},
		{"model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight"},
		{"model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight"},
		{"model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"},
		{"model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight"},
		{"model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight"},
		{"model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"},
		{"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"},
		{"model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight"},
	} {
		if ts[i].Name != want.hf || g[i].Name != want.gg || g[i].Key != want.hf {
			t.Errorf("tensor %d: %s / %s (key %s), want %s / %s", i, ts[i].Name, g[i].Name, g[i].Key, want.hf, want.gg)
		}
	}
	last := len(ts) - 1
	if ts[last].Name != "lm_head.weight" || g[last].Name != "output.weight" || g[last-1].Name != "output_norm.weight" {
		t.Errorf("tail: %s, %s, %s", ts[last].Name, g[last].Name, g[last-1].Name)
	}
	if s := ts[0].Shape; s[0] != 32000 || s[1] != 4096 {
		t.Errorf("embed shape %v", s)
	}
	if s := ts[7].Shape; s[0] != 4096 || s[1] != 11008 {
		t.Errorf("down_proj shape %v", s)
	}
	if g[8].DType != "F32" || ts[8].DType != "BF16" {
		t.Errorf("norm dtypes: gguf %s, safetensors %s", g[8].DType, ts[8].DType)
	}
}

func TestTinyShape(t *testing.T) {
	c := Tiny()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if p := c.Params(); p < 3_000_000 || p > 4_000_000 {
		t.Errorf("Tiny has %d parameters", p)
	}
	ts := c.Tensors(Safetensors)
	if k := ts[2].Shape; k[0] != 128 || k[1] != 256 { // 4 kv heads of 32
		t.Errorf("k_proj shape %v", k)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"arch", func(c *Config) { c.Arch = "gpt2" }, "arch"},
		{"layers", func(c *Config) { c.Layers = 0 }, "layers"},
		{"hidden/heads", func(c *Config) { c.Hidden = 250 }, "not a multiple of heads"},
		{"heads/kv", func(c *Config) { c.KVHeads = 3 }, "kv-heads"},
		{"vocab", func(c *Config) { c.Vocab = -1 }, "vocab"},
		{"dtype", func(c *Config) { c.DType = "Q4_K" }, "dtype"},
		{"huge hidden", func(c *Config) { c.Hidden = 1 << 20 }, "hidden"},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			c := Tiny()
			cs.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), cs.want) {
				t.Fatalf("Validate = %v, want %q", err, cs.want)
			}
		})
	}
}

func TestGenerateVerify(t *testing.T) {
	for _, f := range []string{Safetensors, GGUF} {
		for _, dtype := range []string{"BF16", "F16", "F32"} {
			t.Run(f+"/"+dtype, func(t *testing.T) {
				dir := t.TempDir()
				cfg := Tiny()
				cfg.DType, cfg.Seed = dtype, 99
				out := filepath.Join(dir, "m."+f)
				var calls int
				var last, total uint64
				res, err := Generate(context.Background(), cfg, out, Options{Format: f, ChunkBytes: 64 << 10, Progress: func(done, tot uint64) {
					if done < last || tot != cfg.DataBytes(f) {
						t.Errorf("progress %d/%d after %d", done, tot, last)
					}
					calls++
					last, total = done, tot
				}})
				if err != nil {
					t.Fatal(err)
				}
				if calls < 2 || last != total {
					t.Errorf("progress: %d calls, last %d of %d", calls, last, total)
				}
				st, err := os.Stat(out)
				if err != nil {
					t.Fatal(err)
				}
				if st.Mode().Perm() != 0o644 {
					t.Errorf("mode %v, want 0644", st.Mode().Perm())
				}
				wantFiles := 1
				if f == Safetensors {
					wantFiles = 2 // and config.json
				}
				var onDisk uint64
				for _, p := range res.Files {
					if fst, err := os.Stat(p); err == nil {
						onDisk += uint64(fst.Size())
					}
				}
				if res.Path != out || onDisk != res.FileBytes || res.DataBytes != cfg.DataBytes(f) || len(res.Files) != wantFiles {
					t.Errorf("result %+v, file size %d", res, st.Size())
				}
				m := open(t, out)
				if err := Verify(m); err != nil {
					t.Fatal(err)
				}
				if got, err := ConfigFromMetadata(m.Metadata); err != nil || got != cfg {
					t.Errorf("config from metadata = %+v, %v", got, err)
				}
				if entries, _ := os.ReadDir(dir); len(entries) != wantFiles {
					t.Errorf("%d files left in the directory, want %d", len(entries), wantFiles)
				}
			})
		}
	}
}

// TestFormatsAgree: the same seed gives the same bytes in both formats.
func TestFormatsAgree(t *testing.T) {
	dir := t.TempDir()
	st, err := WriteTiny(context.Background(), dir, Safetensors)
	if err != nil {
		t.Fatal(err)
	}
	gg, err := WriteTiny(context.Background(), dir, GGUF)
	if err != nil {
		t.Fatal(err)
	}
	ms, mg := open(t, st), open(t, gg)
	if mg.Metadata["general.architecture"] != "llama" || mg.Metadata["llama.block_count"] != uint32(4) || mg.Metadata["llama.attention.head_count_kv"] != uint32(4) {
		t.Errorf("gguf metadata: %v", mg.Metadata)
	}
	a, _ := ms.Tensor("model.layers.2.mlp.down_proj.weight")
	b, _ := mg.Tensor("blk.2.ffn_down.weight")
	if !bytes.Equal(ms.Data(a), mg.Data(b)) || len(ms.Data(a)) == 0 {
		t.Error("down_proj differs between formats")
	}
}

func TestDeterministicAcrossParallelism(t *testing.T) {
	dir := t.TempDir()
	cfg := Tiny()
	var files [][]byte
	for i, o := range []Options{{Workers: 1, ChunkBytes: 1 << 20}, {Workers: 3, ChunkBytes: 4096 + 16}, {}} {
		p := filepath.Join(dir, "m"+string(rune('0'+i))+".safetensors")
		if _, err := Generate(context.Background(), cfg, p, o); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, b)
	}
	if !bytes.Equal(files[0], files[1]) || !bytes.Equal(files[0], files[2]) {
		t.Fatal("output depends on workers or chunk size")
	}
	cfg.Seed = 1
	p := filepath.Join(dir, "seed1.safetensors")
	if _, err := Generate(context.Background(), cfg, p, Options{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); bytes.Equal(b, files[0]) {
		t.Fatal("seed does not change the output")
	}
}

func TestSharded(t *testing.T) {
	dir := t.TempDir()
	cfg := Tiny()
	out := filepath.Join(dir, "model.safetensors.index.json")
	res, err := Generate(context.Background(), cfg, out, Options{Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Files) != 5 || res.Files[3] != out || filepath.Base(res.Files[4]) != "config.json" || filepath.Base(res.Files[0]) != "model-00001-of-00003.safetensors" {
		t.Fatalf("files %v", res.Files)
	}
	m := open(t, out)
	if err := Verify(m); err != nil {
		t.Fatal(err)
	}
	if len(m.Files()) != 3 {
		t.Fatalf("model maps %d shards", len(m.Files()))
	}
	per := map[string]uint64{}
	for _, tt := range m.Tensors {
		per[tt.File] += tt.Bytes
	}
	avg := cfg.DataBytes(Safetensors) / 3
	for f, n := range per {
		if n < avg/2 || n > avg*3/2 {
			t.Errorf("shard %s holds %d bytes, average %d", filepath.Base(f), n, avg)
		}
	}
	if m.Metadata["total_size"] != cfg.DataBytes(Safetensors) {
		t.Errorf("total_size %v", m.Metadata["total_size"])
	}
}

func TestSplitShardsNeverEmpty(t *testing.T) {
	ts := Tiny().Tensors(Safetensors)
	for n := 1; n <= len(ts); n++ {
		parts := splitShards(ts, n, "d")
		count := 0
		for i, p := range parts {
			if len(p.tensors) == 0 {
				t.Fatalf("%d shards: shard %d empty", n, i)
			}
			count += len(p.tensors)
		}
		if count != len(ts) {
			t.Fatalf("%d shards hold %d of %d tensors", n, count, len(ts))
		}
	}
}

func TestGenerateErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		out  string
		opts Options
		want string
	}{
		{"format", "m.bin", Options{Format: "onnx"}, "format"},
		{"shards without index name", "m.safetensors", Options{Shards: 2}, "must name the index"},
		{"gguf shards", "m.json", Options{Format: GGUF, Shards: 2}, "safetensors only"},
		{"too many shards", "m.json", Options{Shards: 1000}, "shards for"},
		{"missing directory", "nodir/m.safetensors", Options{}, "nodir"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Generate(context.Background(), Tiny(), filepath.Join(dir, c.out), c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left %d files behind", len(entries))
	}
}

func TestCancel(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	out := filepath.Join(dir, "m.safetensors")
	_, err := Generate(ctx, Tiny(), out, Options{ChunkBytes: 4096, Progress: func(done, total uint64) {
		if done > total/3 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left %d files behind after cancel", len(entries))
	}
}

func TestVerifyDetectsCorruption(t *testing.T) {
	dir := t.TempDir()
	p, err := WriteTiny(context.Background(), dir, Safetensors)
	if err != nil {
		t.Fatal(err)
	}
	m := open(t, p)
	victim, _ := m.Tensor("model.layers.1.self_attn.v_proj.weight")
	b, _ := os.ReadFile(p)
	b[victim.Offset+100] ^= 0x40
	bad := filepath.Join(dir, "bad.safetensors")
	os.WriteFile(bad, b, 0o644)
	err = Verify(open(t, bad))
	if err == nil || !strings.Contains(err.Error(), victim.Name) || !strings.Contains(err.Error(), "byte 100") {
		t.Fatalf("Verify = %v", err)
	}
}

// TestGenerateKeepsForeignConfig: Generate replaces a config.json it wrote
// and refuses, before writing anything, one it did not.
func TestGenerateKeepsForeignConfig(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "model.safetensors")
	if _, err := Generate(context.Background(), Tiny(), out, Options{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	if err := CheckConfig(dir); err != nil {
		t.Fatalf("its own config.json: %v", err)
	}
	if _, err := Generate(context.Background(), Tiny(), out, Options{Workers: 2}); err != nil {
		t.Fatalf("over its own config.json: %v", err)
	}
	other := t.TempDir()
	cfg := filepath.Join(other, "config.json")
	theirs := []byte(`{"model_type": "llama"}`)
	os.WriteFile(cfg, theirs, 0o644)
	_, err := Generate(context.Background(), Tiny(), filepath.Join(other, "model.safetensors"), Options{Workers: 2})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Path != cfg || !strings.Contains(err.Error(), MetadataKey) {
		t.Fatalf("a foreign config.json: %v", err)
	}
	if b, _ := os.ReadFile(cfg); !bytes.Equal(b, theirs) {
		t.Errorf("config.json changed: %s", b)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 1 {
		t.Errorf("%d files written beside it", len(entries)-1)
	}
	if _, err := Generate(context.Background(), Tiny(), filepath.Join(other, "model.gguf"), Options{Format: GGUF, Workers: 2}); err != nil {
		t.Errorf("a GGUF model writes no config.json: %v", err)
	}
}

// TestGenerateMetadata: Options.Metadata's keys are in a GGUF file's
// header once each, replacing Generate's (no_vocab), the tensors where they
// were; a safetensors file ignores them.
func TestGenerateMetadata(t *testing.T) {
	dir := t.TempDir()
	cfg := Tiny()
	cfg.Layers = 1
	extra := []gguf.KV{{Key: gguf.KeyTokenizerModel, Value: "llama"}, {Key: "tokenizer.ggml.tokens", Value: []string{"a", "b"}}}
	plain, err := Generate(context.Background(), cfg, filepath.Join(dir, "a.gguf"), Options{Format: GGUF})
	if err != nil {
		t.Fatal(err)
	}
	with, err := Generate(context.Background(), cfg, filepath.Join(dir, "b.gguf"), Options{Format: GGUF, Metadata: extra})
	if err != nil {
		t.Fatal(err)
	}
	a, b := open(t, plain.Path), open(t, with.Path)
	if a.Metadata[gguf.KeyTokenizerModel] != gguf.NoVocab || b.Metadata[gguf.KeyTokenizerModel] != "llama" || len(b.Metadata["tokenizer.ggml.tokens"].([]string)) != 2 {
		t.Fatalf("metadata: %v, %v %v", a.Metadata[gguf.KeyTokenizerModel], b.Metadata[gguf.KeyTokenizerModel], b.Metadata["tokenizer.ggml.tokens"])
	}
	f, err := os.ReadFile(with.Path)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(f, []byte(gguf.KeyTokenizerModel)); n != 1 {
		t.Errorf("%s %d times in the file", gguf.KeyTokenizerModel, n)
	}
	if err := Verify(b); err != nil {
		t.Fatal(err)
	}
	for i, ta := range a.Tensors {
		if !bytes.Equal(a.Data(ta), b.Data(b.Tensors[i])) {
			t.Errorf("tensor %s differs", ta.Name)
		}
	}
	st, err := Generate(context.Background(), cfg, filepath.Join(dir, "model.safetensors"), Options{Metadata: extra})
	if err != nil {
		t.Fatal(err)
	}
	if m := open(t, st.Path); m.Metadata[gguf.KeyTokenizerModel] != nil {
		t.Errorf("safetensors metadata %v", m.Metadata)
	}
}
