package kvcache

import (
	"errors"
	"fmt"
)

// SeqID names a sequence (a request, or one branch of a fork).
type SeqID uint64

// NoBlock stands in a block table for a position whose block is not held:
// blocks that left a sliding window.
const NoBlock int32 = -1

// Errors; match with errors.Is.
var (
	// ErrOutOfBlocks: the request needs more free blocks than there are.
	// Nothing changed. The scheduler's cue to preempt.
	ErrOutOfBlocks = errors.New("kvcache: out of blocks")
	// ErrOutOfHostBlocks: a swap-out needs more host blocks than are free.
	ErrOutOfHostBlocks = errors.New("kvcache: out of host blocks")
	// ErrUnknownSeq: no such sequence.
	ErrUnknownSeq = errors.New("kvcache: unknown sequence")
	// ErrSeqExists: Add or Fork of an id already in use.
	ErrSeqExists = errors.New("kvcache: sequence already exists")
	// ErrSwapped: the sequence is on the host; swap it in first.
	ErrSwapped = errors.New("kvcache: sequence is swapped out")
	// ErrNotSwapped: SwapIn of a sequence that is on the device.
	ErrNotSwapped = errors.New("kvcache: sequence is not swapped out")
	// ErrInvalid: a bad configuration or argument.
	ErrInvalid = errors.New("kvcache: invalid argument")
)

// ManagerConfig sizes a Manager.
type ManagerConfig struct {
	// Blocks is the number of device blocks (≥ 1).
	Blocks int
	// BlockTokens is the tokens per block (default 16).
	BlockTokens int
	// HostBlocks is the number of host blocks for swap (0: no swap).
	HostBlocks int
	// Window, when positive, makes the layers a sliding-window group of
	// that many tokens: blocks whose every position is more than Window
	// positions behind the newest one are released (their table entry
	// becomes NoBlock). Prefix caching is off for a window group.
	Window int
	// NoPrefixCache turns prefix caching off: no hashes, no hits.
	NoPrefixCache bool
	// OnEvent, when set, receives every KV event (blocks stored in and
	// removed from the prefix cache, the cache cleared), synchronously.
	OnEvent func(Event)
}

// Move is one block copy of a swap: device block Block to or from host
// block Host.
type Move struct {
	Block, Host int32
}

// block flags.
const (
	flagCached = 1 << iota // in the hash map under hash
	flagFree               // in the free list
	flagHit                // served a prefix hit since it was cached
)

// block is one device block's metadata. prev and next link the free list
// (-1 ends it); they are meaningless while the block is held.
type block struct {
	prev, next int32
	ref        int32
	flags      uint32
	hash       uint64
	parent     uint64
}

// seq is one sequence's state.
type seq struct {
	table []int32
	n     int // tokens held
	// hashes are the chained hashes of the full blocks (with prefix
	// caching); the first stored of them are in the cache or were offered
	// to it: their K/V is computed.
	hashes []uint64
	stored int
	// partial holds the tokens of the incomplete last block, for its hash
	// when it fills.
	partial []int32
	extra   uint64
	// host is non-nil while swapped: host[j] is the host block holding
	// table entry j, or NoBlock for an entry still held on the device.
	host []int32
	// first is the index of the first table entry still held (window).
	first int
}

// Manager is the block manager: block tables, reference counts, the free
// list in eviction order, the prefix cache and host slots, all in host
// memory and independent of any device, so that a scheduler can run
// millions of operations in simulation. Every operation costs O(1) per
// block it touches. A Manager is not safe for concurrent use.
//
// The free list is intrusive and doubly linked, in eviction order: blocks
// that hold no cached prefix are taken first (the last freed first), then
// cached blocks that never served a hit, then cached blocks that did, each
// group in least-recently-freed order (a segmented LRU: a prefix proven
// shared outlives the private blocks of later sequences). A sequence's
// blocks are freed tail first, so that its first blocks, the likeliest to
// be shared, are evicted last. A prefix hit on a free cached block takes it
// out of the list wherever it is.
//
// Prefix caching: a full block's hash chains its parent's hash, its tokens
// and the sequence's extra key (an adapter id, say). Only full blocks are
// cached; freed blocks stay in the cache until evicted. Hashes are 64-bit:
// two different prefixes collide with probability about n²/2⁶⁵ for n cached
// blocks (10⁻⁷ for a million), an accepted risk as in vLLM's default.
type Manager struct {
	cfg    ManagerConfig
	blocks []block
	lists  [numLists]freeList
	nfree  int
	cfree  int // free blocks that are cached
	seqs   seqTable
	spare  []*seq // freed sequences, their slices reused
	cache  hashTable
	host   []int32 // free host blocks (a stack)
	copyFn func(src, dst int32) error
	st     counters
}

