package tokenizer

import "strings"

// StreamDecoder decodes ids as they arrive, one at a time, and hands out
// only text that later ids cannot change: a character split over several
// byte tokens (<0xE2> <0x82> <0xAC>, or byte-level pieces) comes out whole
// once its last byte has arrived. It skips special tokens, as
// Decode(ids, true) does. It follows HF tokenizers' DecodeStream: the ids
// since the last emitted text are decoded together with the token before
// them, so the decoders' rules for the first token (the stripped leading
// space) apply only at the very start.
type StreamDecoder struct {
	t      *Tokenizer
	ids    []int  // the context: ids decoded together
	prefix string // the decode of ids[:start], already handed out
	start  int
}

// NewDecoder returns a StreamDecoder at the start of a text.
func (t *Tokenizer) NewDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// Add takes the next id and returns the text it completes, possibly "".
// The concatenation of everything Add and Flush return is Decode(ids, true)
// for the ids added, when that has no U+FFFD (a run of byte tokens that is
// not UTF-8 decodes to one U+FFFD per byte only once the run is seen whole).
func (d *StreamDecoder) Add(id int) string {
	if d.prefix == "" && len(d.ids) > 0 {
		if p := d.t.Decode(d.ids, true); !strings.HasSuffix(p, "\uFFFD") {
			d.prefix, d.start = p, len(d.ids)
		}
	}
	d.ids = append(d.ids, id)
	s := d.t.Decode(d.ids, true)
	if len(s) <= len(d.prefix) || strings.HasSuffix(s, "\uFFFD") || !strings.HasPrefix(s, d.prefix) {
		return ""
	}
	text := s[len(d.prefix):]
	d.ids = append(d.ids[:0], d.ids[d.start:]...)
	d.start = len(d.ids)
	d.prefix = d.t.Decode(d.ids, true)
	return text
}

// Flush returns the text still held back (bytes that never completed a
// character, as U+FFFD) and starts over.
func (d *StreamDecoder) Flush() string {
	s, prefix := d.t.Decode(d.ids, true), d.prefix
	d.ids, d.prefix, d.start = d.ids[:0], "", 0
	if len(s) <= len(prefix) || !strings.HasPrefix(s, prefix) {
		return ""
	}
	return s[len(prefix):]
}
