#!/usr/bin/env bash
# memwall quantize against llama.cpp's llama-quantize on the GPU machine's cores (issue 27), from the repo root:
# the Llama-7B-shaped bf16 GGUF gen-model writes (~60 s the first time, kept in $MODELS, shared with hybrid.sh)
# quantized to $TYPE (default Q4_K_M) by both, alternately, $ROUNDS times (default 1; ~55 s a run on 16 cores),
# through scripts/bench-quantize.sh; both outputs' per-tensor RMS error against the source measured with memwall's
# dequantizer (`memwall quantize --compare`); then, when a llama-bench is at hand, llama.cpp loading memwall's
# output as it is (llama-bench -p 16 -n 16 on the GPU). Prints a table last.
#
#   OUT=/some/dir LLAMA_QUANTIZE=/tmp/lc/llama-quantize scripts/gpu/quantize.sh
#
# LLAMA_QUANTIZE names a llama-quantize built on the machine; without it, $ANCHORS/build-llama.cpp.sh (default
# gpurun/) builds one into /tmp/lc first (~4.5 min: run that in a call of its own, then this script with
# LLAMA_QUANTIZE=/tmp/lc/llama-quantize, to stay within one call's limit). LLAMA_BENCH names a llama-bench
# (default /tmp/lc/llama-bench when it exists). Needs gpubin/memwall. Writes under $OUT/quantize/: bench.txt
# (bench-quantize.sh's output), times.txt, mw.json, compare.json, llama-bench-*.txt; the quantized files stay in
# $MODELS/quantize/ (3.9 GiB each for Q4_K_M), not under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/quantize
mkdir -p "$dir"
bin=${BIN:-gpubin}
[[ $bin == /* ]] || bin=$PWD/$bin
mw=$bin/memwall
[ -x "$mw" ] || { echo "quantize: $mw missing (CGO_ENABLED=0 go build -o gpubin/memwall ./cmd/memwall)"; exit 1; }
models=${MODELS:-/dev/shm/memwall-hybrid}
anchors=${ANCHORS:-$PWD/gpurun}
type=${TYPE:-Q4_K_M}
mkdir -p "$models"
m=$models/llama-7b.gguf
if [ ! -f "$m" ]; then
  "$mw" gen-model --preset llama-7b --format gguf --out "$m" >"$dir/gen.txt" 2>&1 || { tail "$dir/gen.txt"; exit 1; }
fi
lq=${LLAMA_QUANTIZE:-}
if [ -z "$lq" ]; then
  timeout 500 "$anchors/build-llama.cpp.sh" /tmp/lc llama-quantize >"$dir/build.txt" 2>&1 || { echo "quantize: building llama-quantize failed:"; tail "$dir/build.txt"; exit 1; }
  lq=/tmp/lc/llama-quantize
fi
work=$models/quantize
rm -rf "$work"
timeout 560 env MEMWALL="$mw" MODEL="$m" WORK="$work" scripts/bench-quantize.sh "$lq" "$type" "$(nproc)" "${ROUNDS:-1}" 2>&1 | tee "$dir/bench.txt"
cp "$work"/times.txt "$work"/mw.json "$work"/compare.json "$dir"/ 2>/dev/null
lb=${LLAMA_BENCH:-/tmp/lc/llama-bench}
if [ -x "$lb" ] && [ -f "$work/mw.gguf" ]; then
  for f in llama-7b.gguf quantize/mw.gguf; do
    name=$(basename "$f" .gguf)
    timeout 120 "$lb" -m "$models/$f" -ngl 99 -fa 1 -p 16 -n 16 >"$dir/llama-bench-$name.txt" 2>&1 &&
      echo "llama-bench loads $f: $(grep -c ' tg16 ' "$dir/llama-bench-$name.txt") tg16 row" ||
      { echo "llama-bench failed on $f:"; tail -5 "$dir/llama-bench-$name.txt"; }
  done
fi
python3 - "$dir" <<'PY'
import json, os, sys
d = sys.argv[1]
times = {}
try:
    for line in open(os.path.join(d, "times.txt")):
        tool, r, wall, u, s = line.split()
        times.setdefault(tool, []).append((float(wall), float(u) + float(s)))
except OSError:
    pass
try:
    files = json.load(open(os.path.join(d, "compare.json")))["files"]
except (OSError, ValueError, KeyError):
    files = []
def summary(f):
    per = {}
    for t in f["tensors"]:
        rel = t["relative_error"] or 0.0
        per.setdefault(t["to"], []).append(rel)
    return f["relative_error"], {k: max(v) for k, v in per.items()}
print(f"\n{'':16s} {'wall s':>14s} {'CPU s':>14s} {'file bytes':>14s} {'rel. RMS error':>15s}  worst per type")
for tool, idx in (("memwall", 0), ("llama-quantize", 1)):
    ts = times.get(tool, [])
    wall = "/".join(f"{w:.1f}" for w, _ in ts) or "-"
    cpu = "/".join(f"{c:.0f}" for _, c in ts) or "-"
    size = "-"
    for f in files[idx:idx + 1]:
        size = sum(t["bytes"] for t in f["tensors"])
    rel, worst = summary(files[idx]) if idx < len(files) else (None, {})
    print(f"{tool:16s} {wall:>14s} {cpu:>14s} {size:>14} {rel if rel is None else f'{rel:.5f}':>15}  " +
          ", ".join(f"{k} {v:.4f}" for k, v in sorted(worst.items())))
if len(files) == 2:
    b = {t["name"]: t for t in files[1]["tensors"]}
    worse = [t["name"] for t in files[0]["tensors"] if t["name"] in b and t["to"] == b[t["name"]]["to"] and (t["relative_error"] or 0) > (b[t["name"]]["relative_error"] or 0)]
    print(f"tensors where memwall's error exceeds llama-quantize's: {len(worse)} of {len(files[0]['tensors'])}" + (f" (first: {worse[0]})" if worse else ""))
mw, lq = times.get("memwall"), times.get("llama-quantize")
if mw and lq:
    print(f"time ratio memwall/llama-quantize (best wall): {min(w for w, _ in mw) / min(w for w, _ in lq):.3f}")
PY
