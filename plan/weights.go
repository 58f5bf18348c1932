package plan

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memwall/memwall/format"
)

// Weight placement: which groups of a model's tensors stay resident in
// device memory and which are streamed through a ring of staging slots,
// under a VRAM budget.
//
// A group is the unit of residency and of streaming: a transformer block
// (Hugging Face "model.layers.N.", GGUF "blk.N."), or any other tensor on
// its own (embeddings, final norm, output head). A group is moved with as
// few copies as possible: its tensors are merged into extents, runs of file
// bytes that are contiguous up to small gaps, and each extent lands at a
// 256-byte aligned offset of the group's device region.

// extentGap is the largest hole between two tensors of a group that is
// copied rather than split into two copies (GGUF alignment padding, small
// tensors of other groups never lie inside a group's range because extents
// are built from the group's own tensors only).
const extentGap = 4096

// regionAlign aligns extents within a group's device region (and thus the
// start of every tensor that starts an extent).
const regionAlign = 256

// Extent is one host-to-device copy of a group: Bytes bytes of File at
// Offset, landing at DevOffset within the group's device region.
type Extent struct {
	File      string `json:"file"`
	Offset    uint64 `json:"offset"`
	Bytes     uint64 `json:"bytes"`
	DevOffset uint64 `json:"dev_offset"`
}

// Matmul is one weight matrix of a group that the streamer multiplies by
// the activation: an M×K row-major matrix of DType ("bf16", "f16" or "f32",
// the kernels' names) at DevOffset within the group's device region.
type Matmul struct {
	Tensor    string `json:"tensor"`
	DType     string `json:"dtype"`
	M         uint64 `json:"m"`
	K         uint64 `json:"k"`
	DevOffset uint64 `json:"dev_offset"`
}

// WeightGroup is a set of tensors placed and moved together.
type WeightGroup struct {
	Name string `json:"name"` // "model.layers.3", "blk.3", or the tensor name
	// Layer is the block number, or -1 for a group that is not a block.
	Layer   int             `json:"layer"`
	Tensors []format.Tensor `json:"-"`
	Extents []Extent        `json:"-"`
	Matmuls []Matmul        `json:"-"`
	Bytes   uint64          `json:"bytes"`        // sum of tensor bytes
	Copy    uint64          `json:"copy_bytes"`   // bytes moved by its extents (tensor bytes plus small gaps)
	Region  uint64          `json:"region_bytes"` // device bytes its extents occupy
	// Mapped says the caller reads the group in place from host memory
	// the device maps (zero-copy over the link: an embedding table whose
	// few rows a step gathers): it takes none of the budget, is never
	// copied, and plans as resident (PlanWeights keeps it so).
	Mapped bool `json:"mapped,omitempty"`
}

// MatmulDType maps a format dtype ("BF16", "F16", "F32") to the kernels'
// name ("bf16", "f16", "f32"), or "" when the kernels cannot multiply it.
func MatmulDType(formatDType string) string {
	switch formatDType {
	case "BF16":
		return "bf16"
	case "F16":
		return "f16"
	case "F32":
		return "f32"
	}
	return ""
}

func dtypeSize(kernelDType string) uint64 {
	if kernelDType == "f32" {
		return 4
	}
	return 2
}

