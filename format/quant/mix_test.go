package quant

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// llamaTensors lists a Llama model's tensors in GGUF naming, as llama.cpp's
// converter writes them: matrices BF16, norms F32.
func llamaTensors(layers, hidden, inter, heads, kv, vocab int, tied bool) []Tensor {
	h, kvd := uint64(hidden), uint64(hidden/heads*kv)
	ts := []Tensor{{"token_embd.weight", BF16, []uint64{uint64(vocab), h}}}
	for l := range layers {
		p := "blk." + strconv.Itoa(l) + "."
		ts = append(ts,
			Tensor{p + "attn_q.weight", BF16, []uint64{h, h}},
			Tensor{p + "attn_k.weight", BF16, []uint64{kvd, h}},
			Tensor{p + "attn_v.weight", BF16, []uint64{kvd, h}},
			Tensor{p + "attn_output.weight", BF16, []uint64{h, h}},
			Tensor{p + "ffn_gate.weight", BF16, []uint64{uint64(inter), h}},
			Tensor{p + "ffn_up.weight", BF16, []uint64{uint64(inter), h}},
			Tensor{p + "ffn_down.weight", BF16, []uint64{h, uint64(inter)}},
			Tensor{p + "attn_norm.weight", F32, []uint64{h}},
			Tensor{p + "ffn_norm.weight", F32, []uint64{h}})
	}
	ts = append(ts, Tensor{"output_norm.weight", F32, []uint64{h}})
	if !tied {
		ts = append(ts, Tensor{"output.weight", BF16, []uint64{uint64(vocab), h}})
	}
	return ts
}

// TestChooseMatchesLlamaCpp compares Choose with the types llama.cpp's own
// rules gave (testdata/llama.cpp/types.txt.gz, see its README) for six
// Llama shapes — 7B, 2-70B, a Llama-3-8B shape, gen-model's tiny and
// tiny-f16, a model with tied embeddings — under every file type.
func TestChooseMatchesLlamaCpp(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "llama.cpp", "types.txt.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	type group struct {
		head string
		want []string
	}
	var groups []group
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "== ") {
			groups = append(groups, group{head: line[3:]})
			continue
		}
		groups[len(groups)-1].want = append(groups[len(groups)-1].want, line)
	}
	if len(groups) != 30 {
		t.Fatalf("%d groups in the file, want 30", len(groups))
	}
	for _, g := range groups {
		t.Run(strings.Join(strings.Fields(g.head)[:2], "/"), func(t *testing.T) {
			var name, ftName string
			var layers, hidden, inter, heads, kv, vocab, tied int
			if _, err := fmt.Sscanf(g.head, "%s %s layers=%d hidden=%d inter=%d heads=%d kv=%d vocab=%d tied=%d", &name, &ftName, &layers, &hidden, &inter, &heads, &kv, &vocab, &tied); err != nil {
				t.Fatal(err)
			}
			ft, ok := ParseFileType(ftName)
			if !ok {
				t.Fatalf("file type %q", ftName)
			}
			ts := llamaTensors(layers, hidden, inter, heads, kv, vocab, tied == 1)
			// Reversed, to show that the given order does not matter.
			for i, j := 0, len(ts)-1; i < j; i, j = i+1, j-1 {
				ts[i], ts[j] = ts[j], ts[i]
			}
			got, err := Choose(ft, Model{Arch: "llama", Layers: layers, Heads: heads, KVHeads: kv}, ts)
			if len(g.want) == 1 && strings.HasPrefix(g.want[0], "error ") {
				if err == nil {
					t.Fatalf("no error; llama.cpp says %q", g.want[0])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			byName := map[string]Type{}
			for i, tt := range ts {
				byName[tt.Name] = got[i]
			}
			if len(g.want) != len(ts) {
				t.Fatalf("%d tensors in llama.cpp's list, %d here", len(g.want), len(ts))
			}
			for _, w := range g.want {
				n, typ, _ := strings.Cut(w, " ")
				if have := byName[n]; !strings.EqualFold(have.String(), typ) {
					t.Errorf("%s: %v, llama.cpp %s", n, have, typ)
				}
			}
		})
	}
}

func TestChooseErrors(t *testing.T) {
	ts := llamaTensors(2, 256, 512, 4, 4, 256, false)
	if _, err := Choose(FileType(99), Model{Arch: "llama", Layers: 2}, ts); err == nil {
		t.Error("unknown file type: no error")
	}
	if _, err := Choose(MostlyQ4_K_M, Model{Arch: "gpt2", Layers: 2}, ts); err == nil {
		t.Error("another architecture: no error")
	}
	ts = llamaTensors(2, 96, 512, 4, 4, 256, false)
	ts[1].Shape = []uint64{100, 100}
	_, err := Choose(MostlyQ8_0, Model{Arch: "llama", Layers: 2, Heads: 4, KVHeads: 4}, ts)
	if err == nil || !strings.Contains(err.Error(), ts[1].Name) {
		t.Errorf("rows of 100 in Q8_0: %v, want an error naming %s", err, ts[1].Name)
	}
}

func TestFileTypes(t *testing.T) {
	want := map[FileType]Type{MostlyQ4_K_M: Q4_K, MostlyQ5_K_M: Q5_K, MostlyQ6_K: Q6_K, MostlyQ8_0: Q8_0, MostlyQ4_0: Q4_0}
	for _, f := range FileTypes() {
		g, ok := ParseFileType(strings.ToLower(f.String()))
		if !ok || g != f || f.Default() != want[f] {
			t.Errorf("%v: parse %v %v, default %v", f, g, ok, f.Default())
		}
	}
	if _, ok := ParseFileType("Q4_K_S"); ok {
		t.Error("Q4_K_S is not one of the file types written")
	}
}
