package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// normalizer rewrites a run of text before it is split (tokenizer.json's
// "normalizer").
type normalizer interface {
	normalize(s string) string
}

// prependNormalizer puts its text before any non-empty input (Llama-2's "▁").
type prependNormalizer struct{ prefix string }

func (n prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

// replaceNormalizer replaces every occurrence of a string.
type replaceNormalizer struct{ old, new string }

func (n replaceNormalizer) normalize(s string) string {
	if n.old == "" {
		return s
	}
	return strings.ReplaceAll(s, n.old, n.new)
}

// stripNormalizer removes whitespace at either end.
type stripNormalizer struct{ left, right bool }

func (n stripNormalizer) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// preTokenizer cuts a piece of normalized text into smaller pieces (and may
// rewrite them), appending them to out. first says the piece starts the
// input.
type preTokenizer interface {
	split(s string, first bool, out []string) []string
}

// byteLevel is HF's ByteLevel pre-tokenizer: an optional leading space, the
// GPT-2 split when useRegex, then every byte written as its printable rune.
type byteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

func (b byteLevel) split(s string, _ bool, out []string) []string {
	if b.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if !b.useRegex {
		return append(out, byteLevelEncode(s))
	}
	for _, m := range (splitPattern{match: matchGPT2}).findAll(s) {
		out = append(out, byteLevelEncode(s[m[0]:m[1]]))
	}
	return out
}

// splitBehavior says where a Split pre-tokenizer's matches go.
type splitBehavior int

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

// splitPre is HF's Split pre-tokenizer on one of the known patterns, or on
// a literal string.
type splitPre struct {
	pattern  splitPattern
	literal  string // when pattern.match is nil
	behavior splitBehavior
	invert   bool
}

func (p splitPre) matches(s string) [][2]int {
	if p.pattern.match != nil {
		return p.pattern.findAll(s)
	}
	var out [][2]int
	for i := 0; p.literal != "" && i <= len(s); {
		k := strings.Index(s[i:], p.literal)
		if k < 0 {
			break
		}
		out = append(out, [2]int{i + k, i + k + len(p.literal)})
		i += k + len(p.literal)
	}
	return out
}

func (p splitPre) split(s string, _ bool, out []string) []string {
	// Mark each byte range as a match or not, then group as the behavior says.
	type span struct {
		a, b  int
		match bool
	}
	var spans []span
	prev := 0
	for _, m := range p.matches(s) {
		if prev < m[0] {
			spans = append(spans, span{prev, m[0], false})
		}
		spans = append(spans, span{m[0], m[1], true})
		prev = m[1]
	}
	if prev < len(s) {
		spans = append(spans, span{prev, len(s), false})
	}
	if p.invert {
		for i := range spans {
			spans[i].match = !spans[i].match
		}
	}
	emit := func(a, b int) {
		if a < b {
			out = append(out, s[a:b])
		}
	}
	switch p.behavior {
	case splitRemoved:
		for _, sp := range spans {
			if !sp.match {
				emit(sp.a, sp.b)
			}
		}
	case splitIsolated:
		for _, sp := range spans {
			emit(sp.a, sp.b)
		}
	case splitMergedWithPrevious:
		// As HF folds the spans: a match right after a non-match joins the
		// piece before it; every other span starts a piece.
		start := -1
		for i, sp := range spans {
			if sp.match && i > 0 && !spans[i-1].match {
				continue
			}
			if start >= 0 {
				emit(start, sp.a)
			}
			start = sp.a
		}
		if start >= 0 {
			emit(start, len(s))
		}
	case splitMergedWithNext:
		// The mirror image: a match right before a non-match joins the piece
		// after it; every other span ends a piece.
		start := 0
		for i, sp := range spans {
			if sp.match && i+1 < len(spans) && !spans[i+1].match {
				continue
			}
			emit(start, sp.b)
			start = sp.b
		}
	case splitContiguous:
		start := 0
		for i, sp := range spans {
			if i > 0 && sp.match != spans[i-1].match {
				emit(start, sp.a)
				start = sp.a
			}
		}
		emit(start, len(s))
	}
	return out
}

// metaspace is HF's Metaspace pre-tokenizer: spaces become the replacement
// rune, which is put first as the scheme says, and optionally splits before
// each replacement.
type metaspace struct {
	replacement string
	scheme      string // "always", "first" or "never"
	splitEach   bool
}

func (m metaspace) split(s string, first bool, out []string) []string {
	s = strings.ReplaceAll(s, " ", m.replacement)
	if !strings.HasPrefix(s, m.replacement) && (m.scheme == "always" || m.scheme == "first" && first) {
		s = m.replacement + s
	}
	if !m.splitEach {
		return append(out, s)
	}
	return splitPre{literal: m.replacement, behavior: splitMergedWithNext}.split(s, false, out)
}

// digits is HF's Digits pre-tokenizer: runs of numeric characters (or
// single ones) apart from the rest. Numeric is Rust's char::is_numeric: the
// categories Nd, Nl and No (so Ⅳ and ² too, not only 0-9 and other decimal
// digits).
type digits struct{ individual bool }

func (d digits) split(s string, _ bool, out []string) []string {
	isDigit := func(s string, i int) (int, bool) {
		r, w := utf8.DecodeRuneInString(s[i:])
		return w, unicode.In(r, unicode.Nd, unicode.Nl, unicode.No)
	}
	start := 0
	for i := 0; i < len(s); {
		w, dg := isDigit(s, i)
		if dg {
			if start < i {
				out = append(out, s[start:i])
			}
			j := i + w
			if !d.individual {
				for j < len(s) {
					w2, d2 := isDigit(s, j)
					if !d2 {
						break
					}
					j += w2
				}
			}
			out = append(out, s[i:j])
			start, i = j, j
			continue
		}
		i += w
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// The byte-level alphabet (GPT-2's bytes_to_unicode): printable bytes stand
// for themselves, the others for the runes from U+0100 on, in byte order.
type byteAlphabet struct {
	toStr    [256]string
	fromRune [256 + 68]int16 // rune → byte; -1 for runes that stand for none
}

var alphabet = newByteAlphabet() // a constant table

func newByteAlphabet() *byteAlphabet {
	a := &byteAlphabet{}
	for i := range a.fromRune {
		a.fromRune[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !('!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF) {
			r = rune(256 + n)
			n++
		}
		a.toStr[b] = string(r)
		a.fromRune[r] = int16(b)
	}
	return a
}

// byteOf is the byte that rune r stands for in the byte-level alphabet.
func (a *byteAlphabet) byteOf(r rune) (byte, bool) {
	if r < 0 || int(r) >= len(a.fromRune) || a.fromRune[r] < 0 {
		return 0, false
	}
	return byte(a.fromRune[r]), true
}

func byteLevelEncode(s string) string {
	var sb strings.Builder
	sb.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		sb.WriteString(alphabet.toStr[s[i]])
	}
	return sb.String()
}
