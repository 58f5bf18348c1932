package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
)

// TestRun runs the example on the simulator as a user would and checks
// every step's line: the pool's accounting, the KV cache's shared prefix
// and the engine's six tokens, the same on a second run.
func TestRun(t *testing.T) {
	var out [2]bytes.Buffer
	for i := range out {
		if err := run(context.Background(), &out[i], "sim"); err != nil {
			t.Fatal(err)
		}
	}
	got := out[0].String()
	for _, want := range []string{
		`(?m)^device: .* \(sim\)$`,
		`(?m)^pool: 2 blocks live, weights 32 MiB, activations 3 MiB$`,
		`(?m)^kv cache: the second request found 32 tokens cached; first block shared: true$`,
		`(?m)^engine: 6 tokens \[\d+ \d+ \d+ \d+ \d+ \d+\], 0 of \d+ weight groups streamed$`,
	} {
		if !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("output lacks %s:\n%s", want, got)
		}
	}
	if out[1].String() != got {
		t.Errorf("second run differs:\n%s\nfirst:\n%s", out[1].String(), got)
	}
}
