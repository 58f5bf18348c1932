package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/memwall/memwall/device/vulkan"
)

// TestInfoVulkan runs `memwall info --device vulkan` with and without
// --json: the same heap figures in both, backend "vulkan". It skips where
// no Vulkan loader or driver exists.
func TestInfoVulkan(t *testing.T) {
	d, err := vulkan.Open(vulkan.Options{})
	if err != nil {
		t.Skipf("no usable Vulkan device: %v", err)
	}
	want := d.Details()
	d.Close()
	code, stdout, stderr := runVerb(t, nil, "info", "--device", "vulkan", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got struct {
		Backend string         `json:"backend"`
		Vulkan  vulkan.Details `json:"vulkan"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("%v in %s", err, stdout)
	}
	if got.Backend != "vulkan" || len(got.Vulkan.Heaps) != len(want.Heaps) || len(got.Vulkan.Queues) != len(want.Queues) ||
		len(got.Vulkan.Types) != len(want.Types) {
		t.Fatalf("info --json: backend %q, %d heaps %d types %d queue families; want vulkan, %d, %d, %d",
			got.Backend, len(got.Vulkan.Heaps), len(got.Vulkan.Types), len(got.Vulkan.Queues), len(want.Heaps), len(want.Types), len(want.Queues))
	}
	code, stdout, stderr = runVerb(t, nil, "info", "--device", "vulkan")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, h := range got.Vulkan.Heaps {
		if line := fmt.Sprintf("heap %-7d", h.Index); !strings.Contains(stdout, line) {
			t.Errorf("human output lacks %q:\n%s", line, stdout)
		}
		if !strings.Contains(stdout, humanBytes(h.SizeBytes)) {
			t.Errorf("human output lacks heap %d's size %s:\n%s", h.Index, humanBytes(h.SizeBytes), stdout)
		}
	}
	if !strings.Contains(stdout, "memwall device") || !strings.Contains(stdout, "memwall compute") {
		t.Errorf("human output does not say which memory type and queue memwall uses:\n%s", stdout)
	}
}
