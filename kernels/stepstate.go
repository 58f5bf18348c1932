package kernels

import (
	"errors"
	"fmt"
	"math"

	"github.com/memwall/memwall/device"
)

// Step-state kernels: KVWrite and Attention with the step's first position
// read from device memory (the positions buffer a step uploads) instead of
// a launch argument, so that a decode step captured once as a device graph
// (device.Grapher) replays correctly at every position. They compute the
// same bits as KVWrite and Attention at start = pos[0] (the same kernel
// code; the context split is PlanAttention's rule, applied on the device).

// Names of the step-state kernels (kernels.cu, "Step-state variants").
const (
	NameKVWriteAt     = "memwall_kvwrite_at"
	NameAttnAt        = "memwall_attn_at" // prefix of memwall_attn_at_e<E>
	NameAttnDecodeAt  = "memwall_attn_decode_at"
	NameAttnCombineAt = "memwall_attn_combine_at"
)

// StateNames lists the step-state kernels. They are optional at load: a
// module without every one of them (the PTX built before they existed)
// loads, and StepState reports false.
func StateNames() []string {
	n := []string{NameKVWriteAt}
	for _, e := range attnLanes {
		n = append(n, fmt.Sprintf("%s_e%d", NameAttnAt, e))
	}
	return append(n, NameAttnDecodeAt, NameAttnCombineAt)
}

type stateFuncs struct {
	ok                       bool
	kvwrite, decode, combine device.Function
	attn                     [len(attnLanes)]device.Function
}

// resolveAll looks up every one of names, a set of kernels optional at
// load (the step-state kernels, the row kernels): on the simulator and the
// CPU (all) every name is tried, elsewhere only those the PTX declares. It
// returns nil unless all of them resolved.
func resolveAll(names []string, ptx []byte, all bool, get func(string) (device.Function, error)) []device.Function {
	have := map[string]bool{}
	for _, e := range PTXEntries(ptx) {
		have[e] = true
	}
	fs := make([]device.Function, len(names))
	for i, n := range names {
		if !all && !have[n] {
			return nil
		}
		f, err := get(n)
		if err != nil {
			return nil
		}
		fs[i] = f
	}
	return fs
}

// resolveState looks the step-state kernels up (resolveAll). StepState is
// true only when all of them resolved.
func (s *Set) resolveState(ptx []byte, all bool, get func(string) (device.Function, error)) {
	fs := resolveAll(StateNames(), ptx, all, get)
	if fs == nil {
		return
	}
	st := &s.state
	st.kvwrite, st.decode, st.combine = fs[0], fs[len(fs)-2], fs[len(fs)-1]
	copy(st.attn[:], fs[1:1+len(attnLanes)])
	st.ok = true
}

// StepState reports whether KVWriteAt and AttentionAt can run: the module
// has the step-state kernels (PTX built from this kernels.cu, or the
// simulator's Go twins).
func (s *Set) StepState() bool { return s.state.ok }

func (s *Set) stateOK(kernel string) error {
	if !s.state.ok {
		return fmt.Errorf("kernels: %s: not in %s (rebuild with scripts/build-ptx.sh): %w", kernel, s.source, device.ErrUnsupported)
	}
	return nil
}

// KVWriteAt is KVWrite with start read from pos (an int32 on the device:
// the first of the step's positions) when the kernel runs.
func (s *Set) KVWriteAt(k, v, cache, table, pos device.Ptr, T uint32, L KVLayout, layer uint32, st device.Stream) error {
	if err := s.stateOK(NameKVWriteAt); err != nil {
		return err
	}
	if err := L.Validate(); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameKVWriteAt, err)
	}
	if T == 0 {
		return nil
	}
	if layer >= L.Layers {
		return fmt.Errorf("kernels: %s: layer %d of %d: %w", NameKVWriteAt, layer, L.Layers, ErrShape)
	}
	elt, _ := ElemSize(L.DType)
	if err := errors.Join(checkPtr(NameKVWriteAt, "k", k, 4), checkPtr(NameKVWriteAt, "v", v, 4),
		checkPtr(NameKVWriteAt, "cache", cache, uint64(elt)), checkPtr(NameKVWriteAt, "table", table, 4),
		checkPtr(NameKVWriteAt, "pos", pos, 4)); err != nil {
		return err
	}
	c, _ := dtCode(L.DType)
	n := uint64(T) * uint64(L.KVHeads) * uint64(L.HeadDim)
	return s.launch(NameKVWriteAt, s.state.kvwrite, s.gridFor(n), st,
		k, v, cache, table, pos, T, L.BlockTokens, L.KVHeads, L.HeadDim, layer, c, L.BlockBytes)
}

