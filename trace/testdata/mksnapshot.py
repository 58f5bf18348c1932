#!/usr/bin/env python3
"""Writes the snapshot test fixtures of package trace, without torch.

A PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) is a pickled
dict built by torch/csrc/cuda/Module.cpp (THCPModule_memorySnapshot):

    {"segments": [{"device", "address", "total_size", "allocated_size",
                   "active_size", "requested_size", "stream", "segment_type",
                   "segment_pool_id", "is_expandable", "frames", "blocks"}],
     "device_traces": [[{"action", "addr" (or "device_free" for oom), "size",
                         "stream", "time_us", "frames"}, ...], ...],
     "allocator_settings": {...},
     "external_annotations": [...]}

This script builds dicts with the same keys, the same sharing (key strings and
action names are single objects, frame lists are shared between entries, as
PyTorch's symbolizer shares them) and the same value types, and pickles them
the way _dump_snapshot does (pickle.dump). Run it from trace/testdata:

    python3 mksnapshot.py

It writes:
    snapshot_p2.pickle, snapshot_p4.pickle, snapshot_p5.pickle
        one snapshot pickled with protocols 2, 4 and 5;
    snapshot.golden.jsonl
        the events a reader must return for it, in memwall's JSON-lines format;
    fuzz-seeds/small_p2.pickle, fuzz-seeds/small_p4.pickle
        the same snapshot with 6 blocks instead of 400, as fuzzing seeds;
    hostile_reduce_p2.pickle, hostile_reduce_p4.pickle
        pickles that call a function when unpickled (GLOBAL/STACK_GLOBAL and
        REDUCE: the harmless builtins.print), which readers must refuse.

With --from-csv TRACE.csv.gz OUT.pickle.gz it converts a CSV trace into a
gzipped snapshot (protocol 4) holding the same events, for cross-format tests
and benchmarks.
"""

import gzip
import json
import pickle
import sys

MiB = 1 << 20
BASE = 0x7F2A_0000_0000  # device addresses as the CUDA driver hands them out
STREAM = 0  # the default stream
SIDE_STREAM = 94_800_000_000_000  # a cudaStream_t pointer, as PyTorch stores it

FILES = ["/app/model.py", "/usr/lib/python3/site-packages/torch/nn/modules/linear.py"]


def frames_pool():
    """A few shared tracebacks (lists of frame dicts), as the symbolizer makes."""
    pool = []
    for i in range(4):
        pool.append([
            {"filename": FILES[j % 2], "line": 10 * i + j, "name": "forward_%d" % j}
            for j in range(i + 1)
        ])
    return pool


def entry(action, addr, size, stream, t, frames, oom=False):
    d = {}
    d["action"] = action
    d["device_free" if oom else "addr"] = addr
    d["size"] = size
    d["stream"] = stream
    d["time_us"] = t
    d["frames"] = frames
    return d


def snapshot_dict(traces, segments):
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0},
        },
        "external_annotations": [],
    }


def segment(device, address, total, allocated, stream, frames, blocks):
    return {
        "device": device,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": stream,
        "segment_type": "large" if total > MiB else "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": frames,
        "blocks": blocks,
    }


def fixture(blocks=400):
    """One snapshot covering every action, three devices (the middle one
    empty, the last with a single entry), more than 1000 entries on device 0
    (Python's pickler appends in batches of 1000), OOM's device_free, a
    "snapshot" marker, and addresses above 2^31 (LONG1)."""
    pool = frames_pool()
    dev0 = []
    golden = []
    t = 1_000_000

    def add(action, addr, size, stream=STREAM, oom=False, device=0, into=dev0, marker=False):
        nonlocal t
        t += 7
        into.append(entry(action, addr, size, stream, t, pool[len(into) % len(pool)], oom))
        if not marker:
            ev = {"t": t * 1000, "action": action, "addr": 0 if oom else addr, "size": size, "stream": stream}
            if device:
                ev["device"] = device
            if oom:
                ev["device_free"] = addr
            golden.append(ev)

    seg0, seg1 = BASE, BASE + 2 * MiB
    add("segment_alloc", seg0, 2 * MiB)
    add("segment_alloc", seg1, 20 * MiB, stream=SIDE_STREAM)
    # 400 blocks allocated, requested and freed in a sliding window: 1200
    # entries, so device 0's list needs two APPENDS batches and a remainder.
    live = []
    for i in range(blocks):
        addr = seg0 + 512 * (i % 64) if i % 3 else seg1 + 4096 * (i % 128)
        while any(a == addr for a, _ in live):
            addr += 64 * 1024 * 1024 * 4  # never collides: beyond both segments
        size = 512 if i % 3 else 4096
        add("alloc", addr, size)
        live.append((addr, size))
        if len(live) > 8:
            a, s = live.pop(0)
            add("free_requested", a, s)
            add("free_completed", a, s)
    add("snapshot", 0, 0, marker=True)
    for a, s in live:
        add("free_requested", a, s)
        add("free_completed", a, s)
    add("segment_map", BASE + 64 * MiB, 2 * MiB)
    add("segment_unmap", BASE + 64 * MiB, 2 * MiB)
    add("oom", 3 * MiB, 1 << 41, oom=True)  # device_free 3 MiB, asked for 2 TiB
    add("segment_free", seg0, 2 * MiB)

    dev2 = []
    add("segment_alloc", BASE + (1 << 40), 2 * MiB, device=2, into=dev2)

    segments = [
        segment(0, seg1, 20 * MiB, 0, SIDE_STREAM, pool[0],
                [{"address": seg1, "size": 20 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]),
        segment(2, BASE + (1 << 40), 2 * MiB, 0, STREAM, [], []),
    ]
    return snapshot_dict([dev0, [], dev2], segments), golden


class Call:
    """Unpickling this calls builtins.print: what a hostile pickle does."""

    def __reduce__(self):
        return (print, ("unpickled: this pickle ran code",))


def write_fixtures():
    snap, golden = fixture()
    for proto in (2, 4, 5):
        with open("snapshot_p%d.pickle" % proto, "wb") as f:
            pickle.dump(snap, f, protocol=proto)
    with open("snapshot.golden.jsonl", "w") as f:
        for ev in golden:
            f.write(json.dumps(ev, separators=(",", ":")) + "\n")
    small, _ = fixture(blocks=6)
    for proto in (2, 4):
        with open("fuzz-seeds/small_p%d.pickle" % proto, "wb") as f:
            pickle.dump(small, f, protocol=proto)
    for proto in (2, 4):
        with open("hostile_reduce_p%d.pickle" % proto, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[Call()]]}, f, protocol=proto)


def from_csv(src, dst):
    """Converts a CSV trace (action,addr,size,stream) into a gzipped snapshot."""
    pool = frames_pool()
    trace = []
    with gzip.open(src, "rt") as f:
        header = f.readline().strip()
        assert header == "action,addr,size,stream", header
        for i, line in enumerate(f):
            action, addr, size, stream = line.rstrip("\n").split(",")
            trace.append(entry(sys.intern(action), int(addr), int(size), int(stream), i, pool[i % len(pool)]))
    with gzip.open(dst, "wb") as f:
        pickle.dump(snapshot_dict([trace], []), f, protocol=4)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--from-csv":
        from_csv(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 1:
        write_fixtures()
    else:
        sys.exit(__doc__)