// counters are the Manager's monotone statistics.
type counters struct {
	queries, hits   uint64 // prefix lookups and hits, in blocks
	evictions       uint64
	cows            uint64
	allocs, frees   uint64
	swapOut, swapIn uint64 // blocks moved
	storedBlocks    uint64
}

// NewManager returns a Manager with every block free.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.BlockTokens == 0 {
		cfg.BlockTokens = 16
	}
	switch {
	case cfg.Blocks < 1 || cfg.Blocks > 1<<30:
		return nil, fmt.Errorf("%w: %d blocks, want 1..2^30", ErrInvalid, cfg.Blocks)
	case cfg.BlockTokens < 1 || cfg.BlockTokens > 1<<16:
		return nil, fmt.Errorf("%w: %d tokens per block, want 1..65536", ErrInvalid, cfg.BlockTokens)
	case cfg.HostBlocks < 0 || cfg.HostBlocks > 1<<30:
		return nil, fmt.Errorf("%w: %d host blocks, want 0..2^30", ErrInvalid, cfg.HostBlocks)
	case cfg.Window < 0:
		return nil, fmt.Errorf("%w: window of %d tokens", ErrInvalid, cfg.Window)
	}
	if cfg.Window > 0 {
		cfg.NoPrefixCache = true
	}
	m := &Manager{cfg: cfg, blocks: make([]block, cfg.Blocks),
		seqs: newSeqTable()}
	m.cache = newHashTable(0)
	if !cfg.NoPrefixCache {
		m.cache = newHashTable(cfg.Blocks)
	}
	for l := range m.lists {
		m.lists[l] = freeList{-1, -1}
	}
	for i := range m.blocks {
		m.pushBack(int32(i), listUncached)
	}
	m.host = make([]int32, cfg.HostBlocks)
	for i := range m.host {
		m.host[i] = int32(cfg.HostBlocks - 1 - i)
	}
	return m, nil
}

// Config returns the configuration with defaults filled in.
func (m *Manager) Config() ManagerConfig { return m.cfg }

// SetCopy sets the function that copies device block src to dst when a
// sequence appends into a block it shares (copy-on-write). The device
// Cache sets it; without one, copies are only counted.
func (m *Manager) SetCopy(f func(src, dst int32) error) { m.copyFn = f }

// --- the free list ---
//
// Three intrusive lists in eviction order, taken from in turn: blocks that
// hold no cached prefix (newest first: the last freed is the warmest), then
// cached blocks no other sequence has hit, then cached blocks that served a
// prefix hit, each least recently freed first (a segmented LRU: a proven
// shared prefix outlives the private blocks of later sequences).

const (
	listUncached = iota
	listCold
	listHot
	numLists
	listShift = 8 // flags bits holding a free block's list
)

type freeList struct{ head, tail int32 }

func (m *Manager) listOf(b int32) int { return int(m.blocks[b].flags>>listShift) & 3 }

func (m *Manager) pushBack(b int32, l int) {
	k := &m.blocks[b]
	fl := &m.lists[l]
	k.prev, k.next = fl.tail, -1
	if fl.tail >= 0 {
		m.blocks[fl.tail].next = b
	} else {
		fl.head = b
	}
	fl.tail = b
	k.flags = k.flags&^(3<<listShift) | flagFree | uint32(l)<<listShift
	m.nfree++
}

func (m *Manager) pushFront(b int32, l int) {
	k := &m.blocks[b]
	fl := &m.lists[l]
	k.prev, k.next = -1, fl.head
	if fl.head >= 0 {
		m.blocks[fl.head].prev = b
	} else {
		fl.tail = b
	}
	fl.head = b
	k.flags = k.flags&^(3<<listShift) | flagFree | uint32(l)<<listShift
	m.nfree++
}