// AttnAtPlan is how AttentionAt launches for contexts up to a longest one:
// the grid (Z the most splits any such context takes), the split cap the
// kernels apply to the context they find, and the partials' bytes at that
// most (0 when no context splits).
type AttnAtPlan struct {
	Grid         device.Dim3
	Cap          uint32
	ScratchBytes uint64
}

// PlanAttentionAt returns AttentionAt's launch for T tokens whose context
// (first position + T) is at most maxCtx. For every such context the
// kernels split it as PlanAttention does.
func PlanAttentionAt(maxCtx, T, nHeads, kvHeads, headDim, sms uint32) AttnAtPlan {
	groups := ceilDiv(nHeads/kvHeads, attnHeads)
	limit := attnSplitCap(T, nHeads, kvHeads, headDim, sms)
	most := uint64(1)
	if limit > 1 && uint64(maxCtx) > minChunk {
		most = min(limit, (uint64(maxCtx)+minChunk-1)/minChunk)
	}
	p := AttnAtPlan{Grid: device.Dim3{X: kvHeads * groups, Y: T, Z: uint32(most)}, Cap: uint32(limit)}
	if most > 1 {
		p.ScratchBytes = attnPartBytes(T, nHeads, headDim, most)
	}
	return p
}

// ReserveAttentionAt allocates, outside any capture, the scratch that
// AttentionAt on st needs for contexts up to maxCtx (the Set keeps it per
// stream until Close), so that a captured AttentionAt allocates nothing.
func (s *Set) ReserveAttentionAt(st device.Stream, maxCtx, T, nHeads uint32, L KVLayout) error {
	if nHeads == 0 || L.KVHeads == 0 || nHeads%L.KVHeads != 0 {
		return fmt.Errorf("kernels: %s: %d query heads for %d kv heads: %w", NameAttnAt, nHeads, L.KVHeads, ErrShape)
	}
	p := PlanAttentionAt(maxCtx, T, nHeads, L.KVHeads, L.HeadDim, s.sms)
	if p.ScratchBytes == 0 {
		return nil
	}
	if _, err := s.scratchFor(st, p.ScratchBytes); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameAttnAt, err)
	}
	return nil
}

