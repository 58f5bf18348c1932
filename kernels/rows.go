package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/memwall/memwall/device"
)

// Row kernels: KVWrite and decode attention for a batched step in which
// every row is one token of its own sequence (each decoding sequence of a
// continuous batch), in one launch each instead of one per sequence. Row t
// sits at position pos[t] (int32 on the device: the step's positions
// buffer) and reads its sequence's block table at tables + t·perSeq
// entries. Each row runs the code KVWrite and Attention run for that
// sequence alone at T = 1, its context split by the same rule under the
// cap of a T-row launch (PlanAttentionRows): while the rows do not fill
// the GPU that is the one-token split and the bits are the same; when they
// do, a long context takes fewer splits than alone (no partials, no
// combine), and its sums round in another order.

// Names of the row kernels (kernels.cu, "Rows of many sequences").
const (
	NameKVWriteRows     = "memwall_kvwrite_rows"
	NameAttnDecodeRows  = "memwall_attn_decode_rows"
	NameAttnCombineRows = "memwall_attn_combine_rows"
)

// RowsNames lists the row kernels. They are optional at load: a module
// without them (the PTX built before they existed) loads, and Rows reports
// false.
func RowsNames() []string {
	return []string{NameKVWriteRows, NameAttnDecodeRows, NameAttnCombineRows}
}

type rowsFuncs struct {
	ok, off                  bool
	kvwrite, decode, combine device.Function
}

// resolveRows looks the row kernels up (resolveAll).
func (s *Set) resolveRows(ptx []byte, all bool, get func(string) (device.Function, error)) {
	fs := resolveAll(RowsNames(), ptx, all, get)
	if fs == nil {
		return
	}
	s.rows = rowsFuncs{ok: true, kvwrite: fs[0], decode: fs[1], combine: fs[2]}
}

// SetRows turns Rows off (false) or back on where the module has the row
// kernels: a caller that asks Rows first then attends each sequence with
// its own launches, for comparison.
func (s *Set) SetRows(on bool) { s.rows.off = !on }

// Rows reports whether KVWriteRows and AttentionRows can run for a cache
// of layout L at cache with nHeads query heads: the module has the row
// kernels, and the decode attention kernel takes the shapes (head dim 64
// or 128, a bf16 or f16 cache, at most 8 query heads per kv head, 16-byte
// aligned rows), and SetRows did not turn them off.
func (s *Set) Rows(nHeads uint32, L KVLayout, cache device.Ptr) bool {
	return s.rows.ok && !s.rows.off && !s.decodeOff && L.KVHeads > 0 && nHeads%L.KVHeads == 0 && useDecode(1, nHeads, L, cache)
}

func (s *Set) rowsOK(kernel string) error {
	if !s.rows.ok {
		return fmt.Errorf("kernels: %s: not in %s (rebuild with scripts/build-ptx.sh): %w", kernel, s.source, device.ErrUnsupported)
	}
	return nil
}

// KVWriteRows queues the K and V rows of T tokens (k and v:
// T×KVHeads×HeadDim float32), row t at position pos[t] of the sequence
// whose block table is tables + t·perSeq int32 entries, into layer of the
// paged cache, converted to L.DType as KVWrite converts.
func (s *Set) KVWriteRows(k, v, cache, tables, pos device.Ptr, perSeq, T uint32, L KVLayout, layer uint32, st device.Stream) error {
	const kn = NameKVWriteRows
	if err := s.rowsOK(kn); err != nil {
		return err
	}
	if err := L.Validate(); err != nil {
		return fmt.Errorf("kernels: %s: %w", kn, err)
	}
	if T == 0 {
		return nil
	}
	if layer >= L.Layers || perSeq == 0 {
		return fmt.Errorf("kernels: %s: layer %d of %d, %d table entries a sequence: %w", kn, layer, L.Layers, perSeq, ErrShape)
	}
	elt, _ := ElemSize(L.DType)
	if err := errors.Join(checkPtr(kn, "k", k, 4), checkPtr(kn, "v", v, 4), checkPtr(kn, "cache", cache, uint64(elt)),
		checkPtr(kn, "tables", tables, 4), checkPtr(kn, "pos", pos, 4)); err != nil {
		return err
	}
	c, _ := dtCode(L.DType)
	n := uint64(T) * uint64(L.KVHeads) * uint64(L.HeadDim)
	return s.launch(kn, s.rows.kvwrite, s.gridFor(n), st,
		k, v, cache, tables, pos, T, L.BlockTokens, L.KVHeads, L.HeadDim, layer, c, L.BlockBytes, perSeq)
}