func (m *Manager) unlink(b int32) {
	k := &m.blocks[b]
	fl := &m.lists[m.listOf(b)]
	if k.prev >= 0 {
		m.blocks[k.prev].next = k.next
	} else {
		fl.head = k.next
	}
	if k.next >= 0 {
		m.blocks[k.next].prev = k.prev
	} else {
		fl.tail = k.prev
	}
	k.prev, k.next = -1, -1
	k.flags &^= flagFree
	m.nfree--
}

// take removes the front free block, evicting its cached prefix, and
// returns it with one reference. The caller has checked nfree > 0.
func (m *Manager) take() int32 {
	l := 0
	for m.lists[l].head < 0 {
		l++
	}
	b := m.lists[l].head
	m.unlink(b)
	k := &m.blocks[b]
	if k.flags&flagCached != 0 {
		m.cfree--
		m.uncache(b)
		m.st.evictions++
	}
	k.ref = 1
	m.st.allocs++
	return b
}

// warmVictim prefetches the hash slot of the block the next take evicts,
// so that its removal from the prefix cache finds the slot in the cache.
func (m *Manager) warmVictim() {
	for l := range m.lists {
		if h := m.lists[l].head; h >= 0 {
			if k := &m.blocks[h]; k.flags&flagCached != 0 {
				m.cache.warm(k.hash)
			}
			return
		}
	}
}

// ref adds a reference to block b, taking it out of the free list when it
// was there (a prefix hit on a freed block: the "touch").
func (m *Manager) ref(b int32) {
	k := &m.blocks[b]
	if k.ref == 0 {
		m.unlink(b)
		if k.flags&flagCached != 0 {
			m.cfree--
		}
	}
	k.ref++
}

// unref drops a reference; a block left without one goes to the free list:
// to the back of the cold or hot list when it holds a cached prefix, to the
// front of the uncached one otherwise.
func (m *Manager) unref(b int32) {
	k := &m.blocks[b]
	k.ref--
	if k.ref > 0 {
		return
	}
	if k.ref < 0 {
		panic("kvcache: block reference count below zero")
	}
	m.st.frees++
	switch {
	case k.flags&flagHit != 0:
		m.cfree++
		m.pushBack(b, listHot)
	case k.flags&flagCached != 0:
		m.cfree++
		m.pushBack(b, listCold)
	default:
		m.pushFront(b, listUncached)
	}
}

func (m *Manager) uncache(b int32) {
	k := &m.blocks[b]
	m.cache.del(k.hash)
	k.flags &^= flagCached | flagHit
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(Event{Kind: BlockRemoved, Hash: k.hash, Parent: k.parent, Block: b, Tokens: m.cfg.BlockTokens})
	}
	k.hash, k.parent = 0, 0
}

// store caches full block b under hash h (child of parent) unless another
// block already holds that hash.
func (m *Manager) store(b int32, h, parent uint64) {
	if m.cfg.NoPrefixCache {
		return
	}
	if _, dup := m.cache.get(h); dup {
		return
	}
	k := &m.blocks[b]
	if k.flags&flagCached != 0 {
		return
	}
	m.cache.put(h, b)
	k.hash, k.parent = h, parent
	k.flags |= flagCached
	m.st.storedBlocks++
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(Event{Kind: BlockStored, Hash: h, Parent: parent, Block: b, Tokens: m.cfg.BlockTokens})
	}
}

// --- sequences ---

func (m *Manager) get(id SeqID) (*seq, error) {
	s, ok := m.seqs.get(id)
	if !ok {
		return nil, fmt.Errorf("sequence %d: %w", id, ErrUnknownSeq)
	}
	return s, nil
}

func (m *Manager) running(id SeqID) (*seq, error) {
	s, err := m.get(id)
	if err == nil && s.host != nil {
		err = fmt.Errorf("sequence %d: %w", id, ErrSwapped)
	}
	return s, err
}

func blocksFor(tokens, per int) int { return (tokens + per - 1) / per }

// maxSpare bounds the freed sequences kept for reuse.
const maxSpare = 1024

