package replay

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
)

const tracesDir = "../../testdata/traces/"

// writeTrace writes content to a file named name in a temporary directory
// and returns its path.
func writeTrace(t *testing.T, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func gz(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write([]byte(s))
	w.Close()
	return b.Bytes()
}

const header = "action,addr,size,stream\n"

func TestLoadBadInput(t *testing.T) {
	good := header + "alloc,4096,1000,0\nfree_requested,4096,1000,0\nfree_completed,4096,1000,0\n"
	full := gz(t, good+strings.Repeat("alloc,8192,512,0\nfree_completed,8192,512,0\n", 2000))
	hostile, err := os.ReadFile("../testdata/hostile_reduce_p4.pickle")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, file string
		content    []byte
		want       error
		pos        string // in the message
		lenientOK  bool   // lenient reading succeeds, skipping one record
	}{
		{"truncated gzip", "t.csv.gz", full[:len(full)/2], trace.ErrTruncated, "", false},
		{"free of unknown address", "u.csv", []byte(good + "free_completed,999,8,0\n"), trace.ErrUnknownAddress, "line 5", true},
		{"double alloc", "d.csv", []byte(header + "alloc,4096,8,0\nalloc,4096,8,0\n"), trace.ErrDoubleAlloc, "line 3", true},
		{"unknown action", "a.csv", []byte(good + "realloc,4096,8,0\n"), trace.ErrUnknownAction, "line 5", true},
		{"negative size", "n.csv", []byte(header + "alloc,4096,-8,0\n"), nil, "line 2", true},
		{"absurd size", "s.csv", []byte(header + "alloc,4096,99999999999999999,0\n"), trace.ErrBadSize, "line 2", true},
		{"hostile pickle", "h.pickle", hostile, trace.ErrForbidden, "offset 66", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeTrace(t, tc.file, tc.content)
			_, err := Load(path, LoadOptions{})
			if err == nil {
				t.Fatal("Load succeeded on bad input")
			}
			var te *trace.Error
			if !errors.As(err, &te) {
				t.Fatalf("error %v is not a *trace.Error", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v does not wrap %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.pos) || !strings.Contains(err.Error(), tc.file) {
				t.Errorf("error %q does not name %q and the file", err, tc.pos)
			}
			tr, err := Load(path, LoadOptions{Lenient: true})
			if !tc.lenientOK {
				if err == nil {
					t.Fatal("lenient Load succeeded on structurally bad input")
				}
				return
			}
			if err != nil {
				t.Fatalf("lenient Load: %v", err)
			}
			if tr.Skipped != 1 || tr.FirstSkipped == nil {
				t.Errorf("lenient Load skipped %d (first %v), want 1", tr.Skipped, tr.FirstSkipped)
			}
		})
	}
}

func TestFreeAt(t *testing.T) {
	// Block A is requested free before B is allocated but completes after:
	// freed at completion both are live at once, at request they are not.
	csv := header +
		"alloc,1000,4096,0\n" +
		"free_requested,1000,4096,0\n" +
		"alloc,9000,8192,0\n" +
		"free_completed,1000,4096,0\n" +
		"free_requested,9000,8192,0\n" +
		"free_completed,9000,8192,0\n"
	path := writeTrace(t, "f.csv", []byte(csv))
	for _, tc := range []struct {
		at   FreeAt
		peak uint64
	}{{FreeCompleted, 4096 + 8192}, {FreeRequested, 8192}} {
		t.Run(tc.at.String(), func(t *testing.T) {
			tr, err := Load(path, LoadOptions{FreeAt: tc.at})
			if err != nil {
				t.Fatal(err)
			}
			if tr.PeakLive != tc.peak || len(tr.Ops) != 4 || tr.Allocs != 2 || tr.Events != 6 {
				t.Errorf("peak %d ops %d allocs %d events %d; want peak %d, 4 ops, 2 allocs, 6 events", tr.PeakLive, len(tr.Ops), tr.Allocs, tr.Events, tc.peak)
			}
			if tr.Unfreed != 0 {
				t.Errorf("%d blocks left live", tr.Unfreed)
			}
		})
	}
	if _, err := ParseFreeAt("later"); err == nil {
		t.Error("ParseFreeAt accepted a bad name")
	}
}

func TestMaxOps(t *testing.T) {
	path := writeTrace(t, "m.csv", []byte(header+strings.Repeat("alloc,64,8,0\nfree_completed,64,8,0\n", 10)))
	_, err := Load(path, LoadOptions{MaxOps: 5})
	if !errors.Is(err, ErrTooLong) {
		t.Fatalf("err = %v, want ErrTooLong", err)
	}
}

