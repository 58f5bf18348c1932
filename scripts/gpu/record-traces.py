#!/usr/bin/env python3
"""Records allocation traces of four inference workloads from PyTorch's
CUDA caching allocator, in the format of testdata/traces (gzip CSV,
action,addr,size,stream), each with a JSON sidecar of PyTorch's own peaks.

Expected time on an NVIDIA H200: about 60-90 s for the first four (each workload stops
adding calls after --seconds, default 15). Needs torch with CUDA and
transformers; every model is built from a config in code with random
weights, so nothing is downloaded.

    python3 scripts/gpu/record-traces.py --out-dir traces/
    python3 scripts/gpu/record-traces.py --out-dir traces/ --only llama_generate,vit_varbatch

Workloads (fp16, inference, weights loaded before recording begins, as in
the shared traces):

  llama_generate  LlamaForCausalLM (12 layers, width 1536, GQA 12/4 heads)
                  generate() with prompts of 16-1000 tokens, batch 1-8,
                  64 new tokens: the KV cache grows every step.
  unet_denoise    a diffusion-style UNet written in torch.nn (three levels of
                  residual conv blocks, self-attention at the lowest
                  resolution, skip connections), 8 denoise steps per call at
                  latent sizes 32-96, batch 1-4.
  vit_varbatch    transformers ViTModel (12 layers, width 768, 224 px,
                  patch 16), batch 1-48 varying per call.
  encoder_varlen  transformers RobertaModel (16 layers, width 1024, 16 heads)
                  forward at sequence lengths 8-1000, batch 1-16.
  t5_generate     T5ForConditionalGeneration (12+12 layers, width 768)
                  generate() with inputs of 16-512 tokens, batch 1-8,
                  16-48 new tokens: an encoder-decoder, cross-attention
                  caches sized by the input.
  gpt2_varbatch   GPT2LMHeadModel (24 layers, width 1024) generate() with
                  batch 1-16 and prompts of 8-480 tokens varying per
                  request, 32 new tokens.
  unet_sd         the UNet above at Stable Diffusion's widths (320/640/1280)
                  at 64 and 96 latents (512 and 768 px), batch 1-4, 6 steps.
  moe_generate    MixtralForCausalLM (8 layers, width 1024, 8 experts, top 2)
                  generate() with batch 1-8, prompts of 16-600 tokens.
  resnet_varbatch transformers ResNetModel (ResNet-50's stages), 224 px,
                  batch 1-64 varying per call.
  whisper_generate WhisperForConditionalGeneration (12+12 layers, width 768)
                  generate() from 30 s of random log-mel features, batch
                  1-8, 24-96 new tokens.
  llama_long      LlamaForCausalLM (8 layers, width 2048, GQA 16/4 heads)
                  generate() with prompts of 600-2,000 tokens, batch 1-3,
                  128 new tokens.

For each NAME it writes NAME.csv.gz and NAME.json: calls, events, peak live
bytes and peak reserved bytes computed from the trace (segment events),
torch.cuda.max_memory_reserved/max_memory_allocated over the recorded part
(minus what was held before it), and the seconds it took.
"""

import argparse
import gzip
import json
import math
import os
import random
import sys
import time

WORKLOADS = ["llama_generate", "unet_denoise", "vit_varbatch", "encoder_varlen",
             "t5_generate", "gpt2_varbatch", "unet_sd", "moe_generate",
             "resnet_varbatch", "whisper_generate", "llama_long"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default=os.path.join(os.environ.get("OUT", "."), "pool", "traces"),
                   help="folder for NAME.csv.gz and NAME.json (default $OUT/pool/traces)")
    p.add_argument("--only", default="", help="comma-separated workloads (default all: %s)" % ",".join(WORKLOADS))
    p.add_argument("--seconds", type=float, default=15.0, help="stop adding calls to a workload after this (default 15)")
    p.add_argument("--max-entries", type=int, default=3_000_000, help="PyTorch's trace ring buffer (default 3e6)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index")
    return p.parse_args()


# ---------------------------------------------------------------- workloads


