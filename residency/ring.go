package residency

import (
	"errors"
	"fmt"
	"time"

	"github.com/memwall/memwall/device"
)

func (r *Residency) usable() error {
	if r.closed {
		return ErrClosed
	}
	return r.failed
}

func (r *Residency) group(g int) (*group, error) {
	if g < 0 || g >= len(r.groups) {
		return nil, fmt.Errorf("%w: group %d of a plan of %d", ErrState, g, len(r.groups))
	}
	return &r.groups[g], nil
}

// Acquire returns the device views of group g, in the order of
// p.Groups[g].Tensors, and the event after which their bytes are valid: 0
// for a resident group (valid since New), else the end of the group's copy
// on the copy stream, which the caller's stream must wait on
// (StreamWaitEvent) before reading. The views and the event stay valid
// until Release(g); the slice must not be modified.
//
// A resident group may be acquired any number of times (each Acquire
// wants a Release). A streamed group is acquired once until released
// (ErrState otherwise); when it is not in a slot its copy is issued now,
// into a free slot or the slot of a copied-ahead group, which is dropped;
// with every slot holding an acquired group it fails with ErrRingFull.
// Then the next Prefetch streamed groups are issued into free slots. A
// failed copy fails this and every later call (Close still gives back
// everything).
func (r *Residency) Acquire(g int) ([]View, device.Event, error) {
	if err := r.usable(); err != nil {
		return nil, 0, err
	}
	gr, err := r.group(g)
	if err != nil {
		return nil, 0, err
	}
	if gr.resident {
		gr.acquires++
		r.last = g
		if err := r.fill(); err != nil {
			return nil, 0, err
		}
		return gr.views, 0, nil
	}
	switch gr.state {
	case acquired:
		return nil, 0, fmt.Errorf("%w: group %d (%s) is already acquired; Release it first", ErrState, g, gr.plan.Name)
	case idle:
		s := r.takeSlot(gr.pos, -1)
		if s < 0 {
			return nil, 0, fmt.Errorf("%w (acquiring group %d, %s; %d slots)", ErrRingFull, g, gr.plan.Name, len(r.slots))
		}
		if err := r.issue(g, s); err != nil {
			return nil, 0, err
		}
	}
	gr.state = acquired
	r.last = g
	ready := r.slots[gr.slot].ready
	if err := r.fill(); err != nil {
		return nil, 0, err
	}
	return gr.views, ready, nil
}

// Release says that the compute reading group g's views is captured by
// done, an event recorded on the caller's stream after that compute (0 when
// nothing reads them any more, e.g. after a synchronize). The slot may then
// be overwritten by a copy that waits for done on the copy stream: the host
// does not wait. done must stay valid until that copy is issued (at the
// latest by the next Acquire or Release that needs the slot); re-recording
// it on the same stream meanwhile only makes the copy wait longer.
// Releasing a resident group only counts; releasing a group not acquired
// fails with ErrState.
func (r *Residency) Release(g int, done device.Event) error {
	if err := r.usable(); err != nil {
		return err
	}
	gr, err := r.group(g)
	if err != nil {
		return err
	}
	if gr.resident {
		if gr.acquires == 0 {
			return fmt.Errorf("%w: release of resident group %d (%s), which is not acquired", ErrState, g, gr.plan.Name)
		}
		gr.acquires--
		return nil
	}
	if gr.state != acquired {
		return fmt.Errorf("%w: release of group %d (%s), which is not acquired", ErrState, g, gr.plan.Name)
	}
	s := &r.slots[gr.slot]
	r.releases++
	s.occupant, s.released, s.freedAt = -1, done, r.releases
	gr.state, gr.slot = idle, -1
	return r.fill()
}

// wanted returns the streamed positions that should be in slots after the
// last acquired group: the next Prefetch streamed groups in cyclic order,
// not counting the last acquired group itself.
func (r *Residency) wanted(buf []int) []int {
	n := len(r.streamed)
	if n == 0 || r.last < 0 {
		return buf[:0]
	}
	var start, count int
	if lg := &r.groups[r.last]; !lg.resident {
		start, count = lg.pos+1, min(r.prefetch, n-1)
	} else {
		// The first streamed group after the resident one, cyclically.
		start = 0
		for k, gi := range r.streamed {
			if gi > r.last {
				start = k
				break
			}
		}
		count = min(r.prefetch, n)
	}
	buf = buf[:0]
	for k := range count {
		buf = append(buf, (start+k)%n)
	}
	return buf
}

// fill issues the wanted groups that are in no slot, in order, into free
// slots or slots of copied-ahead groups no longer wanted; it stops at the
// first that finds no slot.
func (r *Residency) fill() error {
	var arr [16]int
	want := r.wanted(arr[:0])
	for i, pos := range want {
		g := r.streamed[pos]
		if r.groups[g].state != idle {
			continue
		}
		s := r.takeSlot(pos, i)
		if s < 0 {
			return nil
		}
		if err := r.issue(g, s); err != nil {
			return err
		}
	}
	return nil
}