// newSeq returns an empty sequence, reusing a freed one's slices.
func (m *Manager) newSeq() *seq {
	if n := len(m.spare); n > 0 {
		s := m.spare[n-1]
		m.spare = m.spare[:n-1]
		*s = seq{table: s.table[:0], hashes: s.hashes[:0], partial: s.partial[:0]}
		return s
	}
	return &seq{partial: make([]int32, 0, m.cfg.BlockTokens)}
}

func (m *Manager) recycle(s *seq) {
	if len(m.spare) < maxSpare && cap(s.table) <= 1<<12 {
		m.spare = append(m.spare, s)
	}
}

// Add creates sequence id holding prompt: blocks of the prompt's longest
// cached prefix are shared (a prefix hit) and the rest are taken from the
// free list. It returns how many leading tokens already have their K/V in
// the cache: whole blocks, and at most len(prompt)-1 so that the last token
// is always computed (its logits start generation; its K/V is rewritten
// with the same values). extraKey separates caches that must not share (an
// adapter id). The prompt's full blocks enter the prefix cache once their
// K/V is computed: at the sequence's next Append, or at Computed.
// ErrOutOfBlocks leaves everything unchanged.
func (m *Manager) Add(id SeqID, prompt []int32, extraKey uint64) (cachedTokens int, err error) {
	if _, dup := m.seqs.get(id); dup {
		return 0, fmt.Errorf("add sequence %d: %w", id, ErrSeqExists)
	}
	B := m.cfg.BlockTokens
	nfull := len(prompt) / B
	need := blocksFor(len(prompt), B)
	s := m.newSeq()
	s.n, s.extra = len(prompt), extraKey
	// The hits, and how many of them are free blocks that taking would
	// remove from the free list.
	hits, freeHits := 0, 0
	if !m.cfg.NoPrefixCache {
		h := rootHash(extraKey)
		for j := range nfull {
			h = chainHash(h, extraKey, prompt[j*B:(j+1)*B])
			s.hashes = append(s.hashes, h)
		}
		for hits < nfull {
			b, ok := m.cache.get(s.hashes[hits])
			if !ok {
				break
			}
			if m.blocks[b].ref == 0 {
				freeHits++
			}
			hits++
		}
		m.st.queries += uint64(nfull)
		m.st.hits += uint64(hits)
	}
	if need-hits > m.nfree-freeHits {
		m.recycle(s)
		return 0, fmt.Errorf("add sequence %d: %d tokens need %d new blocks, %d free: %w",
			id, len(prompt), need-hits, m.nfree-freeHits, ErrOutOfBlocks)
	}
	for j := range hits {
		b, _ := m.cache.get(s.hashes[j])
		m.ref(b)
		m.blocks[b].flags |= flagHit
		s.table = append(s.table, b)
	}
	for range need - hits {
		s.table = append(s.table, m.take())
	}
	s.stored = hits
	s.partial = append(s.partial, prompt[nfull*B:]...)
	m.seqs.put(id, s)
	cachedTokens = hits * B
	if cachedTokens == len(prompt) && cachedTokens > 0 {
		cachedTokens--
	}
	m.window(s)
	return cachedTokens, nil
}

// AddNeeds returns how many free blocks Add(·, prompt, extraKey) would take
// now: the prompt's blocks less its cached prefix (counting a hit on a free
// cached block as taken, since it leaves the free list).
func (m *Manager) AddNeeds(prompt []int32, extraKey uint64) int {
	B := m.cfg.BlockTokens
	need := blocksFor(len(prompt), B)
	if m.cfg.NoPrefixCache {
		return need
	}
	h := rootHash(extraKey)
	for j := 0; j < len(prompt)/B; j++ {
		h = chainHash(h, extraKey, prompt[j*B:(j+1)*B])
		b, ok := m.cache.get(h)
		if !ok {
			break
		}
		if m.blocks[b].ref > 0 {
			need--
		}
	}
	return need
}

// Computed says that the K/V of id's first n positions is written: its
// full blocks among them enter the prefix cache (a block whose hash another
// block already holds stays out). Append implies Computed(id, Len(id)).
func (m *Manager) Computed(id SeqID, n int) error {
	s, err := m.running(id)
	if err != nil {
		return err
	}
	m.commit(s, min(n, s.n))
	return nil
}

