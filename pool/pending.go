package pool

import (
	"github.com/memwall/memwall/device"
)

// pendingList holds blocks freed on one stream since its last seal: work
// queued on that stream may still use them, so only that stream may reuse
// them (its later work is ordered after the earlier work).
type pendingList struct {
	head  *meta
	n     int
	bytes uint64
}

// A stream's pending blocks are sealed with one event per batch.
const (
	pendingBatchBytes  = 64 << 20
	pendingBatchBlocks = 64
)

func (l *pendingList) add(m *meta) {
	m.next = l.head
	l.head = m
	l.n++
	l.bytes += m.size
}

// take removes and returns a block that fits size and align without wasting
// more than a quarter of it, or nil. The slack before its address must be
// less than align, as a placement for this request would leave it.
func (l *pendingList) take(size, align uint64) *meta {
	var prev *meta
	for m := l.head; m != nil; prev, m = m, m.next {
		if m.size-m.shift < size || m.size > size+size/4 || uint64(m.ptr())%align != 0 || m.shift >= align {
			continue
		}
		if prev == nil {
			l.head = m.next
		} else {
			prev.next = m.next
		}
		m.next = nil
		l.n--
		l.bytes -= m.size
		return m
	}
	return nil
}

// awaitBatch is a sealed batch: its blocks return to the arenas once ev,
// recorded on the freeing stream after their last use, has completed.
type awaitBatch struct {
	ev     device.Event
	blocks *meta
	bytes  uint64
}

// sealPending records an event on s covering its pending blocks and moves
// them to the awaiting list. Called with p.mu held.
func (p *Pool) sealPending(s device.Stream, l *pendingList) {
	if l.head == nil {
		return
	}
	ev, err := p.dev.NewEvent(false)
	if err == nil {
		err = p.dev.EventRecord(ev, s)
		if err != nil {
			_ = p.dev.DestroyEvent(ev)
		}
	}
	if err != nil {
		// Without an event the only safe way is to wait for the stream.
		p.logf("seal pending frees on stream %#x: %v; synchronizing the stream", uint64(s), err)
		if serr := p.dev.StreamSynchronize(s); serr == nil {
			p.releaseList(l.head)
			p.pendingBytes.Add(^(l.bytes - 1))
			*l = pendingList{}
		}
		return
	}
	p.awaiting = append(p.awaiting, awaitBatch{ev: ev, blocks: l.head, bytes: l.bytes})
	*l = pendingList{}
}

func (p *Pool) releaseList(m *meta) {
	for m != nil {
		next := m.next
		m.next = nil
		p.release(m)
		m = next
	}
}

// reapAwaiting releases the batches whose events have completed; with wait,
// it waits for all of them. It returns the bytes released. Called with
// p.mu held.
func (p *Pool) reapAwaiting(wait bool) uint64 {
	var n uint64
	kept := p.awaiting[:0]
	for _, b := range p.awaiting {
		done, _ := p.dev.EventQuery(b.ev)
		if !done && wait {
			err := p.dev.EventSynchronize(b.ev)
			done = err == nil
		}
		if !done {
			kept = append(kept, b)
			continue
		}
		_ = p.dev.DestroyEvent(b.ev)
		p.releaseList(b.blocks)
		p.pendingBytes.Add(^(b.bytes - 1))
		n += b.bytes
	}
	for i := len(kept); i < len(p.awaiting); i++ {
		p.awaiting[i] = awaitBatch{}
	}
	p.awaiting = kept
	return n
}

// sealAll seals every stream's pending list. Called with p.mu held.
func (p *Pool) sealAll() {
	for s, l := range p.pending {
		p.sealPending(s, l)
	}
}
