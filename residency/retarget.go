package residency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
)

// Change is what one Retarget did.
type Change struct {
	// Demoted and Promoted count the groups that left and joined the
	// resident set; DemotedBytes and PromotedBytes are their device
	// regions' bytes (given back, and allocated and uploaded).
	Demoted       int    `json:"demoted"`
	Promoted      int    `json:"promoted"`
	DemotedBytes  uint64 `json:"demoted_bytes"`
	PromotedBytes uint64 `json:"promoted_bytes"`
	// Slots and SlotBytes are the staging ring after the change.
	Slots     int    `json:"slots"`
	SlotBytes uint64 `json:"slot_bytes"`
	// UploadedBytes are the bytes the promoted groups' uploads copied
	// (their tensors, without the regions' rounding) and UploadSeconds
	// their wall time.
	UploadedBytes uint64  `json:"uploaded_bytes"`
	UploadSeconds float64 `json:"upload_seconds"`
	// Seconds is the whole Retarget's wall time.
	Seconds float64 `json:"seconds"`
}

// Retarget changes the placement to p, a plan of the same groups (names,
// regions and extents as the current plan's) that keeps a different set
// resident with its own staging slots: a budget that shrank or grew. The
// Residency must have been made with Options.Live, so that every group
// has a host source. No group may be acquired, and the caller must have
// synchronized the compute that read groups since their last Release.
//
// It waits for the copy stream, forgets what the slots hold, gives back
// the regions of the groups p streams and the slots whose count or size
// changes, then takes the new slots and the regions of the groups p keeps
// resident and uploads them (from their pinned source: at the link's
// rate). Frees come before allocations, so the device pool never holds
// more than the larger of the two placements. On failure the Residency
// is unusable (every later Acquire fails; Close still gives back
// everything) and the error says which group or slot failed.
func (r *Residency) Retarget(ctx context.Context, p *plan.WeightPlan) (ch Change, err error) {
	if err := r.usable(); err != nil {
		return ch, err
	}
	switch {
	case !r.o.Live:
		return ch, errors.New("residency: Retarget needs a Residency made with Options.Live")
	case r.inPlace:
		return ch, errors.New("residency: the weights are read in place from host memory: there is no device placement to change")
	}
	if err := r.sameGroups(p); err != nil {
		return ch, err
	}
	t0 := time.Now()
	defer func() { ch.Seconds = time.Since(t0).Seconds() }()
	for i := range r.groups {
		if g := &r.groups[i]; g.state == acquired || g.acquires > 0 {
			return ch, fmt.Errorf("%w: group %d (%s) is acquired; Release every group before Retarget", ErrState, i, g.plan.Name)
		}
	}
	if err := r.retarget(ctx, p, &ch); err != nil {
		r.failed = fmt.Errorf("residency: retarget: %w", err)
		return ch, r.failed
	}
	return ch, nil
}

// sameGroups checks that p holds the current plan's groups.
func (r *Residency) sameGroups(p *plan.WeightPlan) error {
	if p == nil || len(p.Groups) != len(r.groups) {
		n := 0
		if p != nil {
			n = len(p.Groups)
		}
		return fmt.Errorf("residency: Retarget to a plan of %d groups, the residency holds %d", n, len(r.groups))
	}
	streams := false
	for i := range p.Groups {
		a, b := r.groups[i].plan, &p.Groups[i]
		if a.Name != b.Name || a.Region != b.Region || a.Copy != b.Copy || a.Mapped != b.Mapped || !slices.Equal(a.Extents, b.Extents) || len(a.Tensors) != len(b.Tensors) {
			return fmt.Errorf("residency: Retarget: group %d is %s (%d bytes) in the new plan, %s (%d bytes) here: plan the same groups", i, b.Name, b.Region, a.Name, a.Region)
		}
		if !b.Resident {
			streams = true
			if b.Region > p.SlotBytes {
				return fmt.Errorf("residency: Retarget: streamed group %s needs %d bytes, the plan's slots hold %d", b.Name, b.Region, p.SlotBytes)
			}
		}
	}
	if streams && p.Slots < 2 {
		return fmt.Errorf("residency: Retarget: the plan streams through %d slots, want at least 2", p.Slots)
	}
	if streams && r.o.Prefetch+1 > p.Slots {
		return fmt.Errorf("residency: Retarget: Prefetch %d needs %d slots, the plan reserved %d", r.o.Prefetch, r.o.Prefetch+1, p.Slots)
	}
	return nil
}

