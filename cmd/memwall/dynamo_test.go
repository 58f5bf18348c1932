package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// planTestDynamo holds graphs exported by PyTorch's dynamo exporter (see
// its README): each model twice, NAME.inline.onnx with its weights and
// NAME.nodata.onnx with every initializer in an external file left out.
const planTestDynamo = "../../testdata/onnx/dynamo"

// TestPlanDynamoExports is the acceptance test for real exporters: every
// exported graph plans to an arena equal to the lower bound (without
// in-place) and no larger with in-place, with its data inline and without
// it (NAME.nodata.onnx when shipped, and every inline graph with its data
// stripped here); without data the plan is the same, and the tensors sized
// from declarations are counted.
func TestPlanDynamoExports(t *testing.T) {
	inline, _ := filepath.Glob(filepath.Join(planTestDynamo, "*.inline.onnx"))
	if len(inline) == 0 {
		t.Fatalf("no exported graphs in %s", planTestDynamo)
	}
	plan := func(t *testing.T, path string) map[string]any {
		t.Helper()
		code, out, errOut := runPlanVerb(t, path, "--json", "--no-inplace", "--time-limit", "2s")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		j := planJSON(t, out, "lower_bound_bytes", "arena_bytes", "inplace_arena_bytes", "inplace_lower_bound_bytes", "declared_tensors", "weights_bytes")
		lb, arena := planNum(t, j, "lower_bound_bytes"), planNum(t, j, "arena_bytes")
		if arena != lb || arena == 0 {
			t.Errorf("without in-place: arena %d, lower bound %d", arena, lb)
		}
		if in, lbIn := planNum(t, j, "inplace_arena_bytes"), planNum(t, j, "inplace_lower_bound_bytes"); in > arena || lbIn > lb {
			t.Errorf("in-place arena %d (bound %d) above the plain one %d (bound %d)", in, lbIn, arena, lb)
		}
		if planNum(t, j, "weights_bytes") == 0 {
			t.Errorf("no weights counted")
		}
		return j
	}
	// Graphs shipped only without their data (the same weights as another
	// model's, on larger inputs) plan on their own.
	nodata, _ := filepath.Glob(filepath.Join(planTestDynamo, "*.nodata.onnx"))
	for _, m := range nodata {
		model := strings.TrimSuffix(filepath.Base(m), ".nodata.onnx")
		if fileExists(filepath.Join(planTestDynamo, model+".inline.onnx")) {
			continue
		}
		t.Run(model+" without data", func(t *testing.T) {
			j := plan(t, m)
			if planNum(t, j, "declared_tensors") == 0 {
				t.Errorf("no tensor sized from declarations, yet every constant is absent")
			}
		})
	}
	for _, m := range inline {
		model := strings.TrimSuffix(filepath.Base(m), ".inline.onnx")
		t.Run(model, func(t *testing.T) {
			with := plan(t, m)
			data, err := os.ReadFile(m)
			if err != nil {
				t.Fatal(err)
			}
			stripped := filepath.Join(t.TempDir(), model+".onnx")
			if err := os.WriteFile(stripped, stripData(t, data), 0o644); err != nil {
				t.Fatal(err)
			}
			variants := []string{stripped}
			if shipped := filepath.Join(planTestDynamo, model+".nodata.onnx"); fileExists(shipped) {
				variants = append(variants, shipped)
			}
			for _, v := range variants {
				without := plan(t, v)
				for _, k := range []string{"arena_bytes", "lower_bound_bytes", "inplace_arena_bytes", "weights_bytes"} {
					if planNum(t, without, k) != planNum(t, with, k) {
						t.Errorf("%s: %s %d without data, %d with", filepath.Base(v), k, planNum(t, without, k), planNum(t, with, k))
					}
				}
				t.Logf("%s: %d tensors sized from declarations without data, %d with", filepath.Base(v), planNum(t, without, "declared_tensors"), planNum(t, with, "declared_tensors"))
			}
		})
	}
}

