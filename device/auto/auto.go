// Package auto opens the device memwall should use: the real GPU through
// device/cuda when it works, otherwise the simulated device, and says why;
// or, when asked, the host's cores (device/cpu) or a Vulkan device.
package auto

import (
	"fmt"
	"os"
	"strconv"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/device/vulkan"
)

// Backends accepted by Open.
const (
	Auto = "auto"
	CUDA = "cuda"
	Sim  = "sim"
	// Vulkan opens device/vulkan (MEMWALL_VULKAN_DEVICE picks the GPU by
	// index or name); auto never picks it.
	Vulkan = "vulkan"
	// CPU opens device/cpu: the host's cores and memory; auto never picks
	// it.
	CPU = "cpu"
)

// The variables CPUFromEnv reads: the CPU device's cpu.Pages ("populate",
// the default; "lazy"; "huge") and its workers (1..4096; default
// cpu.Options' own).
const (
	EnvCPUPages   = "MEMWALL_CPU_PAGES"
	EnvCPUWorkers = "MEMWALL_CPU_WORKERS"
)

// CPUFromEnv returns cpu.Options with Pages and Workers from EnvCPUPages
// and EnvCPUWorkers as getenv (nil: the process environment) reads them,
// or an error naming the variable and its limits.
func CPUFromEnv(getenv func(string) string) (cpu.Options, error) {
	getenv = envOf(getenv)
	var o cpu.Options
	pages, err := cpu.ParsePages(getenv(EnvCPUPages))
	if err != nil {
		return o, fmt.Errorf("%s: %w", EnvCPUPages, err)
	}
	o.Pages = pages
	if s := getenv(EnvCPUWorkers); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 4096 {
			return o, fmt.Errorf("%s=%q: want a whole number of workers in 1..4096", EnvCPUWorkers, s)
		}
		o.Workers = n
	}
	return o, nil
}

// Choice records which backend was opened and why.
type Choice struct {
	Requested string `json:"requested"`
	Backend   string `json:"backend"`
	// Reason explains the choice, e.g. why auto fell back to the simulator.
	Reason string `json:"reason"`
}

// Options configure Open.
type Options struct {
	// Ordinal selects the GPU for cuda.
	Ordinal int
	// Getenv reads MEMWALL_LIBCUDA and friends; nil means the process
	// environment.
	Getenv func(string) string
	// Sim configures the simulated device; zero means sim.DefaultOptions().
	Sim *sim.Options
	// Kernels are registered on the simulated device when Sim names none
	// (a program that launches memwall's kernels passes kernels.Sim():
	// this package, the floor the kernels stand on, does not import them).
	Kernels []sim.Kernel
	// CPU configures the CPU device; nil means cpu.Options{} with
	// CPUKernels.
	CPU *cpu.Options
	// CPUKernels are registered on the CPU device when CPU names none (a
	// program that launches memwall's kernels passes kernels.CPU()).
	CPUKernels []cpu.Kernel
}

// Open opens a device by backend name: "cuda" fails if the GPU cannot be
// used; "sim" always gives the simulator; "auto" tries cuda and falls back to
// sim, recording the cuda error in Choice.Reason.
func Open(backend string, o Options) (device.Device, Choice, error) {
	ch := Choice{Requested: backend}
	openSim := func() device.Device {
		so := sim.DefaultOptions()
		if o.Sim != nil {
			so = *o.Sim
		}
		if so.Kernels == nil {
			so.Kernels = o.Kernels
		}
		return sim.New(so)
	}
	switch backend {
	case CUDA:
		d, err := cuda.Open(cuda.Options{Ordinal: o.Ordinal, Getenv: o.Getenv})
		if err != nil {
			return nil, ch, fmt.Errorf("--device cuda: %w", err)
		}
		ch.Backend, ch.Reason = CUDA, "requested; driver "+d.DriverPath()
		return d, ch, nil
	case Vulkan:
		d, err := vulkan.Open(vulkan.Options{Getenv: o.Getenv})
		if err != nil {
			return nil, ch, fmt.Errorf("--device vulkan: %w", err)
		}
		ch.Backend, ch.Reason = Vulkan, "requested; loader "+d.LoaderPath()+", "+d.Info().DriverVersion
		return d, ch, nil
	case Sim:
		ch.Backend, ch.Reason = Sim, "requested"
		return openSim(), ch, nil
	case CPU:
		var co cpu.Options
		if o.CPU != nil {
			co = *o.CPU
		} else {
			var err error
			if co, err = CPUFromEnv(o.Getenv); err != nil {
				return nil, ch, err
			}
		}
		if co.Kernels == nil {
			co.Kernels = o.CPUKernels
		}
		d, err := cpu.New(co)
		if err != nil {
			return nil, ch, fmt.Errorf("--device cpu: %w", err)
		}
		ch.Backend, ch.Reason = CPU, "requested; "+d.Info().Name
		return d, ch, nil
	case Auto, "":
		d, err := cuda.Open(cuda.Options{Ordinal: o.Ordinal, Getenv: o.Getenv})
		if err == nil {
			ch.Backend, ch.Reason = CUDA, "a CUDA GPU is usable (driver "+d.DriverPath()+")"
			return d, ch, nil
		}
		ch.Backend, ch.Reason = Sim, "no usable CUDA GPU, using the simulated device: "+err.Error()
		return openSim(), ch, nil
	default:
		return nil, ch, fmt.Errorf("unknown device backend %q (want auto, cuda, sim, cpu or vulkan)", backend)
	}
}

// envOf is getenv, or the process environment when it is nil.
func envOf(getenv func(string) string) func(string) string {
	if getenv == nil {
		return os.Getenv
	}
	return getenv
}
