#!/usr/bin/env python3
"""Exports small transformer/UNet graphs with PyTorch's dynamo ONNX exporter
and measures ONNX Runtime on them with its default settings and with the
settings `memwall plan MODEL --ort` prints (issue 16).

  python3 onnx-export.py export --out DIR       # DIR/ship/*.onnx, DIR/work/...
  python3 onnx-export.py ort MODEL --mode default|memwall|memwall-need [--settings PLAN.json]

`export` builds each model from a config written here (random weights, no
download), exports it with torch.onnx.export(..., dynamo=True,
external_data=True) and writes two files to ship per model:
NAME.nodata.onnx, the graph alone with every initializer (the small shape
constants too) moved to an external data file that is left out, as when the
weights are not shipped, and NAME.inline.onnx, the same graph with every
initializer inline. `ort` runs one model once in this
process (run it in a fresh process per measurement) and prints one JSON
line: peak RSS (ru_maxrss), the high-water mark before the session was
created, session creation time and the median of the timed runs.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time


def models():
    """(name, module, example args, dynamic_shapes or None), all small."""
    import torch
    from torch import nn
    import transformers as tf

    torch.manual_seed(0)

    def eager(cfg):
        try:
            cfg._attn_implementation = "eager"
        except Exception:
            pass
        return cfg

    class Field(nn.Module):
        """Calls a transformers model and returns one tensor of its output."""

        def __init__(self, m, field, kw):
            super().__init__()
            self.m, self.field, self.kw = m, field, kw

        def forward(self, x):
            return getattr(self.m(x, **self.kw), self.field)

    out = []

    def gpt2():
        cfg = eager(tf.GPT2Config(vocab_size=1024, n_positions=64, n_embd=96, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=0))
        m = tf.GPT2LMHeadModel(cfg).eval()
        return Field(m, "logits", {"use_cache": False, "return_dict": True})

    def bert():
        cfg = eager(tf.BertConfig(vocab_size=1024, hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=256, max_position_embeddings=512))
        return Field(tf.BertModel(cfg).eval(), "last_hidden_state", {"return_dict": True})

    def vit():
        cfg = eager(tf.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=256, num_labels=10))
        return Field(tf.ViTForImageClassification(cfg).eval(), "logits", {"return_dict": True})

    def whisper():
        cfg = eager(tf.WhisperConfig(vocab_size=1024, num_mel_bins=80, encoder_layers=2, encoder_attention_heads=4,
                                     decoder_layers=1, decoder_attention_heads=4, d_model=96, encoder_ffn_dim=256,
                                     decoder_ffn_dim=256, max_source_positions=50, max_target_positions=32,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))
        enc = tf.WhisperModel(cfg).eval().get_encoder()
        return Field(enc, "last_hidden_state", {"return_dict": True})

    class Res(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x):
            h = self.c1(nn.functional.silu(self.n1(x)))
            h = self.c2(nn.functional.silu(self.n2(h)))
            return h + self.skip(x)

    class UNetBlock(nn.Module):
        """One down/mid/up level of a diffusion UNet, with its skip."""

        def __init__(self):
            super().__init__()
            self.inp = nn.Conv2d(4, 32, 3, padding=1)
            self.down = Res(32, 32)
            self.pool = nn.Conv2d(32, 32, 3, stride=2, padding=1)
            self.mid = nn.Sequential(Res(32, 64), Res(64, 64))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.dec = Res(96, 32)
            self.out = nn.Conv2d(32, 4, 3, padding=1)

        def forward(self, x):
            s = self.down(self.inp(x))
            h = self.up(self.mid(self.pool(s)))
            return self.out(self.dec(torch.cat([h, s], dim=1)))

    ids = torch.randint(0, 1024, (1, 32))
    seq = torch.export.Dim("seq", min=2, max=64)
    out.append(("gpt2", gpt2, (ids,), None))
    out.append(("gpt2_dynamic", gpt2, (ids,), {"x": {1: seq}}))
    out.append(("bert", bert, (ids,), None))
    out.append(("vit", vit, (torch.randn(1, 3, 32, 32),), None))
    out.append(("unet_block", lambda: UNetBlock().eval(), (torch.randn(1, 4, 32, 32),), None))
    # The same weights on larger inputs: activations of tens of MiB, where
    # the runtime's arena and memory patterns have something to do.
    out.append(("bert_512", bert, (torch.randint(0, 1024, (1, 512)),), None))
    out.append(("unet_block_256", lambda: UNetBlock().eval(), (torch.randn(1, 4, 256, 256),), None))
    out.append(("whisper_encoder", whisper, (torch.randn(1, 80, 100),), None))
    return out


def export(args):
    import torch
    import onnx

    work, ship = os.path.join(args.out, "work"), os.path.join(args.out, "ship")
    os.makedirs(work, exist_ok=True)
    os.makedirs(ship, exist_ok=True)
    manifest = []
    for name, build, ex, dyn in models():
        if args.only and name not in args.only.split(","):
            continue
        t0 = time.time()
        entry = {"name": name, "inputs": [list(t.shape) for t in ex], "dynamic": dyn is not None}
        try:
            m = build().eval()
            params = sum(p.numel() for p in m.parameters())
            path = os.path.join(work, name + ".onnx")
            with torch.no_grad():
                torch.onnx.export(m, ex, path, dynamo=True, external_data=True, dynamic_shapes=dyn)
            data = [f for f in os.listdir(work) if f.startswith(name + ".onnx") and f != name + ".onnx"]
            full = onnx.load(path)  # reads the external data beside it
            strip_traces(full)
            inline = os.path.join(ship, name + ".inline.onnx")
            onnx.save_model(full, inline, save_as_external_data=False)
            # Without data: every initializer, however small (the shape
            # constants too), moved to a data file that is then left out.
            strip_data(full, name + ".nodata.onnx.data")
            onnx.save_model(full, os.path.join(ship, name + ".nodata.onnx"))
            entry.update(ok=True, params=params, seconds=round(time.time() - t0, 2), data_files=data,
                         opset=[(o.domain, o.version) for o in full.opset_import],
                         nodes=len(full.graph.node), value_info=len(full.graph.value_info),
                         nodata_bytes=os.path.getsize(os.path.join(ship, name + ".nodata.onnx")),
                         inline_bytes=os.path.getsize(inline), torch=torch.__version__, onnx=onnx.__version__)
        except Exception as e:  # one model failing must not stop the others
            entry.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000], seconds=round(time.time() - t0, 2))
        manifest.append(entry)
        print(json.dumps({k: entry.get(k) for k in ("name", "ok", "seconds", "params", "nodes", "value_info", "error")}), flush=True)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def strip_traces(model):
    """Drops what the exporter records about the Python that ran it (each
    node's doc_string and metadata_props, the graph's metadata_props: stack
    traces naming this machine's file paths); the graph is unchanged."""
    graphs = [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.HasField("g")]
    for g in graphs:
        del g.metadata_props[:]
        for n in g.node:
            n.doc_string = ""
            del n.metadata_props[:]
    for f in model.functions:
        for n in f.node:
            n.doc_string = ""
            del n.metadata_props[:]


def strip_data(model, location):
    """Moves every initializer's bytes out of the model (in place): the
    tensor says its data is at `location` (a file that is not written) and
    keeps its name, type and dims. Written here rather than with onnx's
    external-data helpers, whose keywords differ between versions."""
    from onnx import TensorProto, numpy_helper

    offset = 0
    for t in model.graph.initializer:
        n = len(t.raw_data) if t.raw_data else numpy_helper.to_array(t).nbytes
        for f in ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(f)
        del t.external_data[:]
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(n))):
            e = t.external_data.add()
            e.key, e.value = k, v
        t.data_location = TensorProto.EXTERNAL
        offset += n


def hwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def feed(sess):
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else (1 if k == 0 else 32) for k, d in enumerate(i.shape)]
        if "int64" in i.type:
            out[i.name] = rng.integers(0, 1000, size=shape, dtype=np.int64)
        elif "int32" in i.type:
            out[i.name] = rng.integers(0, 1000, size=shape, dtype=np.int32)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def ort_run(args):
    import numpy  # noqa: F401  (imported before the baseline is taken)
    import onnxruntime as ort

    res = {"model": os.path.basename(args.model), "mode": args.mode, "ort": ort.__version__,
           "providers": ort.get_available_providers()}
    base = hwm_kib()
    try:
        so = ort.SessionOptions()
        providers = ["CPUExecutionProvider"]
        if args.mode.startswith("memwall"):
            with open(args.settings) as f:
                s = json.load(f)["ort"]
            res["settings"] = {"total_bytes": s["total_bytes"], "arena_cfg": s["arena_cfg"]}
            so.enable_cpu_mem_arena = s["session_options"]["enable_cpu_mem_arena"]
            so.enable_mem_pattern = s["session_options"]["enable_mem_pattern"]
            so.enable_mem_reuse = s["session_options"]["enable_mem_reuse"]
            c = s["arena_cfg"]
            ort.create_and_register_allocator(
                ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT),
                ort.OrtArenaCfg(c["max_mem"], c["arena_extend_strategy"], c["initial_chunk_size_bytes"],
                                c["max_dead_bytes_per_chunk"]))
            for k, v in s["session_config_entries"].items():
                so.add_session_config_entry(k, v)
            cuda = s["cuda_provider_options"]
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
        t0 = time.perf_counter()
        sess = ort.InferenceSession(args.model, sess_options=so, providers=providers)
        res["create_seconds"] = time.perf_counter() - t0
        x = feed(sess)
        sess.run(None, x)  # warm-up: memory patterns are made on the first run
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            sess.run(None, x)
            times.append(time.perf_counter() - t0)
        res.update(ok=True, run_median_seconds=statistics.median(times), runs=len(times))
    except Exception as e:
        res.update(ok=False, error=f"{type(e).__name__}: {e}"[:1000])
    res["rss_before_session_kib"] = base
    res["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res["session_peak_kib"] = res["peak_rss_kib"] - base
    print(json.dumps(res))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", required=True)
    e.add_argument("--only", default="", help="comma-separated model names")
    o = sub.add_parser("ort")
    o.add_argument("model")
    o.add_argument("--mode", choices=["default", "memwall", "memwall-need"], required=True)
    o.add_argument("--settings", help="memwall plan --ort --json output (for --mode memwall)")
    o.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    if a.cmd == "export":
        export(a)
    else:
        ort_run(a)


if __name__ == "__main__":
    sys.exit(main())
