package main

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memwall/memwall/format/onnx"
	"github.com/memwall/memwall/graph"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/viz"
)

func init() {
	register(verb{name: "plan", summary: "plan activation memory: lifetimes, offsets, arena vs lower bound", run: runPlan})
}

const planUsage = `MODEL.onnx | --lifetimes FILE.csv [flags]

Plans one arena for a model's activations (or for a MiniMalloc CSV instance:
id,lower,upper,size, each buffer live on [lower, upper)), and reports the
arena next to the lower bound (the most bytes live at one step). For a model
it plans twice, with and without in-place/view aliasing, and reports both;
--no-inplace picks the plan --json, --svg and --out describe. Each plan may
search for up to --time-limit.`

// Symbolic input dimensions default to these when --input does not give
// them: the first dimension is the batch, any other a sequence length. An
// ONNX file does not record the range an exporter allowed a dimension; a
// short sequence stays inside the small ranges exports declare (PyTorch's
// dynamo GPT-2 in testdata: 2..64), and --input gives any other length.
const (
	planDefaultBatch    = 1
	planDefaultSequence = 32
)

// planInputs is the repeatable --input name=1x3x224x224 flag.
type planInputs map[string][]int64

func (p planInputs) String() string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(p)) {
		parts = append(parts, n+"="+planDims(p[n]))
	}
	return strings.Join(parts, ",")
}

