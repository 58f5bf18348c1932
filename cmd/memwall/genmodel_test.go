package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/safetensors"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/tokenizer"
)

func runGen(t *testing.T, terminal bool, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runVerbTerminal(t, terminal, append([]string{"gen-model"}, args...)...)
}

func TestGenModel(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.safetensors")
	code, stdout, stderr := runGen(t, false, "--layers", "2", "--hidden", "64", "--inter", "176", "--heads", "4", "--kv-heads", "2",
		"--vocab", "100", "--dtype", "f16", "--seed", "5", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("stderr not empty without a terminal: %q", stderr)
	}
	if !strings.Contains(stdout, "wrote "+out) || !strings.Contains(stdout, "2 layers, hidden 64") || !strings.Contains(stdout, "f16") || !strings.Contains(stdout, "21 tensors") || !strings.Contains(stdout, "K params") {
		t.Errorf("stdout: %q", stdout)
	}
	m, err := safetensors.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := synth.Verify(m); err != nil {
		t.Fatal(err)
	}
	cfg, _ := synth.ConfigFromMetadata(m.Metadata)
	want := synth.Config{Arch: "llama", Layers: 2, Hidden: 64, Inter: 176, Heads: 4, KVHeads: 2, Vocab: 100, Context: 4096, DType: "F16", Seed: 5}
	if cfg != want {
		t.Errorf("config %+v, want %+v", cfg, want)
	}
}