// TestRunInvariants replays the BERT trace under several configurations
// and checks what must hold whatever the policy.
func TestRunInvariants(t *testing.T) {
	tr, err := Load(tracesDir+"bert_base_varlen.csv.gz", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Allocs != 36145 || tr.Events != 108450 {
		t.Fatalf("allocs %d events %d; the README says 36,145 allocs in 108,450 events", tr.Allocs, tr.Events)
	}
	if r, ok := tr.PyTorchReserved(); !ok || r != 530<<20 {
		t.Errorf("PyTorch reserved %d (%v), want 530 MiB", r, ok)
	}
	if n, ok := tr.PyTorchDeviceAllocs(); !ok || n != 15 {
		t.Errorf("PyTorch device allocs %d (%v), want 15", n, ok)
	}
	for _, c := range []Config{DefaultConfig(), {Name: "chunks", Options: pool.Options{Growth: pool.GrowChunks}}, {Name: "tlsf", Options: pool.Options{Strategy: "tlsf"}}} {
		t.Run(c.Name, func(t *testing.T) {
			r, err := Run(context.Background(), tr, c, Options{AddressMap: true})
			if err != nil {
				t.Fatal(err)
			}
			if r.Ops != len(tr.Ops) || r.PeakLive != tr.PeakLive {
				t.Fatalf("ops %d peak live %d", r.Ops, r.PeakLive)
			}
			if r.PeakUsed < r.PeakLive || r.PeakReserved < r.PeakUsed {
				t.Errorf("peak live %d ≤ used %d ≤ reserved %d does not hold", r.PeakLive, r.PeakUsed, r.PeakReserved)
			}
			if len(r.Timeline) == 0 || len(r.Timeline) > 401 {
				t.Errorf("%d timeline samples", len(r.Timeline))
			}
			var maxLive uint64
			for _, s := range r.Timeline {
				maxLive = max(maxLive, s.Live)
				if s.Reserved < s.Live || s.Frag < 0 || s.Frag > 1 {
					t.Fatalf("sample %+v", s)
				}
			}
			if maxLive != tr.PeakLive {
				t.Errorf("timeline peak %d, trace peak %d", maxLive, tr.PeakLive)
			}
			checkMap(t, r.Map, tr.PeakLive)
		})
	}
}

// checkMap verifies that the address map's blocks lie in reserved memory
// without overlapping and add up to at least the peak live bytes.
func checkMap(t *testing.T, m *AddressMap, peak uint64) {
	t.Helper()
	if m == nil {
		t.Fatal("no address map")
	}
	var sum uint64
	for i, b := range m.Blocks {
		sum += b.Size
		in := false
		for _, r := range m.Reserved {
			if b.Off >= r.Off && b.Off+b.Size <= r.Off+r.Size {
				in = true
			}
		}
		if !in {
			t.Errorf("block %+v outside reserved memory", b)
		}
		for _, o := range m.Blocks[:i] {
			if b.Off < o.Off+o.Size && o.Off < b.Off+b.Size {
				t.Errorf("blocks %+v and %+v overlap", b, o)
			}
		}
	}
	if sum < peak {
		t.Errorf("map holds %d bytes of blocks, peak live is %d", sum, peak)
	}
}

func TestMinCapacity(t *testing.T) {
	tr, err := Load(tracesDir+"bert_base_varlen.csv.gz", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Name: "chunks", Options: pool.Options{Growth: pool.GrowChunks}}
	capBytes, runs, err := MinCapacity(context.Background(), tr, c, Options{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if capBytes < tr.PeakLive || capBytes%(2<<20) != 0 || runs < 2 {
		t.Fatalf("min capacity %d after %d runs, peak live %d", capBytes, runs, tr.PeakLive)
	}
	if _, err := Run(context.Background(), tr, c, Options{Limit: capBytes, Samples: -1}); err != nil {
		t.Errorf("replay at the min capacity fails: %v", err)
	}
	_, err = Run(context.Background(), tr, c, Options{Limit: capBytes - 2<<20, Samples: -1})
	var oe *OpError
	if !errors.Is(err, pool.ErrOutOfMemory) || !errors.As(err, &oe) {
		t.Errorf("replay 2 MiB below the min capacity: %v, want an OpError wrapping pool.ErrOutOfMemory", err)
	}
}

// TestDefaultAgainstGoal holds the pool's default to what the pool's
// documentation claims on the ten traces of testdata/traces: under
// PyTorch's memory on each, peak reserved and device calls per allocation
// within the bounds below (both goals met on the GPT-2 traces and T5). Where a trace misses
// a goal the report must say how far, and a configuration on the other
// side of the trade-off must exist.
func TestDefaultAgainstGoal(t *testing.T) {
	if testing.Short() {
		t.Skip("replays thirteen traces through every configuration")
	}
	for _, tc := range []struct {
		name      string
		callsMeet bool
		maxRatio  float64 // a regression bound for the default's peak reserved / peak live
		maxCalls  float64 // a regression bound for the default's calls per alloc
	}{
		// Bounds a little above the default's figures since db2eb9d (blocks
		// the search placed are not parked), which moved BERT, the
		// encoder, Llama generate and the SD-size UNet the wrong way and
		// ViT, GPT-2 with batch per request, the MoE and Whisper the right
		// way (docs/pool-policy.md has the totals over every trace at five
		// widths: no line lost a goal, six gained one).
		{"gpt2_medium_generate", true, GoalRatio, 0.004},
		{"bert_base_varlen", false, 1.06, 0.10},
		{"encoder_varlen", false, GoalRatio, 0.265},
		{"vit_varbatch", false, GoalRatio, 0.09},
		{"llama_generate", false, 1.15, 0.0015},
		{"unet_denoise", false, 1.15, 0.012},
		{"gpt2_varbatch", true, GoalRatio, 0.008},
		{"t5_generate", true, GoalRatio, 0.004},
		{"moe_generate", false, 1.08, 0.007},
		{"unet_sd", false, GoalRatio, 0.05},
		{"whisper_generate", true, GoalRatio, 0.006},
		{"resnet_varbatch", false, 1.02, 0.22},
		{"llama_long", false, 1.23, 0.004},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := Load(tracesDir+tc.name+".csv.gz", LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Evaluate(context.Background(), tr, Configs(), EvalOptions{NoSearch: true})
			if err != nil {
				t.Fatal(err)
			}
			def := rep.Results[0]
			if def.Config != rep.Default {
				t.Fatalf("first result %q, default %q", def.Config, rep.Default)
			}
			if def.Ratio > tc.maxRatio || def.Ratio < 1 {
				t.Errorf("default reserves %.3f× peak live, bound %.2f×", def.Ratio, tc.maxRatio)
			}
			// llama_long is the one trace where PyTorch's caching allocator
			// reserves less (1.13× against 1.22×: docs/pool-policy.md,
			// "Where mapped-first placement costs memory").
			if beats := *rep.PyTorchRatio > def.Ratio; beats != (tc.name != "llama_long") {
				t.Errorf("PyTorch %.3f×, the default %.3f×: the default beats it = %v", *rep.PyTorchRatio, def.Ratio, beats)
			}
			if def.CallsPerAlloc > tc.maxCalls {
				t.Errorf("default makes %.4f device calls per alloc, bound %.4f", def.CallsPerAlloc, tc.maxCalls)
			}
			if def.MeetsGoal != tc.callsMeet {
				t.Errorf("default meets goal = %v, want %v (%+v)", def.MeetsGoal, tc.callsMeet, def)
			}
			if !tc.callsMeet {
				if def.CallsToGoal <= 1 && def.RatioToGoal <= 1 {
					t.Errorf("report does not show how far the default is from the goal: %+v", def)
				}
				// The other side of the trade-off: calls within 1% for
				// more memory, or (where memory misses) less memory for
				// more calls.
				other := false
				for _, r := range rep.Results {
					if r.Error != "" {
						continue
					}
					if def.CallsToGoal > 1 && r.CallsPerAlloc <= GoalCallsPerAlloc && r.Ratio > def.Ratio ||
						def.RatioToGoal > 1 && r.Ratio < def.Ratio && r.CallsPerAlloc > def.CallsPerAlloc {
						other = true
					}
				}
				if !other {
					t.Error("no configuration shows the other side of the trade-off")
				}
			}
		})
	}
}

func TestSelectConfigs(t *testing.T) {
	cs := Configs()
	for _, tc := range []struct {
		names string
		min   int
		err   bool
	}{{"", len(cs), false}, {"all", len(cs), false}, {"default", 1, false}, {"tlsf", 2, false}, {"chunks-buddy,default", 2, false}, {"nope", 0, true}} {
		t.Run(tc.names, func(t *testing.T) {
			got, err := SelectConfigs(cs, tc.names)
			if (err != nil) != tc.err || len(got) < tc.min {
				t.Fatalf("got %d configs, err %v", len(got), err)
			}
		})
	}
}

// BenchmarkReplay measures one replay of the GPT-2 trace through the
// default configuration, in trace events per second (every event read,
// not only the allocs and frees replayed).
func BenchmarkReplay(b *testing.B) {
	for _, name := range []string{"gpt2_medium_generate", "bert_base_varlen"} {
		b.Run(name, func(b *testing.B) {
			tr, err := Load(tracesDir+name+".csv.gz", LoadOptions{})
			if err != nil {
				b.Fatal(err)
			}
			c := DefaultConfig()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := Run(context.Background(), tr, c, Options{Samples: -1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tr.Events)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(len(tr.Ops))*float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
