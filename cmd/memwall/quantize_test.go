package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/tokenizer"
)

// quantShape is a small Llama whose rows are whole super-blocks.
func quantShape() synth.Config {
	return synth.Config{Arch: "llama", Layers: 2, Hidden: 256, Inter: 512, Heads: 4, KVHeads: 2, Vocab: 512, Context: 256, DType: "BF16", Seed: 4}
}

func genFile(t *testing.T, cfg synth.Config, out, formatName string) string {
	t.Helper()
	if _, err := synth.Generate(context.Background(), cfg, out, synth.Options{Format: formatName, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	return out
}

func openGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(path, b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// tensorData maps each tensor of a GGUF file to its type and bytes.
func tensorData(t *testing.T, path string) map[string]string {
	t.Helper()
	b, _ := os.ReadFile(path)
	f := openGGUF(t, path)
	out := map[string]string{}
	for _, tt := range f.Tensors {
		out[tt.Name] = tt.DType + ":" + string(b[tt.Offset:tt.Offset+tt.Bytes])
	}
	return out
}

// TestQuantize: a BF16 GGUF file quantized by the verb holds what
// gen-model writes for the same model in that type (which format/synth
// holds to llama-quantize's bytes), with the human report's numbers.
func TestQuantize(t *testing.T) {
	dir := t.TempDir()
	in := genFile(t, quantShape(), filepath.Join(dir, "bf16.gguf"), synth.GGUF)
	for _, ft := range []string{"Q4_K_M", "q8_0"} {
		out := filepath.Join(dir, "q."+ft+".gguf")
		code, stdout, stderr := runVerbTerminal(t, false, "quantize", in, out, "--type", ft, "--workers", "2")
		if code != 0 || stderr != "" {
			t.Fatalf("%s: exit %d, stderr %q", ft, code, stderr)
		}
		if !strings.Contains(stdout, "wrote "+out+": "+strings.ToUpper(ft)+", 21 tensors") || !strings.Contains(stdout, "bits per weight") ||
			!strings.Contains(stdout, "vocabulary: carried over (no_vocab)") || strings.Count(stdout, ".weight\n") != 5 || !strings.Contains(stdout, "relative to the source's") {
			t.Errorf("%s: stdout %q", ft, stdout)
		}
		cfg := quantShape()
		cfg.DType = strings.ToUpper(ft)
		want := tensorData(t, genFile(t, cfg, filepath.Join(dir, "gen."+ft+".gguf"), synth.GGUF))
		got := tensorData(t, out)
		if len(got) != len(want) {
			t.Fatalf("%s: %d tensors, gen-model has %d", ft, len(got), len(want))
		}
		for n, w := range want {
			if got[n] != w {
				t.Errorf("%s: tensor %s differs from gen-model's", ft, n)
			}
		}
		f := openGGUF(t, out)
		if v, _ := f.Lookup("general.file_type"); v != map[string]uint32{"Q4_K_M": 15, "q8_0": 7}[ft] {
			t.Errorf("%s: general.file_type %v", ft, v)
		}
	}
}

// TestQuantizeJSON: --json gives the numbers of the file written, and a
// checkpoint's tokenizer.json goes into the GGUF vocabulary, which memwall
// reads back as the same tokenizer.
func TestQuantizeJSON(t *testing.T) {
	dir := t.TempDir()
	genFile(t, quantShape(), filepath.Join(dir, "model.safetensors"), synth.Safetensors)
	tj, err := tokenizer.Synthetic(quantShape().Vocab)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "q.gguf")
	code, stdout, stderr := runVerbTerminal(t, false, "quantize", dir, out, "--type", "Q5_K_M", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Type      string            `json:"type"`
		Tokenizer string            `json:"tokenizer"`
		Types     map[string]int    `json:"types"`
		TypeBytes map[string]uint64 `json:"type_bytes"`
		Tensors   []struct {
			Name  string `json:"name"`
			To    string `json:"to"`
			Bytes uint64 `json:"bytes"`
		} `json:"tensors"`
		DataBytes uint64  `json:"data_bytes"`
		FileBytes uint64  `json:"file_bytes"`
		BPW       float64 `json:"bits_per_weight"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	st, err := os.Stat(out)
	if err != nil || uint64(st.Size()) != res.FileBytes {
		t.Fatalf("file %v %v, JSON says %d bytes", st, err, res.FileBytes)
	}
	f := openGGUF(t, out)
	var sum uint64
	n := 0
	for i, tt := range res.Tensors {
		if f.Tensors[i].Name != tt.Name || f.Tensors[i].DType != tt.To || f.Tensors[i].Bytes != tt.Bytes {
			t.Errorf("tensor %d: file %s %s %d, JSON %+v", i, f.Tensors[i].Name, f.Tensors[i].DType, f.Tensors[i].Bytes, tt)
		}
		sum += tt.Bytes
	}
	for _, c := range res.Types {
		n += c
	}
	var typed uint64
	for _, b := range res.TypeBytes {
		typed += b
	}
	if typed != res.DataBytes || len(res.TypeBytes) != len(res.Types) {
		t.Errorf("type_bytes %v sum to %d, data_bytes %d", res.TypeBytes, typed, res.DataBytes)
	}
	if sum != res.DataBytes || n != len(res.Tensors) || res.Type != "Q5_K_M" || res.Types["Q6_K"] == 0 || res.BPW < 5 || res.BPW > 7 {
		t.Errorf("JSON: %d tensor bytes against data_bytes %d, %d typed of %d, type %s, types %v, %.2f bpw", sum, res.DataBytes, n, len(res.Tensors), res.Type, res.Types, res.BPW)
	}
	if !strings.Contains(res.Tokenizer, "llama, 512 tokens") {
		t.Errorf("tokenizer: %q", res.Tokenizer)
	}
	meta := map[string]any{}
	for _, kv := range f.Metadata {
		meta[kv.Key] = kv.Value
	}
	back, err := tokenizer.FromGGUF(meta)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := tokenizer.Parse("tokenizer.json", tj)
	if err != nil {
		t.Fatal(err)
	}
	text := "The model runs on the device when its weights fit."
	if a, b := back.Encode(text, true), orig.Encode(text, true); !slices.Equal(a, b) {
		t.Errorf("the GGUF vocabulary encodes %v, tokenizer.json %v", a, b)
	}
}

// TestQuantizeProgress: a bar on stderr only when stdout is a terminal,
// counting bytes (of the source, of the quantized file compared) in
// sizes; the work recorded for an interrupted run's message counts bytes
// too.
func TestQuantizeProgress(t *testing.T) {
	dir := t.TempDir()
	in := genFile(t, quantShape(), filepath.Join(dir, "bf16.gguf"), synth.GGUF)
	for _, args := range [][]string{
		{"quantize", in, filepath.Join(dir, "a.gguf"), "--type", "Q4_0"},
		{"quantize", "--compare", in, filepath.Join(dir, "a.gguf")},
	} {
		var ran *env
		code, _, stderr := runEnv(t, func(e *env) { e.terminal, ran = true, e }, args...)
		label := "\rquantize ["
		if args[1] == "--compare" {
			label = "\rcompare ["
		}
		if code != 0 || !strings.Contains(stderr, label) || !regexp.MustCompile(`100% [0-9.]+ [KMG]iB of [0-9.]+ [KMG]iB`).MatchString(stderr) {
			t.Errorf("%v on a terminal: exit %d, stderr %q, want a bar ending in sizes", args, code, stderr)
		}
		if w := ran.work.String(); !regexp.MustCompile(`^[0-9.]+ [KMG]iB of [0-9.]+ [KMG]iB$`).MatchString(w) {
			t.Errorf("%v: the work done reads %q, want sizes", args, w)
		}
	}
	code, _, stderr := runVerbTerminal(t, true, "quantize", in, filepath.Join(dir, "c.gguf"), "--type", "Q4_0")
	if code != 0 || !strings.Contains(stderr, "quantize [") {
		t.Errorf("terminal: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runVerbTerminal(t, false, "quantize", in, filepath.Join(dir, "b.gguf"), "--type", "Q4_0")
	if code != 0 || stderr != "" {
		t.Errorf("no terminal: exit %d, stderr %q", code, stderr)
	}
}

func TestQuantizeErrors(t *testing.T) {
	dir := t.TempDir()
	in := genFile(t, quantShape(), filepath.Join(dir, "bf16.gguf"), synth.GGUF)
	before, _ := os.ReadFile(in)
	link := filepath.Join(dir, "link.gguf")
	if err := os.Symlink(in, link); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "q.gguf")
	tinyCfg := synth.Tiny()
	tinyCfg.Layers = 1
	tiny := genFile(t, tinyCfg, filepath.Join(dir, "tiny.gguf"), synth.GGUF)
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no type", []string{in, out}, 2, "--type is required"},
		{"bad type", []string{in, out, "--type", "Q3_K_M"}, 2, `--type "Q3_K_M"`},
		{"one argument", []string{in, "--type", "Q4_0"}, 2, "want IN and OUT"},
		{"three arguments", []string{in, out, out, "--type", "Q4_0"}, 2, "want IN and OUT"},
		{"bad workers", []string{in, out, "--type", "Q4_0", "--workers", "-1"}, 2, "--workers"},
		{"in is out", []string{in, in, "--type", "Q4_0"}, 2, "is IN"},
		{"out links to in", []string{in, link, "--type", "Q4_0"}, 2, "is IN"},
		{"missing in", []string{filepath.Join(dir, "none.gguf"), out, "--type", "Q4_0"}, 1, "none.gguf"},
		{"missing out dir", []string{in, filepath.Join(dir, "no", "q.gguf"), "--type", "Q4_0"}, 1, "OUT"},
		// tiny's rows of 688 are no whole Q8_0 blocks: llama-quantize refuses too
		{"rows of 688 in Q8_0", []string{tiny, out, "--type", "Q8_0"}, 1, "ffn_down"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runVerbTerminal(t, false, append([]string{"quantize"}, c.args...)...)
			if code != c.code || !strings.Contains(stderr, c.want) || strings.Count(stderr, "memwall quantize:") != 1 {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q, once", code, stderr, c.code, c.want)
			}
		})
	}
	if after, _ := os.ReadFile(in); !bytes.Equal(before, after) {
		t.Error("IN changed")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("failed runs left files: %v", names)
	}
}

// TestQuantizeCancelled: an interrupted run says so and leaves nothing.
func TestQuantizeCancelled(t *testing.T) {
	dir := t.TempDir()
	in := genFile(t, quantShape(), filepath.Join(dir, "bf16.gguf"), synth.GGUF)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code, _, stderr := runEnv(t, func(e *env) { e.ctx = ctx }, "quantize", in, filepath.Join(dir, "q.gguf"), "--type", "Q4_K_M")
	if code != 1 || !strings.Contains(stderr, "interrupted") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files left", len(entries))
	}
}

// quantizeJSON is what quantize --json and quantize --compare --json say
// of each tensor's error.
type quantizeJSON struct {
	Tensors []struct {
		Name     string   `json:"name"`
		To       string   `json:"to"`
		RMS      float64  `json:"rms_error"`
		Relative *float64 `json:"relative_error"`
	} `json:"tensors"`
	Relative *float64 `json:"relative_error"`
}

// TestQuantizeCompare: --compare measures, on the files written, the
// errors the writing runs reported, and sets two files side by side.
func TestQuantizeCompare(t *testing.T) {
	dir := t.TempDir()
	in := genFile(t, quantShape(), filepath.Join(dir, "bf16.gguf"), synth.GGUF)
	var written []quantizeJSON
	for _, ft := range []string{"Q4_K_M", "Q8_0"} {
		code, stdout, stderr := runVerbTerminal(t, false, "quantize", in, filepath.Join(dir, ft+".gguf"), "--type", ft, "--json", "--workers", "3")
		var r quantizeJSON
		if err := json.Unmarshal([]byte(stdout), &r); code != 0 || err != nil {
			t.Fatalf("%s: exit %d, %v, stderr %q", ft, code, err, stderr)
		}
		for _, tt := range r.Tensors {
			quantized := tt.To != "F32"
			if tt.Relative == nil || (*tt.Relative > 0) != quantized || *tt.Relative > 0.1 || (tt.RMS > 0) != quantized {
				t.Errorf("%s %s %s: relative error %v, RMS %g", ft, tt.Name, tt.To, tt.Relative, tt.RMS)
			}
		}
		written = append(written, r)
	}
	if !(*written[1].Relative < *written[0].Relative/4) {
		t.Errorf("Q8_0's error %g, Q4_K_M's %g", *written[1].Relative, *written[0].Relative)
	}
	a, b := filepath.Join(dir, "Q4_K_M.gguf"), filepath.Join(dir, "Q8_0.gguf")
	code, stdout, stderr := runVerbTerminal(t, false, "quantize", "--compare", in, a, b, "--json", "--workers", "2")
	var res struct {
		Files []quantizeJSON `json:"files"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); code != 0 || err != nil || len(res.Files) != 2 {
		t.Fatalf("exit %d, %v, stderr %q, %d files", code, err, stderr, len(res.Files))
	}
	for i, f := range res.Files {
		if len(f.Tensors) != len(written[i].Tensors) || *f.Relative != *written[i].Relative {
			t.Fatalf("file %d: %d tensors, error %g; written %d, %g", i, len(f.Tensors), *f.Relative, len(written[i].Tensors), *written[i].Relative)
		}
		for k, tt := range f.Tensors {
			if w := written[i].Tensors[k]; tt.Name != w.Name || tt.To != w.To || *tt.Relative != *w.Relative || tt.RMS != w.RMS {
				t.Errorf("file %d tensor %s: compared %s %g, written %s %g", i, tt.Name, tt.To, *tt.Relative, w.To, *w.Relative)
			}
		}
	}
	code, stdout, _ = runVerbTerminal(t, false, "quantize", "--compare", in, a, a)
	if code != 0 || !strings.Contains(stdout, "21 the same error, 0 larger, 0 smaller") || !strings.Contains(stdout, "the largest:") {
		t.Errorf("exit %d, stdout %q", code, stdout)
	}
}

func TestQuantizeCompareErrors(t *testing.T) {
	dir := t.TempDir()
	in := genFile(t, quantShape(), filepath.Join(dir, "bf16.gguf"), synth.GGUF)
	other := quantShape()
	other.Hidden = 512
	otherIn := genFile(t, other, filepath.Join(dir, "other.gguf"), synth.GGUF)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no file", []string{"--compare", in}, 2, "at least one FILE"},
		{"with type", []string{"--compare", in, in, "--type", "Q4_0"}, 2, "give one"},
		{"missing file", []string{"--compare", in, filepath.Join(dir, "none.gguf")}, 1, "none.gguf"},
		{"another model", []string{"--compare", in, otherIn}, 1, "shape"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runVerbTerminal(t, false, append([]string{"quantize"}, c.args...)...)
			if code != c.code || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d mentioning %q", code, stderr, c.code, c.want)
			}
		})
	}
}

// TestQuantizeCompareCancelled: an interrupted --compare says so.
func TestQuantizeCompareCancelled(t *testing.T) {
	dir := t.TempDir()
	in := genFile(t, quantShape(), filepath.Join(dir, "bf16.gguf"), synth.GGUF)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code, stdout, stderr := runEnv(t, func(e *env) { e.ctx = ctx }, "quantize", "--compare", in, in)
	if code != 1 || !strings.Contains(stderr, "interrupted") || stdout != "" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
