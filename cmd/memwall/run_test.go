package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
)

// tinyDir writes a preset as a safetensors directory (with config.json)
// and as a GGUF file into one temp dir.
func tinyDir(t *testing.T, preset string) (dir, ggufPath string) {
	t.Helper()
	dir = t.TempDir()
	cfg := synth.Presets()[preset]
	if _, err := synth.Generate(context.Background(), cfg, filepath.Join(dir, "model.safetensors"), synth.Options{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	ggufPath = filepath.Join(t.TempDir(), "model.gguf")
	if _, err := synth.Generate(context.Background(), cfg, ggufPath, synth.Options{Format: synth.GGUF, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	return dir, ggufPath
}

func runJSONOut(t *testing.T, args ...string) map[string]any {
	t.Helper()
	code, out, errOut := runVerbSim(t, args...)
	if code != 0 {
		t.Fatalf("memwall %v: exit %d: %s", args, code, errOut)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return m
}

func tokensOf(m map[string]any) []int {
	var out []int
	for _, v := range m["tokens"].([]any) {
		out = append(out, int(v.(float64)))
	}
	return out
}

func TestRunJSON(t *testing.T) {
	dir, gg := tinyDir(t, "tiny")
	args := []string{"--prompt-ids", "5,17,300,42,9,77", "--max-new", "12", "--ignore-eos", "--device", "sim", "--json"}
	resident := runJSONOut(t, append([]string{"run", dir, "--vram", "1GiB"}, args...)...)
	for _, k := range []string{"prompt_ids", "tokens", "prefill_tokens_per_s", "decode_tokens_per_s", "peak_device_bytes",
		"budget_bytes", "streamed_bytes_per_token", "gemm"} {
		if _, ok := resident[k]; !ok {
			t.Errorf("run --json lacks %q", k)
		}
	}
	if len(tokensOf(resident)) != 12 || resident["streamed_bytes_per_token"].(float64) != 0 || resident["gemm"] != "memwall" {
		t.Errorf("resident run: %v", resident)
	}
	if resident["peak_device_bytes"].(float64) > resident["budget_bytes"].(float64) {
		t.Errorf("peak %v above the budget %v", resident["peak_device_bytes"], resident["budget_bytes"])
	}
	// A budget that forces streaming gives the same tokens.
	streamed := runJSONOut(t, append([]string{"run", dir, "--vram", "6MiB"}, args...)...)
	if streamed["streamed_bytes_per_token"].(float64) == 0 || streamed["streamed_groups"].(float64) == 0 {
		t.Errorf("6 MiB streams nothing: %v", streamed)
	}
	if a, b := tokensOf(resident), tokensOf(streamed); !equalInts(a, b) {
		t.Errorf("resident %v, streaming %v", a, b)
	}
	// The embedding gather was timed on the device, and its figure is
	// what decided the table's place; --embedding device times nothing.
	eg, ok := streamed["embedding_gather"].(map[string]any)
	if !ok || eg["host_seconds"].(float64) <= 0 || eg["device_seconds"].(float64) <= 0 || eg["row_bytes"].(float64) <= 0 ||
		eg["mapped"] != (streamed["mapped_bytes"] != nil) {
		t.Errorf("streamed run: embedding_gather %v, mapped_bytes %v", streamed["embedding_gather"], streamed["mapped_bytes"])
	}
	onDevice := runJSONOut(t, append([]string{"run", dir, "--vram", "6MiB", "--embedding", "device"}, args...)...)
	if onDevice["embedding_gather"] != nil || onDevice["mapped_bytes"] != nil || !equalInts(tokensOf(onDevice), tokensOf(streamed)) {
		t.Errorf("--embedding device: gather %v, mapped %v, tokens %v (auto %v)", onDevice["embedding_gather"], onDevice["mapped_bytes"],
			tokensOf(onDevice), tokensOf(streamed))
	}
	for _, j := range []map[string]any{resident, streamed} {
		peak, pred, budget := j["peak_device_bytes"].(float64), j["predicted_peak_bytes"].(float64), j["budget_bytes"].(float64)
		if peak > budget || pred < 0.95*peak || pred > 1.05*peak {
			t.Errorf("peak %v, predicted %v, budget %v", peak, pred, budget)
		}
	}
	// The simulator has no device graphs: decode says why it runs plain
	// launches, and --graph off gives the same tokens with its own reason.
	if resident["decode_graph"] != false || resident["decode_graph_reason"] == "" || resident["decode_graph_steps"].(float64) != 0 {
		t.Errorf("resident run on the simulator: graph %v (%v), %v steps", resident["decode_graph"], resident["decode_graph_reason"], resident["decode_graph_steps"])
	}
	off := runJSONOut(t, append([]string{"run", dir, "--vram", "1GiB", "--graph", "off"}, args...)...)
	if a, b := tokensOf(resident), tokensOf(off); !equalInts(a, b) || !strings.Contains(off["decode_graph_reason"].(string), "off") {
		t.Errorf("--graph off: tokens %v (auto %v), reason %v", b, a, off["decode_graph_reason"])
	}
	// The GGUF file of the same weights gives the same tokens.
	g := runJSONOut(t, append([]string{"run", gg, "--vram", "1GiB"}, args...)...)
	if a, b := tokensOf(resident), tokensOf(g); !equalInts(a, b) {
		t.Errorf("safetensors %v, gguf %v", a, b)
	}
	// Human output streams the ids and reports.
	code, out, errOut := runVerbSim(t, append([]string{"run", filepath.Join(dir, "model.safetensors"), "--vram", "1GiB"}, args[:len(args)-1]...)...)
	if code != 0 || !strings.Contains(out, "decode") || !strings.Contains(out, "peak device memory") {
		t.Errorf("human output: exit %d\n%s\n%s", code, out, errOut)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRunErrors(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	long := strings.Repeat("1,", 600) + "1"
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", dir, "--device", "sim"}, 2, "exactly one of --prompt and --prompt-ids"},
		{[]string{"run", dir, "--prompt-ids", "1,x", "--device", "sim"}, 2, "--prompt-ids"},
		{[]string{"run", dir, "--prompt-ids", "1", "--vram", "lots", "--device", "sim"}, 2, "--vram"},
		{[]string{"run", dir, "--prompt-ids", "1", "--top-p", "2", "--device", "sim"}, 2, "top-p"},
		{[]string{"run", dir, "--prompt-ids", "1", "--device", "gpu"}, 2, "--device"},
		{[]string{"run", dir, "--prompt-ids", "1", "--graph", "on", "--device", "sim"}, 2, "--graph"},
		{[]string{"run", "--prompt-ids", "1"}, 2, "MODEL"},
		{[]string{"run", dir, "--prompt-ids", long, "--device", "sim"}, 1, "max_position_embeddings"},
		{[]string{"run", dir, "--prompt-ids", "1,2,5000", "--device", "sim"}, 1, "vocab_size"},
		{[]string{"run", dir, "--prompt-ids", "1,2", "--vram", "1MiB", "--device", "sim"}, 1, "below the minimum"},
		{[]string{"run", dir, "--prompt", "hello", "--device", "sim"}, 1, "no tokenizer"},
		{[]string{"run", filepath.Join(dir, "nope"), "--prompt-ids", "1", "--device", "sim"}, 1, "nope"},
	} {
		code, _, errOut := runVerbSim(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	// A config that contradicts the tensors names the file and the field.
	cfgPath := filepath.Join(dir, "config.json")
	b, _ := os.ReadFile(cfgPath)
	var c map[string]any
	json.Unmarshal(b, &c)
	c["intermediate_size"] = 700
	b, _ = json.Marshal(c)
	os.WriteFile(cfgPath, b, 0o644)
	code, _, errOut := runVerbSim(t, "run", dir, "--prompt-ids", "1", "--device", "sim")
	if code != 1 || !strings.Contains(errOut, "mlp.gate_proj.weight") || !strings.Contains(errOut, "shape") {
		t.Errorf("mismatched config: exit %d, %s", code, errOut)
	}
	c["model_type"] = "qwen2"
	b, _ = json.Marshal(c)
	os.WriteFile(cfgPath, b, 0o644)
	code, _, errOut = runVerbSim(t, "run", dir, "--prompt-ids", "1", "--device", "sim")
	if code != 1 || !strings.Contains(errOut, "config.json: model_type") {
		t.Errorf("qwen2: exit %d, %s", code, errOut)
	}
}

// byteTokenizer writes a byte-level BPE tokenizer.json (GPT-2's byte
// alphabet, ids 3..258, a few merges, <s> = 1 and </s> = 2 as the synthetic
// models' BOS and EOS) into dir.
func byteTokenizer(t *testing.T, dir string) {
	t.Helper()
	var printable []int
	for b := '!'; b <= '~'; b++ {
		printable = append(printable, int(b))
	}
	for b := 0xA1; b <= 0xAC; b++ {
		printable = append(printable, b)
	}
	for b := 0xAE; b <= 0xFF; b++ {
		printable = append(printable, b)
	}
	isPrint := map[int]bool{}
	for _, b := range printable {
		isPrint[b] = true
	}
	vocab := map[string]int{"<pad>": 0, "<s>": 1, "</s>": 2}
	n := 0
	for b := range 256 {
		r := rune(b)
		if !isPrint[b] {
			r = rune(256 + n)
			n++
		}
		vocab[string(r)] = 3 + b
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"}
	next := 259
	for _, m := range merges {
		a, b, _ := strings.Cut(m, " ")
		vocab[a+b] = next
		next++
	}
	special := func(id int, s string) map[string]any {
		return map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
	}
	tj := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   []any{special(0, "<pad>"), special(1, "<s>"), special(2, "</s>")},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}}, "pair": []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}}}, "special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}}},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
	}
	b, err := json.Marshal(tj)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRunText(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	byteTokenizer(t, dir)
	j := runJSONOut(t, "run", dir, "--prompt", "hello world", "--max-new", "10", "--ignore-eos", "--device", "sim", "--json")
	ids := []int{}
	for _, v := range j["prompt_ids"].([]any) {
		ids = append(ids, int(v.(float64)))
	}
	// <s>, "hello", "Ġworld"
	if !equalInts(ids, []int{1, 262, 267}) {
		t.Errorf("prompt ids %v", ids)
	}
	if _, ok := j["text"].(string); !ok || len(tokensOf(j)) != 10 {
		t.Errorf("text %v, tokens %v", j["text"], j["tokens"])
	}
	// The same prompt as ids gives the same tokens; human output is text.
	k := runJSONOut(t, "run", dir, "--prompt-ids", "1,262,267", "--max-new", "10", "--ignore-eos", "--device", "sim", "--json")
	if !equalInts(tokensOf(j), tokensOf(k)) || j["text"] != k["text"] {
		t.Errorf("text prompt %v %q, ids %v %q", j["tokens"], j["text"], k["tokens"], k["text"])
	}
	code, out, errOut := runVerbSim(t, "run", dir, "--prompt", "hello world", "--max-new", "10", "--ignore-eos", "--device", "sim")
	if code != 0 || !strings.HasPrefix(out, j["text"].(string)) {
		t.Errorf("human output: exit %d %q (%s), want it to start with %q", code, out, errOut, j["text"])
	}
	// A tokenizer file that does not parse is an error naming it.
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"model": {"type": "BPE", "vocab": 3}}`), 0o644)
	code, _, errOut = runVerbSim(t, "run", dir, "--prompt", "hi", "--device", "sim")
	if code != 1 || !strings.Contains(errOut, "tokenizer.json") {
		t.Errorf("bad tokenizer.json: exit %d, %s", code, errOut)
	}
}

// ctxDevice is a simulated device that reports a CUDA-like context.
type ctxDevice struct {
	device.Device
	ctx uint64
}

func (c ctxDevice) ContextBytes() (uint64, string, bool) { return c.ctx, "test", true }

// TestRunBudgetBelowContext: a --vram below the context's own memory still
// gets the minimum in the error, context included.
func TestRunBudgetBelowContext(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	m, err := llama.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	d := ctxDevice{sim.New(o), 500 << 20}
	defer d.Close()
	var stdout, stderr bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
	for _, vram := range []uint64{1 << 20, 500 << 20} {
		g := generation{model: m, path: dir, ids: []int{1, 2, 3}, vram: vram, sampling: engine.Sampling{MaxNew: 4}, quiet: true}
		_, _, err = g.run(e, d, "sim")
		if err == nil || !strings.Contains(err.Error(), "below the minimum") || !strings.Contains(err.Error(), "context's own 500.0 MiB") {
			t.Errorf("--vram %d: %v", vram, err)
		}
	}
	// Context plus the stated minimum runs.
	g := generation{model: m, path: dir, ids: []int{1, 2, 3}, vram: 1 << 20, sampling: engine.Sampling{MaxNew: 4}, quiet: true}
	_, _, err = g.run(e, d, "sim")
	minimum := regexp.MustCompile(`minimum (\d+) bytes`).FindStringSubmatch(err.Error())
	n, _ := strconv.ParseUint(minimum[1], 10, 64)
	g.vram = n
	if out, _, err := g.run(e, d, "sim"); err != nil || out.PeakDeviceBytes > n {
		t.Errorf("at the stated minimum %d: %v (peak %d)", n, err, out.PeakDeviceBytes)
	}
}

func TestRunLogitsOut(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	out := filepath.Join(t.TempDir(), "first.f32")
	runJSONOut(t, "run", dir, "--prompt-ids", "1,2,3", "--max-new", "2", "--device", "sim", "--json", "--logits-out", out)
	if st, err := os.Stat(out); err != nil || st.Size() != 4*1024 {
		t.Errorf("logits file: %v, %v", st, err)
	}
	code, _, errOut := runVerbSim(t, "run", dir, "--prompt-ids", "1", "--device", "sim", "--logits-out", t.TempDir())
	if code != 1 || !strings.Contains(errOut, "--logits-out") {
		t.Errorf("a directory as --logits-out: exit %d, %s", code, errOut)
	}
}

func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{"1,2,3", " 5 , 6", "", ",", "-1", "99999999999", "1,,2", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := parseIDs(s)
		if err != nil {
			return
		}
		parts := strings.Split(s, ",")
		if len(ids) != len(parts) {
			t.Fatalf("%q: %d ids from %d parts", s, len(ids), len(parts))
		}
		for i, id := range ids {
			if id < 0 || strconv.Itoa(id) != strings.TrimLeft(strings.TrimSpace(parts[i]), "+0") && id != 0 {
				t.Fatalf("%q: id %d from %q", s, id, parts[i])
			}
		}
	})
}

// TestRunVulkanSaysWhy: the Vulkan backend has no Llama kernels, and run says
// so in words instead of failing inside the module loader. Skips where no
// Vulkan device opens.
func TestRunVulkanSaysWhy(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	code, _, errOut := runVerbSim(t, "run", dir, "--prompt-ids", "1,2", "--max-new", "2", "--device", "vulkan")
	if code != exitFail {
		t.Fatalf("exit %d, want %d; stderr %q", code, exitFail, errOut)
	}
	if !strings.Contains(errOut, "no Llama kernels") {
		if strings.Contains(strings.ToLower(errOut), "vulkan") && !strings.Contains(errOut, "LoadModule") {
			t.Skipf("no Vulkan device here: %s", strings.TrimSpace(errOut))
		}
		t.Fatalf("stderr %q does not say the backend lacks the kernels", errOut)
	}
}

// TestRunNotAModel: run names what a file is when it is not a model it
// reads (empty, random bytes, ONNX, text) and says what it reads, instead
// of asking for a config.json beside it.
func TestRunNotAModel(t *testing.T) {
	dir := t.TempDir()
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(i*7919>>3) ^ 0x80
	}
	files := map[string][]byte{"empty.bin": nil, "random.bin": random, "notes.txt": []byte("not a model\n")}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(dir, "empty.bin"), "it is an empty file"},
		{filepath.Join(dir, "random.bin"), "it is a binary file"},
		{filepath.Join(dir, "notes.txt"), "it is a text file"},
		{filepath.Join(planTestONNX, "mobilenet_v2.onnx"), "it is an ONNX model"},
	} {
		code, _, errOut := runVerbSim(t, "run", tc.path, "--prompt", "hi", "--device", "sim")
		if code != exitFail || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "run reads a Llama-family model") ||
			strings.Contains(errOut, "config.json:") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 saying %q and what run reads", filepath.Base(tc.path), code, errOut, tc.want)
		}
	}
}

// TestRunGGUFTokenizerBeside: a GGUF file without a vocabulary in its
// metadata (gen-model's) takes tokenizer.json beside it, and gives the
// tokens and text the safetensors directory of the same weights gives.
func TestRunGGUFTokenizerBeside(t *testing.T) {
	dir, gg := tinyDir(t, "tiny")
	byteTokenizer(t, dir)
	byteTokenizer(t, filepath.Dir(gg))
	args := []string{"--prompt", "hello world", "--max-new", "8", "--ignore-eos", "--device", "sim", "--json"}
	st := runJSONOut(t, append([]string{"run", dir}, args...)...)
	g := runJSONOut(t, append([]string{"run", gg}, args...)...)
	ids := []int{}
	for _, v := range g["prompt_ids"].([]any) {
		ids = append(ids, int(v.(float64)))
	}
	if !equalInts(ids, []int{1, 262, 267}) || !equalInts(tokensOf(st), tokensOf(g)) || g["text"] != st["text"] {
		t.Errorf("gguf: prompt %v, tokens %v %q; safetensors: tokens %v %q", ids, g["tokens"], g["text"], st["tokens"], st["text"])
	}
}

// TestRunUndecodableWarns: ids the tokenizer has no token for (the tiny
// model's vocabulary is 1024, the tokenizer's 268) print as nothing, so
// human output warns once on stderr with their count and the first, and
// --json counts them.
func TestRunUndecodableWarns(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	byteTokenizer(t, dir)
	args := []string{"run", dir, "--prompt-ids", "1,262,267", "--max-new", "16", "--ignore-eos", "--device", "sim"}
	j := runJSONOut(t, append(args, "--json")...)
	n, first := 0, -1
	for _, id := range tokensOf(j) {
		if id >= 268 {
			if n == 0 {
				first = id
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no generated id above the tokenizer's 268 tokens: %v", j["tokens"])
	}
	if j["undecodable_tokens"] != float64(n) || j["first_undecodable_id"] != float64(first) {
		t.Errorf("--json: undecodable %v (first %v), want %d (first %d)", j["undecodable_tokens"], j["first_undecodable_id"], n, first)
	}
	code, _, errOut := runVerbSim(t, args...)
	want := fmt.Sprintf("warning: %d of the 16 generated ids are not in the tokenizer's 268 tokens (the model's vocab_size is 1024) and printed as nothing; the first is %d", n, first)
	if code != 0 || !strings.Contains(errOut, want) || strings.Count(errOut, "warning") != 1 {
		t.Errorf("exit %d, stderr %q; want one warning %q", code, errOut, want)
	}
}

// TestRunPlacement: a budget that cannot hold the model with --placement
// host computes blocks on the host's cores, reports host_bytes_per_token
// and the placement of each block, and gives the tokens of the streamed
// run; --placement stream hosts nothing.
func TestRunPlacement(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	args := []string{"--prompt-ids", "5,17,300,42,9,77", "--max-new", "12", "--ignore-eos", "--device", "sim", "--json", "--vram", "6MiB"}
	hosted := runJSONOut(t, append([]string{"run", dir, "--placement", "host"}, args...)...)
	streamed := runJSONOut(t, append([]string{"run", dir, "--placement", "stream"}, args...)...)
	if hosted["host_bytes_per_token"].(float64) == 0 {
		t.Fatalf("--placement host: host_bytes_per_token 0: %v", hosted)
	}
	if streamed["host_bytes_per_token"].(float64) != 0 || streamed["streamed_bytes_per_token"].(float64) == 0 {
		t.Fatalf("--placement stream: %v", streamed)
	}
	pl, _ := hosted["placement"].([]any)
	n := 0
	for _, p := range pl {
		if p == "host" {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("placement %v names no host block", pl)
	}
	if a, b := tokensOf(hosted), tokensOf(streamed); !equalInts(a, b) {
		t.Errorf("hosted %v, streamed %v", a, b)
	}
	if hosted["peak_device_bytes"].(float64) > hosted["budget_bytes"].(float64) {
		t.Errorf("peak %v above the budget %v", hosted["peak_device_bytes"], hosted["budget_bytes"])
	}
	code, _, errOut := runVerbSim(t, "run", dir, "--prompt-ids", "1", "--device", "sim", "--placement", "sideways")
	if code != 2 || !strings.Contains(errOut, "--placement") {
		t.Errorf("--placement sideways: exit %d, %s", code, errOut)
	}
}

// A quantized model's prefill: --quant-prefill bf16 (the default) plans
// the dequant scratch, which fit's prediction and the measured peak both
// hold; quantized plans none; any other value is a bad command line.
func TestRunQuantPrefill(t *testing.T) {
	m := tinyQ4(t)
	args := []string{"run", m, "--vram", "1GiB", "--prompt-ids", "5,17,300,42,9,11,13,2,8,99,100,101,7,6,5,4,3,21,22,23", "--max-new", "4", "--ignore-eos", "--json"}
	runs := map[string]map[string]any{}
	for _, v := range []string{"bf16", "quantized"} {
		j := runJSONOut(t, append(args, "--quant-prefill", v)...)
		peak, pred := j["peak_device_bytes"].(float64), j["predicted_peak_bytes"].(float64)
		if pred < peak || pred > 1.05*peak {
			t.Errorf("--quant-prefill %s: peak %v, predicted %v", v, peak, pred)
		}
		if n := len(tokensOf(j)); n != 4 {
			t.Errorf("--quant-prefill %s: %d tokens", v, n)
		}
		runs[v] = j
	}
	// (20 prompt tokens in one chunk: the arena holds the bf16 weight of a
	// block's largest product and the chunk's activations besides.)
	if a, b := runs["bf16"]["arena_bytes"].(float64), runs["quantized"]["arena_bytes"].(float64); a <= b {
		t.Errorf("arena %v with the dequant scratch, %v without", a, b)
	}
	if code, _, errOut := runVerbSim(t, append(args, "--quant-prefill", "f16")...); code != 2 || !strings.Contains(errOut, "want bf16 or quantized") {
		t.Errorf("--quant-prefill f16: exit %d: %s", code, errOut)
	}
}

// --quant-decode: q8 (the default on the simulator) says so in --json,
// float turns the 8-bit products off, anything else is a bad command line.
func TestRunQuantDecode(t *testing.T) {
	m := tinyQ4(t)
	args := []string{"run", m, "--vram", "1GiB", "--prompt-ids", "5,17,300,42", "--max-new", "4", "--ignore-eos", "--json"}
	for v, want := range map[string]bool{"q8": true, "float": false} {
		j := runJSONOut(t, append(args, "--quant-decode", v)...)
		if got, _ := j["kernels_q8_activations"].(bool); got != want {
			t.Errorf("--quant-decode %s: kernels_q8_activations %v, want %v", v, got, want)
		}
		if n := len(tokensOf(j)); n != 4 {
			t.Errorf("--quant-decode %s: %d tokens", v, n)
		}
	}
	if code, _, errOut := runVerbSim(t, append(args, "--quant-decode", "int4")...); code != 2 || !strings.Contains(errOut, "want q8 or float") {
		t.Errorf("--quant-decode int4: exit %d: %s", code, errOut)
	}
}

// tinyQ4 writes the tiny preset as a Q4_K_M GGUF and returns its path.
func tinyQ4(t *testing.T) string {
	t.Helper()
	m := filepath.Join(t.TempDir(), "q.gguf")
	if code, _, errOut := runGen(t, false, "--preset", "tiny", "--dtype", "q4_k_m", "--out", m); code != 0 {
		t.Fatalf("gen-model: exit %d: %s", code, errOut)
	}
	return m
}
