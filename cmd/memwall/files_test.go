package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/memwall/memwall/format/synth"
)

// treeSums hashes every file under dir by its path relative to dir: what
// a refused command must leave as it found.
func treeSums(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	sums := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.Type()&fs.ModeSymlink != 0 {
			l, _ := os.Readlink(p)
			sums[rel] = sha256.Sum256([]byte("link " + l))
			return nil
		}
		b, err := os.ReadFile(p)
		sums[rel] = sha256.Sum256(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return sums
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestOutputIsInput: every verb that reads files and writes others refuses,
// before any work and with one line naming both, an output that is one of
// its inputs — the same path, the same file by another path (./x, a hard
// link, a symbolic link), a file beside a model that the model is read
// with, a path inside an input directory — and two outputs that are one
// file; exit status 1, and every file is left as it was.
func TestOutputIsInput(t *testing.T) {
	dir := t.TempDir()
	onnx := filepath.Join(dir, "m.onnx")
	copyFile(t, filepath.Join(planTestONNX, "squeezenet1_1.onnx"), onnx)
	hard := filepath.Join(dir, "hard.onnx")
	if err := os.Link(onnx, hard); err != nil {
		t.Fatal(err)
	}
	csv := filepath.Join(dir, "A.1048576.csv")
	copyFile(t, filepath.Join(planTestMinimalloc, "A.1048576.csv"), csv)
	link := filepath.Join(dir, "link.csv")
	if err := os.Symlink("A.1048576.csv", link); err != nil {
		t.Fatal(err)
	}
	pickle := filepath.Join(dir, "t.pickle.gz")
	copyFile(t, "../../testdata/traces/tx_expandable.pickle.gz", pickle)
	requests := filepath.Join(dir, "r.jsonl")
	copyFile(t, "../../testdata/kv/long-system-prompts.jsonl", requests)
	model := filepath.Join(dir, "model")
	os.Mkdir(model, 0o755)
	weights := filepath.Join(model, "model.safetensors")
	if _, err := synth.Generate(context.Background(), synth.Tiny(), weights, synth.Options{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	gguf := filepath.Join(dir, "m.gguf")
	if _, err := synth.Generate(context.Background(), synth.Tiny(), gguf, synth.Options{Format: synth.GGUF, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	sim := []string{"--device", "sim", "--vram", "1GiB"}
	for _, c := range []struct {
		name string
		args []string
		want []string // in the one line of stderr
	}{
		{"plan --out the model", []string{"plan", onnx, "--out", onnx}, []string{"--out " + onnx, "is the input MODEL " + onnx}},
		{"plan --svg ./model", []string{"plan", onnx, "--svg", dir + "/./m.onnx"}, []string{"--svg " + dir + "/./m.onnx", "MODEL " + onnx}},
		{"plan a hard link", []string{"plan", hard, "--out", onnx}, []string{"--out " + onnx, "is the same file as the input MODEL " + hard}},
		{"plan a symbolic link", []string{"plan", "--lifetimes", link, "--svg", csv}, []string{"--svg " + csv, "the input --lifetimes " + link}},
		{"plan into a link to the input", []string{"plan", "--lifetimes", csv, "--out", link}, []string{"--out " + link, "--lifetimes " + csv}},
		{"replay --html the trace", []string{"replay", pickle, "--html", pickle}, []string{"--html " + pickle, "TRACE " + pickle}},
		{"run --pool-log in the model", append([]string{"run", model, "--prompt-ids", "1", "--pool-log", weights}, sim...), []string{"--pool-log " + weights, "inside the input MODEL " + model}},
		{"run --pool-log a new file in the model", append([]string{"run", model, "--prompt-ids", "1", "--pool-log", filepath.Join(model, "log.jsonl")}, sim...), []string{"--pool-log " + filepath.Join(model, "log.jsonl"), "MODEL " + model}},
		{"run --logits-out the config beside", append([]string{"run", weights, "--prompt-ids", "1", "--logits-out", filepath.Join(model, "config.json")}, sim...), []string{"--logits-out " + filepath.Join(model, "config.json"), "MODEL's config.json"}},
		{"run --oom-snapshot the model", append([]string{"run", gguf, "--prompt-ids", "1", "--oom-snapshot", gguf}, sim...), []string{"--oom-snapshot " + gguf, "MODEL " + gguf}},
		{"stream --pool-log the model", append([]string{"stream", gguf, "--pool-log", gguf}, sim...), []string{"--pool-log " + gguf, "MODEL " + gguf}},
		{"stream --oom-snapshot in the model", append([]string{"stream", model, "--oom-snapshot", weights}, sim...), []string{"--oom-snapshot " + weights, "MODEL " + model}},
		{"kv --html the requests", []string{"kv", "simulate", "--requests", requests, "--model", "tiny", "--vram", "1GiB", "--html", requests}, []string{"--html " + requests, "--requests " + requests}},
		{"kv --events in the model", []string{"kv", "simulate", "--synthetic", "alpaca", "--model", model, "--vram", "1GiB", "--events", filepath.Join(model, "config.json")}, []string{"--events " + filepath.Join(model, "config.json"), "--model " + model}},
		{"bench alloc two outputs", []string{"bench", "alloc", "--device", "sim", "--out", filepath.Join(dir, "x.json"), "--oom-snapshot", filepath.Join(dir, "x.json")}, []string{"--out " + filepath.Join(dir, "x.json") + " and --oom-snapshot " + filepath.Join(dir, "x.json") + " are the same file"}},
		{"plan two outputs by a link", []string{"plan", onnx, "--out", csv, "--svg", link}, []string{"--out " + csv + " and --svg " + link}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := treeSums(t, dir)
			code, out, errOut := runVerbSim(t, c.args...)
			if code != exitFail || out != "" || strings.Count(errOut, "\n") != 1 {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 and one line", code, out, errOut)
			}
			for _, w := range c.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q lacks %q", errOut, w)
				}
			}
			after := treeSums(t, dir)
			if len(after) != len(before) {
				t.Errorf("%d files, %d before", len(after), len(before))
			}
			for p, s := range before {
				if after[p] != s {
					t.Errorf("%s changed", p)
				}
			}
		})
	}
	// The same paths as separate inputs and outputs are fine.
	if code, _, errOut := runVerbSim(t, "plan", onnx, "--out", filepath.Join(dir, "plan.json"), "--time-limit", "0s"); code != 0 {
		t.Errorf("an output beside the input: exit %d: %s", code, errOut)
	}
}

// pipeFrom returns /dev/fd/N for the read end of a pipe that a goroutine
// fills with data and then closes: an input that can be read once, from
// its start, as /dev/stdin under `cat FILE | memwall ...`.
func pipeFrom(t *testing.T, data []byte) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	go func() {
		w.Write(data)
		w.Close()
	}()
	p := "/dev/fd/" + strconv.Itoa(int(r.Fd()))
	if _, err := os.Stat(p); err != nil {
		t.Skip("no /dev/fd here:", err)
	}
	return p
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// TestInputsFromPipes: every format memwall reads is read from a pipe as
// from the file (the sniffing of its kind does not eat the pipe's start;
// what is mapped or read twice is copied to a temporary file, removed at
// the end); what cannot come from a pipe is refused saying so.
func TestInputsFromPipes(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	defer func() {
		if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
			t.Errorf("temporary copies left: %v", entries)
		}
	}()
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	same := func(what string, a, b map[string]any, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if a[k] == nil || a[k] != b[k] {
				t.Errorf("%s: %s is %v from the pipe, %v from the file", what, k, a[k], b[k])
			}
		}
	}
	csv := filepath.Join(planTestMinimalloc, "A.1048576.csv")
	file := runJSONOut(t, "plan", "--lifetimes", csv, "--json", "--time-limit", "0s", "--capacity", "2MiB")
	for name, data := range map[string][]byte{"csv": read(csv), "csv.gz": gzipped(t, read(csv))} {
		p := pipeFrom(t, data)
		got := runJSONOut(t, "plan", "--lifetimes", p, "--json", "--time-limit", "0s", "--capacity", "2MiB")
		same("plan --lifetimes "+name, got, file, "buffers", "lower_bound_bytes", "arena_bytes")
		if got["instance"] != p {
			t.Errorf("instance %v, want %s", got["instance"], p)
		}
	}
	onnx := filepath.Join(planTestONNX, "squeezenet1_1.onnx")
	same("plan ONNX", runJSONOut(t, "plan", pipeFrom(t, read(onnx)), "--json", "--time-limit", "0s"),
		runJSONOut(t, "plan", onnx, "--json", "--time-limit", "0s"), "tensors", "lower_bound_bytes", "arena_bytes")

	fitArgs := []string{"--vram", "1GiB", "--device", "sim", "--link-gbps", "10", "--json"}
	for _, f := range []string{synth.Safetensors, synth.GGUF} {
		path := tinyFile(t, f)
		p := pipeFrom(t, read(path))
		args := fitArgs
		if f == synth.Safetensors {
			// The file has its config.json beside it, the pipe none: the
			// pipe's is the plain plan (a GGUF holds its config: both are
			// planned as run plans them).
			args = append(args, "--plain")
		}
		got := runJSONOut(t, append([]string{"fit", p}, args...)...)
		same("fit "+f, got, runJSONOut(t, append([]string{"fit", path}, args...)...), "format", "model_bytes", "resident_bytes", "predicted_peak_bytes")
		if got["model"] != p {
			t.Errorf("fit %s: model %v, want %s", f, got["model"], p)
		}
		streamArgs := []string{"--vram", "12MiB", "--ctx", "128", "--steps", "1", "--device", "sim", "--json"}
		same("stream "+f, runJSONOut(t, append([]string{"stream", pipeFrom(t, read(path))}, streamArgs...)...),
			runJSONOut(t, append([]string{"stream", path}, streamArgs...)...), "format", "model_bytes", "resident_bytes", "verified")
	}
	gguf := tinyFile(t, synth.GGUF)
	runArgs := []string{"--prompt-ids", "5,17,300", "--max-new", "3", "--device", "sim", "--vram", "1GiB", "--json"}
	fromPipe := runJSONOut(t, append([]string{"run", pipeFrom(t, read(gguf))}, runArgs...)...)
	if a, b := tokensOf(fromPipe), tokensOf(runJSONOut(t, append([]string{"run", gguf}, runArgs...)...)); len(a) == 0 || !equalInts(a, b) {
		t.Errorf("run from a pipe: tokens %v, from the file %v", a, b)
	}

	poolLog := filepath.Join(t.TempDir(), "pool.jsonl")
	if code, _, errOut := runVerbSim(t, "stream", tinyFile(t, synth.Safetensors), "--vram", "12MiB", "--steps", "1", "--device", "sim", "--pool-log", poolLog); code != 0 {
		t.Fatalf("stream --pool-log: exit %d: %s", code, errOut)
	}
	for _, trace := range []string{bertTrace, "../../testdata/traces/tx_expandable.pickle.gz", poolLog} {
		args := []string{"--json", "--no-search", "--strategy", "default"}
		same("replay "+filepath.Base(trace), runJSONOut(t, append([]string{"replay", pipeFrom(t, read(trace))}, args...)...),
			runJSONOut(t, append([]string{"replay", trace}, args...)...), "format", "events", "allocs", "peak_live_bytes")
	}

	// What needs a directory beside it cannot come from a pipe.
	index := filepath.Join(t.TempDir(), "model.safetensors.index.json")
	if _, err := synth.Generate(context.Background(), synth.Tiny(), index, synth.Options{Shards: 2, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fit", pipeFrom(t, read(index)), "--vram", "1GiB", "--device", "sim"}, "cannot read a sharded safetensors index from a pipe"},
		{[]string{"run", pipeFrom(t, read(tinyFile(t, synth.Safetensors))), "--prompt-ids", "1", "--device", "sim"}, "cannot read a safetensors model to run from a pipe"},
		{[]string{"kv", "simulate", "--synthetic", "alpaca", "--model", pipeFrom(t, read(gguf)), "--vram", "1GiB"}, "cannot read a model from a pipe"},
		{[]string{"fit", pipeFrom(t, []byte("# not a model\n")), "--vram", "1GiB", "--device", "sim"}, "/dev/fd/"},
	} {
		code, _, errOut := runVerbSim(t, c.args...)
		if code != exitFail || !strings.Contains(errOut, c.want) || strings.Contains(errOut, tmp) {
			t.Errorf("%v: exit %d, %q; want exit 1 saying %q, naming no temporary file", c.args, code, errOut, c.want)
		}
	}
}

// TestPlanCapacityFromName: the capacity in a MiniMalloc instance's name
// is read whether the file is compressed or not.
func TestPlanCapacityFromName(t *testing.T) {
	dir := t.TempDir()
	csv, err := os.ReadFile(filepath.Join(planTestMinimalloc, "B.1048576.csv"))
	if err != nil {
		t.Fatal(err)
	}
	// Without the search (--time-limit 0s) the greedy arena is above the
	// capacity: the plan exits 1, whichever the file.
	_, out, _ := runVerbSim(t, "plan", "--lifetimes", filepath.Join(planTestMinimalloc, "B.1048576.csv"), "--json", "--time-limit", "0s")
	var plain map[string]any
	if json.Unmarshal([]byte(out), &plain) != nil || planNum(t, plain, "capacity_bytes") != 1048576 {
		t.Fatalf("B.1048576.csv: %s", out)
	}
	for _, name := range []string{"B.1048576.csv.gz", "B.1048576.csv.gzip", "B.1048576.CSV.GZ"} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, gzipped(t, csv), 0o644)
		code, out, errOut := runVerbSim(t, "plan", "--lifetimes", p, "--json", "--time-limit", "0s")
		var got map[string]any
		json.Unmarshal([]byte(out), &got)
		if code != exitFail || got["capacity_bytes"] != plain["capacity_bytes"] || got["arena_bytes"] != plain["arena_bytes"] || got["fits_capacity"] != false {
			t.Errorf("%s: exit %d, capacity %v, arena %v, fits %v; want what the plain file gets (%v, %v, false): %s",
				name, code, got["capacity_bytes"], got["arena_bytes"], got["fits_capacity"], plain["capacity_bytes"], plain["arena_bytes"], errOut)
		}
	}
}

