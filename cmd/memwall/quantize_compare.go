package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/quantize"
)

// comparedFile is one FILE of quantize --compare: its tensors' errors
// against IN.
type comparedFile struct {
	path    string
	tensors []quantize.TensorResult
}

// runQuantizeCompare is quantize --compare IN FILE...: the error of each
// FILE's tensors against IN's, measured with memwall's dequantizer.
func runQuantizeCompare(e *env, pos []string, workers int, asJSON bool) error {
	if len(pos) < 2 {
		return usagef("--compare wants IN and at least one FILE, got %d arguments", len(pos))
	}
	const maxFiles = 16
	if len(pos)-1 > maxFiles {
		return usagef("--compare: %d files, at most %d", len(pos)-1, maxFiles)
	}
	in := pos[0]
	m, err := openInput(e, in, llama.Open)
	if err != nil {
		return err
	}
	defer m.Close()
	src, err := quantize.FromModel(m, modelName(in), nil)
	if err != nil {
		return err
	}
	start := time.Now()
	var files []comparedFile
	for _, path := range pos[1:] {
		ts, err := compareFile(e, src, path, workers)
		if err != nil {
			return err
		}
		files = append(files, comparedFile{path: path, tensors: ts})
	}
	secs := time.Since(start).Seconds()
	if asJSON {
		return writeJSON(e.stdout, compareJSON(in, files, secs))
	}
	fmt.Fprintf(e.stdout, "%s against %d quantized file(s), RMS error relative to the source's, %.2f s\n", in, len(files), secs)
	for _, f := range files {
		fmt.Fprintf(e.stdout, "%s: %d tensors compared (%s)\n", f.path, len(f.tensors), typeErrors(f.tensors))
		printWorst(e.stdout, f.tensors, worstShown)
	}
	if len(files) == 2 {
		printHeadToHead(e.stdout, files[0], files[1])
	}
	return nil
}

// compareFile opens a quantized file of src's model and measures its
// tensors' errors, with a progress bar.
func compareFile(e *env, src *quantize.Source, path string, workers int) ([]quantize.TensorResult, error) {
	q, err := openInput(e, path, llama.Open)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	qs, err := quantize.FromModel(q, modelName(path), nil)
	if err != nil {
		return nil, err
	}
	bar := newProgress(e, "compare")
	bar.unit = "bytes" // of the quantized file read
	var last time.Time
	ts, err := quantize.Compare(e.ctx, src, qs, quantize.Options{Workers: workers, Progress: func(done, total uint64) {
		if now := time.Now(); done == total || now.Sub(last) >= 100*time.Millisecond {
			last = now
			bar.update(float64(done), float64(total), humanBytes(done)+" of "+humanBytes(total))
		}
	}})
	bar.done()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%s: no tensor of the same name as one of the source's", path)
	}
	return ts, nil
}

// typeErrors is "Q4_K 0.0712 (193), ...": each output type's relative RMS
// error over its tensors, and how many there are.
func typeErrors(ts []quantize.TensorResult) string {
	sums := map[string]*quantize.Error{}
	counts := map[string]int{}
	for _, t := range ts {
		k := t.To.String()
		if sums[k] == nil {
			sums[k] = &quantize.Error{}
		}
		sums[k].Add(t.Error)
		counts[k]++
	}
	keys := make([]string, 0, len(sums))
	for k := range sums {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.4f (%d)", k, sums[k].Relative(), counts[k])
	}
	return strings.Join(parts, ", ")
}

// printHeadToHead sets two files' errors side by side over the tensors
// both have in the same type.
func printHeadToHead(w io.Writer, a, b comparedFile) {
	byName := map[string]quantize.TensorResult{}
	for _, t := range b.tensors {
		byName[t.Name] = t
	}
	var same, larger, smaller, otherType int
	worst, worstName := 1.0, ""
	for _, ta := range a.tensors {
		tb, ok := byName[ta.Name]
		if !ok || tb.To != ta.To {
			otherType++
			continue
		}
		ea, eb := ta.Error.Relative(), tb.Error.Relative()
		switch {
		case ea == eb:
			same++
		case ea > eb:
			larger++
		default:
			smaller++
		}
		if eb > 0 && ea/eb > worst {
			worst, worstName = ea/eb, ta.Name
		}
	}
	fmt.Fprintf(w, "%s against %s, tensors of the same type: %d the same error, %d larger, %d smaller; %d in another type or only in one\n",
		a.path, b.path, same, larger, smaller, otherType)
	if worstName != "" {
		fmt.Fprintf(w, "  the largest ratio: %s, %.4f× the other's error\n", worstName, worst)
	}
}

func compareJSON(in string, files []comparedFile, secs float64) map[string]any {
	out := make([]map[string]any, len(files))
	for i, f := range files {
		tensors := make([]map[string]any, len(f.tensors))
		for k, t := range f.tensors {
			tensors[k] = map[string]any{"name": t.Name, "from": t.From.String(), "to": t.To.String(), "shape": t.Shape, "bytes": t.Bytes,
				"rms_error": t.Error.RMS(), "relative_error": finite(t.Error.Relative())}
		}
		out[i] = map[string]any{"path": f.path, "tensors": tensors, "relative_error": finite(totalError(f.tensors).Relative())}
	}
	return map[string]any{"in": in, "files": out, "seconds": secs}
}