def generate_calls(torch, dev, model, shapes, lo, hi, new, pad):
    # One greedy generate per (batch, prompt length): ids drawn from
    # [lo, hi), exactly new tokens, the KV cache growing each step.
    for batch, length in shapes:
        ids = torch.randint(lo, hi, (batch, length), device=dev)
        yield lambda ids=ids: model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, use_cache=True, pad_token_id=pad)


def image_calls(torch, dev, model, batches):
    # One forward per batch size of 224 px images, pooled output kept.
    for b in batches:
        px = torch.randn(b, 3, 224, 224, device=dev, dtype=torch.float16)
        yield lambda px=px: model(pixel_values=px).pooler_output


def llama_workload(torch, dev):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=1536, intermediate_size=4096, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(cfg).to(dev, dtype=torch.float16).eval()
    shapes = [(1, 16), (4, 128), (2, 512), (8, 64), (1, 1000), (3, 300), (6, 200), (2, 48), (5, 700), (1, 256)]
    return model, generate_calls(torch, dev, model, shapes, 2, cfg.vocab_size, 64, 0)


def unet_workload(torch, dev):
    model = build_unet(torch, (128, 256, 512), 512).to(dev, dtype=torch.float16).eval()
    shapes = [(1, 32), (2, 64), (4, 48), (1, 96), (3, 40), (2, 80), (4, 32), (1, 64)]
    return model, denoise_calls(torch, dev, model, shapes, 8)


def unet_sd_workload(torch, dev):
    # Stable-Diffusion-sized widths (320/640/1280) at its two usual
    # resolutions: 512 px and 768 px images are 64 and 96 latents.
    model = build_unet(torch, (320, 640, 1280), 1280).to(dev, dtype=torch.float16).eval()
    shapes = [(1, 64), (2, 96), (2, 64), (1, 96), (4, 64), (1, 64), (2, 96), (3, 64)]
    return model, denoise_calls(torch, dev, model, shapes, 6)


def denoise_calls(torch, dev, model, shapes, steps):
    for batch, res in shapes:
        def run(batch=batch, res=res):
            x = torch.randn(batch, 4, res, res, device=dev, dtype=torch.float16)
            for step in range(steps):
                t = torch.full((batch,), 999 - step * 120, device=dev)
                eps = model(x, t)
                x = x - 0.1 * eps
            return x
        yield run


