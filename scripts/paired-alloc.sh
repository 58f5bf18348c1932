#!/usr/bin/env bash
# Paired measurement of memwall's pool against cuMemAllocAsync, for ratios
# that the host's drift does not skew: on each of a few CPUs, alternately
# time the driver from C (scripts/anchor-alloc.c) and memwall (`memwall
# bench alloc --goroutines 1`), both pinned to that CPU, ROUNDS times, and
# finish with the driver. Each memwall run's ratio is taken against the
# mean of the driver runs just before and just after it on the same CPU.
# On the H200 host the same code ran up to 2x slower on one CPU than on
# another, and minutes apart on the same one, for the driver and memwall
# alike. Needs nvcc, taskset, python3 and a memwall binary (BIN, default
# gpubin). Output under $OUT (default ./gpu-out/paired); a table last.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}/paired
BIN=${BIN:-$PWD/gpubin}
ROUNDS=${ROUNDS:-5}
CPUS=${CPUS:-"2 9 13"}
# Long enough that a burst of the host's slowness (tens to hundreds of
# milliseconds) does not decide a run's median by itself.
PAIRS=${PAIRS:-200000}
export ANCHOR_PAIRS=${ANCHOR_PAIRS:-40000}
MIXES=${MIXES:-random,4KiB,1MiB,64MiB}
mkdir -p "$OUT"
nvcc -O2 -o "$OUT/anchor-alloc" scripts/anchor-alloc.c -lcuda
words=${MIXES//,/ }
for cpu in $CPUS; do
  for r in $(seq 0 "$ROUNDS"); do
    taskset -c "$cpu" "$OUT/anchor-alloc" $words >"$OUT/driver-cpu$cpu-r$r.jsonl"
    [ "$r" = "$ROUNDS" ] && break
    taskset -c "$cpu" "$BIN/memwall" bench alloc --goroutines 1 --mixes "$MIXES" --pairs "$PAIRS" \
      --json >"$OUT/memwall-cpu$cpu-r$r.json" 2>/dev/null
  done
done
python3 scripts/paired-alloc.py "$OUT" | tee "$OUT/summary.txt"
