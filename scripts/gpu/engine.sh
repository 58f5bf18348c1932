#!/usr/bin/env bash
# Engine check on the GPU machine (issue 15, `memwall run`), from the repo root.
# Expected run time: quick mode (the default) about 70 s — two tiny models
# (bf16 GQA, f16 GQA) in safetensors and GGUF, resident and streaming, against
# transformers, short compute-sanitizer memcheck and racecheck runs, and the
# engine package's tests on the GPU against its Go reference (gpubin/engine.test).
# EXTRA=full adds the Llama-7B-shaped bf16 model and the 7B-class model with 8
# KV heads and Llama-3 rope scaling at --vram 8GiB (decode at 512 tokens of
# context, a 2048-token prefill, nvidia-smi's memory.used sampled, memwall fit's
# prediction), about 5 minutes more, most of it writing and loading 27 GB.
#
#   OUT=/some/dir [EXTRA=full] [MODEL7B=/path/to/llama-7b-dir] scripts/gpu/engine.sh
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
[ -x /opt/torch/.venv/bin/python3 ] && py=/opt/torch/.venv/bin/python3
bin=$PWD/${BIN:-gpubin}/memwall
if [ ! -x "$bin" ]; then
  echo "engine: $bin missing (run scripts/gpu-build.sh)"; exit 1
fi
models=${MODELS:-/dev/shm/memwall-engine}
mode=quick
[ "${EXTRA:-}" = full ] && mode=full
limit=170
[ "$mode" = full ] && limit=560
timeout --kill-after=10 "$limit" "$py" scripts/gpu/run-check.py --bin "$bin" --out "$dir" --models "$models" \
  --mode "$mode" ${MODEL7B:+--model7b "$MODEL7B"}
rc=$?
[ "${KEEP_MODELS:-}" = 1 ] || rm -rf "$models"
exit $rc
