package plan

import (
	"testing"

	"github.com/memwall/memwall/format/synth"
)

// TestSpread: with room for half the blocks, Spread keeps every other
// block resident (32 layers: the even ones), the default the first half;
// both keep the same bytes resident.
func TestSpread(t *testing.T) {
	c := synth.Llama7B()
	gs, err := GroupWeights(synthTensors(c, synth.Safetensors, 256))
	if err != nil {
		t.Fatal(err)
	}
	var block, other uint64
	for _, g := range gs {
		if g.Layer == 0 {
			block = wAlign(g.Region, 512)
		}
		if g.Layer < 0 {
			other += wAlign(g.Region, 512)
		}
	}
	budget := other + 16*block + 2*block + 1<<20 // two slots of a block, 1 MiB for activations
	plans := map[bool]*WeightPlan{}
	for _, spread := range []bool{false, true} {
		p, err := PlanWeights(gs, WeightOptions{Budget: budget, LinkGBps: 50, Spread: spread})
		if err != nil {
			t.Fatal(err)
		}
		plans[spread] = p
		var resident []int
		for _, g := range p.Groups {
			if g.Layer >= 0 && g.Resident {
				resident = append(resident, g.Layer)
			}
		}
		if len(resident) != 16 {
			t.Fatalf("spread %v: %d resident blocks %v, want 16", spread, len(resident), resident)
		}
		for i, l := range resident {
			if want := map[bool]int{false: i, true: 2 * i}[spread]; l != want {
				t.Fatalf("spread %v: resident blocks %v", spread, resident)
			}
		}
	}
	if plans[false].ResidentBytes != plans[true].ResidentBytes || plans[false].StreamedBytes != plans[true].StreamedBytes {
		t.Errorf("resident %d vs %d, streamed %d vs %d", plans[false].ResidentBytes, plans[true].ResidentBytes, plans[false].StreamedBytes, plans[true].StreamedBytes)
	}
	for n := 1; n <= 70; n++ {
		seen := map[int]bool{}
		for l := range n {
			r := spreadRank(l, n)
			if seen[r] {
				t.Fatalf("n=%d: rank %d twice", n, r)
			}
			seen[r] = true
		}
	}
}
