package main

import (
	"strings"
	"testing"
)

// TestRunCPUMatchesSim: `memwall run --device cpu` (the host's cores, no
// GPU) generates the tokens `--device sim` generates, greedy, on the tiny
// models in bf16 and f16, with every weight resident and with weights
// streamed through staging slots.
func TestRunCPUMatchesSim(t *testing.T) {
	for _, preset := range []string{"tiny", "tiny-f16"} {
		dir, _ := tinyDir(t, preset)
		for _, vram := range []string{"1GiB", "6MiB"} {
			args := []string{"run", dir, "--vram", vram, "--prompt-ids", "5,17,300,42,9,77", "--max-new", "16", "--ignore-eos", "--json"}
			sim := runJSONOut(t, append(args, "--device", "sim")...)
			cpu := runJSONOut(t, append(args, "--device", "cpu")...)
			if dev, _ := cpu["device"].(string); !strings.HasPrefix(dev, "cpu: ") {
				t.Errorf("%s --vram %s --device cpu ran on %q", preset, vram, cpu["device"])
			}
			a, b := tokensOf(sim), tokensOf(cpu)
			if len(b) != 16 || !equalInts(a, b) {
				t.Errorf("%s --vram %s: sim %v, cpu %v", preset, vram, a, b)
			}
			if (sim["streamed_bytes_per_token"].(float64) == 0) != (cpu["streamed_bytes_per_token"].(float64) == 0) {
				t.Errorf("%s --vram %s: sim streams %v bytes per token, cpu %v", preset, vram, sim["streamed_bytes_per_token"], cpu["streamed_bytes_per_token"])
			}
		}
	}
}
