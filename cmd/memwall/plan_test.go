package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// Fixtures copied into the repository (see their READMEs).
const (
	planTestONNX       = "../../testdata/onnx"
	planTestMinimalloc = "../../testdata/minimalloc"
)

// runPlanVerb runs `memwall plan args...` in-process.
func runPlanVerb(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	env := &env{ctx: context.Background(), stdout: &o, stderr: &e, getenv: func(string) string { return "" }}
	code = run(append([]string{"plan"}, args...), env)
	return code, o.String(), e.String()
}

// planJSON decodes --json output into a map and checks it has every key.
func planJSON(t *testing.T, out string, keys ...string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, out)
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("--json lacks %q; has %v", k, slices.Sorted(maps.Keys(m)))
		}
	}
	return m
}

func planNum(t *testing.T, m map[string]any, key string) uint64 {
	t.Helper()
	v, ok := m[key].(float64)
	if !ok {
		t.Fatalf("%q is %T, not a number", key, m[key])
	}
	return uint64(v)
}

var planModelKeys = []string{"model", "tensors", "naive_bytes", "lower_bound_bytes", "arena_bytes", "algorithm", "inplace", "seconds"}

// TestPlanSharedModels is the acceptance test for models: without in-place
// the arena equals the lower bound on every shared model; with in-place the
// arena is below that bound, and both figures are reported.
func TestPlanSharedModels(t *testing.T) {
	models, _ := filepath.Glob(filepath.Join(planTestONNX, "*.onnx"))
	if len(models) == 0 {
		t.Fatalf("no models in %s", planTestONNX)
	}
	for _, m := range models {
		t.Run(filepath.Base(m), func(t *testing.T) {
			code, out, errOut := runPlanVerb(t, m, "--json", "--no-inplace")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			j := planJSON(t, out, append(planModelKeys, "inplace_arena_bytes", "inplace_lower_bound_bytes",
				"no_inplace_arena_bytes", "no_inplace_lower_bound_bytes")...)
			if j["inplace"] != false {
				t.Errorf("inplace = %v with --no-inplace", j["inplace"])
			}
			lb, arena := planNum(t, j, "lower_bound_bytes"), planNum(t, j, "arena_bytes")
			if arena != lb {
				t.Errorf("without in-place: arena %d, lower bound %d", arena, lb)
			}
			ipArena, ipLB := planNum(t, j, "inplace_arena_bytes"), planNum(t, j, "inplace_lower_bound_bytes")
			if ipArena >= lb || ipArena < ipLB {
				t.Errorf("with in-place: arena %d (lower bound %d), want below %d", ipArena, ipLB, lb)
			}
			naive := planNum(t, j, "naive_bytes")
			t.Logf("%s: %v tensors, naive %d, no in-place lb %d arena %d, in-place lb %d arena %d",
				filepath.Base(m), j["tensors"], naive, lb, arena, ipLB, ipArena)
		})
	}
}

