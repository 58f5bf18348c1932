#!/usr/bin/env bash
# Times `memwall quantize` against llama.cpp's llama-quantize on the same bf16 GGUF file, alternately, on the same
# number of threads, checks whether the two files are byte for byte the same, and measures both files' per-tensor
# RMS error against the source with memwall's dequantizer (`memwall quantize --compare`).
#   scripts/bench-quantize.sh LLAMA_QUANTIZE [TYPE] [THREADS] [ROUNDS]
# LLAMA_QUANTIZE is a llama-quantize binary (llama.cpp's tools/quantize). The model is made by gen-model: 2 layers
# of hidden 2048, intermediate 5632, 32 heads over 4 KV heads, vocabulary 32000 (418 MiB in bf16). Defaults:
# Q4_K_M, every core, 3 rounds. Each run prints its wall-clock time and its CPU time (user + system), which a
# machine shared with other work distorts less.
# Environment: MEMWALL, a memwall binary (default: built from this checkout); MODEL, a bf16 GGUF file to quantize
# instead of the generated one; WORK, a directory for the outputs, kept (default: a temporary one, removed), where
# times.txt (one line a run: tool, round, wall and CPU seconds), mw.json (memwall's last report) and compare.json
# (the --compare report: memwall's file first, llama-quantize's second) are left.
set -euo pipefail
lq=${1:?usage: bench-quantize.sh LLAMA_QUANTIZE [TYPE] [THREADS] [ROUNDS]}
type=${2:-Q4_K_M}
threads=${3:-$(nproc)}
rounds=${4:-3}
cd "$(dirname "$0")/.."
if [ -n "${WORK:-}" ]; then
  dir=$WORK; mkdir -p "$dir"
else
  dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fi
mw=${MEMWALL:-}
if [ -z "$mw" ]; then mw=$dir/memwall; go build -o "$mw" ./cmd/memwall; fi
model=${MODEL:-}
if [ -z "$model" ]; then
  model=$dir/m.gguf
  "$mw" gen-model --layers 2 --hidden 2048 --inter 5632 --heads 32 --kv-heads 4 --vocab 32000 --out "$model" >/dev/null
fi
: >"$dir/times.txt"
TIMEFORMAT='%R %U %S'
timed() { # timed TOOL ROUND CMD...: prints and records the run's wall and CPU time
  local tool=$1 r=$2 t; shift 2
  t=$( { time "$@" >"$dir/$tool.out" 2>&1; } 2>&1 ) || { echo "$tool failed:"; tail -5 "$dir/$tool.out"; return 1; }
  echo "$tool $r $t" >>"$dir/times.txt"
  read -r wall u s <<<"$t"
  printf 'round %s: %-16s %6.1f s wall, %6.1f s CPU\n' "$r" "$tool" "$wall" "$(awk "BEGIN{print $u + $s}")"
}
for r in $(seq "$rounds"); do
  timed llama-quantize "$r" "$lq" "$model" "$dir/lq.gguf" "$type" "$threads"
  timed memwall "$r" "$mw" quantize "$model" "$dir/mw.gguf" --type "$type" --workers "$threads" --json
done
cp "$dir/memwall.out" "$dir/mw.json"
if cmp -s "$dir/lq.gguf" "$dir/mw.gguf"; then
  echo "the two files are identical ($(stat -c %s "$dir/mw.gguf") bytes)"
else
  echo "the two files differ: llama-quantize $(stat -c %s "$dir/lq.gguf") bytes, memwall $(stat -c %s "$dir/mw.gguf") ($(cmp "$dir/lq.gguf" "$dir/mw.gguf" | head -1))"
fi
"$mw" quantize --compare "$model" "$dir/mw.gguf" "$dir/lq.gguf" --workers "$threads"
"$mw" quantize --compare "$model" "$dir/mw.gguf" "$dir/lq.gguf" --workers "$threads" --json >"$dir/compare.json"