// TestPlanDynamicExport: the graph exported with a dynamic sequence (seq in
// 2..64) plans without flags, its data absent or not, at a default inside
// that range; --input sizes it to another length, and the graph without
// its data plans as the one with it (the Unsqueeze axes left in the absent
// file are found from the shapes the file declares for their uses).
func TestPlanDynamicExport(t *testing.T) {
	for _, m := range []string{"gpt2_dynamic.inline.onnx", "gpt2_dynamic.nodata.onnx"} {
		code, out, errOut := runPlanVerb(t, filepath.Join(planTestDynamo, m))
		if code != 0 || !strings.Contains(out, "input        x 1x32 (assumed seq=32)") {
			t.Errorf("%s with no flags: exit %d, %s%s", m, code, out, errOut)
		}
	}
	arenas := map[string]uint64{}
	for _, seq := range []string{"2", "48", "64"} {
		for _, m := range []string{"gpt2_dynamic.inline.onnx", "gpt2_dynamic.nodata.onnx"} {
			code, out, errOut := runPlanVerb(t, filepath.Join(planTestDynamo, m), "--input", "x=1x"+seq, "--json", "--time-limit", "0s")
			if code != 0 {
				t.Fatalf("%s --input x=1x%s: exit %d: %s", m, seq, code, errOut)
			}
			j := planJSON(t, out, "arena_bytes", "skipped_tensors")
			if planNum(t, j, "skipped_tensors") != 0 {
				t.Errorf("%s --input x=1x%s: %d tensors skipped", m, seq, planNum(t, j, "skipped_tensors"))
			}
			a := planNum(t, j, "arena_bytes")
			if prev, ok := arenas[seq]; ok && prev != a {
				t.Errorf("--input x=1x%s: arena %d without data, %d with", seq, a, prev)
			}
			arenas[seq] = a
		}
	}
	if !(arenas["2"] < arenas["48"] && arenas["48"] < arenas["64"]) {
		t.Errorf("arenas by sequence length: %v", arenas)
	}
}

// TestPlanEveryBundledModel: every ONNX file in testdata/onnx and its
// dynamo folder plans with default flags.
func TestPlanEveryBundledModel(t *testing.T) {
	var files []string
	for _, d := range []string{planTestONNX, planTestDynamo} {
		fs, _ := filepath.Glob(filepath.Join(d, "*.onnx"))
		files = append(files, fs...)
	}
	if len(files) < 20 {
		t.Fatalf("%d ONNX files in testdata", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if code, _, errOut := runPlanVerb(t, f); code != 0 {
				t.Errorf("exit %d: %s", code, errOut)
			}
		})
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// stripData returns the ONNX model with every initializer's data moved to
// an external file that is not there (data_location EXTERNAL, location
// "absent.data"), as a model is shipped without its weights: the tensors'
// typed data and raw_data are dropped, every other field is kept as
// encoded.
func stripData(t *testing.T, model []byte) []byte {
	t.Helper()
	// edit copies the fields of message b, replacing the value of each
	// length-delimited field for which sub returns non-nil, and leaving out
	// the fields drop names.
	edit := func(b []byte, sub func(protowire.Number, []byte) []byte, drop map[protowire.Number]bool) []byte {
		var out []byte
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if n < 0 || m < 0 {
				t.Fatalf("not a protobuf message")
			}
			var r []byte
			if typ == protowire.BytesType && !drop[num] {
				v, _ := protowire.ConsumeBytes(b[n : n+m])
				r = sub(num, v)
			}
			switch {
			case drop[num]:
			case r != nil:
				out = protowire.AppendTag(out, num, typ)
				out = protowire.AppendBytes(out, r)
			default:
				out = append(out, b[:n+m]...)
			}
			b = b[n+m:]
		}
		return out
	}
	none := func(protowire.Number, []byte) []byte { return nil }
	tensorData := map[protowire.Number]bool{4: true, 5: true, 6: true, 7: true, 9: true, 10: true, 11: true, 13: true, 14: true}
	tensor := func(b []byte) []byte {
		out := edit(b, none, tensorData)
		var kv []byte
		kv = protowire.AppendTag(kv, 1, protowire.BytesType)
		kv = protowire.AppendString(kv, "location")
		kv = protowire.AppendTag(kv, 2, protowire.BytesType)
		kv = protowire.AppendString(kv, "absent.data")
		out = protowire.AppendTag(out, 13, protowire.BytesType)
		out = protowire.AppendBytes(out, kv)
		out = protowire.AppendTag(out, 14, protowire.VarintType)
		return protowire.AppendVarint(out, 1) // EXTERNAL
	}
	graph := func(num protowire.Number, v []byte) []byte {
		if num != 5 { // GraphProto.initializer
			return nil
		}
		return tensor(v)
	}
	return edit(model, func(num protowire.Number, v []byte) []byte {
		if num != 7 { // ModelProto.graph
			return nil
		}
		return edit(v, graph, nil)
	}, nil)
}
