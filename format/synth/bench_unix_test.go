//go:build unix

package synth

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user+system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGenerate writes a model of about 0.93 GB (Llama-7B layer shapes,
// one layer, 32000-token vocabulary) per iteration to the benchmark's temp
// directory ($TMPDIR), removing it after each iteration. Besides MB/s (wall
// clock) it reports cpu-s/GB, the process's CPU seconds per GB written, which
// a loaded machine does not distort: on k idle cores the wall-clock rate can
// reach at most k/cpu-s-per-GB. Run with -benchtime=3x.
func BenchmarkGenerate(b *testing.B) {
	cfg := Llama7B()
	cfg.Layers = 1
	for _, f := range []string{Safetensors, GGUF} {
		b.Run(f, func(b *testing.B) {
			dir := b.TempDir()
			b.SetBytes(int64(cfg.DataBytes(f)))
			var cpu time.Duration
			var gb float64
			for b.Loop() {
				out := filepath.Join(dir, "m."+f)
				c0 := cpuTime(b)
				res, err := Generate(context.Background(), cfg, out, Options{Format: f})
				if err != nil {
					b.Fatal(err)
				}
				cpu += cpuTime(b) - c0
				gb += float64(res.FileBytes) / 1e9
				os.Remove(out)
			}
			b.ReportMetric(cpu.Seconds()/gb, "cpu-s/GB")
		})
	}
}
