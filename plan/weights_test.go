package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/synth"
)

// synthTensors lays out a synthetic model's tensors back to back (with the
// given alignment between them) without writing a file.
func synthTensors(c synth.Config, formatName string, align uint64) []format.Tensor {
	var out []format.Tensor
	off := uint64(1024)
	for _, t := range c.Tensors(formatName) {
		off = wAlign(off, align)
		out = append(out, format.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Offset: off, Bytes: t.Bytes(), File: "m"})
		off += t.Bytes()
	}
	return out
}

func TestGroupWeights(t *testing.T) {
	for _, f := range []string{synth.Safetensors, synth.GGUF} {
		t.Run(f, func(t *testing.T) {
			c := synth.Tiny()
			gs, err := GroupWeights(synthTensors(c, f, 32))
			if err != nil {
				t.Fatal(err)
			}
			if len(gs) != c.Layers+3 {
				t.Fatalf("%d groups, want %d", len(gs), c.Layers+3)
			}
			if gs[0].Layer != -1 || !isEmbedding(gs[0].Name) {
				t.Errorf("first group %s, want the embedding", gs[0].Name)
			}
			for l := range c.Layers {
				g := gs[1+l]
				if g.Layer != l || len(g.Tensors) != 9 || len(g.Extents) != 1 || len(g.Matmuls) != 7 {
					t.Errorf("group %d: %s layer %d, %d tensors, %d extents, %d matmuls; want layer %d, 9, 1, 7",
						1+l, g.Name, g.Layer, len(g.Tensors), len(g.Extents), len(g.Matmuls), l)
				}
				if g.Copy < g.Bytes || g.Copy > g.Bytes+9*32 || g.Region < g.Copy {
					t.Errorf("%s: bytes %d copy %d region %d", g.Name, g.Bytes, g.Copy, g.Region)
				}
			}
		})
	}
	cases := []struct {
		name    string
		tensors []format.Tensor
		want    string
	}{
		{"overlap", []format.Tensor{
			{Name: "blk.0.a", DType: "F32", Shape: []uint64{4}, Offset: 0, Bytes: 16, File: "f"},
			{Name: "blk.0.b", DType: "F32", Shape: []uint64{4}, Offset: 8, Bytes: 16, File: "f"}}, `"blk.0.b" at [8, 24) overlaps`},
		{"overflow", []format.Tensor{{Name: "x", Offset: 1 << 63, Bytes: 1 << 63, File: "f"}}, `"x": offset`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := GroupWeights(c.tensors)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestLayerOf(t *testing.T) {
	for name, want := range map[string]int{
		"model.layers.12.mlp.up_proj.weight": 12, "blk.0.attn_q.weight": 0, "blk.x.attn": -1,
		"model.layers.01.a": -1, "lm_head.weight": -1, "blk.3": -1, "model.layers.-1.a": -1,
	} {
		if got, _ := layerOf(name); got != want {
			t.Errorf("layerOf(%q) = %d, want %d", name, got, want)
		}
	}
}

// TestPlanLlama7B checks the arithmetic on the Llama-7B shape under 8 GiB.
func TestPlanLlama7B(t *testing.T) {
	c := synth.Llama7B()
	gs, err := GroupWeights(synthTensors(c, synth.Safetensors, 8))
	if err != nil {
		t.Fatal(err)
	}
	const layer = 4*4096*4096*2 + 3*4096*11008*2 + 2*4096*2
	const mib2 = 2 << 20
	for _, tc := range []struct {
		tokens, ctx int
		resident    int // blocks
	}{{1, 0, 17}, {1, 512, 17}, {4096, 0, 16}} {
		t.Run(fmt.Sprintf("tokens=%d,ctx=%d", tc.tokens, tc.ctx), func(t *testing.T) {
			p, err := PlanWeights(gs, WeightOptions{Budget: 8 << 30, Tokens: tc.tokens, Ctx: tc.ctx, LinkGBps: 55, Granule: mib2})
			if err != nil {
				t.Fatal(err)
			}
			if p.ModelBytes != c.DataBytes(synth.Safetensors) {
				t.Errorf("model bytes %d, want %d", p.ModelBytes, c.DataBytes(synth.Safetensors))
			}
			if p.SlotBytes < layer || p.SlotBytes > layer+9*256 {
				t.Errorf("slot %d bytes, want about one block (%d)", p.SlotBytes, layer)
			}
			blocks := 0
			for _, g := range p.Groups {
				if g.Resident && g.Layer >= 0 {
					blocks++
				}
				if g.Layer < 0 && !g.Resident {
					t.Errorf("stand-alone group %s streams", g.Name)
				}
			}
			if blocks != tc.resident {
				t.Errorf("%d blocks resident, want %d", blocks, tc.resident)
			}
			wantKV := uint64(0)
			if tc.ctx > 0 {
				wantKV = wAlign(32*2*4096*uint64(tc.ctx)*2, mib2)
			}
			if p.KVBytes != wantKV {
				t.Errorf("KV %d bytes, want %d", p.KVBytes, wantKV)
			}
			wantAct := wAlign(uint64(tc.tokens)*11008*2, mib2) + wAlign(uint64(tc.tokens)*32000*4, mib2)
			if p.ActivationBytes != wantAct {
				t.Errorf("activations %d, want %d", p.ActivationBytes, wantAct)
			}
			if p.PeakBytes > 8<<30 || p.PeakBytes != p.ResidentBytes+p.StagingBytes+p.ActivationBytes+p.KVBytes {
				t.Errorf("peak %d: resident %d + staging %d + act %d + kv %d, budget %d", p.PeakBytes,
					p.ResidentBytes, p.StagingBytes, p.ActivationBytes, p.KVBytes, uint64(8<<30))
			}
			if p.StagingBytes != 2*wAlign(p.SlotBytes, mib2) {
				t.Errorf("staging %d, want two slots of %d", p.StagingBytes, p.SlotBytes)
			}
			// The budget left over cannot hold another block.
			if left := uint64(8<<30) - p.PeakBytes; left >= wAlign(layer, mib2) {
				t.Errorf("%d bytes left over, room for another block", left)
			}
			wantCopy := time.Duration(float64(p.StreamedBytes) / 55)
			if d := p.CopyTime - wantCopy; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("copy time %v, want %v", p.CopyTime, wantCopy)
			}
			if p.StepTime < max(p.CopyTime, p.ComputeTime) || p.StepTime > p.CopyTime+p.ComputeTime {
				t.Errorf("step %v outside [max, sum] of copy %v, compute %v", p.StepTime, p.CopyTime, p.ComputeTime)
			}
			t.Logf("resident %d blocks, streamed %.2f GB, peak %.3f GiB, step %v (copy %v, compute %v)",
				blocks, float64(p.StreamedBytes)/1e9, float64(p.PeakBytes)/(1<<30), p.StepTime, p.CopyTime, p.ComputeTime)
		})
	}
}

func TestPlanBudget(t *testing.T) {
	gs, err := GroupWeights(synthTensors(synth.Tiny(), synth.Safetensors, 8))
	if err != nil {
		t.Fatal(err)
	}
	base := WeightOptions{LinkGBps: 25, Budget: 1 << 40, Ctx: 64, Batch: 2}
	full, err := PlanWeights(gs, base)
	if err != nil {
		t.Fatal(err)
	}
	if full.Slots != 0 || full.StreamedBytes != 0 || full.StagingBytes != 0 || full.StepTime != full.ComputeTime {
		t.Errorf("a budget that holds everything: %d slots, %d streamed, step %v (compute %v)", full.Slots, full.StreamedBytes, full.StepTime, full.ComputeTime)
	}
	// KV: 4 layers × 2 × kv dim 128 × ctx 64 × batch 2 × 2 bytes.
	if want := uint64(4 * 2 * 128 * 64 * 2 * 2); full.KVBytes != want {
		t.Errorf("KV %d, want %d", full.KVBytes, want)
	}
	o := base
	o.Budget = full.MinimumBytes
	p, err := PlanWeights(gs, o)
	if err != nil {
		t.Fatalf("at the minimum: %v", err)
	}
	if p.PeakBytes > o.Budget || p.Slots != 2 {
		t.Errorf("at the minimum: peak %d > budget %d or %d slots", p.PeakBytes, o.Budget, p.Slots)
	}
	o.Budget = full.MinimumBytes - 1
	_, err = PlanWeights(gs, o)
	var be *BudgetError
	if !errors.Is(err, ErrBudget) || !errors.As(err, &be) || be.Minimum != full.MinimumBytes ||
		!strings.Contains(err.Error(), fmt.Sprint(full.MinimumBytes)) {
		t.Errorf("one byte below the minimum: %v", err)
	}
	// Asking for more slots than fit falls back towards two.
	o.Budget, o.Slots = full.MinimumBytes+full.SlotBytes/2, 8
	if p, err := PlanWeights(gs, o); err != nil || p.Slots != 2 {
		t.Errorf("8 slots in room for 2: %v slots, %v", p, err)
	}
	bad := []WeightOptions{
		{LinkGBps: 25}, {Budget: 1 << 30}, {Budget: 1 << 30, LinkGBps: 25, Slots: 1},
		{Budget: 1 << 30, LinkGBps: 25, Tokens: -1}, {Budget: 1 << 30, LinkGBps: 25, Granule: 3},
		{Budget: 1 << 30, LinkGBps: 25, Ctx: -1},
	}
	for _, b := range bad {
		if _, err := PlanWeights(gs, b); err == nil {
			t.Errorf("options %+v accepted", b)
		}
	}
	if _, err := PlanWeights(nil, base); err == nil {
		t.Error("no groups accepted")
	}
	// No key projection: the KV cache cannot be sized.
	if _, err := PlanWeights(gs[:1], base); err == nil || !strings.Contains(err.Error(), "KV") {
		t.Errorf("KV without a key projection: %v", err)
	}
}

// TestPlanPages: with PageBytes the peak and the minimum are whole pages,
// only the budget's whole pages are planned into, and a plan at any budget
// keeps its rounded peak within it.
func TestPlanPages(t *testing.T) {
	gs, err := GroupWeights(synthTensors(synth.Tiny(), synth.Safetensors, 8))
	if err != nil {
		t.Fatal(err)
	}
	const page = 2 << 20
	o := WeightOptions{LinkGBps: 25, Budget: 1 << 40, PageBytes: page}
	full, err := PlanWeights(gs, o)
	if err != nil {
		t.Fatal(err)
	}
	if full.PeakBytes%page != 0 || full.MinimumBytes%page != 0 || full.PageBytes != page {
		t.Errorf("peak %d, minimum %d: not whole pages of %d", full.PeakBytes, full.MinimumBytes, page)
	}
	var sum uint64
	for _, a := range full.Allocations {
		sum += a.Charged
	}
	if full.PeakBytes < sum || full.PeakBytes >= sum+page {
		t.Errorf("peak %d for allocations of %d bytes", full.PeakBytes, sum)
	}
	for b := full.MinimumBytes; b <= full.PeakBytes+page; b += page / 4 {
		o.Budget = b
		p, err := PlanWeights(gs, o)
		if err != nil {
			t.Fatalf("budget %d: %v", b, err)
		}
		if p.PeakBytes > b {
			t.Errorf("budget %d: peak %d above it", b, p.PeakBytes)
		}
	}
	o.Budget = full.MinimumBytes - 1
	var be *BudgetError
	if _, err := PlanWeights(gs, o); !errors.As(err, &be) || be.Minimum != full.MinimumBytes || !strings.Contains(err.Error(), "whole pages") {
		t.Errorf("a byte below the minimum in pages: %v", err)
	}
	o.PageBytes = 3 << 20
	if _, err := PlanWeights(gs, o); err == nil {
		t.Error("a page size that is not a power of two accepted")
	}
}

// TestPipeline: copy-bound and compute-bound steps by hand.
func TestPipeline(t *testing.T) {
	g := func(res bool, slot int, cp, comp time.Duration) GroupPlan {
		return GroupPlan{Resident: res, Slot: slot, CopyTime: cp, ComputeTime: comp}
	}
	cases := []struct {
		name  string
		slots int
		gs    []GroupPlan
		step  time.Duration
	}{
		// Copies 10 each back to back; each compute 1 after its copy.
		{"copy bound", 2, []GroupPlan{g(true, -1, 0, 5), g(false, 0, 10, 1), g(false, 1, 10, 1), g(false, 0, 10, 1)}, 31},
		// Compute 10 each after 5 of resident compute; the third copy waits for
		// slot 0 to be freed at 15.
		{"compute bound", 2, []GroupPlan{g(true, -1, 0, 5), g(false, 0, 2, 10), g(false, 1, 2, 10), g(false, 0, 2, 10)}, 35},
		{"one slot reuse stalls", 2, []GroupPlan{g(false, 0, 10, 10), g(false, 1, 1, 1), g(false, 0, 10, 1)}, 31},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &WeightPlan{Groups: c.gs, Slots: c.slots}
			_, _, step := p.pipeline()
			if step != c.step {
				t.Errorf("step %v, want %v", step, c.step)
			}
		})
	}
}

