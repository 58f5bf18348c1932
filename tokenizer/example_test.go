package tokenizer_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/memwall/memwall/tokenizer"
)

// A tiny Llama-2-style tokenizer.json: SentencePiece BPE with byte fallback.
const llama2JSON = `{
  "added_tokens": [
    {"id": 0, "content": "<unk>", "special": true, "normalized": false},
    {"id": 1, "content": "<s>", "special": true, "normalized": false},
    {"id": 2, "content": "</s>", "special": true, "normalized": false}],
  "normalizer": {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "▁"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
    "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xE2>": 3, "<0x82>": 4, "<0xAC>": 5,
      "▁": 6, "h": 7, "i": 8, "▁h": 9, "▁hi": 10},
    "merges": [["▁", "h"], ["▁h", "i"]]}
}`

func Example() {
	dir, _ := os.MkdirTemp("", "tok")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tokenizer.json")
	os.WriteFile(path, []byte(llama2JSON), 0o644)

	tok, err := tokenizer.Load(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	ids := tok.Encode("hi hi €", true)
	fmt.Println(ids)
	fmt.Printf("%q\n", tok.Decode(ids, true))

	// Streaming: the euro sign's three byte tokens come out as one piece.
	d := tok.NewDecoder()
	var pieces []string
	for _, id := range ids {
		pieces = append(pieces, d.Add(id))
	}
	fmt.Printf("%q\n", pieces)
	bos, _ := tok.BOS()
	eos, _ := tok.EOS()
	fmt.Println(bos, eos, tok.VocabSize())
	// Output:
	// [1 10 10 6 3 4 5]
	// "hi hi €"
	// ["" "hi" " hi" " " "" "" "€"]
	// 1 2 11
}
