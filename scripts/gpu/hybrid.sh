#!/usr/bin/env bash
# Hybrid placement on the GPU machine (issue 26), from the repo root: a
# Llama-7B-shaped bf16 GGUF written by gen-model (~60 s the first time, kept
# in $MODELS); `memwall run --vram 8GiB` with the default placement (auto:
# blocks that do not fit computed on the host's cores when the measured rates
# say so) and with --placement stream, a 448-token prompt and 64 new tokens
# each, nvidia-smi's memory.used sampled during each; `memwall fit` at the
# same budget; llama.cpp's llama-bench (CUDA build, -fa 1, -ngl 16..20, pp512
# and tg128) sampled the same way, in the same run. Needs gpubin/memwall
# (CGO_ENABLED=0 go build -o gpubin/memwall ./cmd/memwall) and llama-bench.xz
# in $ANCHORS (default gpurun/). Writes under $OUT/hybrid/ and prints a table.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/hybrid
mkdir -p "$dir"
bin=$PWD/${BIN:-gpubin}
models=${MODELS:-/dev/shm/memwall-hybrid}
anchors=${ANCHORS:-$PWD/gpurun}
mkdir -p "$models"
m=$models/llama-7b.gguf
if [ ! -f "$m" ]; then
  "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$m" >"$dir/gen.txt" 2>&1 || { tail "$dir/gen.txt"; exit 1; }
fi
# sampled NAME CMD...: runs CMD with nvidia-smi's memory.used (MiB) sampled
# every 100 ms into $dir/NAME.smi; the peak goes to $dir/NAME.peak.
sampled() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$dir/$name.smi" 2>/dev/null &
  local smi=$!
  "$@"
  local rc=$?
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  sort -n "$dir/$name.smi" | tail -1 >"$dir/$name.peak"
  return $rc
}
ids=$(python3 -c 'print(",".join(str(3 + (i * 7919) % 31000) for i in range(448)))')
for p in auto stream; do
  sampled "memwall-$p" timeout 300 "$bin/memwall" run "$m" --vram 8GiB --placement "$p" --prompt-ids "$ids" --max-new 64 --ignore-eos --json \
    >"$dir/memwall-$p.json" 2>"$dir/memwall-$p.err" || { echo "memwall run --placement $p failed:"; tail -5 "$dir/memwall-$p.err"; }
done
timeout 120 "$bin/memwall" fit "$m" --vram 8GiB --prompt-tokens 448 --max-new 64 --json >"$dir/fit.json" 2>"$dir/fit.err" ||
  { echo "memwall fit failed:"; tail -5 "$dir/fit.err"; }
# LLAMA_BENCH names a llama-bench already built on the machine (the anchors'
# build-llama.cpp.sh), for when llama-bench.xz cannot travel with the tree.
lb=${LLAMA_BENCH:-/tmp/llama-bench}
[ -n "${LLAMA_BENCH:-}" ] || { xz -dc "$anchors/llama-bench.xz" >"$lb" && chmod +x "$lb"; }
for n in 16 17 18 19 20; do
  sampled "llama-ngl$n" timeout 300 "$lb" -m "$m" -fa 1 -ngl "$n" -t "$(nproc)" -p 512 -n 128 -r 2 -o json \
    >"$dir/llama-ngl$n.json" 2>"$dir/llama-ngl$n.err" || { echo "llama-bench -ngl $n failed:"; tail -5 "$dir/llama-ngl$n.err"; }
done
python3 - "$dir" <<'PY'
import json, sys, os
d = sys.argv[1]
def peak(name):
    try: return int(open(os.path.join(d, name + ".peak")).read().split()[0])
    except Exception: return None
rows = []
for p in ("auto", "stream"):
    try:
        j = json.load(open(os.path.join(d, f"memwall-{p}.json")))
        hosted = sum(1 for x in j.get("placement") or [] if x == "host")
        rows.append((f"memwall --placement {p} ({hosted} host blocks)", j.get("prefill_tokens_per_s"), j.get("decode_tokens_per_s"), peak(f"memwall-{p}")))
        print(f"memwall {p}: streamed {j.get('streamed_bytes_per_token')} B/token, host {j.get('host_bytes_per_token')} B/token, rates {j.get('rates')}, peak_device_bytes {j.get('peak_device_bytes')}")
    except Exception as e:
        rows.append((f"memwall --placement {p}", None, None, peak(f"memwall-{p}")))
best = None
for n in range(16, 21):
    pp = tg = None
    try:
        for r in json.load(open(os.path.join(d, f"llama-ngl{n}.json"))):
            if r.get("n_prompt", 0): pp = r["avg_ts"]
            else: tg = r["avg_ts"]
    except Exception: pass
    rows.append((f"llama-bench -fa 1 -ngl {n}", pp, tg, peak(f"llama-ngl{n}")))
f = lambda v, w=14: f"{v:{w}.2f}" if isinstance(v, (int, float)) else f"{'-':>{w}s}"
print(f"{'':44s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'smi peak MiB':>13s}")
for n, p, g, k in rows:
    print(f"{n:44s} {f(p)} {f(g, 13)} {k if k is not None else '-':>13}")
mw = rows[0]
if mw[3] is not None:
    rivals = [r for r in rows[2:] if r[2] and r[3] is not None and r[3] <= mw[3]]
    if rivals and mw[2]:
        b = max(rivals, key=lambda r: r[2])
        print(f"decode ratio vs best llama.cpp at <= memwall's peak ({b[0]}): {mw[2] / b[2]:.2f}x; prefill vs its pp512: {(mw[1] or 0) / (b[1] or 1):.2f}x")
PY
