// Package tokenizer turns text into the token ids a Llama-family model reads
// and back: byte-level BPE (GPT-2 and Llama-3 style tokenizer.json files) and
// SentencePiece-style BPE with byte fallback (Llama-2 tokenizer.json files,
// and the tokenizer.ggml.* vocabulary of a GGUF file).
//
// For a tokenizer.json the ids are those HF tokenizers gives for the same
// file: the same added-token matching, normalizers, pre-tokenizers (the GPT-2
// and Llama-3 split patterns are matched by hand, lookahead included), BPE
// merge order, byte fallback, post-processor and decoders. A GGUF "llama"
// vocabulary is encoded the way llama.cpp does, merging by score.
//
// Quick start:
//
//	tok, err := tokenizer.Load("model/tokenizer.json")
//	if err != nil { ... }
//	ids := tok.Encode("Hello, world", true) // BOS first when the file says so
//	text := tok.Decode(ids, true)           // "Hello, world"
//
//	d := tok.NewDecoder() // as tokens arrive one at a time
//	for _, id := range generated {
//		fmt.Print(d.Add(id)) // only whole characters
//	}
//
// GGUFMetadata gives a vocabulary's tokenizer.ggml.* keys for a GGUF file,
// and Synthetic a small Llama-2-style tokenizer.json for made-up models.
//
// A Tokenizer is immutable once built and safe for concurrent use; a
// StreamDecoder is not.
package tokenizer

import (
	"fmt"
	"strings"
)

// MaxVocab bounds token ids (and so the id tables a file can make this
// package allocate). The largest vocabularies in use have about 256k entries.
const MaxVocab = 1 << 22

// Error says why a tokenizer file cannot be used: File names the file (or
// "gguf metadata"), Field the JSON path or GGUF key, Reason the problem.
type Error struct {
	File   string
	Field  string
	Reason string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s: %s", e.File, e.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", e.File, e.Field, e.Reason)
}

// Tokenizer encodes text to ids and decodes ids to text.
type Tokenizer struct {
	model   model
	pieces  []string // id → token text (model vocabulary or added token); "" where no token has the id
	has     []bool   // id has a token
	special []bool   // id is a special added token
	skip    []bool   // Decode(ids, true) leaves id out
	// decodeAs holds the text Decode uses for a normalized added token whose
	// content the normalizers change (HF decodes "▁<x>", not "<x>").
	decodeAs map[int]string

	added       []addedToken
	rawMatch    *matcher // added tokens matched on the text as given
	normMatch   *matcher // added tokens matched after normalization
	normalizers []normalizer
	pre         []preTokenizer
	decoders    []decoder // nil: tokens joined with spaces, as HF does without a decoder
	hasDecoder  bool

	prefix, suffix []int // the post-processor's ids around the text (Encode with addSpecial)
	bos, eos       int   // -1 when unknown
}

// VocabSize is one more than the largest token id, added tokens included: a
// model's embedding needs at least this many rows.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// BOS is the beginning-of-sequence token: the one the post-processor puts
// before the text, else the one the file (or tokenizer_config.json, or the
// GGUF metadata) names.
func (t *Tokenizer) BOS() (int, bool) { return t.bos, t.bos >= 0 }

// EOS is the end-of-sequence token, when the files name one or the
// vocabulary has a conventional one (</s>, <|end_of_text|>, <|endoftext|>).
func (t *Tokenizer) EOS() (int, bool) { return t.eos, t.eos >= 0 }

// Token is the text of token id as the vocabulary spells it (byte-level
// tokens in their mapped alphabet, SentencePiece ones with ▁; an added
// token's content as the file writes it), and whether the id is a token.
func (t *Tokenizer) Token(id int) (string, bool) {
	if id < 0 || id >= len(t.pieces) || !t.has[id] {
		return "", false
	}
	return t.pieces[id], true
}

// IsSpecial says whether id is a special added token (BOS, EOS, control
// tokens). Decode(ids, true) leaves these out, except, as in HF, a special
// token matched after normalization whose content the normalizers change;
// it also leaves out a vocabulary token spelled as a special token's content.
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.special) && t.special[id]
}

// Encode returns the ids of text. Added tokens written in the text (such as
// "<|eot_id|>") become their ids whatever addSpecial is; addSpecial adds what
// the post-processor adds around the text (the BOS of Llama models), as HF's
// add_special_tokens does. Text should be valid UTF-8; invalid bytes are
// encoded as single bytes.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int {
	var ids []int
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	for _, seg := range t.segments(text) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			continue
		}
		for _, p := range t.preTokenize(seg.text, seg.first) {
			ids = t.model.tokenize(p, ids)
		}
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids
}

// segment is a piece of the text after added tokens are split out: either
// an added token's id, or normalized text (id -1). first says the text begins
// at the start of the input (Metaspace's prepend_scheme "first").
type segment struct {
	text  string
	id    int
	first bool
}

func (t *Tokenizer) segments(text string) []segment {
	var out []segment
	for _, raw := range t.rawMatch.split(text) {
		if raw.id >= 0 {
			out = append(out, segment{id: raw.id})
			continue
		}
		s := raw.text
		for _, n := range t.normalizers {
			s = n.normalize(s)
		}
		for i, m := range t.normMatch.split(s) {
			if m.id >= 0 {
				out = append(out, segment{id: m.id})
			} else if m.text != "" {
				out = append(out, segment{text: m.text, id: -1, first: raw.start == 0 && i == 0})
			}
		}
	}
	return out
}

func (t *Tokenizer) preTokenize(s string, first bool) []string {
	pieces := []string{s}
	for _, p := range t.pre {
		var next []string
		for i, piece := range pieces {
			next = p.split(piece, first && i == 0, next)
		}
		pieces = next
	}
	return pieces
}

// decodeText is the text id has on the way back: the token's, or the
// normalized form of a normalized added token.
func (t *Tokenizer) decodeText(id int) string {
	if s, ok := t.decodeAs[id]; ok {
		return s
	}
	return t.pieces[id]
}

// Decode returns the text of ids, as HF's decode does: ids that are no token
// are left out, special tokens too when skipSpecial (IsSpecial says which),
// a normalized added token is read as its normalizers write it ("▁<x>" for
// "<x>" after Llama-2's Prepend), and the rest go through
// the file's decoders (byte-level bytes, ▁ to space, <0xNN> bytes, the
// leading space). Bytes that do not form UTF-8 become U+FFFD.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id >= len(t.pieces) || !t.has[id] || skipSpecial && t.skip[id] {
			continue
		}
		tokens = append(tokens, t.decodeText(id))
	}
	if !t.hasDecoder {
		return strings.Join(tokens, " ")
	}
	for _, d := range t.decoders {
		tokens = d.decode(tokens)
	}
	return strings.Join(tokens, "")
}