// commit stores the full blocks among s's first n positions.
func (m *Manager) commit(s *seq, n int) {
	if m.cfg.NoPrefixCache {
		return
	}
	for full := min(n/m.cfg.BlockTokens, len(s.hashes)); s.stored < full; s.stored++ {
		j := s.stored
		parent := rootHash(s.extra)
		if j > 0 {
			parent = s.hashes[j-1]
		}
		m.store(s.table[j], s.hashes[j], parent)
	}
}

// AppendNeeds returns how many free blocks appending k tokens to id takes
// (new blocks, plus one when its last block is shared and must be copied).
func (m *Manager) AppendNeeds(id SeqID, k int) (int, error) {
	s, err := m.running(id)
	if err != nil {
		return 0, err
	}
	return m.appendNeeds(s, k), nil
}

func (m *Manager) appendNeeds(s *seq, k int) int {
	B := m.cfg.BlockTokens
	need := blocksFor(s.n+k, B) - blocksFor(s.n, B)
	if k > 0 && s.n%B != 0 && m.blocks[s.table[len(s.table)-1]].ref > 1 {
		need++
	}
	return need
}

// Append makes room for tokens after id's last one: new blocks as
// positions cross block boundaries, and a private copy of the last block
// when it is partially filled and shared with a fork (copy-on-write, through
// the copy function). Calling it says that the K/V of every position before
// the new tokens is computed (the engine appends a token once it has run
// the step for the one before): full blocks among them enter the prefix
// cache. ErrOutOfBlocks leaves everything unchanged (but the caching).
func (m *Manager) Append(id SeqID, tokens ...int32) error {
	s, err := m.running(id)
	if err != nil {
		return err
	}
	if need := m.appendNeeds(s, len(tokens)); need > m.nfree {
		return fmt.Errorf("append %d tokens to sequence %d: %d blocks needed, %d free: %w", len(tokens), id, need, m.nfree, ErrOutOfBlocks)
	}
	if s.n%m.cfg.BlockTokens == 0 && len(tokens) > 0 {
		m.warmVictim()
	}
	m.commit(s, s.n)
	B := m.cfg.BlockTokens
	for len(tokens) > 0 {
		if s.n%B == 0 {
			s.table = append(s.table, m.take())
		} else if last := s.table[len(s.table)-1]; m.blocks[last].ref > 1 {
			nb := m.take()
			if m.copyFn != nil {
				if err := m.copyFn(last, nb); err != nil {
					m.unref(nb)
					return fmt.Errorf("append to sequence %d: copy-on-write of block %d: %w", id, last, err)
				}
			}
			m.st.cows++
			m.unref(last)
			s.table[len(s.table)-1] = nb
		}
		k := min(B-s.n%B, len(tokens))
		s.partial = append(s.partial, tokens[:k]...)
		s.n += k
		tokens = tokens[k:]
		if s.n%B == 0 {
			if !m.cfg.NoPrefixCache {
				parent := rootHash(s.extra)
				if len(s.hashes) > 0 {
					parent = s.hashes[len(s.hashes)-1]
				}
				h := chainHash(parent, s.extra, s.partial)
				s.hashes = append(s.hashes, h)
				m.cache.warm(h) // stored at the next Append or Computed
			}
			s.partial = s.partial[:0]
		}
	}
	m.window(s)
	return nil
}

// window releases the blocks of a window group that left the window.
func (m *Manager) window(s *seq) {
	W := m.cfg.Window
	if W <= 0 {
		return
	}
	B := m.cfg.BlockTokens
	// Block j covers positions [jB, (j+1)B); the newest position is n-1 and
	// attention reaches back to n-W. Block j is out when (j+1)B ≤ n-W.
	for s.first < len(s.table) && (s.first+1)*B <= s.n-W {
		m.unref(s.table[s.first])
		s.table[s.first] = NoBlock
		s.first++
	}
}

// Table returns id's block table: position p lives in block
// Table[p/BlockTokens] at slot p%BlockTokens. The slice is the Manager's:
// read it before the next call that changes id; nil for an unknown or
// swapped-out sequence.
func (m *Manager) Table(id SeqID) []int32 {
	s, ok := m.seqs.get(id)
	if !ok || s.host != nil {
		return nil
	}
	return s.table
}

