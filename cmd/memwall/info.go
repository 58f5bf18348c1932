package main

import (
	"fmt"
	"strings"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/kernels"
)

func init() {
	register(verb{name: "info", summary: "show the device memwall sees and what it will do about it", run: runInfo})
}

// deviceFlag is the --device flag shared by verbs that open a device.
type deviceFlag struct{ backend string }

// add registers --device on fs.
func (f *deviceFlag) add(fs interface {
	StringVar(*string, string, string, string)
}) {
	fs.StringVar(&f.backend, "device", "auto", "device backend: auto, cuda, sim, cpu or vulkan")
}

// check refuses a backend auto.Open does not know, as a usage error.
func (f *deviceFlag) check() error {
	switch f.backend {
	case "auto", "cuda", "sim", "cpu", "vulkan":
		return nil
	}
	return usagef("--device %q: want auto, cuda, sim or cpu (or vulkan)", f.backend)
}

// open opens the device --device names; an unknown name is a usage error.
func (f *deviceFlag) open(e *env) (device.Device, auto.Choice, error) {
	if err := f.check(); err != nil {
		return nil, auto.Choice{}, err
	}
	return e.open(f.backend, auto.Options{Getenv: e.getenv, Kernels: kernels.Sim()})
}

// open opens a device by backend name (auto.Open), wrapped by
// e.wrapDevice when a test set one; the CPU device gets memwall's kernels.
func (e *env) open(backend string, o auto.Options) (device.Device, auto.Choice, error) {
	if o.CPUKernels == nil {
		o.CPUKernels = kernels.CPU()
	}
	d, ch, err := auto.Open(backend, o)
	if err != nil {
		return nil, ch, withAlternative(backend, err)
	}
	if e.wrapDevice != nil {
		d = e.wrapDevice(d)
	}
	return d, ch, nil
}

// withAlternative is the error of a backend asked for by name that did not
// open, with the backends to give instead: a machine without Vulkan or
// without a CUDA GPU still runs memwall on its cores.
func withAlternative(backend string, err error) error {
	switch backend {
	case auto.Vulkan:
		return fmt.Errorf("%w; without a usable Vulkan device give --device cpu (the host's cores) or --device cuda (an NVIDIA GPU)", err)
	case auto.CUDA:
		return fmt.Errorf("%w; without a usable CUDA GPU give --device cpu (the host's cores) or --device sim (the simulator)", err)
	}
	return err
}

// loadKernels is kernels.Load, whose failure on a Vulkan device (its
// SPIR-V product kernel did not load there) says so and names the
// backends that run the same products.
func loadKernels(e *env, d device.Device) (*kernels.Set, error) {
	ks, err := kernels.Load(d, e.getenv)
	if err != nil && d.Info().Backend == auto.Vulkan {
		err = fmt.Errorf("--device vulkan: memwall's SPIR-V matrix product did not load on %s (%v); give --device cpu (the host's cores) or --device cuda (an NVIDIA GPU), which run the same products", d.Info().Name, err)
	}
	return ks, err
}

// infoJSON is `memwall info --json`.
type infoJSON struct {
	device.Info
	FreeBytes uint64      `json:"free_bytes"`
	Choice    auto.Choice `json:"choice"`
	Strategy  string      `json:"strategy"`
}

// strategyFor says what memwall does about the topology.
func strategyFor(in device.Info) string {
	switch {
	case in.HostMemory:
		return "host memory: resident weights are read in place from the read-only mapping of the model file (no copy; they count as the file's page cache), kernels run on the host's cores"
	case in.Integrated:
		return "unified memory: weights are used in place from host memory (zero-copy through mapped pointers), no staging copies"
	case in.PageableMemoryAccess:
		return "discrete with pageable access: weights that do not fit are streamed from pinned host memory through device staging slots; the GPU could also read host memory directly"
	default:
		return "discrete: weights that do not fit are streamed from pinned host memory through device staging slots, copies overlapped with compute"
	}
}

func runInfo(e *env, args []string) error {
	fs := newFlags(e, "info", "[--device auto|cuda|sim] [--json]")
	var df deviceFlag
	df.add(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	d, ch, err := df.open(e)
	if err != nil {
		return err
	}
	defer d.Close()
	in := d.Info()
	free, total, err := d.MemInfo()
	if err != nil {
		return fmt.Errorf("memory info: %w", err)
	}
	if total != 0 {
		in.TotalBytes = total
	}
	out := infoJSON{Info: in, FreeBytes: free, Choice: ch, Strategy: strategyFor(in)}
	if *asJSON {
		return writeJSON(e.stdout, withVulkan(d, out))
	}
	w := e.stdout
	fmt.Fprintf(w, "device       %s (%s, ordinal %d)\n", in.Name, in.Backend, in.Ordinal)
	fmt.Fprintf(w, "chosen       %s → %s: %s\n", ch.Requested, ch.Backend, ch.Reason)
	if in.DriverVersion != "" {
		if in.Backend == "cuda" {
			fmt.Fprintf(w, "driver       CUDA %s\n", in.DriverVersion)
		}
	}
	fmt.Fprintf(w, "memory       %s total, %s free\n", humanBytes(in.TotalBytes), humanBytes(free))
	if in.HostMemory {
		fmt.Fprintf(w, "compute      %d worker cores\n", in.Multiprocessors)
	} else {
		fmt.Fprintf(w, "compute      capability %d.%d, %d multiprocessors\n", in.ComputeMajor, in.ComputeMinor, in.Multiprocessors)
	}
	topo := "discrete GPU"
	switch {
	case in.HostMemory:
		topo = "the host itself (device memory is host memory)"
	case in.Integrated:
		topo = "integrated GPU (unified memory)"
	}
	link := "PCIe link unknown"
	if in.HostMemory {
		link = "no link"
	}
	if in.PCIeGen > 0 {
		link = fmt.Sprintf("PCIe Gen%d x%d", in.PCIeGen, in.PCIeWidth)
	}
	fmt.Fprintf(w, "topology     %s, %s, %d copy engines", topo, link, in.CopyEngines)
	if in.PCIBusID != "" {
		fmt.Fprintf(w, ", bus %s", in.PCIBusID)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "host memory  map into device: %s; pageable access: %s; read-only register: %s\n",
		yesNo(in.CanMapHostMemory), yesNo(in.PageableMemoryAccess), yesNo(in.ReadOnlyHostRegister))
	vm := "no"
	if in.VirtualMemory {
		vm = "yes, granularity " + humanBytes(in.Granularity)
	}
	fmt.Fprintf(w, "virtual mem  %s\n", vm)
	fmt.Fprintf(w, "plan         %s\n", out.Strategy)
	if len(in.Disabled) > 0 {
		fmt.Fprintf(w, "disabled     %s\n", strings.Join(in.Disabled, "\n             "))
	}
	return printVulkan(w, d)
}