func (r *Residency) retarget(ctx context.Context, p *plan.WeightPlan, ch *Change) error {
	if err := r.d.StreamSynchronize(r.copyS); err != nil {
		return err
	}
	// The slots' contents are forgotten: a group copied ahead is copied
	// again when next acquired.
	for i := range r.groups {
		g := &r.groups[i]
		g.state, g.slot = idle, -1
	}
	for i := range r.slots {
		r.slots[i].occupant = -1
	}
	var promote []int
	for i := range r.groups {
		g := &r.groups[i]
		now := p.Groups[i].Resident
		switch {
		case g.resident && !now:
			if g.block.Size > 0 {
				if err := r.dev.Free(g.block); err != nil {
					return fmt.Errorf("free %s: %w", g.plan.Name, err)
				}
				ch.DemotedBytes += g.block.Size
				r.stats.ResidentBytes -= g.block.Size
			}
			g.block = pool.Block{}
			ch.Demoted++
		case !g.resident && now:
			promote = append(promote, i)
		}
	}
	want := 0
	if slices.ContainsFunc(p.Groups, func(g plan.GroupPlan) bool { return !g.Resident }) {
		want = p.Slots
	}
	size := p.SlotBytes
	if u := r.dev.Options().PageBytes; u > 1 {
		size = alignUp(size, u)
	}
	if len(r.slots) != want || (want > 0 && (r.slots[0].block.Size < size || r.slots[0].block.Size > size+size/8)) {
		if err := r.resizeSlots(want, p.SlotBytes); err != nil {
			return err
		}
	}
	// The plan and the streamed order, before the uploads (which read the
	// group's plan).
	r.p = p
	r.streamed = r.streamed[:0]
	for i := range r.groups {
		g := &r.groups[i]
		g.plan = &p.Groups[i]
		g.resident = g.plan.Resident
		g.pos = -1
		if !g.resident {
			g.pos = len(r.streamed)
			r.streamed = append(r.streamed, i)
		}
	}
	r.last = -1
	r.prefetch = 0
	if len(r.streamed) > 0 {
		r.prefetch = r.o.Prefetch
		if r.prefetch <= 0 {
			r.prefetch = p.Slots - 1
		}
	}
	if err := r.timingEvents(); err != nil {
		return err
	}
	slices.SortStableFunc(promote, func(a, b int) int { return cmp.Compare(r.groups[b].plan.Region, r.groups[a].plan.Region) })
	for k, i := range promote {
		g := &r.groups[i]
		b, err := r.devAlloc(g.plan.Region, pool.AllocOptions{Purpose: pool.Weights})
		if err != nil {
			for _, j := range promote[k:] {
				r.groups[j].resident = false // holds no region: nothing to free at Close
			}
			return fmt.Errorf("resident group %s (%d bytes): %w", g.plan.Name, g.plan.Region, err)
		}
		g.block = b
		g.place(b.Ptr)
		r.stats.ResidentBytes += b.Size
		ch.Promoted++
		ch.PromotedBytes += b.Size
		for _, e := range g.plan.Extents {
			ch.UploadedBytes += e.Bytes
		}
	}
	t0 := time.Now()
	if err := r.uploads(ctx, slices.Values(promote)); err != nil {
		return err
	}
	ch.UploadSeconds = time.Since(t0).Seconds()
	ch.Slots = len(r.slots)
	if ch.Slots > 0 {
		ch.SlotBytes = r.slots[0].block.Size
	}
	return nil
}

// resizeSlots gives back the staging slots and takes n of size bytes.
func (r *Residency) resizeSlots(n int, size uint64) error {
	for i := range r.slots {
		if err := r.dev.Free(r.slots[i].block); err != nil {
			return fmt.Errorf("free staging slot %d: %w", i, err)
		}
	}
	old := r.slots
	r.slots = nil
	for i := range n {
		b, err := r.devAlloc(size, pool.AllocOptions{Purpose: pool.Staging, Stream: r.copyS})
		if err != nil {
			return fmt.Errorf("staging slot %d of %d (%d bytes): %w", i+1, n, size, err)
		}
		s := slot{block: b, occupant: -1}
		if i < len(old) {
			s.ready = old[i].ready // events are kept until Close
		} else {
			ev, err := r.newEvent(false)
			if err != nil {
				r.slots = append(r.slots, s)
				return err
			}
			s.ready = ev
		}
		r.slots = append(r.slots, s)
	}
	return nil
}

// timingEvents gives each streamed group its timing events
// (Options.Timing) if it has none yet.
func (r *Residency) timingEvents() error {
	if !r.o.Timing {
		return nil
	}
	for _, i := range r.streamed {
		g := &r.groups[i]
		if g.timing[0][0] != 0 {
			continue
		}
		for k := range 2 {
			for j := range 2 {
				e, err := r.newEvent(true)
				if err != nil {
					return err
				}
				g.timing[k][j] = e
			}
		}
	}
	return nil
}

// devAlloc takes n bytes of the device pool. Under Options.Live a region
// is whole pages of the pool (Options().PageBytes), at a page boundary:
// no page is shared by two regions, so the pages a demoted group gives
// back are free whole, and the pool's reserved bytes are the regions'
// sum after a Retarget (as the engine's live plan counts them), not that
// sum plus the pages that regions freed in between still share.
func (r *Residency) devAlloc(n uint64, o pool.AllocOptions) (pool.Block, error) {
	if u := r.dev.Options().PageBytes; r.o.Live && u > 1 {
		n, o.Align = alignUp(n, u), u
	}
	return r.dev.Alloc(n, o)
}