// Len returns the tokens id holds (0 for an unknown sequence).
func (m *Manager) Len(id SeqID) int {
	if s, ok := m.seqs.get(id); ok {
		return s.n
	}
	return 0
}

// Blocks returns the number of blocks id holds on the device (0 for an
// unknown one).
func (m *Manager) Blocks(id SeqID) int {
	s, ok := m.seqs.get(id)
	if !ok {
		return 0
	}
	n := 0
	for j, b := range s.table {
		if b != NoBlock && (s.host == nil || s.host[j] == NoBlock) {
			n++
		}
	}
	return n
}

// Fork makes child a copy of parent that shares all its blocks (each gains
// a reference); the first append into a shared, partially filled block
// copies it. Fork takes no free block and cannot run out.
func (m *Manager) Fork(parent, child SeqID) error {
	p, err := m.running(parent)
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	if _, dup := m.seqs.get(child); dup {
		return fmt.Errorf("fork %d into %d: %w", parent, child, ErrSeqExists)
	}
	c := m.newSeq()
	c.n, c.extra, c.stored, c.first = p.n, p.extra, p.stored, p.first
	c.table = append(c.table, p.table...)
	c.hashes = append(c.hashes, p.hashes...)
	c.partial = append(c.partial, p.partial...)
	for _, b := range c.table {
		if b != NoBlock {
			m.ref(b)
		}
	}
	m.seqs.put(child, c)
	return nil
}

// Free drops id and its references, tail first. Blocks left unreferenced
// return to the free list; the cached ones stay cached until evicted. A
// swapped-out sequence's host blocks are released too.
func (m *Manager) Free(id SeqID) error {
	s, err := m.get(id)
	if err != nil {
		return fmt.Errorf("free: %w", err)
	}
	for j := len(s.table) - 1; j >= 0; j-- {
		if s.host != nil && s.host[j] != NoBlock {
			m.host = append(m.host, s.host[j])
			continue
		}
		if b := s.table[j]; b != NoBlock {
			m.unref(b)
		}
	}
	m.seqs.del(id)
	m.recycle(s)
	return nil
}

// SwapOutNeeds returns the host blocks swapping id out takes: its blocks no
// other sequence references.
func (m *Manager) SwapOutNeeds(id SeqID) (int, error) {
	s, err := m.running(id)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, b := range s.table {
		if b != NoBlock && m.blocks[b].ref == 1 {
			n++
		}
	}
	return n, nil
}

// SwapOut moves id to the host: each block that only id references gets a
// host block and is released (it keeps its cached prefix until evicted);
// shared blocks stay referenced on the device. The returned moves say which
// device block to copy to which host block; the caller copies them before
// any released block is written again. ErrOutOfHostBlocks leaves
// everything unchanged.
func (m *Manager) SwapOut(id SeqID) ([]Move, error) {
	n, err := m.SwapOutNeeds(id)
	if err != nil {
		return nil, fmt.Errorf("swap out: %w", err)
	}
	if n > len(m.host) {
		return nil, fmt.Errorf("swap out sequence %d: %d host blocks needed, %d free: %w", id, n, len(m.host), ErrOutOfHostBlocks)
	}
	s, _ := m.seqs.get(id)
	s.host = make([]int32, len(s.table))
	moves := make([]Move, 0, n)
	// Host blocks in table order (so that blocks adjacent on the device
	// and in the table move in one copy), then the releases tail first.
	for j, b := range s.table {
		s.host[j] = NoBlock
		if b == NoBlock || m.blocks[b].ref != 1 {
			continue
		}
		h := m.host[len(m.host)-1]
		m.host = m.host[:len(m.host)-1]
		s.host[j] = h
		moves = append(moves, Move{Block: b, Host: h})
	}
	for j := len(s.table) - 1; j >= 0; j-- {
		if s.host[j] != NoBlock {
			m.unref(s.table[j])
			s.table[j] = NoBlock
		}
	}
	m.st.swapOut += uint64(len(moves))
	return moves, nil
}