// AttentionAt is Attention with start read from pos when the kernels run
// (the context pos[0] + T must be at most maxCtx, which sizes the grid and
// the partials: see PlanAttentionAt and ReserveAttentionAt). It gives the
// bits Attention gives at start = pos[0]: the same kernel (split or decode
// attention, chosen as Attention chooses) and the same split. It fails
// with device.ErrUnsupported when StepState is false, or when Attention
// would run the flash prefill kernel for T tokens (T ≥ 16 with flash on),
// which has no step-state form.
func (s *Set) AttentionAt(q, cache, table, pos device.Ptr, maxCtx, T, nHeads uint32, L KVLayout, layer uint32, scale float32, out device.Ptr, odt string, st device.Stream) error {
	const k = NameAttnAt
	if err := s.stateOK(k); err != nil {
		return err
	}
	if err := L.Validate(); err != nil {
		return fmt.Errorf("kernels: %s: %w", k, err)
	}
	oc, err := dtCode(odt)
	if err != nil {
		return fmt.Errorf("kernels: %s: output: %w", k, err)
	}
	if T == 0 {
		return nil
	}
	if nHeads == 0 || nHeads%L.KVHeads != 0 || T > maxGridY || maxCtx < T || layer >= L.Layers {
		return fmt.Errorf("kernels: %s: %d query heads for %d kv heads, T %d, longest context %d, layer %d of %d: %w",
			k, nHeads, L.KVHeads, T, maxCtx, layer, L.Layers, ErrShape)
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return fmt.Errorf("kernels: %s: scale %g: %w", k, scale, ErrShape)
	}
	if s.useFlash(T, nHeads, L, q, cache) {
		return fmt.Errorf("kernels: %s: %d tokens run the flash kernel, which has no step-state form: %w", k, T, device.ErrUnsupported)
	}
	elt, _ := ElemSize(L.DType)
	oe, _ := ElemSize(odt)
	if err := errors.Join(checkPtr(k, "q", q, 4), checkPtr(k, "cache", cache, uint64(elt)),
		checkPtr(k, "table", table, 4), checkPtr(k, "pos", pos, 4), checkPtr(k, "out", out, uint64(oe))); err != nil {
		return err
	}
	c, _ := dtCode(L.DType)
	p := PlanAttentionAt(maxCtx, T, nHeads, L.KVHeads, L.HeadDim, s.sms)
	var part device.Ptr
	if p.ScratchBytes > 0 {
		if part, err = s.scratchFor(st, p.ScratchBytes); err != nil {
			return fmt.Errorf("kernels: %s: %w", k, err)
		}
	}
	f := s.state.attnFunc(L.HeadDim)
	if !s.decodeOff && useDecode(T, nHeads, L, cache) {
		f = s.state.decode
	}
	if err := s.launchK(f, p.Grid, blockDim(), 0, st, q, cache, table, pos, T, nHeads,
		L.KVHeads, L.HeadDim, L.BlockTokens, layer, c, L.BlockBytes, scale, p.Cap, part, out, oc); err != nil {
		return fmt.Errorf("kernels: %s: %w", k, err)
	}
	if p.Grid.Z == 1 {
		return nil
	}
	rows := T * nHeads
	return s.launch(NameAttnCombineAt, s.state.combine, s.rowGrid(rows), st, part, out, oc, rows, L.HeadDim, pos, T, p.Cap)
}

func (f *stateFuncs) attnFunc(headDim uint32) device.Function {
	for i, e := range attnLanes {
		if headDim <= 32*e {
			return f.attn[i]
		}
	}
	return 0
}

// Go twins: each reads pos[0], applies the split rule and runs the plain
// kernel's twin with start (and chunk, and the splits as grid.z) in place.

func stateGoKernels() []goKernel {
	ks := []goKernel{{name: NameKVWriteAt, run: runKVWriteAt, cost: costKVWriteAt}}
	for _, e := range attnLanes {
		ks = append(ks, goKernel{name: fmt.Sprintf("%s_e%d", NameAttnAt, e), run: runAttnAt(runAttn(e)), cost: costAttnAt})
	}
	return append(ks, goKernel{name: NameAttnDecodeAt, run: runAttnAt(runAttnDecode), cost: costAttnAt},
		goKernel{name: NameAttnCombineAt, run: runCombineAt, cost: costCombineAt})
}

// readPos returns the int32 at p, the step's first position.
func readPos(k string, mem memory, p device.Ptr) (uint32, error) {
	pos, err := rowPositions(k, mem, p, 1)
	if err != nil {
		return 0, err
	}
	return pos[0], nil
}

// withArg returns args with args[i] replaced by v (args itself untouched).
func withArg(args []any, i int, v any) []any {
	out := append([]any(nil), args...)
	out[i] = v
	return out
}

func runKVWriteAt(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameKVWriteAt
	if len(args) != 12 {
		return fmt.Errorf("kernels: %s: %d arguments, want 12: %w", k, len(args), device.ErrInvalid)
	}
	pos, err := argPtr(k, args, 4)
	if err != nil {
		return err
	}
	start, err := readPos(k, mem, pos)
	if err != nil {
		return err
	}
	return runKVWrite(mem, grid, block, withArg(args, 4, start))
}