def build_unet(torch, chans, temb_dim):
    nn = torch.nn

    class ResBlock(nn.Module):
        def __init__(self, cin, cout, temb):
            super().__init__()
            self.n1 = nn.GroupNorm(32, cin)
            self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(temb, cout)
            self.n2 = nn.GroupNorm(32, cout)
            self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, t):
            h = self.c1(nn.functional.silu(self.n1(x)))
            h = h + self.t(t)[:, :, None, None]
            h = self.c2(nn.functional.silu(self.n2(h)))
            return h + self.skip(x)

    class Attn(nn.Module):
        def __init__(self, c, heads=8):
            super().__init__()
            self.n = nn.GroupNorm(32, c)
            self.qkv = nn.Linear(c, 3 * c)
            self.o = nn.Linear(c, c)
            self.heads = heads

        def forward(self, x):
            b, c, h, w = x.shape
            s = self.n(x).flatten(2).transpose(1, 2)
            q, k, v = self.qkv(s).chunk(3, dim=-1)
            sh = lambda z: z.view(b, h * w, self.heads, c // self.heads).transpose(1, 2)
            a = nn.functional.scaled_dot_product_attention(sh(q), sh(k), sh(v))
            a = a.transpose(1, 2).reshape(b, h * w, c)
            return x + self.o(a).transpose(1, 2).view(b, c, h, w)

    class UNet(nn.Module):
        def __init__(self, chans, temb):
            super().__init__()
            self.temb = nn.Sequential(nn.Linear(128, temb), nn.SiLU(), nn.Linear(temb, temb))
            self.inp = nn.Conv2d(4, chans[0], 3, padding=1)
            self.down, self.downs = nn.ModuleList(), nn.ModuleList()
            c = chans[0]
            skips = [c]  # channels of every tensor the down path keeps for the up path
            for i, co in enumerate(chans):
                self.down.append(nn.ModuleList([ResBlock(c, co, temb), ResBlock(co, co, temb)]))
                c = co
                skips += [c, c]
                if i < len(chans) - 1:
                    self.downs.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                    skips.append(c)
                else:
                    self.downs.append(nn.Identity())
            self.mid1, self.mida, self.mid2 = ResBlock(c, c, temb), Attn(c), ResBlock(c, c, temb)
            self.up, self.ups = nn.ModuleList(), nn.ModuleList()
            for i, co in reversed(list(enumerate(chans))):
                blocks = nn.ModuleList()
                for _ in range(3):
                    blocks.append(ResBlock(c + skips.pop(), co, temb))
                    c = co
                self.up.append(blocks)
                self.ups.append(nn.Upsample(scale_factor=2) if i > 0 else nn.Identity())
            self.attn_low = Attn(chans[-1])
            self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 4, 3, padding=1))

        def forward(self, x, t):
            half = 64
            f = torch.exp(-math.log(10000) * torch.arange(half, device=x.device) / half)
            e = t[:, None].float() * f[None]
            t = self.temb(torch.cat([e.sin(), e.cos()], dim=1).to(x.dtype))
            h = self.inp(x)
            hs = [h]
            for i, (blocks, ds) in enumerate(zip(self.down, self.downs)):
                for blk in blocks:
                    h = blk(h, t)
                    if i == len(self.down) - 1:
                        h = self.attn_low(h)
                    hs.append(h)
                if i < len(self.down) - 1:
                    h = ds(h)
                    hs.append(h)
            h = self.mid2(self.mida(self.mid1(h, t)), t)
            for blocks, us in zip(self.up, self.ups):
                for blk in blocks:
                    h = blk(torch.cat([h, hs.pop()], dim=1), t)
                h = us(h)
            return self.out(h)

    return UNet(chans, temb_dim)


def vit_workload(torch, dev):
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                    image_size=224, patch_size=16)
    model = ViTModel(cfg, add_pooling_layer=True).to(dev, dtype=torch.float16).eval()
    batches = [1, 8, 3, 32, 16, 5, 48, 12, 24, 2, 40, 7, 20, 1, 36, 10]
    return model, image_calls(torch, dev, model, batches)


def encoder_workload(torch, dev):
    from transformers import RobertaConfig, RobertaModel

    cfg = RobertaConfig(vocab_size=50265, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                        intermediate_size=4096, max_position_embeddings=1026, pad_token_id=1)
    model = RobertaModel(cfg, add_pooling_layer=False).to(dev, dtype=torch.float16).eval()
    rng = random.Random(13)
    shapes = [(rng.choice([1, 2, 4, 8, 16]), rng.randint(8, 1000)) for _ in range(80)]

    def calls():
        for batch, length in shapes:
            ids = torch.randint(3, cfg.vocab_size, (batch, length), device=dev)
            yield lambda ids=ids: model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    return model, calls()


def t5_workload(torch, dev):
    # An encoder-decoder: the encoder runs once per request at its length,
    # the decoder's self-attention cache grows each step and its
    # cross-attention cache has the encoder's length.
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12,
                   num_heads=12, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg).to(dev, dtype=torch.float16).eval()
    rng = random.Random(5)
    shapes = [(rng.choice([1, 2, 4, 8]), rng.randint(16, 512), rng.choice([16, 32, 48])) for _ in range(40)]

    def calls():
        for batch, length, new in shapes:
            ids = torch.randint(2, cfg.vocab_size, (batch, length), device=dev)
            yield lambda ids=ids, new=new: model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                do_sample=False, use_cache=True)
    return model, calls()


def gpt2_varbatch_workload(torch, dev):
    # A serving loop: every request has its own batch size and prompt
    # length, so the KV cache and activations change shape per request.
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024, bos_token_id=50256,
                     eos_token_id=None, pad_token_id=50256)
    model = GPT2LMHeadModel(cfg).to(dev, dtype=torch.float16).eval()
    rng = random.Random(7)
    shapes = [(rng.randint(1, 16), rng.randint(8, 480)) for _ in range(40)]
    return model, generate_calls(torch, dev, model, shapes, 0, 50000, 32, 50256)


