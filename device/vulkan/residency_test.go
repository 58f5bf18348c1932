package vulkan_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

// TestStreamWeights is weight streaming over Vulkan: the tiny model planned
// into a budget that streams some of its groups, residency copying them on
// its own stream (the transfer queue where there is one) into a ring of
// slots, a compute stream waiting for each copy on the GPU (a timeline
// semaphore wait) before it reads the group back. Every byte read through
// a view equals the file's, over three passes of the ring.
func TestStreamWeights(t *testing.T) {
	d := open(t)
	ctx := context.Background()
	path, err := synth.WriteTiny(ctx, t.TempDir(), synth.Safetensors)
	if err != nil {
		t.Fatal(err)
	}
	m, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	groups, _ := plan.GroupWeights(m.Tensors)
	var total uint64
	for _, tn := range m.Tensors {
		total += tn.Bytes
	}
	p, err := plan.PlanWeights(groups, plan.WeightOptions{Budget: total / 2, LinkGBps: 25})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := pool.New(d, pool.Options{Name: "weights"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	host, err := pool.NewHost(d, pool.Options{Name: "pinned", Cache: pool.CacheOff})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	r, err := residency.New(ctx, d, dev, host, m, p, residency.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	compute, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(compute)
	done := make([]device.Event, len(p.Groups))
	for g := range done {
		if done[g], err = d.NewEvent(false); err != nil {
			t.Fatal(err)
		}
		defer d.DestroyEvent(done[g])
	}
	// Pinned memory for the read-back, so that the read is itself a copy
	// queued on the compute stream after the wait.
	var maxBytes uint64
	for _, tn := range m.Tensors {
		maxBytes = max(maxBytes, tn.Bytes)
	}
	hb, err := d.HostAlloc(maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(hb)
	checked := 0
	for pass := range 3 {
		for g := range p.Groups {
			views, ready, err := r.Acquire(g)
			if err != nil {
				t.Fatalf("pass %d group %d: %v", pass, g, err)
			}
			if ready != 0 {
				if err := d.StreamWaitEvent(compute, ready); err != nil {
					t.Fatal(err)
				}
			}
			for _, v := range views {
				got := hb.Bytes[:v.Tensor.Bytes]
				if err := d.CopyDtoH(got, v.Ptr, compute); err != nil {
					t.Fatal(err)
				}
				if err := d.StreamSynchronize(compute); err != nil {
					t.Fatal(err)
				}
				if want := m.Data(v.Tensor); !bytes.Equal(got, want) {
					t.Fatalf("pass %d group %d tensor %s: the %d bytes read on the device differ from the file's", pass, g, v.Tensor.Name, len(want))
				}
				checked++
			}
			if err := d.EventRecord(done[g], compute); err != nil {
				t.Fatal(err)
			}
			if err := r.Release(g, done[g]); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := r.Stats()
	if st.Copies == 0 || st.StreamedBytes == 0 {
		t.Fatalf("nothing streamed: %+v", st)
	}
	t.Logf("%d groups (%d resident, %d slots), %d copies, %d bytes streamed from %s; %d tensors checked", st.Groups, st.ResidentGroups, st.Slots, st.Copies, st.StreamedBytes, st.Source, checked)
}
