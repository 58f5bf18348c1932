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

// piece is a run of text (id -1) or an added token, with where it starts in
// the string that was split.
type piece struct {
	text  string
	id    int
	start int
}

// split cuts s at the added tokens it holds. Pieces of text are never empty.
func (m *matcher) split(s string) []piece {
	if m == nil || len(m.byFirst) == 0 {
		if s == "" {
			return nil
		}
		return []piece{{text: s, id: -1}}
	}
	var out []piece
	done := 0 // s[:done] is in out
	for i := 0; i < len(s); {
		a := m.longestAt(s, i)
		if a == nil {
			i++
			continue
		}
		start, stop := i, i+len(a.pattern)
		i = stop // the next search starts after this match, taken or not
		if a.singleWord && (start > 0 && isWordChar(lastRune(s[:start])) || stop < len(s) && isWordChar(firstRune(s[stop:]))) {
			continue
		}
		if a.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), done)
		}
		if a.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
			i = max(i, stop)
		}
		if done < start {
			out = append(out, piece{text: s[done:start], id: -1, start: done})
		}
		out = append(out, piece{text: s[start:stop], id: a.id, start: start})
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

func isWordChar(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r)
}

func lastRune(s string) rune  { r, _ := utf8.DecodeLastRuneInString(s); return r }
func firstRune(s string) rune { r, _ := utf8.DecodeRuneInString(s); return r }