// readAll reads what the pipe r gets until its writer closes.
func readAll(r *os.File) <-chan []byte {
	ch := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r)
		ch <- b
	}()
	return ch
}

// TestOutputToDescriptors: /dev/stdout, /dev/fd/N and /proc/self/fd/N are
// written to the descriptor itself, a pipe or a file, which is then
// written where it stands (after what it held), not replaced; an output
// that is the verb's stdout (by name, or the same file or pipe) sends the
// report to stderr, so that stdout holds the output alone.
func TestOutputToDescriptors(t *testing.T) {
	m := filepath.Join(planTestONNX, "squeezenet1_1.onnx")
	svgPath := filepath.Join(t.TempDir(), "plan.svg")
	if code, _, errOut := runVerbSim(t, "plan", m, "--time-limit", "0s", "--svg", svgPath); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	svg, err := os.ReadFile(svgPath)
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) {
		t.Fatalf("%v: %.40q", err, svg)
	}
	// /dev/stdout on an env over buffers: the env's stdout gets the SVG.
	code, out, errOut := runVerbSim(t, "plan", m, "--time-limit", "0s", "--svg", "/dev/stdout")
	if code != 0 || out != string(svg) || !strings.Contains(errOut, "model        "+m) {
		t.Errorf("--svg /dev/stdout: exit %d, stdout %.60q (want the SVG alone), stderr %.80q (want the report)", code, out, errOut)
	}
	// A pipe as stdout, named by /dev/fd/N and /proc/self/fd/N.
	for _, dir := range []string{"/dev/fd/", "/proc/self/fd/"} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(r)
		p := dir + strconv.Itoa(int(w.Fd()))
		if _, err := os.Stat(p); err != nil {
			t.Skip("no", dir, "here:", err)
		}
		var stderr bytes.Buffer
		code := run([]string{"plan", m, "--time-limit", "0s", "--svg", p}, &env{ctx: context.Background(), stdout: w, stderr: &stderr, getenv: func(string) string { return "" }})
		w.Close()
		if b := <-got; code != 0 || !bytes.Equal(b, svg) || !strings.Contains(stderr.String(), "arena") {
			t.Errorf("--svg %s on a pipe: exit %d, the pipe got %d bytes (want the %d of the SVG), stderr %.80q", p, code, len(b), len(svg), stderr.String())
		}
		r.Close()
	}
	// A file as stdout, holding a line already: the output follows it,
	// whether named by its descriptor or by its path.
	for _, by := range []string{"descriptor", "path"} {
		so := filepath.Join(t.TempDir(), "so.txt")
		f, err := os.Create(so)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("before\n")
		before, _ := f.Stat()
		p := "/dev/fd/" + strconv.Itoa(int(f.Fd()))
		if by == "path" {
			p = so
		}
		var stderr bytes.Buffer
		code := run([]string{"plan", m, "--time-limit", "0s", "--svg", p}, &env{ctx: context.Background(), stdout: f, stderr: &stderr, getenv: func(string) string { return "" }})
		f.Close()
		b, _ := os.ReadFile(so)
		after, _ := os.Stat(so)
		if code != 0 || string(b) != "before\n"+string(svg) || !os.SameFile(before, after) || !strings.Contains(stderr.String(), "arena") {
			t.Errorf("--svg by the stdout file's %s: exit %d, the file holds %.40q… (%d bytes; want \"before\\n\" and the SVG, %d), same file %v; stderr %.60q",
				by, code, b, len(b), 7+len(svg), os.SameFile(before, after), stderr.String())
		}
	}
	// /dev/stderr: the env's stderr gets the SVG; the report stays on stdout.
	code, out, errOut = runVerbSim(t, "plan", m, "--time-limit", "0s", "--svg", "/dev/stderr")
	if code != 0 || errOut != string(svg) || !strings.Contains(out, "arena") {
		t.Errorf("--svg /dev/stderr: exit %d, stderr %.40q, stdout %.40q", code, errOut, out)
	}
	if _, err := checkOutput(nil, "--out", "/dev/fd/987"); err == nil || !strings.Contains(err.Error(), "descriptor 987 is not open") {
		t.Errorf("a closed descriptor: %v", err)
	}
}