// PlanAttentionRows returns AttentionRows' grid for T rows whose contexts
// (position + 1) are at most maxCtx, the split cap each row's context is
// split under (attnSplitCap of T tokens: 1 when the rows' blocks already
// fill the GPU, else the splits that would) and the partials' bytes (0
// when no row splits).
func PlanAttentionRows(maxCtx, T, nHeads, kvHeads, headDim, sms uint32) AttnAtPlan {
	limit := attnSplitCap(T, nHeads, kvHeads, headDim, sms)
	most, _ := attnSplits(uint64(maxCtx), limit)
	groups := ceilDiv(nHeads/kvHeads, attnHeads)
	p := AttnAtPlan{Grid: device.Dim3{X: kvHeads * groups, Y: T, Z: uint32(most)}, Cap: uint32(limit)}
	if most > 1 {
		p.ScratchBytes = attnPartBytes(T, nHeads, headDim, most)
	}
	return p
}

// AttentionRows queues decode attention for T rows, row t the query q's
// row t (nHeads×HeadDim float32) of a sequence at position pos[t], whose
// K/V (already written, KVWriteRows) are read through tables + t·perSeq;
// out's row t (odt) gets what Attention gives for that sequence alone at
// T = 1 (the same bits unless the rows fill the GPU and the row's context
// splits into fewer parts: see PlanAttentionRows). maxCtx bounds every row's pos[t] + 1 (it sizes the grid and the
// partials). Rows must be true; it fails with device.ErrUnsupported
// otherwise.
func (s *Set) AttentionRows(q, cache, tables, pos device.Ptr, perSeq, maxCtx, T, nHeads uint32, L KVLayout, layer uint32, scale float32, out device.Ptr, odt string, st device.Stream) error {
	const kn = NameAttnDecodeRows
	if err := s.rowsOK(kn); err != nil {
		return err
	}
	if err := L.Validate(); err != nil {
		return fmt.Errorf("kernels: %s: %w", kn, err)
	}
	oc, err := dtCode(odt)
	if err != nil {
		return fmt.Errorf("kernels: %s: output: %w", kn, err)
	}
	if T == 0 {
		return nil
	}
	if !s.Rows(nHeads, L, cache) {
		return fmt.Errorf("kernels: %s: %d query heads, layout %+v: the decode kernel does not take it: %w", kn, nHeads, L, device.ErrUnsupported)
	}
	if T > maxGridY || maxCtx == 0 || uint64(maxCtx) > math.MaxInt32 || layer >= L.Layers || perSeq == 0 {
		return fmt.Errorf("kernels: %s: %d rows, longest context %d, layer %d of %d, %d table entries a sequence: %w",
			kn, T, maxCtx, layer, L.Layers, perSeq, ErrShape)
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return fmt.Errorf("kernels: %s: scale %g: %w", kn, scale, ErrShape)
	}
	elt, _ := ElemSize(L.DType)
	oe, _ := ElemSize(odt)
	if err := errors.Join(checkPtr(kn, "q", q, 4), checkPtr(kn, "cache", cache, uint64(elt)),
		checkPtr(kn, "tables", tables, 4), checkPtr(kn, "pos", pos, 4), checkPtr(kn, "out", out, uint64(oe))); err != nil {
		return err
	}
	c, _ := dtCode(L.DType)
	p := PlanAttentionRows(maxCtx, T, nHeads, L.KVHeads, L.HeadDim, s.sms)
	var part device.Ptr
	if p.ScratchBytes > 0 {
		if part, err = s.scratchFor(st, p.ScratchBytes); err != nil {
			return fmt.Errorf("kernels: %s: %w", kn, err)
		}
	}
	if err := s.launchK(s.rows.decode, p.Grid, blockDim(), 0, st, q, cache, tables, pos, T, nHeads,
		L.KVHeads, L.HeadDim, L.BlockTokens, layer, c, L.BlockBytes, scale, p.Cap, part, out, oc, perSeq); err != nil {
		return fmt.Errorf("kernels: %s: %w", kn, err)
	}
	if p.Grid.Z == 1 {
		return nil
	}
	rows := T * nHeads
	return s.launch(NameAttnCombineRows, s.rows.combine, s.rowGrid(rows), st, part, out, oc, rows, L.HeadDim, pos, T, p.Cap, p.Grid.Z)
}

