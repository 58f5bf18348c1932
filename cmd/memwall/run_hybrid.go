package main

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

// placementFlags are run's and fit's choice of where blocks that do not
// fit the budget go: streamed to the device, computed on the host, or
// (auto) what the measured rates predict is faster for decode.
type placementFlags struct {
	placement          string
	linkGBps, hostGBps float64
}

func (p *placementFlags) check() error {
	switch p.placement {
	case "auto", "stream", "host":
	default:
		return usagef("--placement %q: want stream, host or auto", p.placement)
	}
	if p.linkGBps < 0 || p.hostGBps < 0 || p.linkGBps > 1e4 || p.hostGBps > 1e4 {
		return usagef("--link-gbps and --host-gbps: want 0 (measure) to 10000")
	}
	return nil
}

// hostSide is the host device hosted blocks run on, with its kernels and
// pools; close gives them back.
type hostSide struct {
	h     *engine.Host
	close func()
}

// openHost opens the host's cores as a device for hosted blocks.
// MEMWALL_CPU_PAGES and MEMWALL_CPU_WORKERS (read by getenv) configure it
// as they do --device cpu.
func openHost(getenv func(string) string) (*hostSide, error) {
	co, err := auto.CPUFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	co.Kernels = kernels.CPU()
	d, err := cpu.New(co)
	if err != nil {
		return nil, fmt.Errorf("host device: %w", err)
	}
	ks, err := kernels.Load(d, nil)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("host device kernels: %w", err)
	}
	dev, err := pool.New(d, pool.DefaultOptions(d))
	if err != nil {
		ks.Close()
		d.Close()
		return nil, fmt.Errorf("host device pool: %w", err)
	}
	pinned, err := pool.NewHost(d, pool.Options{Name: "host-staging"})
	if err != nil {
		dev.Close()
		ks.Close()
		d.Close()
		return nil, fmt.Errorf("host device staging pool: %w", err)
	}
	return &hostSide{h: &engine.Host{D: d, KS: ks, Pool: dev, Pinned: pinned}, close: func() {
		pinned.Close()
		dev.Close()
		ks.Close()
		d.Close()
	}}, nil
}

// place decides, when rp's plan streams weights and --placement allows
// (auto: on a CUDA device),
// which blocks the host computes (engine.PlaceHost at the rates given or
// measured), and sets them into rp. The host side returned (nil: none)
// must be closed after the engine.
func (g *generation) place(e *env, d device.Device, ks *kernels.Set, rp *reservation, backend string) (*hostSide, error) {
	pf := g.placement
	if pf == nil || pf.placement == "stream" || backend == "cpu" || rp.foot == nil || len(rp.foot.Plan.Streamed()) == 0 {
		return nil, nil
	}
	if pf.placement == "auto" && d.Info().Backend != "cuda" {
		// The simulator's link is a model, not one to measure against the
		// host's cores: auto streams there (--placement host tests hosting).
		return nil, nil
	}
	hs, err := openHost(e.getenv)
	if err != nil {
		if pf.placement == "host" {
			return nil, err
		}
		return nil, nil // auto: no host device, stream
	}
	rates := engine.Rates{HostGBps: 1} // host: nothing streams
	if pf.placement == "auto" {
		if rates, err = measureRates(d, hs.h, pf, hostProbeBytes); err != nil {
			hs.close()
			return nil, err
		}
	}
	p, err := engine.PlaceHost(e.ctx, g.model, rp.opts, d.Info(), rates)
	if err != nil {
		hs.close()
		return nil, err
	}
	if !slices.Contains(p.HostLayers, true) {
		hs.close()
		return nil, nil
	}
	rp.opts.HostLayers, rp.opts.Host, rp.foot = p.HostLayers, hs.h, p.Footprint
	g.rates = &rates
	return hs, nil
}

// hostProbeBytes is the weights run's measureRates times the host's
// products over.
const hostProbeBytes = 512 << 20