// TestReportWriter: a report that cannot be written fails the command
// (exit 1): quietly when the reader closed the pipe, naming the error
// otherwise; a verb that failed keeps its status.
func TestReportWriter(t *testing.T) {
	var stderr bytes.Buffer
	e := &env{stderr: &stderr}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	rw := &reportWriter{f: w} // not stdout: no SIGPIPE, EPIPE only

	if n, err := rw.Write([]byte("report\n")); n != 7 || err != nil {
		t.Errorf("Write = %d, %v; want the bytes taken and the error kept", n, err)
	}
	if code := rw.status(e, exitOK); code != exitFail || stderr.Len() != 0 {
		t.Errorf("EPIPE: exit %d, stderr %q; want 1, quietly", code, stderr.String())
	}
	w.Close()
	if code := rw.status(e, exitUsage); code != exitUsage {
		t.Errorf("EPIPE after a usage error: exit %d", code)
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full")
	}
	defer full.Close()
	rw = &reportWriter{f: full}
	rw.Write([]byte("report\n"))
	if code := rw.status(e, exitOK); code != exitFail || !strings.Contains(stderr.String(), "writing to stdout: no space left on device") {
		t.Errorf("a full disk: exit %d, stderr %q", code, stderr.String())
	}
}

// TestMemwallProcess is memwall itself when the test binary is started as
// a child by memwallCommand; otherwise it does nothing.
func TestMemwallProcess(t *testing.T) {
	if os.Getenv("MEMWALL_TEST_PROCESS") != "1" {
		return
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	code := memwall(args)
	os.Stdout.Sync()
	syscall.Exit(code) // not os.Exit: the test framework refuses an exit 0 in a test
}

// memwallCommand is the memwall program with args, as a process of its
// own: real descriptors, redirections and signals.
func memwallCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("descriptors by path are Unix's")
	}
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestMemwallProcess$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), "MEMWALL_TEST_PROCESS=1")
	return cmd
}