func TestPlanModelHuman(t *testing.T) {
	code, out, errOut := runPlanVerb(t, filepath.Join(planTestONNX, "mobilenet_v2.onnx"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"input        input 1x3x224x224 (declared)", "209 activations", "without in-place", "with in-place", "(= lower bound)", "planners", "time"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPlanModelInput(t *testing.T) {
	m := filepath.Join(planTestONNX, "squeezenet1_1.onnx")
	code, out, errOut := runPlanVerb(t, m, "--json", "--input", "input=1x3x224x224")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	j := planJSON(t, out, "inputs")
	if in := j["inputs"].([]any)[0].(map[string]any); in["name"] != "input" || len(in["dims"].([]any)) != 4 {
		t.Errorf("inputs %v", j["inputs"])
	}
	// The exported models fix their dimensions; --input may not contradict.
	code, _, errOut = runPlanVerb(t, m, "--input", "input=2x3x224x224")
	if code != 1 || !strings.Contains(errOut, "shape mismatch") {
		t.Errorf("contradicting --input: exit %d, %s", code, errOut)
	}
	code, _, errOut = runPlanVerb(t, m, "--input", "tokens=1x128")
	if code != 1 || !strings.Contains(errOut, `no such input (inputs: input)`) {
		t.Errorf("unknown input: exit %d, %s", code, errOut)
	}
}

func TestPlanLifetimes(t *testing.T) {
	inst := filepath.Join(planTestMinimalloc, "F.1048576.csv")
	code, out, errOut := runPlanVerb(t, "--lifetimes", inst, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	j := planJSON(t, out, "buffers", "capacity_bytes", "lower_bound_bytes", "arena_bytes", "fits_capacity", "seconds")
	if planNum(t, j, "capacity_bytes") != 1048576 || j["fits_capacity"] != true || planNum(t, j, "buffers") != 296 {
		t.Errorf("report %v", j)
	}
	if a := planNum(t, j, "alignment"); a != 1 {
		t.Errorf("alignment %d for a CSV instance, want 1", a)
	}
	// Greedy alone does not fit this family: the report is printed and the
	// run fails (exit 1), in both forms.
	code, out, errOut = runPlanVerb(t, "--lifetimes", inst, "--algorithm", "greedy-size")
	if code != 1 || !strings.Contains(out, "does NOT fit") || !strings.Contains(errOut, "does not fit --capacity 1.0 MiB") {
		t.Errorf("greedy-size: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runPlanVerb(t, "--lifetimes", inst, "--algorithm", "greedy-size", "--json")
	if j := planJSON(t, out, "fits_capacity"); code != 1 || j["fits_capacity"] != false {
		t.Errorf("greedy-size --json: exit %d\n%s", code, out)
	}
	// An explicit capacity overrides the file name's.
	code, out, _ = runPlanVerb(t, "--lifetimes", inst, "--capacity", "2MiB", "--time-limit", "0s")
	if code != 0 || !strings.Contains(out, "capacity     2.0 MiB") || !strings.Contains(out, ": fits") {
		t.Errorf("--capacity 2MiB: exit %d\n%s", code, out)
	}
}

func TestPlanFiles(t *testing.T) {
	dir := t.TempDir()
	svg, out := filepath.Join(dir, "p.svg"), filepath.Join(dir, "p.json")
	code, stdout, errOut := runPlanVerb(t, filepath.Join(planTestONNX, "resnet50.onnx"), "--svg", svg, "--out", out, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	report := planJSON(t, stdout, "arena_bytes", "planned_tensors")
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Model      string `json:"model"`
		ArenaBytes uint64 `json:"arena_bytes"`
		Alignment  uint64 `json:"alignment"`
		Tensors    []struct {
			Name               string
			Offset, Size       uint64
			Start, End, Buffer int
		} `json:"tensors"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	if p.Model != "resnet50.onnx" || p.ArenaBytes != planNum(t, report, "arena_bytes") || p.Alignment != 256 {
		t.Errorf("--out header: %+v", p)
	}
	if len(p.Tensors) != int(planNum(t, report, "planned_tensors")) {
		t.Errorf("--out has %d tensors, the plan %v", len(p.Tensors), report["planned_tensors"])
	}
	for _, ts := range p.Tensors {
		if ts.Name == "" || ts.Size == 0 || ts.Offset%256 != 0 || ts.Offset+ts.Size > p.ArenaBytes || ts.End <= ts.Start {
			t.Fatalf("bad tensor %+v (arena %d)", ts, p.ArenaBytes)
		}
	}
	// Tensors live at the same step never share bytes, unless they are
	// aliases in one buffer.
	for i, a := range p.Tensors {
		for _, b := range p.Tensors[i+1:] {
			live := a.Start < b.End && b.Start < a.End
			overlap := a.Offset < b.Offset+b.Size && b.Offset < a.Offset+a.Size
			if live && overlap && a.Buffer != b.Buffer {
				t.Fatalf("tensors %+v and %+v are live together and overlap", a, b)
			}
		}
	}
	s, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(s, []byte("<svg")) || !bytes.Contains(s, []byte("lower bound")) || bytes.Count(s, []byte("<title>")) == 0 {
		t.Errorf("--svg wrote %d bytes that do not look like the plan", len(s))
	}
}

func TestPlanErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("id,lower,upper,size\nb1,0,3,4\nb2,5,2,4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notONNX := filepath.Join(dir, "x.onnx")
	if err := os.WriteFile(notONNX, []byte("not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(planTestONNX, "squeezenet1_1.onnx")
	tests := []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"nothing to plan", nil, 2, "missing MODEL.onnx"},
		{"two models", []string{model, model}, 2, "one model at a time"},
		{"model and lifetimes", []string{model, "--lifetimes", bad}, 2, "not both"},
		{"bad alignment", []string{model, "--alignment", "zero"}, 2, "--alignment"},
		{"bad algorithm", []string{model, "--algorithm", "magic"}, 2, `--algorithm "magic"`},
		{"bad input", []string{model, "--input", "input=1xbig"}, 2, `dimension "big"`},
		{"input twice", []string{model, "--input", "input=1x3x9x9", "--input", "input=1x3x9x9"}, 2, "given twice"},
		{"input with lifetimes", []string{"--lifetimes", bad, "--input", "x=1"}, 2, "--input applies to models"},
		{"bad capacity", []string{"--lifetimes", bad, "--capacity", "lots"}, 2, "--capacity"},
		{"negative time limit", []string{model, "--time-limit", "-1s"}, 2, "--time-limit"},
		{"unknown flag", []string{model, "--frobnicate"}, 2, "frobnicate"},
		{"missing model", []string{filepath.Join(dir, "none.onnx")}, 1, "none.onnx"},
		{"not a model", []string{notONNX}, 1, "x.onnx"},
		{"bad csv", []string{"--lifetimes", bad}, 1, `bad.csv:3: field "upper": 2 not above lower 5`},
		{"unwritable out", []string{model, "--out", filepath.Join(dir, "no", "such", "dir", "p.json")}, 1, "p.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runPlanVerb(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut, tc.code, tc.want)
			}
		})
	}
}

// pbMessage, pbString and pbVarint encode one protobuf field: a message
// of the parts, a string, a varint.
func pbMessage(num protowire.Number, parts ...[]byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), bytes.Join(parts, nil))
}

func pbString(num protowire.Number, v string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

func pbVarint(num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
}

// planSymbolicModel encodes a one-op ONNX model, y = Relu(x), whose input
// x has symbolic dimensions [batch, seq].
func planSymbolicModel() []byte {
	msg, str, varint := pbMessage, pbString, pbVarint
	// ValueInfoProto{name, type: TypeProto{tensor_type: {elem_type FLOAT,
	// shape: {dim: [{dim_param}...]}}}}.
	value := func(name string) []byte {
		shape := msg(2, msg(1, str(2, "batch")), msg(1, str(2, "seq")))
		return append(str(1, name), msg(2, msg(1, varint(1, 1), shape))...)
	}
	node := msg(1, str(1, "x"), str(2, "y"), str(3, "relu"), str(4, "Relu"))
	g := msg(7, node, str(2, "g"), msg(11, value("x")), msg(12, value("y")))
	return bytes.Join([][]byte{varint(1, 8), msg(8, varint(2, 17)), g}, nil)
}

func TestPlanSymbolicInputs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sym.onnx")
	if err := os.WriteFile(path, planSymbolicModel(), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runPlanVerb(t, path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "input        x 1x32 (assumed batch=1, seq=32)") {
		t.Errorf("defaults not reported:\n%s", out)
	}
	code, out, errOut = runPlanVerb(t, path, "--json", "--input", "x=2x64")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// y is 2*64 float32s: 512 bytes, already a multiple of 256.
	if j := planJSON(t, out, "naive_bytes"); planNum(t, j, "naive_bytes") != 512 {
		t.Errorf("naive_bytes %v, want 512", j["naive_bytes"])
	}
}

func TestPlanDemo(t *testing.T) {
	var o bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &o, stderr: &o, getenv: func(string) string { return "" }}
	if err := planDemo(e); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(o.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "MobileNetV2") || !strings.Contains(lines[1], "lower bound") {
		t.Errorf("demo output:\n%s", o.String())
	}
	// The embedded model is the one in testdata.
	want, err := os.ReadFile(filepath.Join(planTestONNX, "mobilenet_v2.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, planDemoModel) {
		t.Error("demodata/mobilenet_v2.onnx differs from testdata/onnx/mobilenet_v2.onnx")
	}
}

// planAbsentReshapeModel is y = Reshape(x, shape) with shape an int64[2]
// constant in an external file that is absent and y undeclared: no input
// shape sizes y. x has the dimensions xDims (a string is symbolic).
func planAbsentReshapeModel(xDims ...any) []byte {
	msg, str, varint := pbMessage, pbString, pbVarint
	var ds [][]byte
	for _, d := range xDims {
		switch d := d.(type) {
		case int:
			ds = append(ds, msg(1, varint(1, uint64(d))))
		case string:
			ds = append(ds, msg(1, str(2, d)))
		}
	}
	x := append(str(1, "x"), msg(2, msg(1, varint(1, 1), msg(2, ds...)))...)
	y := append(str(1, "y"), msg(2, msg(1, varint(1, 1)))...)
	shape := bytes.Join([][]byte{varint(1, 2), varint(2, 7), str(8, "shape"),
		msg(13, str(1, "location"), str(2, "absent.data")), varint(14, 1)}, nil)
	node := msg(1, str(1, "x"), str(1, "shape"), str(2, "y"), str(3, "reshape"), str(4, "Reshape"))
	g := msg(7, node, str(2, "g"), msg(5, shape), msg(11, x), msg(12, y))
	return bytes.Join([][]byte{varint(1, 8), msg(8, varint(2, 17)), g}, nil)
}

// TestPlanUnknownShapeHint: a shape nothing sizes suggests --input only
// where an input's dimensions were assumed (naming the input and what was
// taken), and --allow-unknown.
func TestPlanUnknownShapeHint(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		dims []any
		want string
	}{
		{"symbolic", []any{"batch", "seq"}, "x was planned as 1x32 (assumed batch=1, seq=32): give other dimensions with --input x=1x32, or plan the rest with --allow-unknown"},
		{"static", []any{2, 8}, "the inputs' shapes are fixed, so --input cannot help: plan the rest with --allow-unknown"},
	} {
		path := filepath.Join(dir, c.name+".onnx")
		if err := os.WriteFile(path, planAbsentReshapeModel(c.dims...), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := runPlanVerb(t, path)
		if code != exitFail || !strings.Contains(errOut, "not known statically") || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want %q", c.name, code, errOut, c.want)
		}
		if code, _, errOut := runPlanVerb(t, path, "--allow-unknown"); code != 0 {
			t.Errorf("%s --allow-unknown: exit %d: %s", c.name, code, errOut)
		}
	}
}