// takeSlot returns a slot for the streamed group at position pos: the
// free one released longest ago (its release the most likely to have
// completed, so the copy waits least), else one holding a copied-ahead
// (issued, not acquired) group, which is dropped: the one furthest ahead
// of pos in cyclic order. For a prefetch (rank ≥ 0, pos's rank in the
// wanted list) only a group not wanted sooner than pos is dropped, so
// prefetching never evicts what it wants first. It returns -1 when there
// is none.
func (r *Residency) takeSlot(pos, rank int) int {
	free := -1
	for i := range r.slots {
		if s := &r.slots[i]; s.occupant < 0 && (free < 0 || s.freedAt < r.slots[free].freedAt) {
			free = i
		}
	}
	if free >= 0 {
		return free
	}
	n := len(r.streamed)
	best, bestDist := -1, -1
	for i := range r.slots {
		s := &r.slots[i]
		og := &r.groups[s.occupant]
		if og.state != issued {
			continue
		}
		dist := (og.pos - pos + n) % n
		if rank >= 0 && !r.dropForPrefetch(og.pos, pos) {
			continue
		}
		if dist > bestDist {
			best, bestDist = i, dist
		}
	}
	if best >= 0 {
		og := &r.groups[r.slots[best].occupant]
		og.state, og.slot = idle, -1
		r.slots[best].occupant = -1
		r.stats.Dropped++
	}
	return best
}

// dropForPrefetch reports whether a copied-ahead group at position have
// may give its slot to a prefetch of position want: only when have is not
// wanted sooner, i.e. is further ahead of the last acquired group.
func (r *Residency) dropForPrefetch(have, want int) bool {
	var arr [16]int
	for _, p := range r.wanted(arr[:0]) {
		if p == have {
			return false // wanted sooner than want
		}
		if p == want {
			break
		}
	}
	return true
}

// issue queues the copy of streamed group g into slot s on the copy
// stream, after the slot's last occupant's release.
func (r *Residency) issue(g, s int) error {
	gr := &r.groups[g]
	sl := &r.slots[s]
	fail := func(err error) error {
		r.failed = fmt.Errorf("residency: copy of group %d (%s) into slot %d: %w", g, gr.plan.Name, s, err)
		return r.failed
	}
	if sl.released != 0 && !r.o.noSlotWait {
		if err := r.d.StreamWaitEvent(r.copyS, sl.released); err != nil {
			return fail(err)
		}
	}
	sl.released = 0
	tim := &gr.timing[gr.copies%2]
	if r.o.Timing {
		if err := r.d.EventRecord(tim[0], r.copyS); err != nil {
			return fail(err)
		}
	}
	base := sl.block.Ptr
	for j, e := range gr.plan.Extents {
		var err error
		if gr.host != nil {
			err = r.d.CopyHtoD(base.Add(e.DevOffset), gr.host[j], r.copyS)
		} else {
			err = r.bounceCopy(base.Add(e.DevOffset), e)
		}
		if err != nil {
			return fail(err)
		}
	}
	if err := r.d.EventRecord(sl.ready, r.copyS); err != nil {
		return fail(err)
	}
	if r.o.Timing {
		if err := r.d.EventRecord(tim[1], r.copyS); err != nil {
			return fail(err)
		}
	}
	gr.copies++
	r.stats.Copies++
	r.stats.StreamedBytes += gr.plan.Copy
	sl.occupant = g
	gr.slot, gr.state = s, issued
	gr.place(base)
	return nil
}

// Copies returns how many times group g has been copied into a slot (0
// for a resident group).
func (r *Residency) Copies(g int) uint64 {
	if g < 0 || g >= len(r.groups) {
		return 0
	}
	return r.groups[g].copies
}

// CopyDuration returns the device time of copy number n (from 0) of
// streamed group g into a slot, waiting for the copy to complete. It needs
// Options.Timing; only a group's two latest copies are kept.
func (r *Residency) CopyDuration(g int, n uint64) (time.Duration, error) {
	gr, err := r.group(g)
	if err != nil {
		return 0, err
	}
	switch {
	case !r.o.Timing:
		return 0, errors.New("residency: CopyDuration needs Options.Timing")
	case gr.resident:
		return 0, fmt.Errorf("residency: group %d (%s) is resident: it is never copied", g, gr.plan.Name)
	case n >= gr.copies || gr.copies-n > 2:
		return 0, fmt.Errorf("residency: group %d (%s): copy %d is not kept (%d copies so far, the last two kept)", g, gr.plan.Name, n, gr.copies)
	}
	tim := gr.timing[n%2]
	if err := r.d.EventSynchronize(tim[1]); err != nil {
		return 0, fmt.Errorf("residency: group %d (%s): copy %d: %w", g, gr.plan.Name, n, err)
	}
	return r.d.EventElapsed(tim[0], tim[1])
}