func TestGenModelPresetGGUFJSON(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "tiny.gguf")
	code, stdout, stderr := runGen(t, true, "--preset", "tiny", "--layers", "2", "--json", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "gen-model [") {
		t.Errorf("no progress bar on a terminal: %q", stderr)
	}
	var res struct {
		Path      string       `json:"path"`
		Format    string       `json:"format"`
		Config    synth.Config `json:"config"`
		DataBytes uint64       `json:"data_bytes"`
		FileBytes uint64       `json:"file_bytes"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	tiny := synth.Tiny()
	tiny.Layers = 2
	if res.Path != out || res.Format != "gguf" || res.Config != tiny || res.DataBytes != tiny.DataBytes(synth.GGUF) {
		t.Errorf("result %+v", res)
	}
	if st, err := os.Stat(out); err != nil || uint64(st.Size()) != res.FileBytes {
		t.Errorf("file size: %v, %v vs %d", st, err, res.FileBytes)
	}
	m, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := synth.Verify(m); err != nil {
		t.Fatal(err)
	}
}

func TestGenModelShards(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "model.safetensors.index.json")
	code, stdout, stderr := runGen(t, false, "--preset", "tiny", "--shards", "2", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "4 files") { // two shards, the index and config.json
		t.Errorf("stdout: %q", stdout)
	}
	m, err := safetensors.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := synth.Verify(m); err != nil {
		t.Fatal(err)
	}
}

func TestGenModelErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.safetensors")
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no out", []string{"--preset", "tiny"}, 2, "--out is required"},
		{"no shape", []string{"--out", out}, 2, "--layers is required"},
		{"bad preset", []string{"--preset", "gpt5", "--out", out}, 2, "unknown --preset"},
		{"bad dtype", []string{"--preset", "tiny", "--dtype", "int4", "--out", out}, 2, "--dtype"},
		{"bad format", []string{"--preset", "tiny", "--format", "onnx", "--out", out}, 2, "--format"},
		{"inconsistent heads", []string{"--preset", "tiny", "--heads", "7", "--out", out}, 2, "not a multiple of heads"},
		{"quantized safetensors", []string{"--preset", "tiny", "--dtype", "q4_k_m", "--out", out}, 2, "GGUF file type"},
		{"quantized rows not whole blocks", []string{"--preset", "tiny", "--dtype", "q8_0", "--out", filepath.Join(dir, "m.gguf")}, 2, "ffn_down"},
		{"gguf shards", []string{"--preset", "tiny", "--shards", "2", "--out", filepath.Join(dir, "m.gguf")}, 2, "--shards"},
		{"shards need index", []string{"--preset", "tiny", "--shards", "2", "--out", out}, 2, "index"},
		{"extra argument", []string{"--preset", "tiny", "--out", out, "extra"}, 2, "unexpected argument"},
		{"unknown flag", []string{"--bogus"}, 2, "bogus"},
		{"missing directory", []string{"--preset", "tiny", "--out", filepath.Join(dir, "no", "m.safetensors")}, 1, "no"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runGen(t, false, c.args...)
			if code != c.code || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, stderr, c.code, c.want)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed runs left %d files", len(entries))
	}
}

// TestGenModelQuantized: --dtype with a file type writes a quantized GGUF
// file that Verify holds to the generator, and says which types it holds.
func TestGenModelQuantized(t *testing.T) {
	out := filepath.Join(t.TempDir(), "q.gguf")
	code, stdout, stderr := runGen(t, false, "--preset", "tiny-f16", "--dtype", "q4_k_m", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "q4_k_m") {
		t.Errorf("stdout: %q", stdout)
	}
	m, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := synth.Verify(m); err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{}
	for _, tt := range m.Tensors {
		types[tt.DType] = true
	}
	// tiny-f16's rows of 192 take llama.cpp's fallbacks from Q4_K and Q6_K.
	if !types["Q5_0"] || !types["Q8_0"] || !types["F32"] || m.Metadata["general.file_type"] != uint32(15) {
		t.Errorf("types %v, file type %v", types, m.Metadata["general.file_type"])
	}
}

func TestParamCount(t *testing.T) {
	for n, want := range map[uint64]string{6_738_415_616: "6.74 B", 3_426_560: "3.43 M", 83_200: "83.2 K", 12: "12"} {
		if got := paramCount(n); got != want {
			t.Errorf("paramCount(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestGenModelConfig: a safetensors model gets a config.json beside it;
// one memwall wrote is replaced, anyone else's is not (exit 1, before any
// model file is written); a GGUF model writes none; the help says so.
func TestGenModelConfig(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.safetensors")
	cfgPath := filepath.Join(dir, "config.json")
	layers := func() int {
		var c struct {
			Layers int `json:"num_hidden_layers"`
		}
		b, err := os.ReadFile(cfgPath)
		if err != nil || json.Unmarshal(b, &c) != nil {
			t.Fatalf("config.json: %v %s", err, b)
		}
		return c.Layers
	}
	if code, _, errOut := runGen(t, false, "--preset", "tiny", "--out", out); code != 0 {
		t.Fatalf("fresh directory: exit %d: %s", code, errOut)
	}
	b, _ := os.ReadFile(cfgPath)
	if !bytes.Contains(b, []byte(`"`+synth.MetadataKey+`"`)) {
		t.Fatalf("config.json lacks memwall's key: %s", b)
	}
	// Its own config.json, regenerated with another shape: replaced.
	if code, _, errOut := runGen(t, false, "--preset", "tiny", "--layers", "3", "--out", out); code != 0 || layers() != 3 {
		t.Fatalf("memwall's config.json: exit %d: %s (layers %d)", code, errOut, layers())
	}
	// Someone else's config.json: refused, untouched, nothing written.
	other := t.TempDir()
	theirs := []byte(`{"model_type": "llama", "num_hidden_layers": 80}` + "\n")
	os.WriteFile(filepath.Join(other, "config.json"), theirs, 0o644)
	code, stdout, errOut := runGen(t, false, "--preset", "tiny", "--out", filepath.Join(other, "x.safetensors"))
	want := filepath.Join(other, "config.json") + " exists and memwall did not write it"
	if code != exitFail || stdout != "" || !strings.Contains(errOut, want) || !strings.Contains(errOut, "--out "+filepath.Join(other, "x.safetensors")) {
		t.Errorf("a foreign config.json: exit %d, stdout %q, stderr %q; want exit 1 saying %q", code, stdout, errOut, want)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "config.json")); !bytes.Equal(b, theirs) {
		t.Errorf("the foreign config.json was changed: %s", b)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 1 {
		t.Errorf("%d files in the directory, want only config.json", len(entries))
	}
	// A config.json that is a directory, or not JSON: refused.
	odd := t.TempDir()
	os.Mkdir(filepath.Join(odd, "config.json"), 0o755)
	if code, _, errOut := runGen(t, false, "--preset", "tiny", "--out", filepath.Join(odd, "x.safetensors")); code != exitFail || !strings.Contains(errOut, "not a regular file") {
		t.Errorf("config.json a directory: exit %d: %s", code, errOut)
	}
	text := t.TempDir()
	os.WriteFile(filepath.Join(text, "config.json"), []byte("not json"), 0o644)
	if code, _, errOut := runGen(t, false, "--preset", "tiny", "--out", filepath.Join(text, "x.safetensors")); code != exitFail || !strings.Contains(errOut, "not a JSON object") {
		t.Errorf("config.json not JSON: exit %d: %s", code, errOut)
	}
	// A GGUF file holds its config: the foreign config.json stays.
	if code, _, errOut := runGen(t, false, "--preset", "tiny", "--out", filepath.Join(other, "x.gguf")); code != 0 {
		t.Errorf("GGUF beside a foreign config.json: exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "config.json")); !bytes.Equal(b, theirs) {
		t.Errorf("gen-model of a GGUF changed config.json: %s", b)
	}
	code, help, _ := runVerb(t, nil, "help", "gen-model")
	if code != 0 || !strings.Contains(help, "config.json in --out's") || !strings.Contains(help, synth.MetadataKey) {
		t.Errorf("help gen-model does not say it writes config.json:\n%s", help)
	}
}

// TestGenModelVocabulary: a GGUF model of --vocab 400 and more carries a
// Llama-2-style vocabulary of exactly that many distinct tokens (llama.cpp
// asserts they are distinct), with <s> and </s> at the model's BOS and EOS
// ids, which memwall's tokenizer reads back and round-trips text with; a
// smaller one keeps no_vocab; a safetensors model gets none.
func TestGenModelVocabulary(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{400, 1234} {
		out := filepath.Join(dir, fmt.Sprintf("v%d.gguf", n))
		code, stdout, stderr := runGen(t, false, "--layers", "1", "--hidden", "64", "--inter", "128", "--heads", "4", "--vocab", strconv.Itoa(n), "--out", out)
		if code != 0 || !strings.Contains(stdout, fmt.Sprintf("vocabulary: synthetic (llama, %d tokens)", n)) {
			t.Fatalf("vocab %d: exit %d, stdout %q, stderr %q", n, code, stdout, stderr)
		}
		f := openGGUF(t, out)
		meta := map[string]any{}
		count := map[string]int{}
		for _, kv := range f.Metadata {
			meta[kv.Key] = kv.Value
			count[kv.Key]++
		}
		tokens, _ := meta["tokenizer.ggml.tokens"].([]string)
		types, _ := meta["tokenizer.ggml.token_type"].([]int32)
		scores, _ := meta["tokenizer.ggml.scores"].([]float32)
		if meta[gguf.KeyTokenizerModel] != "llama" || count[gguf.KeyTokenizerModel] != 1 || len(tokens) != n || len(types) != n || len(scores) != n {
			t.Fatalf("vocab %d: model %v (%d entries), %d tokens, %d types, %d scores", n, meta[gguf.KeyTokenizerModel], count[gguf.KeyTokenizerModel], len(tokens), len(types), len(scores))
		}
		seen := map[string]bool{}
		for i, tok := range tokens {
			if seen[tok] {
				t.Fatalf("vocab %d: token %d %q twice", n, i, tok)
			}
			seen[tok] = true
		}
		bos, eos := meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]
		if bos != uint32(synth.BOS) || eos != uint32(synth.EOS) || tokens[synth.BOS] != "<s>" || tokens[synth.EOS] != "</s>" || tokens[3+'\n'] != "<0x0A>" {
			t.Errorf("vocab %d: bos %v %q, eos %v %q, token %d %q", n, bos, tokens[synth.BOS], eos, tokens[synth.EOS], 3+'\n', tokens[3+'\n'])
		}
		tok, err := tokenizer.FromGGUF(meta)
		if err != nil {
			t.Fatal(err)
		}
		text := "Hello, world!\nThe run takes 3.2 seconds — ünïcode too."
		ids := tok.Encode(text, true)
		if ids[0] != synth.BOS || tok.Decode(ids, true) != text {
			t.Errorf("vocab %d: %q encodes to %v, decodes to %q", n, text, ids, tok.Decode(ids, true))
		}
	}
	small := filepath.Join(dir, "small.gguf")
	if code, stdout, _ := runGen(t, false, "--layers", "1", "--hidden", "64", "--inter", "128", "--heads", "4", "--vocab", "399", "--out", small); code != 0 ||
		!strings.Contains(stdout, "vocabulary: no_vocab") {
		t.Errorf("vocab 399: exit %d, stdout %q", code, stdout)
	}
	for _, kv := range openGGUF(t, small).Metadata {
		if kv.Key == gguf.KeyTokenizerModel && kv.Value != gguf.NoVocab || kv.Key == "tokenizer.ggml.tokens" {
			t.Errorf("vocab 399: %s = %v", kv.Key, kv.Value)
		}
	}
	st := filepath.Join(dir, "model.safetensors")
	if code, stdout, _ := runGen(t, false, "--layers", "1", "--hidden", "64", "--inter", "128", "--heads", "4", "--vocab", "1000", "--out", st); code != 0 || strings.Contains(stdout, "vocabulary") {
		t.Errorf("safetensors: exit %d, stdout %q", code, stdout)
	}
}