// SwapInNeeds returns the device blocks swapping id in takes.
func (m *Manager) SwapInNeeds(id SeqID) (int, error) {
	s, err := m.get(id)
	if err != nil {
		return 0, err
	}
	if s.host == nil {
		return 0, fmt.Errorf("sequence %d: %w", id, ErrNotSwapped)
	}
	n := 0
	for _, h := range s.host {
		if h != NoBlock {
			n++
		}
	}
	return n, nil
}

// SwapIn brings id back: each host block gets a device block and is
// released. The returned moves say which host block to copy to which device
// block; the sequence may run once they are copied. ErrOutOfBlocks leaves
// everything unchanged.
func (m *Manager) SwapIn(id SeqID) ([]Move, error) {
	n, err := m.SwapInNeeds(id)
	if err != nil {
		return nil, fmt.Errorf("swap in: %w", err)
	}
	if n > m.nfree {
		return nil, fmt.Errorf("swap in sequence %d: %d blocks needed, %d free: %w", id, n, m.nfree, ErrOutOfBlocks)
	}
	s, _ := m.seqs.get(id)
	moves := make([]Move, 0, n)
	for j, h := range s.host {
		if h == NoBlock {
			continue
		}
		b := m.take()
		s.table[j] = b
		moves = append(moves, Move{Block: b, Host: h})
		m.host = append(m.host, h)
	}
	s.host = nil
	m.st.swapIn += uint64(len(moves))
	return moves, nil
}

// Swapped reports whether id is swapped out.
func (m *Manager) Swapped(id SeqID) bool {
	s, ok := m.seqs.get(id)
	return ok && s.host != nil
}

// ClearPrefixCache forgets every cached prefix (free blocks stay free) and
// sends one AllCleared event.
func (m *Manager) ClearPrefixCache() {
	m.cache.each(func(_ uint64, b int32) {
		k := &m.blocks[b]
		k.flags &^= flagCached | flagHit
		k.hash, k.parent = 0, 0
	})
	m.cache.clear()
	m.cfree = 0
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(Event{Kind: AllCleared, Block: NoBlock})
	}
}

// FreeBlocks returns the number of free device blocks (cached ones
// included: they are taken when needed).
func (m *Manager) FreeBlocks() int { return m.nfree }

// FreeHostBlocks returns the number of free host blocks.
func (m *Manager) FreeHostBlocks() int { return len(m.host) }

// Seqs returns the number of sequences.
func (m *Manager) Seqs() int { return m.seqs.len() }

// Stats is a snapshot of a Manager's accounting.
type Stats struct {
	Blocks      int `json:"blocks"`
	UsedBlocks  int `json:"used_blocks"`  // referenced by a sequence
	FreeBlocks  int `json:"free_blocks"`  // unreferenced, cached ones included
	CachedFree  int `json:"cached_free"`  // free blocks still holding a cached prefix
	CachedTotal int `json:"cached_total"` // blocks in the prefix cache
	HostBlocks  int `json:"host_blocks"`
	HostUsed    int `json:"host_used"`
	Seqs        int `json:"seqs"`
	// PrefixQueries and PrefixHits count full prompt blocks looked up in
	// the prefix cache and found.
	PrefixQueries uint64 `json:"prefix_queries"`
	PrefixHits    uint64 `json:"prefix_hits"`
	Evictions     uint64 `json:"evictions"`
	CopyOnWrites  uint64 `json:"copy_on_writes"`
	Allocs        uint64 `json:"allocs"`
	Frees         uint64 `json:"frees"`
	SwappedOut    uint64 `json:"swapped_out_blocks"`
	SwappedIn     uint64 `json:"swapped_in_blocks"`
}

// Stats returns the counters.
func (m *Manager) Stats() Stats {
	cf := m.cfree
	return Stats{Blocks: len(m.blocks), UsedBlocks: len(m.blocks) - m.nfree, FreeBlocks: m.nfree,
		CachedFree: cf, CachedTotal: m.cache.len(), HostBlocks: m.cfg.HostBlocks,
		HostUsed: m.cfg.HostBlocks - len(m.host), Seqs: m.seqs.len(),
		PrefixQueries: m.st.queries, PrefixHits: m.st.hits, Evictions: m.st.evictions,
		CopyOnWrites: m.st.cows, Allocs: m.st.allocs, Frees: m.st.frees,
		SwappedOut: m.st.swapOut, SwappedIn: m.st.swapIn}
}