// Go twins: each row runs the plain kernel's twin at its own position,
// table and split.

// rowsGoKernels are the simulator's row kernels, decode the twin of
// memwall_attn_decode each row runs (the simulator's, or the CPU's).
func rowsGoKernels(decode func(mem memory, grid, block device.Dim3, args []any) error) []goKernel {
	return []goKernel{
		{name: NameKVWriteRows, run: runKVWriteRows, cost: costKVWriteRows},
		{name: NameAttnDecodeRows, run: runAttnRows(decode), cost: costAttnRows},
		{name: NameAttnCombineRows, run: runCombineRows, cost: costCombineRows},
	}
}

const kvWriteRowsKinds = "pppppuuuuuuUu"

// rowPositions reads the T positions at pos.
func rowPositions(k string, mem memory, pos device.Ptr, T uint32) ([]uint32, error) {
	b, err := buf(k, "pos", mem, pos, uint64(T), 4)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, T)
	for t := range out {
		v := int32(binary.LittleEndian.Uint32(b[4*t:]))
		if v < 0 {
			return nil, fmt.Errorf("kernels: %s: row %d at position %d: %w", k, t, v, device.ErrInvalid)
		}
		out[t] = uint32(v)
	}
	return out, nil
}

func runKVWriteRows(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameKVWriteRows
	a, err := parseArgs(k, kvWriteRowsKinds, args)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	T, kvHeads, headDim, perSeq := a.u[0], a.u[2], a.u[3], a.u[6]
	if T == 0 {
		return nil
	}
	if perSeq == 0 {
		return fmt.Errorf("kernels: %s: 0 table entries a sequence: %w", k, device.ErrInvalid)
	}
	pos, err := rowPositions(k, mem, a.p[4], T)
	if err != nil {
		return err
	}
	row := uint64(kvHeads) * uint64(headDim) * 4
	for t, p := range pos {
		off := uint64(t) * row
		plain := []any{a.p[0].Add(off), a.p[1].Add(off), a.p[2], a.p[3].Add(4 * uint64(t) * uint64(perSeq)), p, uint32(1),
			a.u[1], kvHeads, headDim, a.u[4], a.u[5], a.U[0]}
		if err := runKVWrite(mem, grid, block, plain); err != nil {
			return fmt.Errorf("%w (row %d)", err, t)
		}
	}
	return nil
}

func costKVWriteRows(grid, block device.Dim3, args []any) (goCost, bool) {
	if len(args) != len(kvWriteRowsKinds) {
		return goCost{}, false
	}
	return costKVWrite(grid, block, withArg(args[:12], 4, uint32(0)))
}

const attnRowsKinds = "ppppuuuuuuuUfuppuu"

// attnRows are memwall_attn_decode_rows' arguments.
type attnRows struct {
	q, cache, tables, pos, part, out device.Ptr
	T, nHeads, headDim, cap, odt     uint32
	perSeq                           uint32
	rest                             []any // kvHeads..blockBytes, scale: as the plain kernel takes them
}

func parseAttnRows(k string, args []any) (attnRows, error) {
	a, err := parseArgs(k, attnRowsKinds, args)
	if err != nil {
		return attnRows{}, err
	}
	return attnRows{q: a.p[0], cache: a.p[1], tables: a.p[2], pos: a.p[3], part: a.p[4], out: a.p[5],
		T: a.u[0], nHeads: a.u[1], headDim: a.u[3], cap: a.u[7], odt: a.u[8], perSeq: a.u[9], rest: args[6:13]}, nil
}

