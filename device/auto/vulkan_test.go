package auto_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/device/vulkan"
)

// TestVulkan: "vulkan" opens device/vulkan when a driver is there and fails
// naming the backend when none is; auto never picks it.
func TestVulkan(t *testing.T) {
	d, ch, err := auto.Open(auto.Vulkan, auto.Options{})
	if err != nil {
		if !strings.Contains(err.Error(), "--device vulkan") {
			t.Fatalf("error %q does not name the backend", err)
		}
		if !errors.Is(err, vulkan.ErrNoLoader) {
			t.Logf("no usable Vulkan device: %v", err)
		}
		return
	}
	defer d.Close()
	if ch.Backend != auto.Vulkan || d.Info().Backend != "vulkan" {
		t.Fatalf("choice %+v, backend %q", ch, d.Info().Backend)
	}
	if _, _, err := auto.Open("bogus", auto.Options{}); err == nil || !strings.Contains(err.Error(), "vulkan") {
		t.Fatalf("unknown backend error %v does not list vulkan", err)
	}
}
