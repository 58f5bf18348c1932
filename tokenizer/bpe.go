package tokenizer

import (
	"container/heap"
	"unicode/utf8"
)

// model turns one pre-tokenized piece into ids, appended to out.
type model interface {
	tokenize(piece string, out []int) []int
}

// bpe is HF's BPE model: a piece starts as its runes (each one a vocabulary
// token, or its <0xNN> bytes with byte fallback, or the unknown token), then
// the pair of neighbours with the lowest merge rank is merged, leftmost first,
// until no pair has a merge.
type bpe struct {
	vocab        map[string]int
	merges       map[uint64]merge // pair of ids → rank and result
	unk          int              // -1: none, unknown runes are dropped
	fuseUnk      bool
	byteFallback bool
	byteIDs      [256]int // <0xNN> ids, -1 where missing
	ignoreMerges bool     // a piece that is a token is that token (Llama-3)
	prefix       string   // continuing_subword_prefix
	suffix       string   // end_of_word_suffix
}

type merge struct {
	rank int32
	id   int32
}

func pairKey(a, b int) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// symbol is one part of the word being merged, linked to its neighbours.
type symbol struct {
	id         int
	prev, next int // indexes into the word; -1 at the ends
	dead       bool
}

func (m *bpe) tokenize(piece string, out []int) []int {
	if piece == "" {
		return out
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[piece]; ok {
			return append(out, id)
		}
	}
	word := m.initial(piece)
	m.mergeAll(word)
	for _, s := range word {
		if !s.dead {
			out = append(out, s.id)
		}
	}
	return out
}

// initial is the word before any merge, as HF's merge_word builds it.
func (m *bpe) initial(w string) []symbol {
	word := make([]symbol, 0, len(w))
	add := func(id int) {
		word = append(word, symbol{id: id, prev: len(word) - 1, next: len(word) + 1})
	}
	pendingUnk := false
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		s := w[i : i+n]
		if i > 0 && m.prefix != "" {
			s = m.prefix + s
		}
		if i+n == len(w) && m.suffix != "" {
			s += m.suffix
		}
		i += n
		if id, ok := m.vocab[s]; ok {
			if pendingUnk {
				add(m.unk)
				pendingUnk = false
			}
			add(id)
			continue
		}
		if m.byteFallback && m.allBytes(s) {
			// As in HF, a pending unknown waits for the next vocabulary
			// token: byte pieces go before it.
			for k := 0; k < len(s); k++ {
				add(m.byteIDs[s[k]])
			}
			continue
		}
		if m.unk < 0 {
			continue
		}
		if pendingUnk && !m.fuseUnk {
			add(m.unk)
		}
		pendingUnk = true
	}
	if pendingUnk {
		add(m.unk)
	}
	if len(word) > 0 {
		word[len(word)-1].next = -1
	}
	return word
}

func (m *bpe) allBytes(s string) bool {
	for k := 0; k < len(s); k++ {
		if m.byteIDs[s[k]] < 0 {
			return false
		}
	}
	return true
}

// candidate is a possible merge of word[pos] with its next symbol.
type candidate struct {
	pos  int
	rank int32
	id   int32
}

type candidates []candidate

func (h candidates) Len() int { return len(h) }
func (h candidates) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h candidates) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candidates) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *candidates) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeAll applies merges as HF's Word::merge_all does, with its queue: the
// lowest rank first, then the leftmost; an entry whose pair has changed since
// it was queued is dropped.
func (m *bpe) mergeAll(word []symbol) {
	if len(word) < 2 || len(m.merges) == 0 {
		return
	}
	q := make(candidates, 0, len(word))
	for i := 0; i+1 < len(word); i++ {
		if mg, ok := m.merges[pairKey(word[i].id, word[i+1].id)]; ok {
			q = append(q, candidate{i, mg.rank, mg.id})
		}
	}
	heap.Init(&q)
	for q.Len() > 0 {
		top := heap.Pop(&q).(candidate)
		cur := &word[top.pos]
		if cur.dead || cur.next < 0 {
			continue
		}
		right := &word[cur.next]
		if mg, ok := m.merges[pairKey(cur.id, right.id)]; !ok || mg.id != top.id {
			continue // stale
		}
		cur.id = int(top.id)
		right.dead = true
		cur.next = right.next
		if cur.next >= 0 {
			word[cur.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if mg, ok := m.merges[pairKey(word[cur.prev].id, cur.id)]; ok {
				heap.Push(&q, candidate{cur.prev, mg.rank, mg.id})
			}
		}
		if cur.next >= 0 {
			if mg, ok := m.merges[pairKey(cur.id, word[cur.next].id)]; ok {
				heap.Push(&q, candidate{top.pos, mg.rank, mg.id})
			}
		}
	}
}
