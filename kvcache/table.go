package kvcache

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
