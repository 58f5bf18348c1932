package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/synth"
)

// TestDeviceUnavailableSaysAlternative: a backend asked for by name that
// does not open (no Vulkan loader, no CUDA driver) fails in one line that
// says why and names the backends to give instead; so does a Vulkan device
// on which memwall's SPIR-V product kernel does not load (stream and fit
// --plain, which multiply there), instead of the module loader's error
// alone.
func TestDeviceUnavailableSaysAlternative(t *testing.T) {
	path := tinyFile(t, synth.Safetensors)
	missing := func(k string) string {
		switch k {
		case "MEMWALL_LIBVULKAN":
			return "/nonexistent/libvulkan.so.1"
		case "MEMWALL_LIBCUDA":
			return "/nonexistent/libcuda.so.1"
		}
		return ""
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stream", path, "--vram", "64MiB", "--device", "vulkan"}, "give --device cpu (the host's cores) or --device cuda"},
		{[]string{"fit", path, "--plain", "--vram", "64MiB", "--device", "vulkan"}, "give --device cpu (the host's cores) or --device cuda"},
		{[]string{"stream", path, "--vram", "64MiB", "--device", "cuda"}, "give --device cpu (the host's cores) or --device sim"},
		{[]string{"info", "--device", "vulkan"}, "give --device cpu (the host's cores) or --device cuda"},
	} {
		code, _, stderr := runVerb(t, missing, c.args...)
		if code != exitFail || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and one line with %q", c.args, code, stderr, c.want)
		}
	}
	// A Vulkan device whose module loader fails: the simulator, named
	// vulkan.
	spirvFails := func(e *env) { e.wrapDevice = func(d device.Device) device.Device { return noSPIRV{d} } }
	for _, args := range [][]string{
		{"stream", path, "--vram", "64MiB", "--device", "sim"},
		{"fit", path, "--plain", "--vram", "64MiB", "--device", "sim"},
	} {
		code, _, stderr := runEnv(t, spirvFails, args...)
		if code != exitFail || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "memwall's SPIR-V matrix product did not load on") ||
			!strings.Contains(stderr, "give --device cpu (the host's cores) or --device cuda (an NVIDIA GPU), which run the same products") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}

// noSPIRV is a device that says it is a Vulkan one and loads no module.
type noSPIRV struct{ device.Device }

func (n noSPIRV) Info() device.Info {
	in := n.Device.Info()
	in.Backend = "vulkan"
	return in
}

func (noSPIRV) LoadModule([]byte) (device.Module, error) {
	return 0, errors.New("vkCreateShaderModule: VK_ERROR_INVALID_SHADER_NV")
}