def moe_workload(torch, dev):
    # A mixture of experts: each expert's batch is the tokens routed to it,
    # a different size in every layer and step.
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=4096, bos_token_id=1,
                        eos_token_id=None, pad_token_id=0)
    model = MixtralForCausalLM(cfg).to(dev, dtype=torch.float16).eval()
    rng = random.Random(11)
    shapes = [(rng.randint(1, 8), rng.randint(16, 600)) for _ in range(40)]
    return model, generate_calls(torch, dev, model, shapes, 2, cfg.vocab_size, 32, 0)


def resnet_workload(torch, dev):
    # A CNN with batch varying per call (ResNet-50's stages: 3/4/6/3
    # bottleneck blocks, widths 256-2048, 224 px).
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048], layer_type="bottleneck")
    model = ResNetModel(cfg).to(dev, dtype=torch.float16).eval()
    batches = [1, 16, 4, 64, 32, 8, 48, 2, 24, 12, 56, 6, 40, 3, 20, 10]
    return model, image_calls(torch, dev, model, batches)


def whisper_workload(torch, dev):
    # Speech-to-text: a fixed-length audio encoder (1,500 frames) and a
    # decoder whose caches grow with the tokens generated.
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.generation import GenerationMixin

    cfg = WhisperConfig(vocab_size=51865, d_model=768, encoder_layers=12, decoder_layers=12,
                        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                        decoder_ffn_dim=3072, num_mel_bins=80, max_source_positions=1500,
                        max_target_positions=448, decoder_start_token_id=50258, pad_token_id=50257,
                        eos_token_id=None, bos_token_id=50257)
    model = WhisperForConditionalGeneration(cfg).to(dev, dtype=torch.float16).eval()
    model.generation_config.forced_decoder_ids = None
    shapes = [(1, 48), (4, 32), (2, 64), (8, 24), (1, 96), (3, 40), (6, 32), (2, 80)]

    def calls():
        for batch, new in shapes:
            feats = torch.randn(batch, 80, 3000, device=dev, dtype=torch.float16)
            start = torch.full((batch, 1), cfg.decoder_start_token_id, device=dev, dtype=torch.long)
            # The plain generate loop: Whisper's own (language detection,
            # timestamps) needs a tokenizer's generation config.
            yield lambda feats=feats, new=new, start=start: GenerationMixin.generate(
                model, input_features=feats, decoder_input_ids=start, max_new_tokens=new,
                min_new_tokens=new, do_sample=False, use_cache=True)
    return model, calls()


def llama_long_workload(torch, dev):
    # Long prompts: prefill of 600-2,000 tokens and a KV cache that grows
    # for 128 steps, batch 1-3.
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                      bos_token_id=1, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(cfg).to(dev, dtype=torch.float16).eval()
    shapes = [(1, 2000), (2, 900), (3, 600), (1, 1500), (2, 1200), (1, 700)]
    return model, generate_calls(torch, dev, model, shapes, 2, cfg.vocab_size, 128, 0)


BUILDERS = {"llama_generate": llama_workload, "unet_denoise": unet_workload,
            "vit_varbatch": vit_workload, "encoder_varlen": encoder_workload,
            "t5_generate": t5_workload, "gpt2_varbatch": gpt2_varbatch_workload,
            "unet_sd": unet_sd_workload, "moe_generate": moe_workload,
            "resnet_varbatch": resnet_workload, "whisper_generate": whisper_workload,
            "llama_long": llama_long_workload}


# ---------------------------------------------------------------- recording


