package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens (or a GGUF control
// or user-defined token): text matched in the input before the model sees it.
type addedToken struct {
	id                         int
	content                    string
	special                    bool
	singleWord, lstrip, rstrip bool
	normalized                 bool   // matched after the normalizers, not before
	pattern                    string // what is matched: content, normalized when normalized
}

// matcher finds added tokens in text the way HF's added vocabulary does: the
// leftmost match, the longest at that position, then on after its end. A
// token matched after normalization is looked for as the normalizers write
// its content (with Llama-2's, "<x>" is found only as "▁<x>").
type matcher struct {
	byFirst map[byte][]*addedToken // longest content first
}

func newMatcher(tokens []*addedToken) *matcher {
	m := &matcher{byFirst: map[byte][]*addedToken{}}
	for _, a := range tokens {
		if a.pattern == "" {
			continue
		}
		m.byFirst[a.pattern[0]] = append(m.byFirst[a.pattern[0]], a)
	}
	for _, l := range m.byFirst {
		sort.SliceStable(l, func(i, j int) bool { return len(l[i].pattern) > len(l[j].pattern) })
	}
	return m
}

// piece is a run of text (id -1) or an added token (its text is not kept),
// with where it starts in the string that was split.
type piece struct {
	text  string
	id    int
	start int
}

// split cuts s at the added tokens it holds. Pieces of text are never empty.
// It follows HF's find_matches: the matches are those of one left-to-right
// scan, each search starting at the end of the previous match whether it
// was taken or not (so not after the spaces an rstrip token took, and a
// token there is matched too); text runs from the end of the last token
// taken, spaces included, to the start of the next. A token left with no
// text by lstrip is dropped.
func (m *matcher) split(s string) []piece {
	if m == nil || len(m.byFirst) == 0 {
		if s == "" {
			return nil
		}
		return []piece{{text: s, id: -1}}
	}
	var out []piece
	done := 0 // where the next piece of text starts
	for i := 0; i < len(s); {
		a := m.longestAt(s, i)
		if a == nil {
			i++
			continue
		}
		start, stop := i, i+len(a.pattern)
		i = stop
		if a.singleWord && (start > 0 && isWordChar(lastRune(s[:start])) || stop < len(s) && isWordChar(firstRune(s[stop:]))) {
			continue
		}
		if a.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), done)
		}
		if a.rstrip {
			stop += len(s[stop:]) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if done < start {
			out = append(out, piece{text: s[done:start], id: -1, start: done})
		}
		if start >= stop {
			// Inside the spaces an rstrip token took, an lstrip token is left
			// with nothing: HF drops it when empty (and fails when reversed).
			done = max(done, stop)
			continue
		}
		out = append(out, piece{id: a.id, start: start})
		done = stop
	}
	if done < len(s) {
		out = append(out, piece{text: s[done:], id: -1, start: done})
	}
	return out
}

func (m *matcher) longestAt(s string, i int) *addedToken {
	for _, a := range m.byFirst[s[i]] {
		if strings.HasPrefix(s[i:], a.pattern) {
			return a
		}
	}
	return nil
}

// isWordChar is Unicode \w as HF's regex crate has it (UTS #18): Alphabetic
// (letters, letter numbers such as Ⅳ, Other_Alphabetic such as ⓐ), marks of
// every kind, decimal digits, connector punctuation and the joiners ZWJ and
// ZWNJ.
func isWordChar(r rune) bool {
	return unicode.In(r, unicode.L, unicode.Nl, unicode.Other_Alphabetic, unicode.M, unicode.Nd, unicode.Pc, unicode.Join_Control)
}

func lastRune(s string) rune  { r, _ := utf8.DecodeLastRuneInString(s); return r }
func firstRune(s string) rune { r, _ := utf8.DecodeRuneInString(s); return r }
