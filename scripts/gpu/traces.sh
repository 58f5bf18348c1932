#!/usr/bin/env bash
# Records the held-out allocation traces (scripts/gpu/record-traces.py) on the
# GPU machine into $OUT/traces/. About 60-90 s on an H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/traces"
py=python3
for c in /opt/*/.venv/bin/python3; do [ -x "$c" ] && py=$c; done
timeout --kill-after=10 150 "$py" scripts/gpu/record-traces.py --out-dir "$OUT/traces"
rc=$?
ls -la "$OUT/traces"
for f in "$OUT"/traces/*.json; do [ -f "$f" ] && { echo "$(basename "$f"):"; cat "$f"; echo; }; done
exit $rc
