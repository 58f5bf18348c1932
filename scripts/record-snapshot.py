#!/usr/bin/env python3
"""Records a real PyTorch CUDA memory snapshot for memwall's trace readers.

Runs a small model on the GPU with the caching allocator's history recording
on, then writes the snapshot with torch.cuda.memory._dump_snapshot (a pickle,
the format trace.Open reads; memory_viz at pytorch.org/memory_viz shows it
too). Needs torch with CUDA; the model is built from torch.nn with random
weights, so nothing is downloaded.

    python3 scripts/record-snapshot.py --out snapshot.pickle
    python3 scripts/record-snapshot.py --out snap.pickle.gz --gzip \\
        --max-entries 50000 --alloc-conf expandable_segments:True

Then, from Go: r, err := trace.Open("snapshot.pickle", trace.Options{}).

--max-entries bounds PyTorch's ring buffer: a run longer than that loses its
first events, and the frees of blocks allocated before them then name unknown
addresses (read such a snapshot with trace.Options{Lenient: true}).
--stacks none records no tracebacks (small files); python records Python
frames as PyTorch does by default for snapshots viewed in memory_viz.
"""

import argparse
import gzip
import os
import pickle
import shutil
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="snapshot file to write (.pickle, or .pickle.gz with --gzip)")
    p.add_argument("--gzip", action="store_true", help="gzip the pickle")
    p.add_argument("--max-entries", type=int, default=100_000, help="trace ring-buffer size (default 100000)")
    p.add_argument("--stacks", choices=["none", "python", "all"], default="python",
                   help="tracebacks to record with each event (default python)")
    p.add_argument("--alloc-conf", default="",
                   help="PYTORCH_CUDA_ALLOC_CONF for the run, e.g. expandable_segments:True")
    p.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    p.add_argument("--width", type=int, default=512, help="model width (default 512)")
    p.add_argument("--calls", type=int, default=6, help="forward calls with varying shapes (default 6)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    return p.parse_args()


def main():
    args = parse_args()
    if args.alloc_conf:
        # Must be set before CUDA initializes.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    import torch

    if not torch.cuda.is_available():
        sys.exit("record-snapshot: no CUDA device (this script must run on a GPU machine)")
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)

    layer = torch.nn.TransformerEncoderLayer(
        d_model=args.width, nhead=8, dim_feedforward=4 * args.width, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=args.layers, enable_nested_tensor=False)
    model = model.to(dev, dtype=torch.float16).eval()
    torch.cuda.synchronize()

    # Weights are loaded: record from here on, as the shared CSV traces do.
    if args.stacks == "none":
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=args.max_entries)
    else:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks=args.stacks, max_entries=args.max_entries)

    shapes = [(1 + (i * 5) % 8, 16 + (i * 97) % 480) for i in range(args.calls)]
    side = torch.cuda.Stream()
    with torch.inference_mode():
        for i, (batch, length) in enumerate(shapes):
            x = torch.randn(batch, length, args.width, device=dev, dtype=torch.float16)
            stream = side if i % 2 else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                y = model(x)
            torch.cuda.current_stream().wait_stream(stream)
            y.sum().item()
            del x, y
        torch.cuda.empty_cache()  # segment_free (or segment_unmap) events
    torch.cuda.synchronize()

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)

    # _dump_snapshot(path) is pickle.dump(_snapshot(), f); we pickle the same
    # dict ourselves to gzip it and to print a summary.
    tmp = args.out + ".tmp"
    opener = gzip.open if args.gzip else open
    with opener(tmp, "wb") as f:
        pickle.dump(snapshot, f)
    shutil.move(tmp, args.out)

    traces = snapshot["device_traces"]
    counts = {}
    for trace in traces:
        for te in trace:
            counts[te["action"]] = counts.get(te["action"], 0) + 1
    reserved = sum(s["total_size"] for s in snapshot["segments"])
    print("record-snapshot: wrote %s (%d bytes): torch %s, %s, pickle protocol %d"
          % (args.out, os.path.getsize(args.out), torch.__version__,
             torch.cuda.get_device_name(dev), pickle.DEFAULT_PROTOCOL))
    print("record-snapshot: %d segments holding %.1f MiB at the end; events by action: %s"
          % (len(snapshot["segments"]), reserved / 2**20,
             ", ".join("%s %d" % kv for kv in sorted(counts.items()))))


if __name__ == "__main__":
    main()
