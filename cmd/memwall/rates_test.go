package main

import (
	"testing"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/kernels"
)

// measureRates gives positive rates, or the flags' rates when given.
func TestMeasureRates(t *testing.T) {
	so := sim.DefaultOptions()
	so.Kernels = kernels.Sim()
	d := sim.New(so)
	defer d.Close()
	hs, err := openHost(func(string) string { return "" })
	if err != nil {
		t.Skip("no host device:", err)
	}
	defer hs.close()
	r, err := measureRates(d, hs.h, &placementFlags{}, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkGBps <= 0 || r.HostGBps <= 0 || r.LinkBothGBps <= 0 || r.HostBothGBps <= 0 {
		t.Fatalf("rates %+v", r)
	}
	r, err = measureRates(d, hs.h, &placementFlags{linkGBps: 7, hostGBps: 9}, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkGBps != 7 || r.LinkBothGBps != 7 || r.HostGBps != 9 || r.HostBothGBps != 9 {
		t.Fatalf("flags' rates not kept: %+v", r)
	}
}