func costKVWriteAt(grid, block device.Dim3, args []any) (goCost, bool) {
	if len(args) != 12 {
		return goCost{}, false
	}
	return costKVWrite(grid, block, withArg(args, 4, uint32(0)))
}

// atArgs turns a step-state attention launch into the plain kernel's:
// start from pos, chunk and grid.z from the split rule (the blocks past
// the context's splits do nothing on the GPU). A context that needs more
// splits than the grid has is refused, as the GPU would leave it short.
func atArgs(k string, mem memory, grid device.Dim3, args []any) (device.Dim3, []any, error) {
	if len(args) != len(attnKinds) {
		return grid, nil, fmt.Errorf("kernels: %s: %d arguments, want %d: %w", k, len(args), len(attnKinds), device.ErrInvalid)
	}
	pos, err := argPtr(k, args, 3)
	if err != nil {
		return grid, nil, err
	}
	T, okT := args[4].(uint32)
	capSplits, okC := args[13].(uint32)
	if !okT || !okC {
		return grid, nil, fmt.Errorf("kernels: %s: T and cap must be uint32: %w", k, device.ErrInvalid)
	}
	start, err := readPos(k, mem, pos)
	if err != nil {
		return grid, nil, err
	}
	splits, chunk := attnSplits(uint64(start)+uint64(T), uint64(capSplits))
	if splits > uint64(grid.Z) {
		return grid, nil, fmt.Errorf("kernels: %s: context %d takes %d splits, the grid has %d: %w", k, uint64(start)+uint64(T), splits, grid.Z, device.ErrInvalid)
	}
	grid.Z = uint32(splits)
	a := withArg(args, 3, start)
	a[13] = uint32(chunk)
	return grid, a, nil
}

func runAttnAt(plain func(mem memory, grid, block device.Dim3, args []any) error) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		g, a, err := atArgs(NameAttnAt, mem, grid, args)
		if err != nil {
			return err
		}
		return plain(mem, g, block, a)
	}
}

// costAttnAt prices the launch as if every split of the grid were full
// (the context is on the device, not in the arguments).
func costAttnAt(grid, block device.Dim3, args []any) (goCost, bool) {
	if len(args) != len(attnKinds) {
		return goCost{}, false
	}
	T, ok := args[4].(uint32)
	if !ok {
		return goCost{}, false
	}
	ctx := uint64(max(grid.Z, 1)) * minChunk
	a := withArg(args, 3, uint32(max(ctx, uint64(T))-uint64(T)))
	a[13] = uint32(minChunk)
	return costAttn(grid, block, a)
}

func runCombineAt(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameAttnCombineAt
	if len(args) != 8 {
		return fmt.Errorf("kernels: %s: %d arguments, want 8: %w", k, len(args), device.ErrInvalid)
	}
	pos, err := argPtr(k, args, 5)
	if err != nil {
		return err
	}
	T, okT := args[6].(uint32)
	capSplits, okC := args[7].(uint32)
	if !okT || !okC {
		return fmt.Errorf("kernels: %s: T and cap must be uint32: %w", k, device.ErrInvalid)
	}
	start, err := readPos(k, mem, pos)
	if err != nil {
		return err
	}
	splits, _ := attnSplits(uint64(start)+uint64(T), uint64(capSplits))
	if splits <= 1 {
		return nil
	}
	return runCombine(mem, grid, block, append(append([]any(nil), args[:5]...), uint32(splits)))
}

func costCombineAt(grid, block device.Dim3, args []any) (goCost, bool) {
	if len(args) != 8 {
		return goCost{}, false
	}
	capSplits, ok := args[7].(uint32)
	if !ok {
		return goCost{}, false
	}
	return costCombine(grid, block, append(append([]any(nil), args[:5]...), capSplits))
}

// AttentionScratch returns the partials buffer the Set holds for st (0
// before any split launch on it). A captured graph bakes the address in:
// when it changes (a longer split grew the buffer), the graph must be
// captured again.
func (s *Set) AttentionScratch(st device.Stream) device.Ptr {
	s.scratchMu.Lock()
	defer s.scratchMu.Unlock()
	return s.scratch[st].p
}
