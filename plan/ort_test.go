package plan

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// TestORTSettings holds NewORTSettings' rule over random sizes: the limit
// covers weights + arena + workspace, by less than a MiB; the CPU arena's
// first chunk is the whole limit exactly when the limit fits an int; the
// CUDA options carry the same limit; the Python lines carry every number.
func TestORTSettings(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 5000 {
		w := r.Uint64N(1 << uint(r.IntN(45)+1))
		a := r.Uint64N(1 << uint(r.IntN(40)+1))
		var ws uint64
		if i%2 == 0 {
			ws = r.Uint64N(1 << 30)
		}
		s, err := NewORTSettings(w, a, ws)
		if err != nil {
			t.Fatal(err)
		}
		if ws == 0 && s.WorkspaceBytes != DefaultORTWorkspace(a) || ws != 0 && s.WorkspaceBytes != ws {
			t.Fatalf("workspace %d, given %d", s.WorkspaceBytes, ws)
		}
		need := w + a + s.WorkspaceBytes
		if s.TotalBytes < need || s.TotalBytes-need >= 1<<20 || s.TotalBytes%(1<<20) != 0 {
			t.Fatalf("total %d for need %d", s.TotalBytes, need)
		}
		if s.CUDAProviderOptions["gpu_mem_limit"] != strconv.FormatUint(s.TotalBytes, 10) || s.CUDAProviderOptions["arena_extend_strategy"] != ORTSameAsRequested {
			t.Fatalf("cuda options %v", s.CUDAProviderOptions)
		}
		c := s.ArenaCfg
		if c.MaxMem != s.TotalBytes {
			t.Fatalf("max_mem %d", c.MaxMem)
		}
		if fits := s.TotalBytes <= math.MaxInt32; fits != (c.ArenaExtendStrategy == 0) ||
			fits && c.InitialChunkSizeBytes != int64(s.TotalBytes) || !fits && c.InitialChunkSizeBytes != -1 {
			t.Fatalf("total %d: arena cfg %+v", s.TotalBytes, c)
		}
		py := s.Python("m.onnx")
		for _, want := range []string{strconv.FormatUint(s.TotalBytes, 10), `"m.onnx"`, "session.use_env_allocators", "enable_mem_pattern = True"} {
			if !strings.Contains(py, want) {
				t.Fatalf("python lacks %q:\n%s", want, py)
			}
		}
	}
	if _, err := NewORTSettings(math.MaxUint64/2, math.MaxUint64/2, 1); err == nil {
		t.Error("overflow accepted")
	}
}
