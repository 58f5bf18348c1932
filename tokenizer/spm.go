package tokenizer

import "container/heap"

// spm is SentencePiece BPE as llama.cpp runs it on a GGUF "llama"
// vocabulary: a piece starts as its UTF-8 characters; the neighbouring pair
// whose concatenation is a token with the highest score merges first (the
// leftmost among equals), until no pair is a token; a part that is no token
// becomes its <0xNN> byte tokens, else the unknown token.
type spm struct {
	vocab   map[string]int
	scores  []float32
	byteIDs [256]int
	unk     int
}

// spmSym is one part of the piece: a byte range and its neighbours.
type spmSym struct {
	start, end int
	prev, next int
}

type bigram struct {
	left, right int // symbol indexes
	score       float32
	size        int // bytes of the pair when queued
}

type bigrams []bigram

func (h bigrams) Len() int { return len(h) }
func (h bigrams) Less(i, j int) bool {
	if h[i].score != h[j].score {
		return h[i].score > h[j].score
	}
	return h[i].left < h[j].left
}
func (h bigrams) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *bigrams) Push(x any)   { *h = append(*h, x.(bigram)) }
func (h *bigrams) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (m *spm) tokenize(s string, out []int) []int {
	if s == "" {
		return out
	}
	syms := make([]spmSym, 0, len(s))
	for i := 0; i < len(s); {
		n := utf8lenLead(s[i])
		if i+n > len(s) {
			n = len(s) - i
		}
		syms = append(syms, spmSym{start: i, end: i + n, prev: len(syms) - 1, next: len(syms) + 1})
		i += n
	}
	syms[len(syms)-1].next = -1
	q := make(bigrams, 0, len(syms))
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		text := s[syms[l].start:syms[r].end]
		if id, ok := m.vocab[text]; ok {
			heap.Push(&q, bigram{left: l, right: r, score: m.scores[id], size: len(text)})
		}
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.Len() > 0 {
		b := heap.Pop(&q).(bigram)
		l, r := &syms[b.left], &syms[b.right]
		if l.end == l.start || r.end == r.start || l.end-l.start+r.end-r.start != b.size || l.next != b.right {
			continue // one side has merged since
		}
		l.end = r.end
		r.start = r.end // dead
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		try(l.prev, b.left)
		try(b.left, l.next)
	}
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		text := s[syms[i].start:syms[i].end]
		if id, ok := m.vocab[text]; ok {
			out = append(out, id)
			continue
		}
		for k := 0; k < len(text); k++ {
			switch {
			case m.byteIDs[text[k]] >= 0:
				out = append(out, m.byteIDs[text[k]])
			case m.unk >= 0:
				out = append(out, m.unk)
			}
		}
	}
	return out
}

// utf8lenLead is the length llama.cpp gives a character from its first byte
// (1 for a continuation byte, 4 for 0xF0 and above).
func utf8lenLead(c byte) int {
	switch {
	case c < 0xC0:
		return 1
	case c < 0xE0:
		return 2
	case c < 0xF0:
		return 3
	}
	return 4
}