def record(torch, name, dev, args):
    t0 = time.time()
    torch.manual_seed(0)
    model, calls = BUILDERS[name](torch, dev)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    allocated0 = torch.cuda.memory_allocated(dev)
    reserved0 = torch.cuda.memory_reserved(dev)
    # Weights are loaded: record from here on, as the shared traces do.
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=args.max_entries)
    start, n = time.time(), 0
    with torch.inference_mode():
        for call in calls:
            out = call()
            torch.cuda.synchronize()
            del out
            n += 1
            if time.time() - start > args.seconds:
                break
    torch.cuda.synchronize()
    peak_reserved = torch.cuda.max_memory_reserved(dev)
    peak_allocated = torch.cuda.max_memory_allocated(dev)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    rec_seconds = time.time() - start
    del model
    torch.cuda.empty_cache()

    events = snap["device_traces"][dev.index]
    path = os.path.join(args.out_dir, name + ".csv.gz")
    counts, live, peak_live, seg, peak_seg = {}, 0, 0, 0, 0
    sizes = {}
    with gzip.open(path + ".tmp", "wt", compresslevel=9, newline="") as f:
        f.write("action,addr,size,stream\n")
        for e in events:
            a = e["action"]
            counts[a] = counts.get(a, 0) + 1
            size = int(e.get("size", 0))
            f.write("%s,%d,%d,%d\n" % (a, int(e.get("addr", 0)), size, int(e.get("stream", 0))))
            if a == "alloc":
                live += size
                peak_live = max(peak_live, live)
            elif a == "free_completed":
                live -= size
            elif a in ("segment_alloc", "segment_map"):
                seg += size
                peak_seg = max(peak_seg, seg)
            elif a in ("segment_free", "segment_unmap"):
                seg -= size
    os.replace(path + ".tmp", path)
    side = {
        "workload": name,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev),
        "calls": n,
        "events": len(events),
        "events_by_action": counts,
        "ring_buffer_full": len(events) >= args.max_entries,
        "trace_peak_live_bytes": peak_live,
        "trace_peak_segment_bytes": peak_seg,
        "trace_ratio": peak_seg / peak_live if peak_live else None,
        "held_before_bytes": {"allocated": allocated0, "reserved": reserved0},
        "torch_peak_reserved_bytes": peak_reserved - reserved0,
        "torch_peak_allocated_bytes": peak_allocated - allocated0,
        "torch_ratio": (peak_reserved - reserved0) / (peak_allocated - allocated0)
        if peak_allocated > allocated0 else None,
        "cuda_malloc_calls": counts.get("segment_alloc", 0) + counts.get("segment_map", 0),
        "record_seconds": round(rec_seconds, 2),
        "total_seconds": round(time.time() - t0, 2),
        "gzip_bytes": os.path.getsize(path),
    }
    with open(os.path.join(args.out_dir, name + ".json"), "w") as f:
        json.dump(side, f, indent=1)
    return side


def main():
    args = parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("record-traces: no CUDA device (this script must run on a GPU machine)")
    os.makedirs(args.out_dir, exist_ok=True)
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    names = [w for w in args.only.split(",") if w] or WORKLOADS
    bad = [w for w in names if w not in BUILDERS]
    if bad:
        print("record-traces: unknown workload(s) %s (have %s)" % (",".join(bad), ",".join(WORKLOADS)), file=sys.stderr)
        sys.exit(2)
    rows, failed = [], 0
    for name in names:
        try:
            rows.append(record(torch, name, dev, args))
        except Exception as e:  # one workload failing must not lose the others
            failed += 1
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass
            print("record-traces: %s failed: %s: %s" % (name, type(e).__name__, e), file=sys.stderr)
    print("%-16s %6s %9s %11s %11s %7s %7s %7s %6s" % ("workload", "calls", "allocs", "live MiB", "seg MiB",
                                                     "trace×", "torch×", "MB gz", "s"))
    for r in rows:
        print("%-16s %6d %9d %11.1f %11.1f %7.3f %7.3f %7.2f %6.1f" % (
            r["workload"], r["calls"], r["events_by_action"].get("alloc", 0), r["trace_peak_live_bytes"] / 2**20,
            r["trace_peak_segment_bytes"] / 2**20, r["trace_ratio"] or 0, r["torch_ratio"] or 0,
            r["gzip_bytes"] / 1e6, r["total_seconds"]))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
