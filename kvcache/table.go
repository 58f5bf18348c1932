package kvcache

import "unsafe"

// hashTable maps block hashes to block ids: open addressing with linear
// probing and backward-shift deletion (no tombstones), at most half full
// (it holds at most one entry per block), so that a lookup, an insert and a
// delete touch one or two cache lines whatever the number of blocks. Key 0
// marks an empty slot; chainHash never returns 0.
type hashTable struct {
	slots []slot
	mask  uint64
	n     int
}

type slot struct {
	key   uint64
	block int32
}

func newHashTable(maxEntries int) hashTable {
	size := 16
	for size < 2*maxEntries {
		size *= 2
	}
	return hashTable{slots: make([]slot, size), mask: uint64(size - 1)}
}

func (t *hashTable) len() int { return t.n }

// warm prefetches k's home slot.
func (t *hashTable) warm(k uint64) {
	if len(t.slots) > 0 {
		prefetch(uintptr(unsafe.Pointer(&t.slots[k&t.mask])))
	}
}

// get returns the block cached under k.
func (t *hashTable) get(k uint64) (int32, bool) {
	for i := k & t.mask; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s.key == k {
			return s.block, true
		}
		if s.key == 0 {
			return 0, false
		}
	}
}

// put adds k → b; k must be absent.
func (t *hashTable) put(k uint64, b int32) {
	i := k & t.mask
	for t.slots[i].key != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = slot{k, b}
	t.n++
}

// del removes k if present, shifting later entries of its probe run back.
func (t *hashTable) del(k uint64) {
	i := k & t.mask
	for t.slots[i].key != k {
		if t.slots[i].key == 0 {
			return
		}
		i = (i + 1) & t.mask
	}
	for j := (i + 1) & t.mask; t.slots[j].key != 0; j = (j + 1) & t.mask {
		home := t.slots[j].key & t.mask
		// Move j back to i unless its home lies cyclically in (i, j].
		if (j-home)&t.mask >= (j-i)&t.mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

// clear empties the table.
func (t *hashTable) clear() {
	clear(t.slots)
	t.n = 0
}

// each calls f for every entry.
func (t *hashTable) each(f func(k uint64, b int32)) {
	for _, s := range t.slots {
		if s.key != 0 {
			f(s.key, s.block)
		}
	}
}

// seqTable maps sequence ids to their state: open addressing with linear
// probing and backward-shift deletion, grown to stay at most half full; a
// nil state marks an empty slot. Cheaper than a Go map for the Manager's
// lookups, inserts and deletes, which every operation makes.
type seqTable struct {
	slots []seqSlot
	shift uint // 64 - log2(len(slots))
	n     int
}

type seqSlot struct {
	id SeqID
	s  *seq
}

func newSeqTable() seqTable {
	return seqTable{slots: make([]seqSlot, 16), shift: 60}
}

func (t *seqTable) home(id SeqID) uint64 {
	return (uint64(id) * 0x9e3779b97f4a7c15) >> t.shift
}

func (t *seqTable) mask() uint64 { return uint64(len(t.slots) - 1) }

func (t *seqTable) get(id SeqID) (*seq, bool) {
	for i := t.home(id); ; i = (i + 1) & t.mask() {
		sl := &t.slots[i]
		if sl.s == nil {
			return nil, false
		}
		if sl.id == id {
			return sl.s, true
		}
	}
}

// put adds id → s; id must be absent.
func (t *seqTable) put(id SeqID, s *seq) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	i := t.home(id)
	for t.slots[i].s != nil {
		i = (i + 1) & t.mask()
	}
	t.slots[i] = seqSlot{id, s}
	t.n++
}

func (t *seqTable) grow() {
	old := t.slots
	t.slots = make([]seqSlot, 2*len(old))
	t.shift--
	t.n = 0
	for _, sl := range old {
		if sl.s != nil {
			t.put(sl.id, sl.s)
		}
	}
}

// del removes id if present.
func (t *seqTable) del(id SeqID) {
	mask := t.mask()
	i := t.home(id)
	for t.slots[i].id != id || t.slots[i].s == nil {
		if t.slots[i].s == nil {
			return
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; t.slots[j].s != nil; j = (j + 1) & mask {
		h := t.home(t.slots[j].id)
		if (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = seqSlot{}
	t.n--
}

func (t *seqTable) len() int { return t.n }

// each calls f for every entry.
func (t *seqTable) each(f func(SeqID, *seq)) {
	for _, sl := range t.slots {
		if sl.s != nil {
			f(sl.id, sl.s)
		}
	}
}
