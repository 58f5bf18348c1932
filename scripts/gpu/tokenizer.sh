#!/usr/bin/env bash
# Tokenizer check against HF tokenizers (issue 15 item 3), from the repo root
# on the GPU machine (python3 with tokenizers; no Go, no GPU use, no network).
# Expected run time: about 15 s, at most 90 s (the timeout).
#
#   OUT=/some/dir scripts/gpu/tokenizer.sh
#
# It trains small tokenizers of each kind (GPT-2 and Llama-3 style byte-level
# BPE, Llama-2 style SentencePiece BPE with byte fallback, and variants: added
# tokens with every combination of lstrip/rstrip/single_word/normalized/special)
# and writes, under $OUT/tokenizer/, each tokenizer.json, expected.jsonl.gz
# (the ids and decodes HF gives for 1,300 strings per kind) and summary.json.
# The Go test in tokenizer/ compares them where Go runs: copy the directory to
# tokenizer/testdata/hf/ (see tokenizer/testdata/README.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/tokenizer
mkdir -p "$dir"
t0=$(date +%s)
timeout 90 python3 scripts/gpu/tokenizer-check.py --out "$dir" >"$dir/log.txt" 2>&1
rc=$?
python3 -c 'import tokenizers, sys; print("tokenizers", tokenizers.__version__, "python", sys.version.split()[0])' >>"$dir/log.txt" 2>&1
tail -n 12 "$dir/log.txt"
echo "tokenizer-check rc=$rc $(( $(date +%s) - t0 ))s files: $(cd "$dir" && ls | tr '\n' ' ')"
exit $rc
