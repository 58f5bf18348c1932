#!/usr/bin/env bash
# Engine check on the GPU machine (issue 15, `memwall run`), from the repo root.
# Expected run time: quick mode (the default) about 70 s — two tiny models
# (bf16 GQA, f16 GQA) in safetensors and GGUF, resident and streaming, against
# transformers, short compute-sanitizer memcheck and racecheck runs, and the
# engine package's tests on the GPU against its Go reference (gpubin/engine.test).
# EXTRA=7b adds the Llama-7B-shaped bf16 model at --vram 8GiB with DEFAULT flags
# (decode at 512 tokens of context; a 2048-token prefill with the chunk and
# slots chosen from the budget, its device time against max(weight copies,
# products at cuBLASLt's rate); nvidia-smi's memory.used sampled against the
# budget and `memwall fit`'s prediction for both runs; transformers' agreement
# and its own bf16-vs-fp32 noise), then the same model with every weight
# resident (--vram 20GiB, 384 + 128 tokens, --profile; PDL on, off, and one
# launch per product: decode tok/s and products as % of a device copy
# measured in the same run, about 25 s): about 200 s more with the model
# cached (KEEP_MODELS=1 MODELS=/dev/shm/mw), plus about 60 s to write it the
# first time.
# EXTRA=full adds the 7B-class model with 8 KV heads and Llama-3 rope scaling
# too (about 120 s more, and 60 s to write it).
#
#   OUT=/some/dir [EXTRA=7b|full] [KEEP_MODELS=1] [MODELS=/dev/shm/mw] [MODEL7B=/path/to/llama-7b-dir] scripts/gpu/engine.sh
#
# Needs gpubin/memwall (scripts/gpu-build.sh) and python3 with torch and
# transformers. Models go to /dev/shm/memwall-engine (or $MODELS). Writes under
# $OUT/engine/: results.json, one JSON and log per run, nvidia-smi samples, the
# sanitizer logs; prints a table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/engine
mkdir -p "$dir"
py=python3
for c in /opt/*/.venv/bin/python3; do [ -x "$c" ] && py=$c; done
bin=$PWD/${BIN:-gpubin}/memwall
if [ ! -x "$bin" ]; then
  echo "engine: $bin missing (run scripts/gpu-build.sh)"; exit 1
fi
models=${MODELS:-/dev/shm/memwall-engine}
mode=quick
limit=170
case "${EXTRA:-}" in
  7b) mode=7b; limit=450 ;;
  full) mode=full; limit=590 ;;
esac
timeout --kill-after=10 "$limit" "$py" scripts/gpu/run-check.py --bin "$bin" --out "$dir" --models "$models" \
  --mode "$mode" ${MODEL7B:+--model7b "$MODEL7B"}
rc=$?
[ "${KEEP_MODELS:-}" = 1 ] || rm -rf "$models"
exit $rc
