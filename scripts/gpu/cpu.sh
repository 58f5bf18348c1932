#!/usr/bin/env bash
# The CPU backend on the GPU machine's host cores (issue 26), from the repo
# root: hostmath's bf16 product over weights read from memory at 1, 2, 4, ...
# workers up to every core (~40 s); a Llama-7B-shaped bf16 GGUF written by
# gen-model (~60 s the first time, kept in $MODELS); `memwall run --device
# cpu` on it (16-token prompt, 32 new tokens, twice) next to llama.cpp's
# llama-bench -ngl 0 on the same file and the same cores, in the same run
# (~120 s). Needs gpubin/memwall and gpubin/device_cpu_hostmath.test
# (GPU_PKGS=device/cpu/hostmath scripts/gpu-build.sh) and llama-bench-cpu.xz or
# llama-bench.xz in $ANCHORS (default gpurun/). Writes under $OUT/cpu/ and prints a table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/cpu
mkdir -p "$dir"
bin=$PWD/${BIN:-gpubin}
models=${MODELS:-/dev/shm/memwall-cpu}
anchors=${ANCHORS:-$PWD/gpurun}
mkdir -p "$models"
cores=$(nproc)
{ lscpu; free -g; } >"$dir/host.txt" 2>&1
grep -m1 'Model name' "$dir/host.txt"
echo "cores: $cores"

# 1. The product kernel alone, weights from memory.
(cd device/cpu/hostmath && timeout 120 "$bin/device_cpu_hostmath.test" -test.run '^$' \
  -test.bench 'MatmulCold/avx512(bf16)?/' -test.benchtime 20x) >"$dir/hostmath.txt" 2>&1
grep -E 'T1/' "$dir/hostmath.txt" | awk '{printf "%-60s %8s GB/s\n", $1, $5}'

# 2. The 7B model on the host, memwall against llama.cpp.
m=$models/llama-7b.gguf
if [ ! -f "$m" ]; then
  /usr/bin/time -v "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$m" >"$dir/gen.txt" 2>&1 || { tail "$dir/gen.txt"; exit 1; }
fi
ids=1,450,4996,17354,1701,29916,432,17204,975,278,17366,11203,29889,13,1576,4996
for i in 1 2; do
  timeout 200 "$bin/memwall" run "$m" --device cpu --prompt-ids "$ids" --max-new 32 --ignore-eos --json \
    >"$dir/memwall-cpu-$i.json" 2>"$dir/memwall-cpu-$i.err" || { echo "memwall run --device cpu failed:"; tail -5 "$dir/memwall-cpu-$i.err"; }
done
# llama.cpp's llama-bench: a CPU-only build (llama-bench-cpu.xz, cmake
# without GGML_CUDA from the source in ../shared/anchors) when present, else
# the CUDA build with -ngl 0 (its decode then runs on the CPU all the same).
# LLAMA_BENCH names one built on the machine (build-llama.cpp.sh).
lb=${LLAMA_BENCH:-}
if [ -z "$lb" ]; then
  lb=/tmp/llama-bench
  if [ -f "$anchors/llama-bench-cpu.xz" ]; then xz -dc "$anchors/llama-bench-cpu.xz" >"$lb"; else xz -dc "$anchors/llama-bench.xz" >"$lb"; fi
  chmod +x "$lb"
fi
timeout 200 "$lb" -m "$m" -ngl 0 -t "$cores" -p 16 -n 32 -r 2 -o json >"$dir/llama-bench.json" 2>"$dir/llama-bench.err" ||
  { echo "llama-bench failed:"; tail -5 "$dir/llama-bench.err"; }
python3 - "$dir" <<'PY'
import json, sys, os
d = sys.argv[1]
rows = []
for i in (1, 2):
    try:
        j = json.load(open(os.path.join(d, f"memwall-cpu-{i}.json")))
        rows.append((f"memwall run --device cpu ({i})", j.get("prefill_tokens_per_s"), j.get("decode_tokens_per_s")))
    except Exception as e:
        rows.append((f"memwall run --device cpu ({i})", None, None))
try:
    for r in json.load(open(os.path.join(d, "llama-bench.json"))):
        kind = "pp" if r.get("n_prompt", 0) else "tg"
        rows.append((f"llama-bench -ngl 0 {kind}{r.get('n_prompt') or r.get('n_gen')}", r["avg_ts"] if kind == "pp" else None, r["avg_ts"] if kind == "tg" else None))
except Exception as e:
    rows.append(("llama-bench", None, None))
print(f"{'':40s} {'prefill tok/s':>14s} {'decode tok/s':>13s}")
for n, p, g in rows:
    f = lambda v: f"{v:14.2f}" if isinstance(v, (int, float)) else f"{'-':>14s}"
    print(f"{n:40s} {f(p)} {f(g)}")
PY
