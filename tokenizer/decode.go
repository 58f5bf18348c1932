package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// decoder rewrites the list of token texts on the way back to text
// (tokenizer.json's "decoder"); the result is joined.
type decoder interface {
	decode(tokens []string) []string
}

// byteLevelDecoder maps each token's runes back to bytes (a token with a rune
// outside the alphabet, such as an added token, keeps its UTF-8 bytes) and
// reads all of them as UTF-8, an invalid sequence becoming U+FFFD.
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(tokens []string) []string {
	var b []byte
	for _, t := range tokens {
		b = appendByteLevel(b, t)
	}
	return []string{lossyUTF8(b)}
}

func appendByteLevel(b []byte, t string) []byte {
	n := len(b)
	for _, r := range t {
		c, ok := alphabet.byteOf(r)
		if !ok {
			return append(b[:n], t...)
		}
		b = append(b, c)
	}
	return b
}

// replaceDecoder replaces a string in every token (Llama-2's ▁ → space).
type replaceDecoder struct{ old, new string }

func (d replaceDecoder) decode(tokens []string) []string {
	if d.old == "" {
		return tokens
	}
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(t, d.old, d.new)
	}
	return tokens
}

// byteFallbackDecoder turns runs of <0xNN> tokens into the text their bytes
// spell; a run that is not UTF-8 becomes one U+FFFD per byte, as in HF.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decode(tokens []string) []string {
	out := tokens[:0:0]
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range tokens {
		if b, ok := byteToken(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// byteToken reads "<0xNN>" as HF does: six bytes, and two hex digits that
// Rust's u8::from_str_radix accepts (it also takes a leading '+').
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	h := t[3:5]
	if h[0] == '+' {
		v, ok := hexDigit(h[1])
		return v, ok
	}
	hi, ok1 := hexDigit(h[0])
	lo, ok2 := hexDigit(h[1])
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// fuseDecoder joins all tokens into one.
type fuseDecoder struct{}

func (fuseDecoder) decode(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// stripDecoder removes up to start leading and stop trailing copies of one
// rune from every token (Llama-2's leading space).
type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decode(tokens []string) []string {
	for i, t := range tokens {
		rs := []rune(t)
		a, b := 0, len(rs)
		for a < d.start && a < b && rs[a] == d.content {
			a++
		}
		for k := 0; k < d.stop && b > a && rs[b-1] == d.content; k++ {
			b--
		}
		if a > 0 || b < len(rs) {
			tokens[i] = string(rs[a:b])
		}
	}
	return tokens
}

// metaspaceDecoder turns the replacement rune into a space, and drops it in
// the first token unless the scheme is "never" (HF's Metaspace decoder).
type metaspaceDecoder struct {
	replacement string
	scheme      string
}

func (d metaspaceDecoder) decode(tokens []string) []string {
	for i, t := range tokens {
		with := " "
		if i == 0 && d.scheme != "never" {
			with = ""
		}
		tokens[i] = strings.ReplaceAll(t, d.replacement, with)
	}
	return tokens
}

// bpeSuffixDecoder is HF's BPEDecoder: the end-of-word suffix becomes a
// space, except in the last token where it goes.
type bpeSuffixDecoder struct{ suffix string }

func (d bpeSuffixDecoder) decode(tokens []string) []string {
	for i, t := range tokens {
		with := " "
		if i == len(tokens)-1 {
			with = ""
		}
		tokens[i] = strings.ReplaceAll(t, d.suffix, with)
	}
	return tokens
}

// lossyUTF8 is Rust's String::from_utf8_lossy: each maximal prefix of a
// valid sequence that cannot be completed becomes one U+FFFD (Go's
// strings.ToValidUTF8 would fold a whole run of bad bytes into one).
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for i := 0; i < len(b); {
		r, w := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || w > 1 {
			sb.Write(b[i : i+w])
			i += w
			continue
		}
		i += invalidPrefix(b[i:])
		sb.WriteString("\uFFFD")
	}
	return sb.String()
}

// invalidPrefix is the length of the maximal subpart of an ill-formed
// sequence at the start of b (b[0] does not begin a valid rune): the lead
// byte and the continuation bytes that could still have completed it.
func invalidPrefix(b []byte) int {
	c := b[0]
	var n int                        // bytes the lead byte asks for
	lo, hi := byte(0x80), byte(0xBF) // range of the second byte
	switch {
	case 0xC2 <= c && c <= 0xDF:
		n = 2
	case c == 0xE0:
		n, lo = 3, 0xA0
	case 0xE1 <= c && c <= 0xEC, c == 0xEE, c == 0xEF:
		n = 3
	case c == 0xED:
		n, hi = 3, 0x9F
	case c == 0xF0:
		n, lo = 4, 0x90
	case 0xF1 <= c && c <= 0xF3:
		n = 4
	case c == 0xF4:
		n, hi = 4, 0x8F
	default:
		return 1
	}
	k := 1
	for ; k < n && k < len(b); k++ {
		if k == 1 && (b[k] < lo || b[k] > hi) || k > 1 && (b[k] < 0x80 || b[k] > 0xBF) {
			break
		}
	}
	return k
}
