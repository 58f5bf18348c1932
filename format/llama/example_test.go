package llama_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
)

// Open reads a model directory (config.json beside the safetensors) and
// gives its tensors by role.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "llama-example")
	defer os.RemoveAll(dir)
	synth.Generate(context.Background(), synth.Tiny(), filepath.Join(dir, "model.safetensors"), synth.Options{})

	m, err := llama.Open(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	c := m.Config
	fmt.Printf("%d layers, %d heads over %d KV heads of %d, vocabulary %d\n", c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.Vocab)
	fmt.Println(m.Tensors.Blocks[2].K.Name, m.Tensors.Blocks[2].K.Shape)
	layer, role, _ := llama.RoleOf("blk.2.attn_k.weight")
	fmt.Println(layer, role)
	// Output:
	// 4 layers, 8 heads over 4 KV heads of 32, vocabulary 1024
	// model.layers.2.self_attn.k_proj.weight [128 256]
	// 2 k
}