func runAttnRows(decode func(mem memory, grid, block device.Dim3, args []any) error) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		const k = NameAttnDecodeRows
		a, err := parseAttnRows(k, args)
		if err != nil {
			return err
		}
		if a.T == 0 {
			return nil
		}
		if grid.Y != a.T || a.perSeq == 0 {
			return fmt.Errorf("kernels: %s: grid %v for %d rows, %d table entries a sequence: %w", k, grid, a.T, a.perSeq, device.ErrInvalid)
		}
		_, oe, err := dtArg(k, a.odt)
		if err != nil {
			return err
		}
		pos, err := rowPositions(k, mem, a.pos, a.T)
		if err != nil {
			return err
		}
		hd := uint64(a.headDim)
		for t, p := range pos {
			splits, chunk := attnSplits(uint64(p)+1, uint64(a.cap))
			if splits > uint64(grid.Z) {
				return fmt.Errorf("kernels: %s: row %d's context %d takes %d splits, the grid has %d: %w", k, t, p+1, splits, grid.Z, device.ErrInvalid)
			}
			var part device.Ptr
			if splits > 1 {
				part = a.part.Add(4 * uint64(t) * uint64(a.nHeads) * uint64(grid.Z) * (hd + 2))
			}
			row := uint64(t) * uint64(a.nHeads) * hd
			plain := append([]any{a.q.Add(4 * row), a.cache, a.tables.Add(4 * uint64(t) * uint64(a.perSeq)), p, uint32(1), a.nHeads}, a.rest...)
			plain = append(plain, uint32(chunk), part, a.out.Add(row*uint64(oe)), a.odt)
			if err := decode(mem, device.Dim3{X: grid.X, Y: 1, Z: uint32(splits)}, block, plain); err != nil {
				return fmt.Errorf("%w (row %d)", err, t)
			}
		}
		return nil
	}
}

func costAttnRows(grid, block device.Dim3, args []any) (goCost, bool) {
	if len(args) != len(attnRowsKinds) {
		return goCost{}, false
	}
	// Priced as T one-token rows at the grid's fullest context.
	T, ok := args[4].(uint32)
	if !ok || T == 0 {
		return goCost{}, false
	}
	ctx := uint64(max(grid.Z, 1)) * minChunk
	plain := withArg(args[:17], 3, uint32(ctx-1))
	plain[4], plain[13] = uint32(1), uint32(minChunk)
	c, ok := costAttn(device.Dim3{X: grid.X, Y: 1, Z: grid.Z}, block, plain)
	c.flops *= float64(T)
	c.bytes *= float64(T)
	return c, ok
}

const combineRowsKinds = "ppuuupuuu"

func runCombineRows(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameAttnCombineRows
	a, err := parseArgs(k, combineRowsKinds, args)
	if err != nil {
		return err
	}
	rows, hd, T, capSplits, zmax := a.u[1], uint64(a.u[2]), a.u[3], a.u[4], a.u[5]
	if T == 0 || rows == 0 {
		return nil
	}
	if rows%T != 0 {
		return fmt.Errorf("kernels: %s: %d rows for %d tokens: %w", k, rows, T, device.ErrInvalid)
	}
	_, oe, err := dtArg(k, a.u[0])
	if err != nil {
		return err
	}
	pos, err := rowPositions(k, mem, a.p[2], T)
	if err != nil {
		return err
	}
	nh := uint64(rows / T)
	for t, p := range pos {
		splits, _ := attnSplits(uint64(p)+1, uint64(capSplits))
		if splits <= 1 {
			continue
		}
		if splits > uint64(zmax) {
			return fmt.Errorf("kernels: %s: row %d's context takes %d splits of %d: %w", k, t, splits, zmax, device.ErrInvalid)
		}
		part := a.p[0].Add(4 * uint64(t) * nh * uint64(zmax) * (hd + 2))
		out := a.p[1].Add(uint64(t) * nh * hd * uint64(oe))
		if err := runCombine(mem, grid, block, []any{part, out, a.u[0], uint32(nh), uint32(hd), uint32(splits)}); err != nil {
			return fmt.Errorf("%w (row %d)", err, t)
		}
	}
	return nil
}

func costCombineRows(grid, block device.Dim3, args []any) (goCost, bool) {
	if len(args) != len(combineRowsKinds) {
		return goCost{}, false
	}
	return costCombine(grid, block, []any{args[0], args[1], args[2], args[3], args[4], args[8]})
}
