package gguf

import "slices"

// Metadata keys and values llama.cpp requires of a file it loads.
const (
	// KeyTokenizerModel names the vocabulary's kind: "llama" (SentencePiece
	// style), "gpt2" (byte-level BPE), ... llama.cpp refuses a file without
	// it.
	KeyTokenizerModel = "tokenizer.ggml.model"
	// NoVocab is KeyTokenizerModel's value for a model without a
	// vocabulary (random weights made for tests and benchmarks): llama.cpp
	// then makes llama.vocab_size placeholder tokens and reads no other
	// tokenizer key.
	NoVocab = "no_vocab"
)

// Set returns kvs with key set to value as llama.cpp's gguf_set_val_* set
// it: any entry for key removed and the new one appended, so that a file
// rewritten with the keys llama-quantize sets has its header byte for byte.
// kvs itself is not modified.
func Set(kvs []KV, key string, value any) []KV {
	out := Delete(kvs, func(k string) bool { return k == key })
	return append(out, KV{Key: key, Value: value})
}

// Delete returns kvs without the keys for which drop is true.
func Delete(kvs []KV, drop func(key string) bool) []KV {
	return slices.DeleteFunc(slices.Clone(kvs), func(kv KV) bool { return drop(kv.Key) })
}
