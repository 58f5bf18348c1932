// Package weights opens a model's weights whatever their format, so callers
// such as the weight streamer take "a model file" without caring which
// parser reads it.
package weights

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/onnx"
	"github.com/memwall/memwall/format/safetensors"
)

// Open opens path with the parser its contents call for: a name ending in
// ".json" is a sharded safetensors index; one ending in ".onnx" an ONNX
// model whose initializers (external data or inline) are the weights; a
// file starting with "GGUF" is
// GGUF; anything else is read as safetensors (whose first bytes are a
// length, with no magic to test). The Model's tensors are backed by
// read-only mappings; the caller must Close it. Errors are those of the
// parser chosen, naming the file and tensor.
func Open(path string) (*format.Model, error) {
	if strings.HasSuffix(path, ".json") {
		return safetensors.Open(path)
	}
	if strings.HasSuffix(path, ".onnx") {
		return onnx.OpenWeights(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	f.Close()
	if err == nil && string(magic[:]) == gguf.Magic {
		return gguf.Open(path)
	}
	return safetensors.Open(path)
}