func (p planInputs) Set(s string) error {
	name, dims, ok := strings.Cut(s, "=")
	if !ok || name == "" || dims == "" {
		return fmt.Errorf("want name=DIMS such as input=1x3x224x224, got %q", s)
	}
	var out []int64
	for _, d := range strings.FieldsFunc(dims, func(r rune) bool { return r == 'x' || r == 'X' || r == ',' }) {
		v, err := strconv.ParseInt(strings.TrimSpace(d), 10, 64)
		if err != nil || v <= 0 || v > 1<<31 {
			return fmt.Errorf("input %q: dimension %q is not a positive integer", name, d)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return fmt.Errorf("input %q: no dimensions", name)
	}
	if _, dup := p[name]; dup {
		return fmt.Errorf("input %q given twice", name)
	}
	p[name] = out
	return nil
}

func planDims(d []int64) string {
	s := make([]string, len(d))
	for i, v := range d {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, "x")
}

// planConfig is the parsed command line.
type planConfig struct {
	model, lifetimes string
	inputs           planInputs
	noInplace        bool
	timeLimit        time.Duration
	jsonOut          bool
	svgPath, outPath string
	alignment        uint64
	allowUnknown     bool
	algorithm        string
	capacity         uint64
	capacitySet      bool
	ort              bool   // print ONNX Runtime settings (--ort)
	ortWorkspace     uint64 // --ort-workspace, 0: plan.DefaultORTWorkspace
	// The side files, checked before the work (nil when not asked for).
	outFile, svgFile *outputFile
}

func runPlan(e *env, args []string) error {
	c := planConfig{inputs: planInputs{}}
	fs := newFlags(e, "plan", planUsage)
	fs.StringVar(&c.lifetimes, "lifetimes", "", "plan a MiniMalloc CSV instance (id,lower,upper,size) instead of a model")
	fs.Var(c.inputs, "input", "an input's dimensions, name=1x3x224x224 (repeatable; default: the model's declared shape, symbolic batch=1, other symbolic dims=32)")
	fs.BoolVar(&c.noInplace, "no-inplace", false, "describe the plan without in-place/view aliasing in --json, --svg and --out")
	fs.DurationVar(&c.timeLimit, "time-limit", plan.DefaultTimeLimit, "most time the offset search may take per plan (0s: greedy planners only)")
	fs.BoolVar(&c.jsonOut, "json", false, "print the report as JSON")
	fs.StringVar(&c.svgPath, "svg", "", "write the plan as an SVG picture (op index across, offset down) to `FILE`")
	fs.StringVar(&c.outPath, "out", "", "write every tensor's offset and size as JSON to `FILE`, for a runtime to load")
	var align, capacity string
	fs.StringVar(&align, "alignment", "256", "offset alignment in bytes, sizes rounded up to it (default 1 with --lifetimes)")
	fs.BoolVar(&c.allowUnknown, "allow-unknown", false, "plan a model even if some tensor sizes cannot be inferred (those tensors are left out)")
	fs.StringVar(&c.algorithm, "algorithm", plan.AlgorithmPortfolio, "offset planner: "+strings.Join(plan.Algorithms(), ", "))
	fs.StringVar(&capacity, "capacity", "", "arena size to fit (e.g. 1MiB); for --lifetimes the default is the number in the file name (A.1048576.csv, A.1048576.csv.gz), else none; a plan above it exits 1")
	fs.BoolVar(&c.ort, "ort", false, "print ONNX Runtime session and provider options that fit the model (with --json: as JSON)")
	var ortWorkspace string
	fs.StringVar(&ortWorkspace, "ort-workspace", "", "with --ort: the margin added to weights + arena (default 64MiB + 3x the arena: ORT's own plan of the activations is larger than memwall's)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 1:
		return usagef("one model at a time, got %d arguments", len(pos))
	case len(pos) == 1 && c.lifetimes != "":
		return usagef("give a model or --lifetimes, not both")
	case len(pos) == 0 && c.lifetimes == "":
		return usagef("missing MODEL.onnx or --lifetimes FILE.csv")
	case len(pos) == 1:
		c.model = pos[0]
	}
	alignSet := false
	fs.Visit(func(f *flag.Flag) { alignSet = alignSet || f.Name == "alignment" })
	if c.lifetimes != "" && !alignSet {
		align = "1" // MiniMalloc instances carry exact sizes
	}
	if c.alignment, err = flagSize("alignment", align, false); err != nil {
		return err
	}
	if c.alignment > plan.MaxAlignment {
		return usagef("--alignment %q: want a size from 1 to %d bytes", align, plan.MaxAlignment)
	}
	if capacity != "" {
		if c.capacity, err = flagSize("capacity", capacity, false); err != nil {
			return err
		}
		c.capacitySet = true
	}
	if ortWorkspace != "" {
		if !c.ort {
			return usagef("--ort-workspace needs --ort")
		}
		if c.ortWorkspace, err = flagSize("ort-workspace", ortWorkspace, false); err != nil {
			return err
		}
	}
	if !slices.Contains(plan.Algorithms(), c.algorithm) {
		return usagef("--algorithm %q: want one of %s", c.algorithm, strings.Join(plan.Algorithms(), ", "))
	}
	if c.timeLimit < 0 || c.timeLimit > maxTimeLimit {
		return usagef("--time-limit %v: want 0s..%v", c.timeLimit, maxTimeLimit)
	}
	if c.lifetimes != "" {
		if len(c.inputs) > 0 {
			return usagef("--input applies to models, not --lifetimes")
		}
		if c.ort {
			return usagef("--ort applies to models, not --lifetimes")
		}
	}
	if c.outFile, err = checkOutput(e.temps, "--out", c.outPath); err != nil {
		return err
	}
	if c.svgFile, err = checkOutput(e.temps, "--svg", c.svgPath); err != nil {
		return err
	}
	in := input{"MODEL", c.model}
	if c.lifetimes != "" {
		in = input{"--lifetimes", c.lifetimes}
	}
	if err := checkFiles(e, []input{in}, c.outFile, c.svgFile); err != nil {
		return err
	}
	if c.lifetimes != "" {
		return planLifetimes(e, c)
	}
	return planModel(e, c)
}

// maxTimeLimit bounds --time-limit: the search's own budget, the longest
// a user waits for an offset plan on purpose.
const maxTimeLimit = time.Hour

// errNoFit is the failure of a plan above --capacity, returned after the
// report is printed (exit status 1).
func errNoFit(arena, capacity uint64) error {
	return fmt.Errorf("the arena, %s (%d bytes), does not fit --capacity %s (%d bytes): %d bytes over",
		humanBytes(arena), arena, humanBytes(capacity), capacity, arena-capacity)
}

// planOptions turns the command line into plan.Options.
func (c planConfig) planOptions(capacity uint64) plan.Options {
	o := plan.Options{Alignment: c.alignment, Capacity: capacity, TimeLimit: c.timeLimit}
	if c.timeLimit == 0 {
		o.TimeLimit = -1 // no search
	}
	if c.algorithm != plan.AlgorithmPortfolio {
		o.Algorithms = []string{c.algorithm}
	}
	return o
}

// planRunJSON is one planner's result in --json.
type planRunJSON struct {
	Algorithm  string  `json:"algorithm"`
	ArenaBytes uint64  `json:"arena_bytes,omitempty"`
	Seconds    float64 `json:"seconds"`
	Nodes      int64   `json:"nodes,omitempty"`
	Outcome    string  `json:"outcome"`
}

func planRuns(rep plan.Report) []planRunJSON {
	out := make([]planRunJSON, len(rep.Runs))
	for i, r := range rep.Runs {
		out[i] = planRunJSON{r.Algorithm, r.ArenaBytes, r.Elapsed.Seconds(), r.Nodes, r.Outcome}
	}
	return out
}

// planRunsLine is the per-planner summary for humans.
func planRunsLine(rep plan.Report) string {
	var parts []string
	for _, r := range rep.Runs {
		s := r.Algorithm + " "
		if r.ArenaBytes > 0 {
			s += humanBytes(r.ArenaBytes)
		} else {
			s += r.Outcome
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", s, planSeconds(r.Elapsed)))
	}
	return strings.Join(parts, ", ")
}

func planSeconds(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// planCapacityName reads MiniMalloc's convention of naming an instance
// after its capacity: "A.1048576.csv", compressed or not ("A.1048576.csv.gz",
// ".csv.gzip"), in any case.
var planCapacityName = regexp.MustCompile(`(?i)\.([0-9]+)\.csv(?:\.gz|\.gzip)?$`)

func planLifetimes(e *env, c planConfig) error {
	bufs, err := readLifetimes(c.lifetimes)
	if err != nil {
		return err
	}
	if !c.capacitySet {
		if m := planCapacityName.FindStringSubmatch(filepath.Base(c.lifetimes)); m != nil {
			c.capacity, _ = strconv.ParseUint(m[1], 10, 64)
		}
	}
	t0 := time.Now()
	stop := ticking(e, "plan", fmt.Sprintf("%d buffers", len(bufs)), c.timeLimit)
	l, rep, err := plan.Solve(e.ctx, bufs, c.planOptions(c.capacity))
	stop()
	if err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	names := make([][]string, len(bufs))
	for i, b := range bufs {
		names[i] = []string{b.ID}
	}
	files, err := planFiles(c, filepath.Base(c.lifetimes), "buffers", bufs, names, l, rep, nil)
	if err != nil {
		return err
	}
	// The files first: a report that names them is printed once they are
	// there, and a reader of the report that stops early (| head) cannot
	// keep them from being written. One that could not be written is the
	// error after the report.
	werr := files.write()
	if err := printLifetimes(e, c, bufs, l, rep, secs); err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	if !rep.Fits {
		return errNoFit(l.ArenaBytes, c.capacity)
	}
	return nil
}

func printLifetimes(e *env, c planConfig, bufs []plan.Buffer, l plan.Layout, rep plan.Report, secs float64) error {
	if c.jsonOut {
		return writeJSON(e.stdout, struct {
			Instance        string        `json:"instance"`
			Buffers         int           `json:"buffers"`
			CapacityBytes   uint64        `json:"capacity_bytes"`
			LowerBoundBytes uint64        `json:"lower_bound_bytes"`
			ArenaBytes      uint64        `json:"arena_bytes"`
			FitsCapacity    bool          `json:"fits_capacity"`
			Algorithm       string        `json:"algorithm"`
			Alignment       uint64        `json:"alignment"`
			Seconds         float64       `json:"seconds"`
			Algorithms      []planRunJSON `json:"algorithms"`
		}{c.lifetimes, len(bufs), c.capacity, rep.LowerBoundBytes, l.ArenaBytes, rep.Fits,
			l.Algorithm, l.Alignment, secs, planRuns(rep)})
	}
	w := e.stdout
	fmt.Fprintf(w, "instance     %s: %d buffers\n", c.lifetimes, len(bufs))
	fmt.Fprintf(w, "lower bound  %s (%d bytes)\n", humanBytes(rep.LowerBoundBytes), rep.LowerBoundBytes)
	if c.capacity > 0 {
		fmt.Fprintf(w, "capacity     %s (%d bytes)\n", humanBytes(c.capacity), c.capacity)
	}
	verdict := ""
	switch {
	case c.capacity > 0 && rep.Fits:
		verdict = ": fits"
	case c.capacity > 0:
		verdict = fmt.Sprintf(": does NOT fit (%d bytes over)", l.ArenaBytes-c.capacity)
	case rep.AtLowerBound:
		verdict = ": at the lower bound (optimal)"
	}
	fmt.Fprintf(w, "arena        %s (%d bytes, %.3fx the lower bound)%s\n", humanBytes(l.ArenaBytes), l.ArenaBytes, planRatio(l.ArenaBytes, rep.LowerBoundBytes), verdict)
	fmt.Fprintf(w, "algorithm    %s; %s\n", l.Algorithm, planRunsLine(rep))
	fmt.Fprintf(w, "time         %s\n", planSeconds(time.Duration(secs*float64(time.Second))))
	return nil
}

// readLifetimes reads a MiniMalloc CSV instance, gzip-compressed or not
// (by its bytes, not its name), from a file or a pipe; any other binary
// file is refused naming what it is, and so is an instance without buffers.
func readLifetimes(path string) ([]plan.Buffer, error) {
	f, br, kind, err := openSniffed(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = br
	switch kind {
	case kindGzip:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%s: gzip: %w", path, err)
		}
		defer zr.Close()
		r = zr
	case kindText, kindEmpty:
	default:
		return nil, fmt.Errorf("%s: not a CSV file: it is %s (want a MiniMalloc CSV: id,lower,upper,size, plain or gzip-compressed)", path, kindPhrase(kind))
	}
	bufs, err := plan.ReadMinimallocCSV(r, path)
	if err != nil {
		return nil, err
	}
	if len(bufs) == 0 {
		return nil, fmt.Errorf("%s: no buffers: the file has a header and no rows", path)
	}
	return bufs, nil
}

func planRatio(a, b uint64) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}

// planModelResult is one plan of a model (with or without aliasing).
type planModelResult struct {
	set    *plan.ActivationSet
	layout plan.Layout
	rep    plan.Report
}

func planModel(e *env, c planConfig) error {
	f, br, kind, err := openSniffed(c.model) // read once: it may be a pipe
	if err != nil {
		return err
	}
	defer f.Close()
	if kind != kindONNX && !(kind == kindBinary && strings.HasSuffix(c.model, ".onnx")) {
		return fmt.Errorf("%s: not an ONNX model: it is %s", c.model, kindPhrase(kind))
	}
	data, err := io.ReadAll(br)
	if err != nil {
		return fmt.Errorf("%s: %w", c.model, err)
	}
	t0 := time.Now()
	res, err := planModelData(e, c, filepath.Base(c.model), data)
	if err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	chosen := res.inplace
	if c.noInplace {
		chosen = res.noInplace
	}
	what := fmt.Sprintf("tensors in %d buffers", len(chosen.set.Buffers))
	files, err := planFiles(c, filepath.Base(c.model), what, chosen.set.Buffers, chosen.set.Members, chosen.layout, chosen.rep, res.g)
	if err != nil {
		return err
	}
	var ort *plan.ORTSettings
	if c.ort {
		// The plan without aliasing: ORT's reuse is its own, so the larger
		// of memwall's two arenas is the safer bound.
		s, err := plan.NewORTSettings(planWeightBytes(res.g), res.noInplace.layout.ArenaBytes, c.ortWorkspace)
		if err != nil {
			return err
		}
		ort = &s
	}
	werr := files.write() // before the report, as in planLifetimes
	if err := printPlanModel(e, c, res, chosen, secs, ort); err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	if !chosen.rep.Fits {
		return errNoFit(chosen.layout.ArenaBytes, c.capacity)
	}
	return nil
}

// planWeightBytes is the bytes of the graph's initializers (its weights),
// whether their data is inline, external or absent.
func planWeightBytes(g *graph.Graph) uint64 {
	var n uint64
	for _, t := range g.Tensors {
		if t.Initializer {
			n += t.Bytes
		}
	}
	return n
}

// printPlanModel prints a model's report: JSON, or the human lines.
func printPlanModel(e *env, c planConfig, res *planModelOut, chosen planModelResult, secs float64, ort *plan.ORTSettings) error {
	tensors := planCount(res.noInplace.set.Members)
	var capacity *uint64
	var fits *bool
	if c.capacity > 0 {
		capacity, fits = &c.capacity, &chosen.rep.Fits
	}
	if c.jsonOut {
		type inJSON struct {
			Name    string  `json:"name"`
			Dims    []int64 `json:"dims"`
			Assumed string  `json:"assumed,omitempty"`
		}
		var ins []inJSON
		for _, in := range res.inputs {
			ins = append(ins, inJSON{in.name, in.dims, in.assumed})
		}
		return writeJSON(e.stdout, struct {
			Model                    string            `json:"model"`
			Tensors                  int               `json:"tensors"`
			NaiveBytes               uint64            `json:"naive_bytes"`
			LowerBoundBytes          uint64            `json:"lower_bound_bytes"`
			ArenaBytes               uint64            `json:"arena_bytes"`
			Algorithm                string            `json:"algorithm"`
			Inplace                  bool              `json:"inplace"`
			Seconds                  float64           `json:"seconds"`
			PlannedTensors           int               `json:"planned_tensors"`
			ExternalViews            int               `json:"external_views"`
			Buffers                  int               `json:"buffers"`
			Alignment                uint64            `json:"alignment"`
			InplaceLowerBoundBytes   uint64            `json:"inplace_lower_bound_bytes"`
			InplaceArenaBytes        uint64            `json:"inplace_arena_bytes"`
			NoInplaceLowerBoundBytes uint64            `json:"no_inplace_lower_bound_bytes"`
			NoInplaceArenaBytes      uint64            `json:"no_inplace_arena_bytes"`
			SkippedTensors           int               `json:"skipped_tensors"`
			DeclaredTensors          int               `json:"declared_tensors"`
			WeightBytes              uint64            `json:"weights_bytes"`
			CapacityBytes            *uint64           `json:"capacity_bytes"`
			FitsCapacity             *bool             `json:"fits_capacity"`
			Inputs                   []inJSON          `json:"inputs"`
			Algorithms               []planRunJSON     `json:"algorithms"`
			ORT                      *plan.ORTSettings `json:"ort,omitempty"`
		}{c.model, tensors, res.noInplace.set.NaiveBytes, chosen.rep.LowerBoundBytes, chosen.layout.ArenaBytes,
			chosen.layout.Algorithm, !c.noInplace, secs, planCount(chosen.set.Members), chosen.set.ExternalViews,
			len(chosen.set.Buffers), c.alignment,
			res.inplace.rep.LowerBoundBytes, res.inplace.layout.ArenaBytes,
			res.noInplace.rep.LowerBoundBytes, res.noInplace.layout.ArenaBytes,
			chosen.set.Skipped, res.g.Declared, planWeightBytes(res.g), capacity, fits, ins, planRuns(chosen.rep), ort})
	}
	w := e.stdout
	naive := res.noInplace.set.NaiveBytes
	fmt.Fprintf(w, "model        %s (%d ops)\n", c.model, len(res.g.Nodes))
	for _, in := range res.inputs {
		note := "declared"
		if in.assumed != "" {
			note = "assumed " + in.assumed
		} else if in.given {
			note = "--input"
		}
		fmt.Fprintf(w, "input        %s %s (%s)\n", in.name, planDims(in.dims), note)
	}
	fmt.Fprintf(w, "tensors      %d activations, %s if each had its own memory", tensors, humanBytes(naive))
	if s := res.noInplace.set.Skipped; s > 0 {
		fmt.Fprintf(w, " (%d of unknown size left out)", s)
	}
	fmt.Fprintln(w)
	if d := res.g.Declared; d > 0 {
		fmt.Fprintf(w, "declared     %d tensors sized from the shapes the file declares (value_info, outputs): a constant they depend on is not in the file, or an operator is not modeled\n", d)
	}
	fmt.Fprintf(w, "%-20s %12s %12s %8s  %s\n", "", "lower bound", "arena", "vs naive", "algorithm")
	for _, r := range []struct {
		name string
		p    planModelResult
	}{{"without in-place", res.noInplace}, {"with in-place", res.inplace}} {
		mark := ""
		if r.p.rep.AtLowerBound {
			mark = " (= lower bound)"
		}
		fmt.Fprintf(w, "%-20s %12s %12s %7.1fx  %s%s\n", r.name, humanBytes(r.p.rep.LowerBoundBytes), humanBytes(r.p.layout.ArenaBytes),
			planRatio(naive, r.p.layout.ArenaBytes), r.p.layout.Algorithm, mark)
	}
	fmt.Fprintf(w, "buffers      %d without in-place, %d with (views and in-place ops share their input's buffer",
		len(res.noInplace.set.Buffers), len(res.inplace.set.Buffers))
	if v := res.inplace.set.ExternalViews; v > 0 {
		fmt.Fprintf(w, "; %d views of inputs or weights need none", v)
	}
	fmt.Fprintln(w, ")")
	fmt.Fprintf(w, "planners     %s\n", planRunsLine(chosen.rep))
	if c.capacity > 0 {
		verdict := "fits"
		if !chosen.rep.Fits {
			verdict = fmt.Sprintf("does NOT fit (%d bytes over)", chosen.layout.ArenaBytes-c.capacity)
		}
		fmt.Fprintf(w, "capacity     %s (%d bytes): the %s plan's arena %s\n", humanBytes(c.capacity), c.capacity, planAliasing(c), verdict)
	}
	fmt.Fprintf(w, "time         %s\n", planSeconds(time.Duration(secs*float64(time.Second))))
	if ort != nil {
		printORT(w, c.model, *ort)
	}
	return nil
}

func planAliasing(c planConfig) string {
	if c.noInplace {
		return "no-in-place"
	}
	return "in-place"
}

// printORT prints the ONNX Runtime settings and the lines to paste.
func printORT(w io.Writer, model string, s plan.ORTSettings) {
	fmt.Fprintf(w, "\nONNX Runtime settings: weights %s + arena %s (the plan without in-place) + workspace %s = %s\n",
		humanBytes(s.WeightBytes), humanBytes(s.ArenaBytes), humanBytes(s.WorkspaceBytes), humanBytes(s.TotalBytes))
	fmt.Fprintf(w, "  CUDA provider   gpu_mem_limit=%s arena_extend_strategy=%s\n", s.CUDAProviderOptions["gpu_mem_limit"], s.CUDAProviderOptions["arena_extend_strategy"])
	fmt.Fprintf(w, "  CPU arena       max_mem=%d arena_extend_strategy=%d initial_chunk_size_bytes=%d max_dead_bytes_per_chunk=%d\n",
		s.ArenaCfg.MaxMem, s.ArenaCfg.ArenaExtendStrategy, s.ArenaCfg.InitialChunkSizeBytes, s.ArenaCfg.MaxDeadBytesPerChunk)
	fmt.Fprintf(w, "  session         enable_cpu_mem_arena=%v enable_mem_pattern=%v enable_mem_reuse=%v session.use_env_allocators=1\n",
		s.SessionOptions.EnableCPUMemArena, s.SessionOptions.EnableMemPattern, s.SessionOptions.EnableMemReuse)
	fmt.Fprintf(w, "(workspace: by default 64 MiB + 3x the arena. ORT plans its activations itself, on the graph it transforms\n"+
		" (layout reorders, fused and decomposed operators), and needed up to 2.6x memwall's arena on its CPU provider;\n"+
		" the margin also covers inputs, outputs and library workspaces. A smaller --ort-workspace can make ORT fail to allocate.)\n\n")
	fmt.Fprint(w, s.Python(model))
}

// planInput is one graph input's dimensions and where they came from.
type planInput struct {
	name    string
	dims    []int64
	given   bool   // from --input
	assumed string // which symbolic dims were defaulted, "" if none
}

// planModelOut holds both plans of a model.
type planModelOut struct {
	g                  *graph.Graph
	inputs             []planInput
	inplace, noInplace planModelResult
}

// planModelData decodes an ONNX model, sizes its tensors and plans its
// activations with and without aliasing.
func planModelData(e *env, c planConfig, name string, data []byte) (*planModelOut, error) {
	m, err := onnx.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	out := &planModelOut{}
	inits := map[string]bool{}
	for _, t := range m.Graph.Initializers {
		inits[t.Name] = true
	}
	dims := map[string][]int64{}
	for _, v := range m.Graph.Inputs {
		if inits[v.Name] {
			continue
		}
		in := planInput{name: v.Name}
		if d, ok := c.inputs[v.Name]; ok {
			in.dims, in.given = d, true
		} else {
			var notes []string
			for i, d := range v.Type.Shape {
				switch {
				case d.HasValue && d.Value > 0:
					in.dims = append(in.dims, d.Value)
				case i == 0:
					in.dims = append(in.dims, planDefaultBatch)
					notes = append(notes, fmt.Sprintf("%s=%d", planDimName(d, "batch"), planDefaultBatch))
				default:
					in.dims = append(in.dims, planDefaultSequence)
					notes = append(notes, fmt.Sprintf("%s=%d", planDimName(d, "sequence"), planDefaultSequence))
				}
			}
			in.assumed = strings.Join(notes, ", ")
		}
		dims[v.Name] = in.dims
		out.inputs = append(out.inputs, in)
	}
	for n := range c.inputs {
		if _, ok := dims[n]; !ok {
			var have []string
			for _, in := range out.inputs {
				have = append(have, in.name)
			}
			return nil, fmt.Errorf("%s: --input %q: the model has no such input (inputs: %s)", name, n, strings.Join(have, ", "))
		}
	}
	g, err := graph.ImportONNX(m, dims, graph.Options{AllowUnknown: c.allowUnknown})
	if err != nil {
		if errors.Is(err, graph.ErrUnknownShape) {
			return nil, fmt.Errorf("%s: %w (%s)", name, err, planUnknownHint(out.inputs))
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	out.g = g
	for _, inplace := range []bool{false, true} {
		set, err := plan.Activations(g, plan.LivenessOptions{Alignment: c.alignment, InPlace: inplace})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		note := "offsets, no in-place"
		if inplace {
			note = "offsets, in-place"
		}
		stop := ticking(e, "plan", note, c.timeLimit)
		l, rep, err := plan.Solve(e.ctx, set.Buffers, c.planOptions(c.capacity))
		stop()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		r := planModelResult{set, l, rep}
		if inplace {
			out.inplace = r
		} else {
			out.noInplace = r
		}
	}
	return out, nil
}

// planUnknownHint is what to try when a shape cannot be inferred: --input
// for an input whose dimensions were assumed (naming it and the dimensions
// taken), and --allow-unknown.
func planUnknownHint(ins []planInput) string {
	for _, in := range ins {
		if in.assumed != "" {
			return fmt.Sprintf("%s was planned as %s (assumed %s): give other dimensions with --input %s=%s, or plan the rest with --allow-unknown",
				in.name, planDims(in.dims), in.assumed, in.name, planDims(in.dims))
		}
	}
	return "the inputs' shapes are fixed, so --input cannot help: plan the rest with --allow-unknown"
}

func planDimName(d onnx.Dim, role string) string {
	if d.Param != "" {
		return d.Param
	}
	return role
}

// planTensorJSON is one tensor in --out.
type planTensorJSON struct {
	Name   string `json:"name"`
	Offset uint64 `json:"offset"`
	Size   uint64 `json:"size"`
	Start  int    `json:"start"`
	End    int    `json:"end"`
	Buffer int    `json:"buffer"` // tensors of one buffer alias each other
}

// planSideFiles are --out's and --svg's contents, made and written before
// the report is printed.
type planSideFiles struct {
	c        planConfig
	out, svg []byte
}

// write writes the files asked for; the first error is returned after
// every file was tried.
func (f planSideFiles) write() error {
	return errors.Join(f.c.outFile.write(f.out), f.c.svgFile.write(f.svg))
}

// planFiles makes --out and --svg. names lists each buffer's tensors; g,
// when set, gives each tensor's own size and lifetime (else the buffer's).
func planFiles(c planConfig, model, what string, bufs []plan.Buffer, names [][]string, l plan.Layout, rep plan.Report, g *graph.Graph) (planSideFiles, error) {
	files := planSideFiles{c: c}
	if c.outPath != "" {
		var ts []planTensorJSON
		for i, b := range bufs {
			for _, n := range names[i] {
				t := planTensorJSON{n, l.Offsets[i], b.Size, b.Start, b.End, i}
				if g != nil {
					if gt := g.Tensor(n); gt != nil {
						t.Size = gt.Bytes
						t.Start = gt.Producer
						t.End = gt.Producer + 1
						if k := len(gt.Consumers); k > 0 {
							t.End = max(t.End, gt.Consumers[k-1]+1)
						}
						if gt.Output {
							t.End = len(g.Nodes)
						}
					}
				}
				ts = append(ts, t)
			}
		}
		var buf bytes.Buffer
		err := writeJSON(&buf, struct {
			Model           string           `json:"model"`
			ArenaBytes      uint64           `json:"arena_bytes"`
			Alignment       uint64           `json:"alignment"`
			LowerBoundBytes uint64           `json:"lower_bound_bytes"`
			Algorithm       string           `json:"algorithm"`
			Inplace         bool             `json:"inplace"`
			Tensors         []planTensorJSON `json:"tensors"`
		}{model, l.ArenaBytes, l.Alignment, rep.LowerBoundBytes, l.Algorithm, g != nil && !c.noInplace, ts})
		if err != nil {
			return files, err
		}
		files.out = buf.Bytes()
	}
	if c.svgPath != "" {
		pic := viz.PlanPicture{
			Title: fmt.Sprintf("%s: %d %s, arena %s, lower bound %s (%s)", model, planCount(names), what,
				humanBytes(l.ArenaBytes), humanBytes(rep.LowerBoundBytes), l.Algorithm),
			LowerBoundBytes: rep.LowerBoundBytes,
			ArenaBytes:      l.ArenaBytes,
			CapacityBytes:   rep.CapacityBytes,
		}
		if g == nil {
			pic.XLabel = "time"
		} else if c.noInplace {
			pic.Title += ", no in-place"
		} else {
			pic.Title += ", in-place"
		}
		for i, b := range bufs {
			label := strings.Join(names[i], ", ")
			if len(names[i]) > 4 {
				label = fmt.Sprintf("%s, ... (%d tensors)", strings.Join(names[i][:4], ", "), len(names[i]))
			}
			pic.Rects = append(pic.Rects, viz.PlanRect{Label: label, Start: b.Start, End: b.End, Offset: l.Offsets[i], Size: b.Size})
		}
		var buf bytes.Buffer
		if err := viz.PlanSVG(&buf, pic); err != nil {
			return files, err
		}
		files.svg = buf.Bytes()
	}
	return files, nil
}

func planCount(names [][]string) int {
	n := 0
	for _, m := range names {
		n += len(m)
	}
	return n
}

// planDemoModel is torchvision's MobileNetV2 exported to ONNX with shapes
// only (see demodata/README.md), so `memwall demo` needs no files.
//
//go:embed demodata/mobilenet_v2.onnx
var planDemoModel []byte

// planDemo plans the embedded MobileNetV2's activations and prints three
// lines: what the tensors would take apart, the planned arena against the
// lower bound, and the same with in-place aliasing.
func planDemo(e *env) error {
	c := planConfig{alignment: plan.DefaultActivationAlignment, timeLimit: plan.DefaultTimeLimit, algorithm: plan.AlgorithmPortfolio}
	res, err := planModelData(e, c, "mobilenet_v2.onnx", planDemoModel)
	if err != nil {
		return err
	}
	no, in := res.noInplace, res.inplace
	tensors := planCount(no.set.Members)
	w := e.stdout
	fmt.Fprintf(w, "  MobileNetV2 (%d ops, batch 1): %d activation tensors, %s if each had its own memory\n",
		len(res.g.Nodes), tensors, humanBytes(no.set.NaiveBytes))
	fmt.Fprintf(w, "  sharing memory between tensors that are never live together: %s arena, %.1fx less (lower bound %s)\n",
		humanBytes(no.layout.ArenaBytes), planRatio(no.set.NaiveBytes, no.layout.ArenaBytes), humanBytes(no.rep.LowerBoundBytes))
	fmt.Fprintf(w, "  plus views and in-place ops writing over their input: %s arena (lower bound %s)\n",
		humanBytes(in.layout.ArenaBytes), humanBytes(in.rep.LowerBoundBytes))
	return nil
}