// TestPlanMapped: a mapped group (the embedding, read in place from host
// memory) is resident in every plan, takes no allocation, no slot and none
// of the budget, and at every budget between the minimum and the whole
// model the plan with it mapped streams no more than the plan without.
func TestPlanMapped(t *testing.T) {
	gs, err := GroupWeights(synthTensors(synth.Tiny(), synth.Safetensors, 8))
	if err != nil {
		t.Fatal(err)
	}
	mapped := slices.Clone(gs)
	emb := -1
	for i := range mapped {
		if strings.Contains(mapped[i].Name, "embed") {
			mapped[i].Mapped, emb = true, i
		}
	}
	if emb < 0 {
		t.Fatal("no embedding group")
	}
	base := WeightOptions{LinkGBps: 25, Budget: 1 << 40, Ctx: 64}
	full, err := PlanWeights(gs, base)
	if err != nil {
		t.Fatal(err)
	}
	fullM, err := PlanWeights(mapped, base)
	if err != nil {
		t.Fatal(err)
	}
	if fullM.PeakBytes+mapped[emb].Region > full.PeakBytes+base.Granule || fullM.MappedBytes != mapped[emb].Bytes {
		t.Errorf("whole model: peak %d mapped (%d mapped bytes), %d not", fullM.PeakBytes, fullM.MappedBytes, full.PeakBytes)
	}
	for step := uint64(0); step <= 64; step++ {
		o := base
		o.Budget = full.MinimumBytes + (full.PeakBytes-full.MinimumBytes)*step/64
		p, err := PlanWeights(gs, o)
		if err != nil {
			t.Fatal(err)
		}
		pm, err := PlanWeights(mapped, o)
		if err != nil {
			t.Fatalf("budget %d: mapped: %v", o.Budget, err)
		}
		if !pm.Groups[emb].Resident || !pm.Groups[emb].Mapped || pm.Groups[emb].Slot != -1 || pm.PeakBytes > o.Budget {
			t.Fatalf("budget %d: mapped group %+v, peak %d", o.Budget, pm.Groups[emb], pm.PeakBytes)
		}
		for _, a := range pm.Allocations {
			if a.Name == mapped[emb].Name {
				t.Fatalf("budget %d: the mapped group has an allocation", o.Budget)
			}
		}
		if pm.StreamedBytes > p.StreamedBytes {
			t.Errorf("budget %d: %d bytes streamed with the embedding mapped, %d without", o.Budget, pm.StreamedBytes, p.StreamedBytes)
		}
	}
}
