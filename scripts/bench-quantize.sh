#!/usr/bin/env bash
# Times `memwall quantize` against llama.cpp's llama-quantize on the same bf16 GGUF file, alternately, on the same
# number of threads, and checks that the two files are byte for byte the same.
#   scripts/bench-quantize.sh LLAMA_QUANTIZE [TYPE] [THREADS] [ROUNDS]
# LLAMA_QUANTIZE is a llama-quantize binary (llama.cpp's tools/quantize, built CPU-only with cmake). The model is
# made by gen-model: 2 layers of hidden 2048, intermediate 5632, 32 heads over 4 KV heads, vocabulary 32000
# (418 MiB in bf16). Defaults: Q4_K_M, every core, 3 rounds. Each run prints its wall-clock time and its CPU time
# (user + system), which a machine shared with other work distorts less.
set -euo pipefail
lq=${1:?usage: bench-quantize.sh LLAMA_QUANTIZE [TYPE] [THREADS] [ROUNDS]}
type=${2:-Q4_K_M}
threads=${3:-$(nproc)}
rounds=${4:-3}
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/memwall" ./cmd/memwall
"$dir/memwall" gen-model --layers 2 --hidden 2048 --inter 5632 --heads 32 --kv-heads 4 --vocab 32000 --out "$dir/m.gguf" >/dev/null
TIMEFORMAT='%R s wall, %U+%S s CPU'
for r in $(seq "$rounds"); do
  { t=$( { time "$lq" "$dir/m.gguf" "$dir/lq.gguf" "$type" "$threads" >/dev/null 2>&1; } 2>&1 ); } ; echo "round $r: llama-quantize   $t"
  { t=$( { time "$dir/memwall" quantize "$dir/m.gguf" "$dir/mw.gguf" --type "$type" --workers "$threads" >/dev/null; } 2>&1 ); } ; echo "round $r: memwall quantize $t"
done
cmp "$dir/lq.gguf" "$dir/mw.gguf" && echo "the two files are identical ($(stat -c %s "$dir/mw.gguf") bytes)"
