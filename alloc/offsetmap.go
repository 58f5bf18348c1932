package alloc

// offsetMap maps block offsets to small integer handles (node ids, sequence
// numbers). It is an open-addressing hash table with linear probing and
// backward-shift deletion: no per-operation allocation, no tombstones, and
// one cache line touched on the common path. It is much cheaper than a Go
// map for the uint64 -> uint64 case on the allocators' hot paths.
//
// Offsets are below MaxCapacity, so ^0 is free to mark empty slots.
type offsetMap struct {
	slots []offsetSlot
	count int
	shift uint // 64 - log2(len(slots))
}

type offsetSlot struct {
	key, val uint64
}

const (
	emptyKey       = ^uint64(0)
	offsetMapMin   = 16
	fibonacciRatio = 0x9E3779B97F4A7C15
)

func (m *offsetMap) home(key uint64) int {
	return int((key * fibonacciRatio) >> m.shift)
}

// get returns the value stored for key.
func (m *offsetMap) get(key uint64) (uint64, bool) {
	if m.count == 0 || key == emptyKey {
		return 0, false
	}
	mask := len(m.slots) - 1
	for i := m.home(key); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == key {
			return s.val, true
		}
		if s.key == emptyKey {
			return 0, false
		}
	}
}

// put stores val for key, replacing any previous value. key must not be
// emptyKey (offsets are below MaxCapacity).
func (m *offsetMap) put(key, val uint64) {
	if (m.count+1)*2 > len(m.slots) {
		m.resize(max(offsetMapMin, len(m.slots)*2))
	}
	mask := len(m.slots) - 1
	for i := m.home(key); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == key {
			s.val = val
			return
		}
		if s.key == emptyKey {
			s.key, s.val = key, val
			m.count++
			return
		}
	}
}

// take removes key and returns its value.
func (m *offsetMap) take(key uint64) (uint64, bool) {
	if m.count == 0 || key == emptyKey {
		return 0, false
	}
	mask := len(m.slots) - 1
	i := m.home(key)
	for {
		s := &m.slots[i]
		if s.key == key {
			break
		}
		if s.key == emptyKey {
			return 0, false
		}
		i = (i + 1) & mask
	}
	val := m.slots[i].val
	// Backward-shift deletion: move later entries of the probe run into the
	// hole when the hole lies on their probe path.
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := m.slots[j]
		if s.key == emptyKey {
			break
		}
		h := m.home(s.key)
		// The entry at j may move to i if i lies cyclically in [h, j).
		if (j-h)&mask >= (j-i)&mask {
			m.slots[i] = s
			i = j
		}
	}
	m.slots[i].key = emptyKey
	m.count--
	return val, true
}

func (m *offsetMap) resize(n int) {
	old := m.slots
	m.slots = make([]offsetSlot, n)
	for i := range m.slots {
		m.slots[i].key = emptyKey
	}
	m.shift = uint(64 - log2(uint64(n)))
	m.count = 0
	mask := n - 1
	for _, s := range old {
		if s.key == emptyKey {
			continue
		}
		i := m.home(s.key)
		for m.slots[i].key != emptyKey {
			i = (i + 1) & mask
		}
		m.slots[i] = s
		m.count++
	}
}

// clear removes every entry, keeping the table's memory.
func (m *offsetMap) clear() {
	for i := range m.slots {
		m.slots[i].key = emptyKey
	}
	m.count = 0
}

// len returns the number of entries.
func (m *offsetMap) len() int { return m.count }