// layerOf returns the block number of a tensor name ("model.layers.12.mlp..."
// → 12, "blk.3.attn_q.weight" → 3) and its group name, or -1 and the
// tensor name itself when the tensor belongs to no block.
func layerOf(name string) (int, string) {
	for _, p := range []string{"model.layers.", "blk.", "layers.", "transformer.h.", "model.decoder.layers."} {
		rest, ok := strings.CutPrefix(name, p)
		if !ok {
			continue
		}
		num, tail, ok := strings.Cut(rest, ".")
		if !ok || num == "" || tail == "" || len(num) > 6 {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 || strconv.Itoa(n) != num {
			continue
		}
		return n, p + num
	}
	return -1, name
}

// isEmbedding reports whether a non-block tensor is an input embedding,
// which runs before the blocks.
func isEmbedding(name string) bool {
	return strings.Contains(name, "embed") || strings.HasPrefix(name, "token_embd") || strings.Contains(name, "wte")
}

// GroupWeights groups tensors into blocks and stand-alone groups, in the
// order a forward pass uses them: embeddings first, then blocks by number,
// then the other stand-alone tensors in storage order. It fails with an
// error naming the tensor when a tensor's range is empty, overflows, or
// overlaps another tensor of its group.
func GroupWeights(tensors []format.Tensor) ([]WeightGroup, error) {
	byName := map[string]*WeightGroup{}
	var order []*WeightGroup
	for _, t := range tensors {
		if t.Offset > math.MaxUint64-t.Bytes {
			return nil, fmt.Errorf("plan weights: tensor %q: offset %d + %d bytes overflows", t.Name, t.Offset, t.Bytes)
		}
		layer, gname := layerOf(t.Name)
		g := byName[gname]
		if g == nil {
			g = &WeightGroup{Name: gname, Layer: layer}
			byName[gname] = g
			order = append(order, g)
		}
		g.Tensors = append(g.Tensors, t)
	}
	out := make([]WeightGroup, 0, len(order))
	pos := func(g *WeightGroup) int {
		switch {
		case g.Layer < 0 && isEmbedding(g.Name):
			return 0
		case g.Layer >= 0:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(order, func(a, b *WeightGroup) int {
		if c := cmp.Compare(pos(a), pos(b)); c != 0 {
			return c
		}
		if a.Layer >= 0 && b.Layer >= 0 {
			return cmp.Compare(a.Layer, b.Layer)
		}
		return 0
	})
	for _, g := range order {
		if err := g.layout(); err != nil {
			return nil, err
		}
		out = append(out, *g)
	}
	return out, nil
}

// layout builds the group's extents and matmuls from its tensors.
func (g *WeightGroup) layout() error {
	ts := slices.Clone(g.Tensors)
	slices.SortFunc(ts, func(a, b format.Tensor) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
	g.Tensors = ts
	var cur *Extent
	devOf := make([]uint64, len(ts))
	for i, t := range ts {
		g.Bytes += t.Bytes
		if cur != nil && cur.File == t.File && t.Offset < cur.Offset+cur.Bytes {
			return fmt.Errorf("plan weights: group %s: tensor %q at [%d, %d) overlaps the tensor before it in %s",
				g.Name, t.Name, t.Offset, t.Offset+t.Bytes, t.File)
		}
		if cur == nil || cur.File != t.File || t.Offset-(cur.Offset+cur.Bytes) > extentGap {
			g.Extents = append(g.Extents, Extent{File: t.File, Offset: t.Offset, DevOffset: g.Region})
			cur = &g.Extents[len(g.Extents)-1]
		}
		cur.Bytes = t.Offset + t.Bytes - cur.Offset
		devOf[i] = cur.DevOffset + (t.Offset - cur.Offset)
		g.Region = wAlign(cur.DevOffset+cur.Bytes, regionAlign)
	}
	for _, e := range g.Extents {
		g.Copy += e.Bytes
	}
	for i, t := range ts {
		dt := MatmulDType(t.DType)
		if dt == "" || len(t.Shape) != 2 || t.Shape[0] == 0 || t.Shape[1] == 0 {
			continue
		}
		if t.Shape[0] > math.MaxUint32 || t.Shape[1] > math.MaxUint32 || t.Shape[0]*t.Shape[1]*dtypeSize(dt) != t.Bytes {
			continue // not a matrix the kernels can take; it is still moved
		}
		if devOf[i]%dtypeSize(dt) != 0 {
			continue
		}
		g.Matmuls = append(g.Matmuls, Matmul{Tensor: t.Name, DType: dt, M: t.Shape[0], K: t.Shape[1], DevOffset: devOf[i]})
	}
	return nil
}

// MatmulCost returns the device time of one product Y[T×M] = X[T×K]·Wᵀ in
// dtype. Roofline models it; a measured table (see package stream) can
// replace it.
type MatmulCost func(dtype string, M, K, T uint64) time.Duration

// Roofline returns the cost model launch + max(2·M·K·T / flops, bytes /
// bytesPerSec), with bytes the matrix, the activation and the float32
// result (M·K·elt + T·K·elt + 4·T·M): the model package device/sim uses
// for the matrix kernels. Non-positive rates count as infinitely fast.
func Roofline(flops, bytesPerSec float64, launch time.Duration) MatmulCost {
	return func(dtype string, M, K, T uint64) time.Duration {
		elt := float64(dtypeSize(dtype))
		fl := 2 * float64(M) * float64(K) * float64(T)
		by := float64(M)*float64(K)*elt + float64(T)*float64(K)*elt + 4*float64(T)*float64(M)
		var s float64
		if flops > 0 {
			s = fl / flops
		}
		if bytesPerSec > 0 {
			s = max(s, by/bytesPerSec)
		}
		return launch + time.Duration(math.Round(s*1e9))
	}
}

// KVShape sizes the KV cache estimate: Layers × 2 (K and V) × Dim
// (kv_heads × head_dim) × context × batch × ElemBytes.
type KVShape struct {
	Layers    int    `json:"layers"`
	Dim       uint64 `json:"dim"`
	ElemBytes uint64 `json:"elem_bytes"`
}

// KVShapeOf derives the KV shape from the tensors: the number of blocks,
// the row count of block 0's key projection ("k_proj.weight",
// "attn_k.weight") and its element size (2 for a quantized key
// projection). It returns false when there are no blocks or no key
// projection.
func KVShapeOf(groups []WeightGroup) (KVShape, bool) {
	var kv KVShape
	found := false
	for _, g := range groups {
		if g.Layer < 0 {
			continue
		}
		kv.Layers++
		if found {
			continue
		}
		for _, t := range g.Tensors {
			if (strings.HasSuffix(t.Name, "k_proj.weight") || strings.HasSuffix(t.Name, "attn_k.weight")) && len(t.Shape) == 2 {
				kv.Dim = t.Shape[0]
				kv.ElemBytes = 2
				if t.DType == "F32" {
					kv.ElemBytes = 4
				}
				found = true
				break
			}
		}
	}
	return kv, found && kv.Layers > 0
}

// WeightOptions configure PlanWeights. Budget and LinkGBps are required.
type WeightOptions struct {
	// Budget is the device memory the plan may use, in bytes.
	Budget uint64
	// Slots is the number of staging slots in the ring (default 2; at
	// least 2 when anything streams).
	Slots int
	// Tokens is the number of activation rows one step multiplies (decode:
	// the batch size; prefill: the prompt tokens), default 1.
	Tokens int
	// Ctx and Batch size the KV cache estimate (Ctx 0: no KV cache).
	Ctx, Batch int
	// KV overrides the KV shape derived from the tensors (KVShapeOf) when
	// its Dim is non-zero.
	KV KVShape
	// LinkGBps is the host-to-device bandwidth streamed weights move at
	// (1e9 bytes/s), as measured on the device.
	LinkGBps float64
	// CopyLatency is added to every extent copy (the device's fixed cost
	// per copy; 0 on real hardware, where it hides in the bandwidth).
	CopyLatency time.Duration
	// Cost is the matrix-product cost model; nil means Roofline at the
	// H200's measured rates (167 TFLOP/s, 3.3 TB/s, 5 µs per launch).
	Cost MatmulCost
	// Granule is the device allocation granularity every allocation is
	// rounded to in the accounting (default 512 bytes; 2 MiB on CUDA).
	Granule uint64
	// PageBytes is the size of the pages a pool maps device memory in
	// (the device's virtual-memory granularity; 0: none): the pool's
	// allocations pack into whole pages, so the peak is their sum rounded
	// up to a page, and only the whole pages of Budget count.
	PageBytes uint64
	// Spread keeps resident blocks spread evenly over the depth (in the
	// bit-reversed order of their numbers: 0, L/2, L/4, 3L/4, ...) instead
	// of the first blocks, so that streamed blocks alternate with resident
	// ones and their copies overlap the resident blocks' compute (a
	// prefill's products take long enough for that to matter).
	Spread bool
}

// Purposes of a plan's allocations.
const (
	PurposeWeights    = "weights"
	PurposeStaging    = "staging"
	PurposeActivation = "activations"
	PurposeKV         = "kv"
)

// Allocation is one device allocation the plan calls for.
type Allocation struct {
	Purpose string `json:"purpose"`
	Name    string `json:"name"`
	Bytes   uint64 `json:"bytes"` // requested
	Charged uint64 `json:"charged_bytes"`
}

// GroupPlan is one group's place in the plan.
type GroupPlan struct {
	WeightGroup
	Resident bool `json:"resident"`
	// Slot is the ring slot a streamed group lands in (its position among
	// streamed groups modulo the slot count), -1 when resident.
	Slot int `json:"slot"`
	// Predicted per-step device times.
	CopyTime    time.Duration `json:"copy_ns"`
	ComputeTime time.Duration `json:"compute_ns"`
}

// WeightPlan is the result of PlanWeights. Byte totals count what the
// streamer allocates, each allocation rounded up to the granule; PeakBytes
// and MinimumBytes are also whole pages when PageBytes is set.
type WeightPlan struct {
	Groups []GroupPlan `json:"groups"`
	Tokens int         `json:"tokens"`
	Slots  int         `json:"slots"` // 0 when everything is resident
	// SlotBytes is the size of one staging slot: the largest group region.
	SlotBytes uint64 `json:"slot_bytes"`
	// XBytes per matmul dtype: the activation buffer (Tokens × largest K).
	XBytes map[string]uint64 `json:"x_bytes"`
	// YBytes is the float32 result buffer (Tokens × largest M × 4).
	YBytes uint64  `json:"y_bytes"`
	KV     KVShape `json:"kv"`

	ModelBytes      uint64 `json:"model_bytes"`            // tensor bytes of the model
	ResidentBytes   uint64 `json:"resident_bytes"`         // charged device bytes of resident groups
	MappedBytes     uint64 `json:"mapped_bytes,omitempty"` // tensor bytes of mapped groups: host memory, read in place
	StreamedBytes   uint64 `json:"streamed_bytes"`         // bytes copied per step
	StagingBytes    uint64 `json:"staging_bytes"`
	ActivationBytes uint64 `json:"activation_bytes"`
	KVBytes         uint64 `json:"kv_bytes"`
	PeakBytes       uint64 `json:"predicted_peak_bytes"`
	// MinimumBytes is the smallest budget that streams this model: two
	// slots of the largest group, the activation arena and the KV cache.
	MinimumBytes uint64 `json:"minimum_bytes"`
	Budget       uint64 `json:"budget_bytes"`

	LinkGBps float64 `json:"link_GBps"`
	// Predicted per-step times: all copies back to back, all products
	// back to back, and the step as the two pipelines overlap through the
	// ring (at least the larger of the other two).
	CopyTime    time.Duration `json:"predicted_copy_ns"`
	ComputeTime time.Duration `json:"predicted_compute_ns"`
	StepTime    time.Duration `json:"predicted_step_ns"`

	Allocations []Allocation `json:"allocations"`
	Granule     uint64       `json:"granule_bytes"`
	// PageBytes is WeightOptions.PageBytes: PeakBytes and MinimumBytes are
	// whole pages of it.
	PageBytes uint64 `json:"page_bytes,omitempty"`
}

// ErrBudget is matched by *BudgetError.
var ErrBudget = errors.New("VRAM budget below the minimum")

// BudgetError is a budget too small to stream the model. It matches
// ErrBudget.
type BudgetError struct {
	Budget, Minimum                     uint64
	SlotBytes, ActivationBytes, KVBytes uint64
	LargestGroup                        string
	// PageBytes is the pool's page size the minimum is rounded up to (0:
	// none).
	PageBytes uint64
}

func (e *BudgetError) Error() string {
	pages := ""
	if e.PageBytes > 0 {
		pages = fmt.Sprintf(", in whole pages of %s", mib(e.PageBytes))
	}
	return fmt.Sprintf("budget %d bytes (%s) is below the minimum %d bytes (%s): two staging slots of %d bytes (largest group %s) + activations %d + KV cache %d%s",
		e.Budget, mib(e.Budget), e.Minimum, mib(e.Minimum), e.SlotBytes, e.LargestGroup, e.ActivationBytes, e.KVBytes, pages)
}

// Is makes errors.Is(err, ErrBudget) true.
func (e *BudgetError) Is(target error) bool { return target == ErrBudget }

func mib(n uint64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
}

// H200Cost is the default matrix cost model: the rates measured on the
// H200 for memwall's own kernels.
func H200Cost() MatmulCost { return Roofline(167e12, 3.3e12, 5*time.Microsecond) }

// pickResident marks groups resident within room, in preference order:
// stand-alone groups, then blocks in order (or spread: see
// WeightOptions.Spread), each taken when it still fits.
func pickResident(p *WeightPlan, groups []WeightGroup, room uint64, charge func(uint64) uint64, spread bool) {
	idx := make([]int, len(groups))
	layers := 0
	for i := range idx {
		idx[i] = i
		p.Groups[i].Resident = groups[i].Mapped
		layers = max(layers, groups[i].Layer+1)
	}
	rank := func(g WeightGroup) int {
		switch {
		case g.Layer < 0:
			return -1
		case spread:
			return spreadRank(g.Layer, layers)
		}
		return 0 // stable sort: blocks in order
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Compare(rank(groups[a]), rank(groups[b]))
	})
	for _, i := range idx {
		if groups[i].Mapped {
			continue
		}
		c := charge(groups[i].Region)
		if c <= room {
			p.Groups[i].Resident = true
			room -= c
		}
	}
}

// spreadRank orders block l of n by the bit reversal of l over the next
// power of two: 0, n/2, n/4, 3n/4, ... (a van der Corput sequence), so that
// any prefix of the order is spread evenly over the blocks.
func spreadRank(l, n int) int {
	w := bits.Len(uint(max(n-1, 1)))
	return int(bits.Reverse(uint(l)) >> (bits.UintSize - w))
}

// streamedRegion is the largest region of a group that streams (0: none).
func streamedRegion(p *WeightPlan) uint64 {
	var s uint64
	for _, g := range p.Groups {
		if !g.Resident {
			s = max(s, g.Region)
		}
	}
	return s
}

// PlanWeights decides which groups stay resident and which stream under
// o.Budget, after reserving the staging ring (o.Slots × the largest group),
// the activation arena (one Tokens × K input per dtype and a float32 Tokens
// × M result, sized for the largest matrix) and the KV cache estimate;
// slots shrink to the largest streamed group when that is smaller and the
// room it frees keeps no larger group from streaming.
// Groups are kept resident in preference order: stand-alone groups
// (embeddings, norms, head) first, then blocks from the first on, each
// taken when it still fits; the rest stream, in forward order. When every
// group fits no ring is reserved. With o.PageBytes the allocations are
// placed in the budget's whole pages and the peak is rounded up to a page,
// as a pool that maps pages reserves them. A budget below the minimum fails with a
// *BudgetError stating it; bad options fail with an error naming the field.
func PlanWeights(groups []WeightGroup, o WeightOptions) (*WeightPlan, error) {
	if len(groups) == 0 {
		return nil, errors.New("plan weights: no tensors")
	}
	if o.Budget == 0 {
		return nil, errors.New("plan weights: budget is 0")
	}
	if !(o.LinkGBps > 0) || math.IsInf(o.LinkGBps, 0) {
		return nil, fmt.Errorf("plan weights: link bandwidth %v GB/s: want a positive number", o.LinkGBps)
	}
	if o.Slots == 0 {
		o.Slots = 2
	}
	if o.Slots < 2 || o.Slots > 64 {
		return nil, fmt.Errorf("plan weights: slots = %d, want 2..64", o.Slots)
	}
	if o.Tokens == 0 {
		o.Tokens = 1
	}
	if o.Tokens < 0 || o.Tokens > 1<<20 {
		return nil, fmt.Errorf("plan weights: tokens = %d, want 1..%d", o.Tokens, 1<<20)
	}
	if o.Ctx < 0 || o.Ctx > 1<<24 || o.Batch < 0 || o.Batch > 1<<16 {
		return nil, fmt.Errorf("plan weights: ctx = %d, batch = %d: want ctx 0..%d, batch 0..%d", o.Ctx, o.Batch, 1<<24, 1<<16)
	}
	if o.Batch == 0 {
		o.Batch = 1
	}
	if o.Granule == 0 {
		o.Granule = 512
	}
	if o.Granule&(o.Granule-1) != 0 {
		return nil, fmt.Errorf("plan weights: granule %d is not a power of two", o.Granule)
	}
	if o.PageBytes&(o.PageBytes-1) != 0 {
		return nil, fmt.Errorf("plan weights: page size %d is not a power of two", o.PageBytes)
	}
	if o.Cost == nil {
		o.Cost = H200Cost()
	}
	charge := func(n uint64) uint64 { return wAlign(n, o.Granule) }
	T := uint64(o.Tokens)
	p := &WeightPlan{Tokens: o.Tokens, XBytes: map[string]uint64{}, LinkGBps: o.LinkGBps, Budget: o.Budget, Granule: o.Granule, PageBytes: o.PageBytes}
	// pages rounds a sum of allocations up to whole pages; room is the
	// budget's whole pages, what those allocations may take.
	pages, room := func(n uint64) uint64 { return n }, o.Budget
	if o.PageBytes > 0 {
		pages = func(n uint64) uint64 { return wAlign(n, o.PageBytes) }
		room = o.Budget / o.PageBytes * o.PageBytes
	}

	// Activation arena: sized for the largest matrix of each dtype.
	var maxM uint64
	maxK := map[string]uint64{}
	largest := -1 // the largest group that may stream
	for i, g := range groups {
		p.ModelBytes += g.Bytes
		for _, mm := range g.Matmuls {
			maxM = max(maxM, mm.M)
			maxK[mm.DType] = max(maxK[mm.DType], mm.K)
		}
		if !g.Mapped && (largest < 0 || g.Region > groups[largest].Region) {
			largest = i
		}
	}
	var allocs []Allocation
	add := func(purpose, name string, n uint64) uint64 {
		if n == 0 {
			return 0
		}
		a := Allocation{Purpose: purpose, Name: name, Bytes: n, Charged: charge(n)}
		allocs = append(allocs, a)
		return a.Charged
	}
	for _, dt := range slices.Sorted(maps.Keys(maxK)) {
		p.XBytes[dt] = T * maxK[dt] * dtypeSize(dt)
		p.ActivationBytes += add(PurposeActivation, "x."+dt, p.XBytes[dt])
	}
	p.YBytes = T * maxM * 4
	p.ActivationBytes += add(PurposeActivation, "y", p.YBytes)

	// KV cache estimate.
	if o.Ctx > 0 {
		kv := o.KV
		if kv.Dim == 0 {
			var ok bool
			kv, ok = KVShapeOf(groups)
			if !ok {
				return nil, errors.New("plan weights: cannot size the KV cache: no key projection (k_proj.weight, attn_k.weight) in block 0; give its shape or use ctx 0")
			}
		}
		if kv.ElemBytes == 0 {
			kv.ElemBytes = 2
		}
		p.KV = kv
		n := float64(kv.Layers) * 2 * float64(kv.Dim) * float64(o.Ctx) * float64(o.Batch) * float64(kv.ElemBytes)
		if n > 1<<62 {
			return nil, fmt.Errorf("plan weights: KV cache of %.3g bytes is too large", n)
		}
		p.KVBytes = add(PurposeKV, "kv", uint64(n))
	}

	var total uint64
	for _, g := range groups {
		if !g.Mapped {
			total += charge(g.Region)
		}
	}
	fixed := p.ActivationBytes + p.KVBytes
	largestName := ""
	if largest >= 0 {
		p.SlotBytes, largestName = groups[largest].Region, groups[largest].Name
	}
	p.MinimumBytes = pages(2*charge(p.SlotBytes) + fixed)

	p.Groups = make([]GroupPlan, len(groups))
	for i, g := range groups {
		p.Groups[i] = GroupPlan{WeightGroup: g, Slot: -1, Resident: g.Mapped}
	}
	if total+fixed <= room {
		for i := range p.Groups {
			p.Groups[i].Resident = true
		}
	} else {
		if room < p.MinimumBytes {
			return nil, &BudgetError{Budget: o.Budget, Minimum: p.MinimumBytes, SlotBytes: p.SlotBytes,
				ActivationBytes: p.ActivationBytes, KVBytes: p.KVBytes, LargestGroup: largestName, PageBytes: o.PageBytes}
		}
		p.Slots = o.Slots
		p.StagingBytes = uint64(o.Slots) * charge(p.SlotBytes)
		for room < fixed+p.StagingBytes && p.Slots > 2 {
			p.Slots--
			p.StagingBytes = uint64(p.Slots) * charge(p.SlotBytes)
		}
		pickResident(p, groups, room-fixed-p.StagingBytes, charge, o.Spread)
		// Slots need only hold the groups that stream: when those are all
		// smaller than the largest group (a resident embedding or LM head),
		// shrink the slots and plan again with the room that frees, unless
		// that makes a larger group stream.
		if s := streamedRegion(p); s < p.SlotBytes {
			prev := slices.Clone(p.Groups)
			staging := uint64(p.Slots) * charge(s)
			pickResident(p, groups, room-fixed-staging, charge, o.Spread)
			if streamedRegion(p) <= s {
				p.SlotBytes, p.StagingBytes = s, staging
			} else {
				p.Groups = prev
			}
		}
	}
	slot := 0
	for i := range p.Groups {
		g := &p.Groups[i]
		for _, mm := range g.Matmuls {
			g.ComputeTime += o.Cost(mm.DType, mm.M, mm.K, T)
		}
		if g.Mapped {
			p.MappedBytes += g.Bytes
			continue
		}
		if g.Resident {
			p.ResidentBytes += add(PurposeWeights, g.Name, g.Region)
			continue
		}
		g.Slot = slot % p.Slots
		slot++
		g.CopyTime = time.Duration(math.Round(float64(g.Copy)/o.LinkGBps)) + time.Duration(len(g.Extents))*o.CopyLatency
		p.StreamedBytes += g.Copy
	}
	for s := range p.Slots {
		add(PurposeStaging, "slot."+strconv.Itoa(s), p.SlotBytes)
	}
	p.Allocations = allocs
	for _, a := range allocs {
		p.PeakBytes += a.Charged
	}
	p.PeakBytes = pages(p.PeakBytes)
	p.CopyTime, p.ComputeTime, p.StepTime = p.pipeline()
	return p, nil
}

// pipeline models one step: a copy engine moving streamed groups into the
// ring in order, each copy waiting for the slot's previous group to be
// consumed, and a compute engine running every group's products in order,
// each streamed group waiting for its copy.
func (p *WeightPlan) pipeline() (copyT, computeT, step time.Duration) {
	var copyFree, compEnd time.Duration
	slotFree := make([]time.Duration, max(p.Slots, 1))
	for _, g := range p.Groups {
		computeT += g.ComputeTime
		if g.Resident {
			compEnd += g.ComputeTime
			continue
		}
		copyT += g.CopyTime
		start := max(copyFree, slotFree[g.Slot])
		copyFree = start + g.CopyTime
		compEnd = max(compEnd, copyFree) + g.ComputeTime
		slotFree[g.Slot] = compEnd
	}
	return copyT, computeT, compEnd
}

// Streamed returns the indexes of the streamed groups in forward order.
func (p *WeightPlan) Streamed() []int {
	var out []int
	for i, g := range p.Groups {
		if !g.Resident {
			out = append(out, i)
		}
	}
	return out
}

// wAlign rounds x up to a multiple of a (a > 0).
func wAlign(x, a uint64) uint64 { return (x + a - 1) / a * a }
