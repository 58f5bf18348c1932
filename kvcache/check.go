package kvcache

import "fmt"

// Check verifies the Manager's invariants and returns the first violation:
// every reference count equals the table entries naming the block; a block
// appears at most once per table and, when shared (by a fork or a prefix
// hit), at the same position in every table; the free list is well linked
// and holds exactly the unreferenced blocks; the hash map and the blocks'
// cached flags agree; tables, partial blocks and host blocks match each
// sequence's length. It costs O(blocks + table entries): for tests.
func (m *Manager) Check() error {
	B := m.cfg.BlockTokens
	N := len(m.blocks)
	refs := make([]int32, N)
	where := make([]int32, N) // table index of the block's references
	for i := range where {
		where[i] = -1
	}
	hostUsed := make([]bool, m.cfg.HostBlocks)
	for _, h := range m.host {
		if h < 0 || int(h) >= len(hostUsed) || hostUsed[h] {
			return fmt.Errorf("host free list: bad or repeated host block %d", h)
		}
		hostUsed[h] = true
	}
	var bad error
	m.seqs.each(func(id SeqID, s *seq) {
		if bad == nil {
			bad = m.checkSeq(id, s, B, N, refs, where, hostUsed)
		}
	})
	if bad != nil {
		return bad
	}
	for h, u := range hostUsed {
		if !u {
			return fmt.Errorf("host block %d neither free nor held", h)
		}
	}
	cached := 0
	for i := range m.blocks {
		k := &m.blocks[i]
		if k.ref != refs[i] {
			return fmt.Errorf("block %d: reference count %d, %d table entries", i, k.ref, refs[i])
		}
		if (k.flags&flagFree != 0) != (k.ref == 0) {
			return fmt.Errorf("block %d: reference count %d but free flag %v", i, k.ref, k.flags&flagFree != 0)
		}
		if k.flags&flagHit != 0 && k.flags&flagCached == 0 {
			return fmt.Errorf("block %d: marked hit but not cached", i)
		}
		if k.flags&flagCached != 0 {
			cached++
			if b, ok := m.cache.get(k.hash); !ok || b != int32(i) {
				return fmt.Errorf("block %d: cached under %x but the map says %d, %v", i, k.hash, b, ok)
			}
		}
	}
	cfree := 0
	m.cache.each(func(_ uint64, b int32) {
		if m.blocks[b].ref == 0 {
			cfree++
		}
	})
	if cfree != m.cfree {
		return fmt.Errorf("%d free cached blocks, count %d", cfree, m.cfree)
	}
	if cached != m.cache.len() {
		return fmt.Errorf("%d cached blocks, %d hash map entries", cached, m.cache.len())
	}
	n := 0
	for l := range m.lists {
		prev := int32(-1)
		for b := m.lists[l].head; b >= 0; b = m.blocks[b].next {
			if n++; n > N {
				return fmt.Errorf("free list: a cycle")
			}
			k := &m.blocks[b]
			if k.prev != prev {
				return fmt.Errorf("free list %d: block %d's prev is %d, want %d", l, b, k.prev, prev)
			}
			if k.ref != 0 {
				return fmt.Errorf("free list %d: block %d has %d references", l, b, k.ref)
			}
			if m.listOf(b) != l {
				return fmt.Errorf("free list %d: block %d says it is in list %d", l, b, m.listOf(b))
			}
			prev = b
		}
		if prev != m.lists[l].tail {
			return fmt.Errorf("free list %d: ends at %d, tail %d", l, prev, m.lists[l].tail)
		}
	}
	if n != m.nfree {
		return fmt.Errorf("free list: %d blocks, count %d", n, m.nfree)
	}
	free := 0
	for i := range m.blocks {
		if m.blocks[i].ref == 0 {
			free++
		}
	}
	if free != n {
		return fmt.Errorf("free list: %d blocks, %d unreferenced", n, free)
	}
	return nil
}

// checkSeq checks one sequence and counts its references.
func (m *Manager) checkSeq(id SeqID, s *seq, B, N int, refs, where []int32, hostUsed []bool) error {
	if want := blocksFor(s.n, B); len(s.table) != want {
		return fmt.Errorf("sequence %d: %d tokens in %d blocks, want %d", id, s.n, len(s.table), want)
	}
	if len(s.partial) != s.n%B {
		return fmt.Errorf("sequence %d: %d tokens but %d in the partial block", id, s.n, len(s.partial))
	}
	if !m.cfg.NoPrefixCache && (len(s.hashes) != s.n/B || s.stored > len(s.hashes)) {
		return fmt.Errorf("sequence %d: %d tokens, %d block hashes, %d stored", id, s.n, len(s.hashes), s.stored)
	}
	if s.host != nil && len(s.host) != len(s.table) {
		return fmt.Errorf("sequence %d: %d host entries for %d blocks", id, len(s.host), len(s.table))
	}
	for j, b := range s.table {
		swapped := s.host != nil && s.host[j] != NoBlock
		if swapped {
			h := s.host[j]
			if h < 0 || int(h) >= len(hostUsed) || hostUsed[h] {
				return fmt.Errorf("sequence %d entry %d: bad or repeated host block %d", id, j, h)
			}
			hostUsed[h] = true
			if b != NoBlock {
				return fmt.Errorf("sequence %d entry %d: swapped out but names device block %d", id, j, b)
			}
			continue
		}
		if j < s.first {
			if b != NoBlock {
				return fmt.Errorf("sequence %d entry %d: before the window start %d but holds block %d", id, j, s.first, b)
			}
			continue
		}
		if b < 0 || int(b) >= N {
			return fmt.Errorf("sequence %d entry %d: block %d out of range", id, j, b)
		}
		// A block twice in one table would sit at two positions.
		if where[b] >= 0 && where[b] != int32(j) {
			return fmt.Errorf("block %d shared at table positions %d and %d", b, where[b], j)
		}
		where[b] = int32(j)
		refs[b]++
	}
	return nil
}