// TestProcessStdout: the program itself, its stdout redirected to a file
// (`> so.txt`, `>> so.txt`) or a pipe (`| wc -c`), and a pipe whose reader
// is gone before the report (`| head`): the output is written through the
// descriptor, the report goes to stderr, and a closed pipe ends the
// command with exit 1, quietly, after its files were written.
func TestProcessStdout(t *testing.T) {
	m := filepath.Join(planTestONNX, "squeezenet1_1.onnx")
	dir := t.TempDir()
	svgPath := filepath.Join(dir, "plan.svg")
	if code, _, errOut := runVerbSim(t, "plan", m, "--time-limit", "0s", "--svg", svgPath); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	svg, _ := os.ReadFile(svgPath)
	for _, c := range []struct {
		name   string
		flag   int
		before string
	}{
		{"> so.txt", os.O_TRUNC, ""},
		{">> so.txt", os.O_APPEND, "before\n"},
	} {
		so := filepath.Join(dir, "so.txt")
		os.WriteFile(so, []byte(c.before), 0o644)
		f, err := os.OpenFile(so, os.O_WRONLY|os.O_CREATE|c.flag, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		cmd := memwallCommand(t, "plan", m, "--time-limit", "0s", "--svg", "/dev/stdout")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = f, &stderr
		err = cmd.Run()
		f.Close()
		b, _ := os.ReadFile(so)
		if err != nil || string(b) != c.before+string(svg) || !strings.Contains(stderr.String(), "arena") {
			t.Errorf("%s: %v; so.txt holds %d bytes (want %d: %q and the SVG); stderr %.80q", c.name, err, len(b), len(c.before)+len(svg), c.before, stderr.String())
		}
	}
	cmd := memwallCommand(t, "plan", m, "--time-limit", "0s", "--svg", "/dev/stdout")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output() // | wc -c
	if err != nil || !bytes.Equal(out, svg) {
		t.Errorf("| wc -c: %v; %d bytes, want the %d of the SVG; stderr %.80q", err, len(out), len(svg), stderr.String())
	}

	// | head, with the reader gone before the first line.
	page := filepath.Join(dir, "page.html")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	cmd = memwallCommand(t, "replay", bertTrace, "--strategy", "default", "--no-search", "--html", page)
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = w, &stderr
	err = cmd.Run()
	w.Close()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitFail || stderr.Len() != 0 {
		t.Errorf("| head: %v (exit code %d), stderr %q; want exit 1, quietly (not killed by SIGPIPE)", err, exitCode(exit), stderr.String())
	}
	if b, err := os.ReadFile(page); err != nil || !bytes.Contains(b, []byte("<html")) {
		t.Errorf("| head: page.html not written: %v", err)
	}
}

func exitCode(e *exec.ExitError) int {
	if e == nil {
		return 0
	}
	return e.ExitCode()
}
