package gguf

import (
	"math"
	"slices"
)

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

// RopeFactorsName is the tensor in which llama.cpp's converter stores
// Llama-3 rope scaling: one F32 factor per frequency, dividing it. llama.cpp
// knows no "llama3" llama.rope.scaling.type, so a file it loads carries the
// scaling this way.
const RopeFactorsName = "rope_freqs.weight"

// Llama3RopeFactors returns the headDim/2 factors of Llama-3 rope scaling
// as llama.cpp's converter derives them: with frequency
// theta^(−2i/headDim) and wavelength 2π/frequency, 1 below
// original/high, factor above original/low, 1/((1−s)/factor + s) between,
// s = (original/wavelength − low)/(high − low). Computed in float64 and
// rounded once (the converter computes the frequencies in float32, so a
// factor may differ from its in the last bit).
func Llama3RopeFactors(theta float64, headDim int, factor, low, high float64, original int) []float32 {
	out := make([]float32, headDim/2)
	orig := float64(original)
	lowWave, highWave := orig/low, orig/high
	for i := range out {
		freq := 1 / math.Pow(theta, float64(2*i)/float64(headDim))
		wave := 2 * math.Pi / freq
		switch {
		case wave < highWave:
			out[i] = 1
		case wave > lowWave:
			out[i] = float32(factor)
		default:
			s := (orig/wave - low) / (high - low)
			out[i] = float32(1 / ((1-s)/factor + s))
		}
	}
	return out
}
