package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Load reads a tokenizer.json (HF tokenizers' format) with a BPE model. When
// a tokenizer_config.json lies beside it, its bos_token and eos_token name
// BOS and EOS (the post-processor's BOS wins). Errors are *Error naming the
// file and the field.
func Load(path string) (*Tokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := Parse(path, b)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	if cb, err := os.ReadFile(cfgPath); err == nil {
		if err := t.applyConfig(cfgPath, cb); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Parse builds a Tokenizer from the bytes of a tokenizer.json; name is used
// in errors.
func Parse(name string, b []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, jsonError(name, "", err)
	}
	return build(name, &f)
}

// fileJSON is the part of tokenizer.json this package reads. Polymorphic
// parts stay raw until their "type" is known.
type fileJSON struct {
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type addedJSON struct {
	ID         *int   `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type bpeJSON struct {
	Type                    string          `json:"type"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Dropout                 *float64        `json:"dropout"`
}

// typed is any component: its type, and its fields for the builders.
type typed struct {
	Type string `json:"type"`
	// Sequence members under each name HF uses.
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	Prepend        string          `json:"prepend"`
	Pattern        patternJSON     `json:"pattern"`
	Content        json.RawMessage `json:"content"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
	AddPrefixSpace *bool           `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
	Replacement    string          `json:"replacement"`
	PrependScheme  string          `json:"prepend_scheme"`
	Split          *bool           `json:"split"`
	Start          int             `json:"start"`
	Stop           int             `json:"stop"`
	StripLeft      *bool           `json:"strip_left"`
	StripRight     *bool           `json:"strip_right"`
	Individual     bool            `json:"individual_digits"`
	Suffix         string          `json:"suffix"`

	Single        []templateItem           `json:"single"`
	SpecialTokens map[string]templateToken `json:"special_tokens"`
	Cls           []json.RawMessage        `json:"cls"`
	Sep           []json.RawMessage        `json:"sep"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type templateItem struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type templateToken struct {
	IDs []int `json:"ids"`
}

func jsonError(file, field string, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return &Error{File: file, Field: field, Reason: fmt.Sprintf("not JSON at byte %d: %v", se.Offset, err)}
	case errors.As(err, &te):
		f := te.Field
		if field != "" && f != "" {
			f = field + "." + f
		} else if f == "" {
			f = field
		}
		return &Error{File: file, Field: f, Reason: fmt.Sprintf("is a JSON %s, want %s", te.Value, te.Type)}
	}
	return &Error{File: file, Field: field, Reason: err.Error()}
}

// isNull says a raw JSON value is absent or null.
func isNull(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) == 0 || string(r) == "null"
}

func build(name string, f *fileJSON) (*Tokenizer, error) {
	errf := func(field, format string, a ...any) error {
		return &Error{File: name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	if isNull(f.Model) {
		return nil, errf("model", "missing")
	}
	var kind struct {
		Type   string          `json:"type"`
		Merges json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(f.Model, &kind); err != nil {
		return nil, jsonError(name, "model", err)
	}
	if kind.Type != "BPE" && !(kind.Type == "" && !isNull(kind.Merges)) { // old files have no type
		return nil, errf("model.type", "%q is not supported (only BPE models are)", kind.Type)
	}
	var mj bpeJSON
	if err := json.Unmarshal(f.Model, &mj); err != nil {
		return nil, jsonError(name, "model", err)
	}
	m, err := buildBPE(name, &mj)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{model: m, bos: -1, eos: -1}
	if err := t.setVocab(name, mj.Vocab, f.AddedTokens); err != nil {
		return nil, err
	}
	if !isNull(f.Normalizer) {
		if t.normalizers, err = buildNormalizers(name, "normalizer", f.Normalizer); err != nil {
			return nil, err
		}
	}
	if err := t.setAdded(name, f.AddedTokens, mj.Vocab, t.normalizers); err != nil {
		return nil, err
	}
	if !isNull(f.PreTokenizer) {
		if t.pre, err = buildPreTokenizers(name, "pre_tokenizer", f.PreTokenizer); err != nil {
			return nil, err
		}
	}
	if !isNull(f.Decoder) {
		t.hasDecoder = true
		if t.decoders, err = buildDecoders(name, "decoder", f.Decoder); err != nil {
			return nil, err
		}
	}
	if !isNull(f.PostProcessor) {
		if err := t.buildPostProcessor(name, "post_processor", f.PostProcessor); err != nil {
			return nil, err
		}
	}
	t.guessSpecials()
	return t, nil
}

func buildBPE(name string, mj *bpeJSON) (*bpe, error) {
	errf := func(field, format string, a ...any) error {
		return &Error{File: name, Field: "model." + field, Reason: fmt.Sprintf(format, a...)}
	}
	if mj.Vocab == nil {
		return nil, errf("vocab", "missing")
	}
	if mj.Dropout != nil && *mj.Dropout != 0 {
		return nil, errf("dropout", "%v: dropout makes encoding random; only null or 0 is supported", *mj.Dropout)
	}
	m := &bpe{vocab: mj.Vocab, unk: -1, fuseUnk: mj.FuseUnk, byteFallback: mj.ByteFallback, ignoreMerges: mj.IgnoreMerges}
	for tok, id := range mj.Vocab {
		if id < 0 || id >= MaxVocab {
			return nil, errf("vocab", "token %q has id %d, outside [0, %d)", tok, id, MaxVocab)
		}
	}
	if mj.UnkToken != nil {
		if id, ok := mj.Vocab[*mj.UnkToken]; ok {
			m.unk = id
		}
	}
	if mj.ContinuingSubwordPrefix != nil {
		m.prefix = *mj.ContinuingSubwordPrefix
	}
	if mj.EndOfWordSuffix != nil {
		m.suffix = *mj.EndOfWordSuffix
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := mj.Vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	pairs, err := parseMerges(mj.Merges)
	if err != nil {
		return nil, errf("merges", "%v", err)
	}
	m.merges = make(map[uint64]merge, len(pairs))
	for rank, p := range pairs {
		a, ok1 := mj.Vocab[p[0]]
		b, ok2 := mj.Vocab[p[1]]
		// As HF builds it: with a continuing_subword_prefix ("##"), the
		// right part loses it ("a" + "##b" is "ab").
		right := p[1]
		if m.prefix != "" {
			if !strings.HasPrefix(right, m.prefix) {
				return nil, errf(fmt.Sprintf("merges[%d]", rank), "%q does not begin with the continuing_subword_prefix %q", right, m.prefix)
			}
			right = right[len(m.prefix):]
		}
		id, ok3 := mj.Vocab[p[0]+right]
		switch {
		case !ok1:
			return nil, errf(fmt.Sprintf("merges[%d]", rank), "%q is not in the vocabulary", p[0])
		case !ok2:
			return nil, errf(fmt.Sprintf("merges[%d]", rank), "%q is not in the vocabulary", p[1])
		case !ok3:
			return nil, errf(fmt.Sprintf("merges[%d]", rank), "the merge result %q is not in the vocabulary", p[0]+right)
		}
		m.merges[pairKey(a, b)] = merge{rank: int32(rank), id: int32(id)}
	}
	return m, nil
}

// parseMerges reads merges as ["a b", ...] (older files) or [["a", "b"], ...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	// The two whole-list forms first (one pass each); element by element
	// only to say which element is wrong.
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		out := make([][2]string, len(strs))
		for i, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("[%d] %q is not two tokens with a space between", i, s)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var pairs [][]string
	if json.Unmarshal(raw, &pairs) == nil {
		out := make([][2]string, len(pairs))
		for i, p := range pairs {
			if len(p) != 2 {
				return nil, fmt.Errorf("[%d] has %d tokens, want 2", i, len(p))
			}
			out[i] = [2]string{p[0], p[1]}
		}
		return out, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("not a list: %v", err)
	}
	out := make([][2]string, len(list))
	for i, e := range list {
		var s string
		if err := json.Unmarshal(e, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("[%d] %q is not two tokens with a space between", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var p []string
		if err := json.Unmarshal(e, &p); err != nil || len(p) != 2 {
			return nil, fmt.Errorf("[%d] is neither \"a b\" nor [\"a\", \"b\"]", i)
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

// setVocab sizes the id tables for the model vocabulary and fills them in;
// setAdded grows them for added tokens past it.
func (t *Tokenizer) setVocab(name string, vocab map[string]int, added []addedJSON) error {
	size := 0
	for _, id := range vocab {
		size = max(size, id+1)
	}
	for i, a := range added {
		if a.ID == nil {
			return &Error{File: name, Field: fmt.Sprintf("added_tokens[%d].id", i), Reason: "missing"}
		}
		if *a.ID < 0 || *a.ID >= MaxVocab {
			return &Error{File: name, Field: fmt.Sprintf("added_tokens[%d].id", i), Reason: fmt.Sprintf("%d is outside [0, %d)", *a.ID, MaxVocab)}
		}
	}
	t.pieces = make([]string, size)
	t.has = make([]bool, size)
	t.special = make([]bool, size)
	for tok, id := range vocab {
		if t.has[id] {
			return &Error{File: name, Field: "model.vocab", Reason: fmt.Sprintf("id %d is both %q and %q", id, t.pieces[id], tok)}
		}
		t.pieces[id], t.has[id] = tok, true
	}
	return nil
}

// setAdded records the added tokens and builds their matchers, the way HF
// tokenizers loads them (AddedVocabulary.add_tokens), which does not read
// the file's ids: in file order, a token whose content is already an added
// token's or in the vocabulary takes that id (a repeated content keeps the
// first id and takes the later flags), the others the ids from the
// vocabulary's size (its number of entries) on; empty contents are left
// out. A normalized token is matched, and decoded, as the normalizers write
// its content ("<x>" as "▁<x>" with Llama-2's); which ids Decode(ids, true)
// leaves out is decided by text, as HF does (skipTable).
func (t *Tokenizer) setAdded(name string, added []addedJSON, vocab map[string]int, normalizers []normalizer) error {
	index := map[string]int{} // content → position in t.added
	next := len(vocab)
	specials := map[string]bool{}
	for i, a := range added {
		if !utf8.ValidString(a.Content) {
			return &Error{File: name, Field: fmt.Sprintf("added_tokens[%d].content", i), Reason: "not UTF-8"}
		}
		if a.Content == "" {
			continue
		}
		at := addedToken{content: a.Content, special: a.Special, singleWord: a.SingleWord,
			lstrip: a.LStrip, rstrip: a.RStrip, normalized: !a.Special}
		if a.Normalized != nil {
			at.normalized = *a.Normalized
		}
		k, dup := index[at.content]
		switch id, inVocab := vocab[at.content]; {
		case dup:
			at.id = t.added[k].id
		case inVocab:
			at.id = id
		default:
			at.id = next
			next++
		}
		if at.id >= MaxVocab {
			return &Error{File: name, Field: fmt.Sprintf("added_tokens[%d]", i), Reason: fmt.Sprintf("its id %d is outside [0, %d)", at.id, MaxVocab)}
		}
		if at.normalized {
			n := at.content
			for _, nz := range normalizers {
				n = nz.normalize(n)
			}
			if n != at.content {
				if t.decodeAs == nil {
					t.decodeAs = map[int]string{}
				}
				t.decodeAs[at.id] = n // kept even if a later repeat is not normalized, as HF's cache is
			}
		}
		t.grow(at.id + 1)
		if at.special { // for good: a later repeat that is not special does not undo it, as in HF
			specials[at.content] = true
			t.special[at.id] = true
		}
		t.pieces[at.id], t.has[at.id] = at.content, true
		if dup {
			t.added[k] = at
		} else {
			index[at.content] = len(t.added)
			t.added = append(t.added, at)
		}
	}
	var raw, norm []*addedToken
	for i := range t.added {
		a := &t.added[i]
		a.pattern = a.content
		if a.normalized {
			if n, ok := t.decodeAs[a.id]; ok {
				a.pattern = n
			}
			norm = append(norm, a)
		} else {
			raw = append(raw, a)
		}
	}
	t.rawMatch, t.normMatch = newMatcher(raw), newMatcher(norm)
	t.skip = t.skipTable(specials)
	return nil
}

// grow extends the id tables to n ids.
func (t *Tokenizer) grow(n int) {
	for len(t.pieces) < n {
		t.pieces, t.has, t.special = append(t.pieces, ""), append(t.has, false), append(t.special, false)
	}
}

// skipTable marks the ids whose decoded text is the content of a special
// added token: HF's decode with skip_special_tokens compares the token's
// text (the normalized form for a normalized added token, the vocabulary's
// for the rest) with the special contents.
func (t *Tokenizer) skipTable(specials map[string]bool) []bool {
	skip := make([]bool, len(t.pieces))
	for id := range skip {
		skip[id] = t.has[id] && specials[t.decodeText(id)]
	}
	return skip
}

func sequenceOf(tp *typed) []json.RawMessage {
	switch {
	case tp.Normalizers != nil:
		return tp.Normalizers
	case tp.PreTokenizers != nil:
		return tp.PreTokenizers
	case tp.Processors != nil:
		return tp.Processors
	}
	return tp.Decoders
}

func parseTyped(name, field string, raw json.RawMessage) (*typed, error) {
	var tp typed
	if err := json.Unmarshal(raw, &tp); err != nil {
		return nil, jsonError(name, field, err)
	}
	return &tp, nil
}

// contentString reads a "content" that is a string (Replace) or one rune
// (Strip).
func contentString(c json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(c, &s); err != nil {
		return "", false
	}
	return s, true
}

func buildNormalizers(name, field string, raw json.RawMessage) ([]normalizer, error) {
	tp, err := parseTyped(name, field, raw)
	if err != nil {
		return nil, err
	}
	errf := func(format string, a ...any) error {
		return &Error{File: name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	switch tp.Type {
	case "Sequence":
		var out []normalizer
		for i, r := range sequenceOf(tp) {
			n, err := buildNormalizers(name, fmt.Sprintf("%s.normalizers[%d]", field, i), r)
			if err != nil {
				return nil, err
			}
			out = append(out, n...)
		}
		return out, nil
	case "Prepend":
		return []normalizer{prependNormalizer{tp.Prepend}}, nil
	case "Replace":
		if tp.Pattern.String == nil {
			return nil, errf("Replace with a regex pattern is not supported (only a String pattern)")
		}
		c, ok := contentString(tp.Content)
		if !ok {
			return nil, errf("Replace needs a string content")
		}
		return []normalizer{replaceNormalizer{*tp.Pattern.String, c}}, nil
	case "Strip":
		return []normalizer{stripNormalizer{left: boolOr(tp.StripLeft, true), right: boolOr(tp.StripRight, true)}}, nil
	}
	return nil, errf("normalizer type %q is not supported (Sequence, Prepend, Replace, Strip are)", tp.Type)
}

func boolOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

func buildPreTokenizers(name, field string, raw json.RawMessage) ([]preTokenizer, error) {
	tp, err := parseTyped(name, field, raw)
	if err != nil {
		return nil, err
	}
	errf := func(format string, a ...any) error {
		return &Error{File: name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	switch tp.Type {
	case "Sequence":
		var out []preTokenizer
		for i, r := range sequenceOf(tp) {
			p, err := buildPreTokenizers(name, fmt.Sprintf("%s.pretokenizers[%d]", field, i), r)
			if err != nil {
				return nil, err
			}
			out = append(out, p...)
		}
		return out, nil
	case "ByteLevel":
		return []preTokenizer{byteLevel{addPrefixSpace: boolOr(tp.AddPrefixSpace, true), useRegex: boolOr(tp.UseRegex, true)}}, nil
	case "Split":
		sp := splitPre{invert: tp.Invert}
		switch {
		case tp.Pattern.Regex != nil:
			p, ok := knownPattern(*tp.Pattern.Regex)
			if !ok {
				return nil, errf("split pattern %q is not one this package matches (GPT-2's, Llama-3's or Qwen2's)", *tp.Pattern.Regex)
			}
			sp.pattern = p
		case tp.Pattern.String != nil:
			sp.literal = *tp.Pattern.String
		default:
			return nil, errf("Split needs a pattern")
		}
		b, ok := map[string]splitBehavior{"Removed": splitRemoved, "Isolated": splitIsolated,
			"MergedWithPrevious": splitMergedWithPrevious, "MergedWithNext": splitMergedWithNext,
			"Contiguous": splitContiguous}[tp.Behavior]
		if !ok {
			return nil, errf("split behavior %q is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", tp.Behavior)
		}
		sp.behavior = b
		return []preTokenizer{sp}, nil
	case "Metaspace":
		ms, err := metaspaceOf(tp)
		if err != nil {
			return nil, errf("%v", err)
		}
		return []preTokenizer{ms}, nil
	case "Digits":
		return []preTokenizer{digits{individual: tp.Individual}}, nil
	}
	return nil, errf("pre-tokenizer type %q is not supported (Sequence, ByteLevel, Split, Metaspace, Digits are)", tp.Type)
}

func metaspaceOf(tp *typed) (metaspace, error) {
	ms := metaspace{replacement: tp.Replacement, scheme: tp.PrependScheme, splitEach: boolOr(tp.Split, true)}
	if utf8.RuneCountInString(ms.replacement) != 1 {
		return ms, fmt.Errorf("replacement %q is not one character", ms.replacement)
	}
	if ms.scheme == "" {
		ms.scheme = "always"
		if tp.AddPrefixSpace != nil && !*tp.AddPrefixSpace {
			ms.scheme = "never"
		}
	}
	switch ms.scheme {
	case "always", "first", "never":
		return ms, nil
	}
	return ms, fmt.Errorf("prepend_scheme %q is not always, first or never", ms.scheme)
}

func buildDecoders(name, field string, raw json.RawMessage) ([]decoder, error) {
	tp, err := parseTyped(name, field, raw)
	if err != nil {
		return nil, err
	}
	errf := func(format string, a ...any) error {
		return &Error{File: name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	switch tp.Type {
	case "Sequence":
		var out []decoder
		for i, r := range sequenceOf(tp) {
			d, err := buildDecoders(name, fmt.Sprintf("%s.decoders[%d]", field, i), r)
			if err != nil {
				return nil, err
			}
			out = append(out, d...)
		}
		return out, nil
	case "ByteLevel":
		return []decoder{byteLevelDecoder{}}, nil
	case "Replace":
		if tp.Pattern.String == nil {
			return nil, errf("Replace with a regex pattern is not supported (only a String pattern)")
		}
		c, ok := contentString(tp.Content)
		if !ok {
			return nil, errf("Replace needs a string content")
		}
		return []decoder{replaceDecoder{*tp.Pattern.String, c}}, nil
	case "ByteFallback":
		return []decoder{byteFallbackDecoder{}}, nil
	case "Fuse":
		return []decoder{fuseDecoder{}}, nil
	case "Strip":
		c, ok := contentString(tp.Content)
		if !ok || utf8.RuneCountInString(c) != 1 {
			return nil, errf("Strip needs content of one character")
		}
		if tp.Start < 0 || tp.Stop < 0 {
			return nil, errf("Strip start %d, stop %d: negative", tp.Start, tp.Stop)
		}
		r, _ := utf8.DecodeRuneInString(c)
		return []decoder{stripDecoder{content: r, start: tp.Start, stop: tp.Stop}}, nil
	case "Metaspace":
		ms, err := metaspaceOf(tp)
		if err != nil {
			return nil, errf("%v", err)
		}
		return []decoder{metaspaceDecoder{replacement: ms.replacement, scheme: ms.scheme}}, nil
	case "BPEDecoder":
		if tp.Suffix == "" {
			tp.Suffix = "</w>"
		}
		return []decoder{bpeSuffixDecoder{tp.Suffix}}, nil
	}
	return nil, errf("decoder type %q is not supported (Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, BPEDecoder are)", tp.Type)
}

// buildPostProcessor reads the ids the post-processor puts around a single
// text (TemplateProcessing, RobertaProcessing, BertProcessing; ByteLevel
// adds none).
func (t *Tokenizer) buildPostProcessor(name, field string, raw json.RawMessage) error {
	tp, err := parseTyped(name, field, raw)
	if err != nil {
		return err
	}
	errf := func(format string, a ...any) error {
		return &Error{File: name, Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	checkID := func(id int) error {
		if id < 0 || id >= len(t.pieces) || !t.has[id] {
			return errf("id %d is not a token", id)
		}
		return nil
	}
	switch tp.Type {
	case "Sequence":
		for i, r := range sequenceOf(tp) {
			if err := t.buildPostProcessor(name, fmt.Sprintf("%s.processors[%d]", field, i), r); err != nil {
				return err
			}
		}
		return nil
	case "ByteLevel":
		return nil
	case "TemplateProcessing":
		seen := false
		for i, item := range tp.Single {
			switch {
			case item.Sequence != nil:
				if seen {
					return errf("single[%d]: a second sequence in a single template", i)
				}
				seen = true
			case item.SpecialToken != nil:
				st, ok := tp.SpecialTokens[item.SpecialToken.ID]
				if !ok {
					return errf("single[%d]: special token %q is not in special_tokens", i, item.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if err := checkID(id); err != nil {
						return err
					}
				}
				if seen {
					t.suffix = append(t.suffix, st.IDs...)
				} else {
					t.prefix = append(t.prefix, st.IDs...)
				}
			default:
				return errf("single[%d]: neither SpecialToken nor Sequence", i)
			}
		}
		if !seen {
			return errf("single: no Sequence in the template")
		}
		return nil
	case "RobertaProcessing", "BertProcessing":
		cls, err := pairID(tp.Cls)
		if err != nil {
			return errf("cls: %v", err)
		}
		sep, err := pairID(tp.Sep)
		if err != nil {
			return errf("sep: %v", err)
		}
		if err := checkID(cls); err != nil {
			return err
		}
		if err := checkID(sep); err != nil {
			return err
		}
		t.prefix, t.suffix = append(t.prefix, cls), append(t.suffix, sep)
		return nil
	}
	return errf("post-processor type %q is not supported (Sequence, TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing are)", tp.Type)
}

// pairID reads ["<s>", 0] as its id.
func pairID(p []json.RawMessage) (int, error) {
	if len(p) != 2 {
		return 0, fmt.Errorf("not a [token, id] pair")
	}
	var id int
	if err := json.Unmarshal(p[1], &id); err != nil {
		return 0, fmt.Errorf("id: %v", err)
	}
	return id, nil
}

// guessSpecials sets BOS from the post-processor's first id, and EOS from a
// conventional name, when nothing better says.
func (t *Tokenizer) guessSpecials() {
	if len(t.prefix) > 0 {
		t.bos = t.prefix[0]
	}
	if t.bos < 0 {
		t.bos = t.lookup("<s>", "<|begin_of_text|>", "<bos>")
	}
	if t.eos < 0 {
		t.eos = t.lookup("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>")
	}
}

// lookup returns the id of the first of names that is an added token or in
// the vocabulary, or -1.
func (t *Tokenizer) lookup(names ...string) int {
	for _, n := range names {
		for _, a := range t.added {
			if a.content == n {
				return a.id
			}
		}
		if b, ok := t.model.(*bpe); ok {
			if id, ok := b.vocab[n]; ok {
				return id
			}
		}
	}
	return -1
}

// applyConfig reads bos_token and eos_token from a tokenizer_config.json:
// each is a string or {"content": ...}.
func (t *Tokenizer) applyConfig(name string, b []byte) error {
	var cfg struct {
		BOS json.RawMessage `json:"bos_token"`
		EOS json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return jsonError(name, "", err)
	}
	read := func(field string, raw json.RawMessage) (int, error) {
		if isNull(raw) {
			return -1, nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			var obj struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(raw, &obj); err != nil {
				return -1, &Error{File: name, Field: field, Reason: "neither a string nor {\"content\": ...}"}
			}
			s = obj.Content
		}
		id := t.lookup(s)
		if id < 0 {
			return -1, &Error{File: name, Field: field, Reason: strconv.Quote(s) + " is not a token of the tokenizer"}
		}
		return id, nil
	}
	eos, err := read("eos_token", cfg.EOS)
	if err != nil {
		return err
	}
	bos, err := read("bos_token", cfg.BOS)
	if err != nil {
		return err
	}
	if eos >= 0 {
		t.eos = eos
	}
	if bos >= 0 && len(t.prefix) == 0 {
		t.bos = bos
	}
	return nil
}
