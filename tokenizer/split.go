package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The split patterns of GPT-2 and Llama-3, matched by hand: Go's regexp has
// no lookahead, and the classes below are Unicode's (\s is White_Space, \p{L}
// letters, \p{N} numbers), as in the Oniguruma engine HF tokenizers uses.
const (
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Qwen2's pattern: Llama-3's with single digits.
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitPattern is one of the known patterns: match returns the length in
// bytes of the match at the start of s[i:] (the whole string is there for
// the lookahead); 0 when there is none.
type splitPattern struct {
	name  string
	match func(s string, i int) int
}

func knownPattern(p string) (splitPattern, bool) {
	switch p {
	case gpt2Pattern:
		return splitPattern{"gpt2", matchGPT2}, true
	case llama3Pattern:
		return splitPattern{"llama3", func(s string, i int) int { return matchLlama3(s, i, 3) }}, true
	case qwen2Pattern:
		return splitPattern{"qwen2", func(s string, i int) int { return matchLlama3(s, i, 1) }}, true
	}
	return splitPattern{}, false
}

// findAll returns the matches of p in s as [start, end) byte pairs, leftmost
// first and not overlapping, as a regex engine's find-all does.
func (p splitPattern) findAll(s string) [][2]int {
	var out [][2]int
	for i := 0; i < len(s); {
		if n := p.match(s, i); n > 0 {
			out = append(out, [2]int{i, i + n})
			i += n
			continue
		}
		_, w := utf8.DecodeRuneInString(s[i:])
		i += w
	}
	return out
}

// class of a rune for the patterns.
const (
	clsOther = iota
	clsLetter
	clsNumber
	clsSpace
)

func classOf(r rune) int {
	switch {
	case r < utf8.RuneSelf:
		return asciiClass[r]
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

var asciiClass = func() (c [utf8.RuneSelf]int) {
	for r := range c {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
			c[r] = clsLetter
		case '0' <= r && r <= '9':
			c[r] = clsNumber
		case r == ' ', '\t' <= r && r <= '\r':
			c[r] = clsSpace
		}
	}
	return c
}()

// at decodes the rune at s[i:]: the rune, its width, and its class. Past the
// end it returns width 0. An invalid byte is one rune of class other.
func at(s string, i int) (rune, int, int) {
	if i >= len(s) {
		return 0, 0, -1
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1, asciiClass[c]
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && w == 1 {
		return r, 1, clsOther
	}
	return r, w, classOf(r)
}

// run returns the end of the run of runes of class cls starting at i.
func run(s string, i, cls int) int {
	for {
		_, w, c := at(s, i)
		if w == 0 || c != cls {
			return i
		}
		i += w
	}
}

// runNot returns the end of the run of runes of class other (not space,
// letter or number) starting at i.
func runOther(s string, i int) int { return run(s, i, clsOther) }

// contraction matches 's 't 're 've 'm 'll 'd at i (fold: any case, and ſ
// for s as Unicode case folding has it); returns its length or 0.
func contraction(s string, i int, fold bool) int {
	if i >= len(s) || s[i] != '\'' {
		return 0
	}
	r1, w1, _ := at(s, i+1)
	if w1 == 0 {
		return 0
	}
	r2, w2, _ := at(s, i+1+w1)
	lower := func(r rune) rune {
		if !fold {
			return r
		}
		if r == 'ſ' {
			return 's'
		}
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}
	switch lower(r1) {
	case 's', 't', 'm', 'd':
		return 1 + w1
	case 'r', 'v':
		if w2 > 0 && lower(r2) == 'e' {
			return 1 + w1 + w2
		}
	case 'l':
		if w2 > 0 && lower(r2) == 'l' {
			return 1 + w1 + w2
		}
	}
	return 0
}

// spaceTail matches \s+(?!\S) then \s+ at i, the pattern's last two
// alternatives: all of a whitespace run that ends the string or is followed
// by more whitespace... that is, the run less its last rune when a non-space
// follows it, unless the run is that one rune.
func spaceTail(s string, i int) int {
	end := run(s, i, clsSpace)
	if end == i {
		return 0
	}
	if end == len(s) {
		return end - i
	}
	_, lw := utf8.DecodeLastRuneInString(s[i:end])
	if end-lw > i {
		return end - lw - i // \s+(?!\S): backs off one rune
	}
	return end - i // \s+
}

// matchGPT2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func matchGPT2(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return n
	}
	j := i
	if s[i] == ' ' {
		j++
	}
	if _, w, c := at(s, j); w > 0 && c != clsSpace {
		return run(s, j, c) - i // ` ?\p{L}+`, ` ?\p{N}+` or ` ?[^\s\p{L}\p{N}]+`
	}
	return spaceTail(s, i)
}

// matchLlama3 (digits = 3):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchLlama3(s string, i, digits int) int {
	if n := contraction(s, i, true); n > 0 {
		return n
	}
	r0, w0, c0 := at(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0 == clsLetter {
		return run(s, i, clsLetter) - i
	}
	if c0 != clsNumber && r0 != '\r' && r0 != '\n' {
		if _, w, c := at(s, i+w0); w > 0 && c == clsLetter {
			return run(s, i+w0, clsLetter) - i
		}
	}
	// \p{N}{1,n}
	if c0 == clsNumber {
		j := i
		for k := 0; k < digits; k++ {
			_, w, c := at(s, j)
			if w == 0 || c != clsNumber {
				break
			}
			j += w
		}
		return j - i
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	j := i
	if r0 == ' ' {
		j++
	}
	if _, w, c := at(s, j); w > 0 && c == clsOther {
		j = runOther(s, j)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j - i
	}
	if c0 != clsSpace {
		return 0 // not reached: every rune is a letter, number, other or space
	}
	// \s*[\r\n]+: the whitespace run up to and including its last \r or \n
	end := run(s, i, clsSpace)
	for k := end - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1 - i
		}
	}
	return spaceTail(s, i)
}