// measureRates times, briefly, 64 MiB host-to-device copies and the host's
// bf16 matrix-vector product over probe bytes of weights, each alone and
// both at once. run probes hostProbeBytes, more than a server's last-level
// cache holds, so that the rate is memory's (over 64 MiB the H200
// machine's host measured 108 GB/s, against 65–80 over the model's
// weights). A rate given by flag is kept.
func measureRates(d device.Device, h *engine.Host, pf *placementFlags, probe uint64) (engine.Rates, error) {
	const n = 64 << 20
	hb, err := d.HostAlloc(n)
	if err != nil {
		return engine.Rates{}, fmt.Errorf("measure the link: %w", err)
	}
	defer d.HostFree(hb)
	dp, err := d.Alloc(n)
	if err != nil {
		return engine.Rates{}, fmt.Errorf("measure the link: %w", err)
	}
	defer d.Free(dp)
	st, err := d.NewStream()
	if err != nil {
		return engine.Rates{}, err
	}
	defer d.DestroyStream(st)
	link := func() (float64, error) {
		t0 := time.Now()
		for range 3 {
			if err := d.CopyHtoD(dp, hb.Bytes, st); err != nil {
				return 0, err
			}
		}
		if err := d.StreamSynchronize(st); err != nil {
			return 0, err
		}
		return 3 * n / time.Since(t0).Seconds() / 1e9, nil
	}
	hd := h.D
	hn := max(2*4096, min(probe, hd.Info().TotalBytes/8)/(2*4096)*(2*4096))
	M, K := uint32(4096), uint32(hn/2/4096)
	w, err := hd.Alloc(hn)
	if err != nil {
		return engine.Rates{}, fmt.Errorf("measure host products: %w", err)
	}
	defer hd.Free(w)
	x, err := hd.Alloc(2 * uint64(K))
	if err != nil {
		return engine.Rates{}, err
	}
	defer hd.Free(x)
	y, err := hd.Alloc(4 * uint64(M))
	if err != nil {
		return engine.Rates{}, err
	}
	defer hd.Free(y)
	hs, err := hd.NewStream()
	if err != nil {
		return engine.Rates{}, err
	}
	defer hd.DestroyStream(hs)
	host := func() (float64, error) {
		t0 := time.Now()
		for range 3 {
			if err := h.KS.Matmul(kernels.BF16, w, x, y, M, K, 1, hs); err != nil {
				return 0, err
			}
		}
		if err := hd.StreamSynchronize(hs); err != nil {
			return 0, err
		}
		return 3 * float64(hn) / time.Since(t0).Seconds() / 1e9, nil
	}
	if _, err := host(); err != nil { // first touch of the weights
		return engine.Rates{}, fmt.Errorf("measure host products: %w", err)
	}
	if _, err := link(); err != nil { // first touch of both buffers
		return engine.Rates{}, fmt.Errorf("measure the link: %w", err)
	}
	var r engine.Rates
	if r.LinkGBps, err = link(); err != nil {
		return r, fmt.Errorf("measure the link: %w", err)
	}
	if r.HostGBps, err = host(); err != nil {
		return r, fmt.Errorf("measure host products: %w", err)
	}
	var wg sync.WaitGroup
	var lerr error
	wg.Add(1)
	go func() { defer wg.Done(); r.LinkBothGBps, lerr = link() }()
	var herr error
	r.HostBothGBps, herr = host()
	wg.Wait()
	if err := errors.Join(lerr, herr); err != nil {
		return r, fmt.Errorf("measure link and host at once: %w", err)
	}
	if pf.linkGBps > 0 {
		r.LinkGBps, r.LinkBothGBps = pf.linkGBps, pf.linkGBps
	}
	if pf.hostGBps > 0 {
		r.HostGBps, r.HostBothGBps = pf.hostGBps, pf.hostGBps
	}
	return r, nil
}

// blockPlacement names where each block's weights are during decode:
// "host", "resident" (every group of the block on the device) or
// "streamed" (at least one group copied per step).
func blockPlacement(eng *engine.Engine, layers int, hosted []bool) []string {
	out := make([]string, layers)
	for l := range out {
		out[l] = "resident"
		if hosted != nil && hosted[l] {
			out[l] = "host"
		}
	}
	for _, g := range eng.Plan().Groups {
		if g.Layer >= 0 && !g.Resident && out[g.Layer] != "host" {
			out[g.Layer] = "streamed"
		}
	}
	return out
}

func countOf(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}
