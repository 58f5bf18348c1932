package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/synth"
)

// readmeCommands returns every memwall command line README.md shows: its
// inline code spans and shell blocks that start with "memwall " (or "go run
// ./cmd/memwall "), with markdown's escaped pipes unescaped and white space
// folded. A span of the verb alone ("memwall fit") names the command and is
// left out.
func readmeCommands(readme string) []string {
	var spans []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(readme, -1) {
		for _, line := range strings.Split(block[1], "\n") {
			line, _, _ = strings.Cut(line, "#")
			spans = append(spans, line)
		}
	}
	rest := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(readme, "")
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(rest, -1) {
		spans = append(spans, m[1])
	}
	var out []string
	seen := map[string]bool{}
	for _, s := range spans {
		s = strings.Join(strings.Fields(strings.ReplaceAll(s, `\|`, "|")), " ")
		s = strings.Replace(s, "go run ./cmd/memwall ", "memwall ", 1)
		if !strings.HasPrefix(s, "memwall ") || len(strings.Fields(s)) < 3 && !strings.HasPrefix(s, "memwall demo") && !strings.HasPrefix(s, "memwall version") || seen[s] {
			continue
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}

// expandSynopsis turns a command's synopsis into the command lines it
// stands for: optional [groups] left out, and one line for each
// alternative of a (group | of them), of a top-level "A | B" after the
// verb, and of a word "a|b".
func expandSynopsis(s string) []string {
	for {
		t := regexp.MustCompile(`\[[^\[\]]*\]`).ReplaceAllString(s, "")
		if t == s {
			break
		}
		s = t
	}
	s = strings.Join(strings.Fields(s), " ")
	if i := strings.Index(s, "("); i >= 0 {
		j := i + strings.Index(s[i:], ")")
		var out []string
		for _, alt := range strings.Split(s[i+1:j], " | ") {
			out = append(out, expandSynopsis(s[:i]+alt+s[j+1:])...)
		}
		return out
	}
	if parts := strings.Split(s, " | "); len(parts) > 1 {
		words := strings.Fields(parts[0])
		prefix := words[:2] // memwall VERB
		out := expandSynopsis(parts[0])
		for _, p := range parts[1:] {
			out = append(out, expandSynopsis(strings.Join(prefix, " ")+" "+p)...)
		}
		return out
	}
	lines := [][]string{nil}
	for _, w := range strings.Fields(s) {
		alts := []string{w}
		if strings.Contains(w, "|") {
			alts = strings.Split(w, "|")
		}
		var next [][]string
		for _, l := range lines {
			for _, a := range alts {
				next = append(next, append(append([]string(nil), l...), a))
			}
		}
		lines = next
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.Join(l, " ")
	}
	return out
}

// placeholder matches the words a synopsis leaves for the reader to fill.
var placeholder = regexp.MustCompile(`^([A-Z][A-Za-z]*(\.[a-z.]+)?|<command>)$`)

// TestREADMECommands runs every memwall command line in README.md, as its
// synopsis reads with the optional flags left out and each alternative
// taken in turn, in-process on the simulator: the placeholders are filled
// with small inputs (a tiny generated model, a bundled ONNX graph, a
// bundled trace), output flags point into a temporary directory, and a few
// optional flags the synopses show keep benchmarks short. A command line
// added to the README with a placeholder this test cannot fill fails it.
func TestREADMECommands(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	llamaDir := filepath.Join(tmp, "llama")
	if err := os.Mkdir(llamaDir, 0o755); err != nil {
		t.Fatal(err)
	}
	modelFile := filepath.Join(llamaDir, "model.safetensors")
	if _, err := synth.Generate(context.Background(), synth.Tiny(), modelFile, synth.Options{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	byteTokenizer(t, llamaDir)
	// quantize's input: rows a whole number of 32-element blocks (Tiny's
	// 688-wide MLP is not, and Q8_0 and Q4_0 have no fallback type).
	quantIn := filepath.Join(tmp, "tiny-f16.gguf")
	if _, err := synth.Generate(context.Background(), synth.TinyF16(), quantIn, synth.Options{Workers: 2, Format: synth.GGUF}); err != nil {
		t.Fatal(err)
	}
	// quantize --compare's FILE: a quantized file of the same model.
	quantCfg := synth.TinyF16()
	quantCfg.DType = "Q8_0"
	quantFile := filepath.Join(tmp, "tiny-q8_0.gguf")
	if _, err := synth.Generate(context.Background(), quantCfg, quantFile, synth.Options{Workers: 2, Format: synth.GGUF}); err != nil {
		t.Fatal(err)
	}
	onnxModel := filepath.Join(planTestONNX, "mobilenet_v2.onnx")
	trace := "../../testdata/traces/vit_varbatch.csv.gz"
	outputs := 0
	// A server for the lines that need a URL (bench serve), started when
	// the first one does.
	serveURL := ""
	// fill returns the value for placeholder word w after flag prev in a
	// command of verb.
	fill := func(verb, prev, w string) (string, bool) {
		switch prev {
		case "--layers", "--heads":
			return "2", true
		case "--hidden":
			return "128", true
		case "--inter":
			return "256", true
		case "--vram":
			return "64MiB", true
		case "--prompt-tokens":
			return "16", true
		case "--prompt":
			return "hello world", true
		case "--requests":
			return "../../testdata/kv/long-system-prompts.jsonl", true
		case "--lifetimes":
			return "../../testdata/minimalloc/A.1048576.csv", true
		case "--config":
			cfg := filepath.Join(tmp, "serve.json")
			body := fmt.Sprintf(`{"models": [{"path": %q, "priority": 2}]}`, llamaDir)
			if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			return cfg, true
		case "--model":
			if w == "PRESET" {
				return "tiny", true
			}
			return modelFile, true
		}
		switch w {
		case "MODEL", "MODEL.onnx", "MODEL...":
			switch verb {
			case "plan":
				return onnxModel, true
			case "stream":
				return modelFile, true
			}
			return llamaDir, true
		case "TRACE", "FILE":
			if verb == "replay" && !strings.HasPrefix(prev, "--") {
				return trace, true
			}
		case "<command>":
			return "plan", true
		case "URL":
			if serveURL == "" {
				serveURL, _ = startServe(t, llamaDir, "--max-model-len", "128", "--max-seqs", "4")
			}
			return serveURL, true
		case "IN":
			if verb == "quantize" {
				return quantIn, true
			}
		case "FILE...":
			if verb == "quantize" {
				return quantFile, true
			}
		case "OUT":
			if verb == "quantize" {
				outputs++
				return filepath.Join(tmp, "out"+strconv.Itoa(outputs)+".gguf"), true
			}
		}
		return "", false
	}
	// Optional flags (each in the synopsis) that keep a run short.
	short := map[string][]string{
		"bench transfer": {"--size", "16MiB", "--reps", "2"},
		"bench alloc":    {"--pairs", "200", "--goroutines", "1", "--mixes", "4KiB", "--policies", "virtual"},
		"bench kv":       {"--blocks", "1000", "--ops", "1000", "--swap-bytes", "4MiB", "--reps", "1"},
		"kv simulate":    {"--n", "50"},
		"run":            {"--max-new", "4"},
		"stream":         {"--steps", "1"},
		"bench serve":    {"--n", "4", "--max-len", "100"},
		"bench batch":    {"--npl", "1,2", "--npp", "4", "--ntg", "2"},
		"bench fleet":    {"--switches", "2", "--npp", "4", "--ntg", "2"},
		"serve":          {"--max-model-len", "128", "--max-seqs", "4"},
	}
	cmds := readmeCommands(string(b))
	if len(cmds) < 15 {
		t.Fatalf("%d memwall command lines in README.md:\n%s", len(cmds), strings.Join(cmds, "\n"))
	}
	ran := map[string]bool{}
	for _, synopsis := range cmds {
		for _, line := range expandSynopsis(synopsis) {
			words := strings.Fields(line)[1:]
			verb := words[0]
			if verb == "bench" || verb == "kv" && len(words) > 1 {
				verb += " " + words[1]
			}
			var args []string
			ok := true
			for i, w := range words {
				prev := ""
				if i > 0 {
					prev = words[i-1]
				}
				switch {
				case prev == "--out" || prev == "--html" || prev == "--svg":
					outputs++
					w = filepath.Join(tmp, "out"+strconv.Itoa(outputs)+filepath.Ext(w))
				case placeholder.MatchString(w):
					v, found := fill(strings.Fields(verb)[0], prev, w)
					if !found {
						t.Errorf("README command %q: no value for %s after %q", line, w, prev)
						ok = false
					}
					w = v
				}
				args = append(args, w)
			}
			if !ok {
				continue
			}
			if verb != "help" && !slices.Contains(args, "-h") {
				if _, help, _ := runVerbSim(t, append(strings.Fields(verb), "-h")...); strings.Contains(help, "  -device") {
					args = append(args, "--device", "sim")
				}
				args = append(args, short[verb]...)
			}
			ran[verb] = true
			if verb == "serve" { // it serves until signalled: start it, then SIGTERM
				_, stop := startServe(t, args[1:]...)
				if code, errOut := stop(); code != 0 {
					t.Errorf("README's %q as memwall %q: exit %d after SIGTERM: %s", synopsis, args, code, errOut)
				}
				continue
			}
			code, _, errOut := runVerbSim(t, args...)
			if code != 0 {
				t.Errorf("README's %q as memwall %q: exit %d: %s", synopsis, args, code, errOut)
			}
		}
	}
	for _, v := range []string{"version", "demo", "info", "bench transfer", "bench alloc", "plan", "replay", "gen-model", "fit", "run", "kv simulate", "bench kv", "stream", "serve", "bench serve", "bench batch"} {
		if !ran[v] {
			t.Errorf("no README command line of %s ran", v)
		}
	}
}

// TestExpandSynopsis: optional groups go, and every alternative gives a
// line of its own.
func TestExpandSynopsis(t *testing.T) {
	got := expandSynopsis("memwall plan MODEL.onnx | --lifetimes FILE.csv[.gz] [--input n=1x2 [--x]] [--json]")
	if strings.Join(got, ";") != "memwall plan MODEL.onnx;memwall plan --lifetimes FILE.csv" {
		t.Errorf("plan: %q", got)
	}
	got = expandSynopsis("memwall kv simulate (--requests F | --synthetic a|b) --model P|Q")
	if len(got) != 6 || got[0] != "memwall kv simulate --requests F --model P" || got[5] != "memwall kv simulate --synthetic b --model Q" {
		t.Errorf("kv simulate: %q", got)
	}
}
