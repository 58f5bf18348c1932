#!/usr/bin/env bash
# The pool on the GPU (issue 13). Expected time on an NVIDIA H200: about
# 130-200 s: the pool suite with MEMWALL_TEST_DEVICE=cuda (-short; the
# property test over every configuration on the GPU's own memory
# included, ~70 s), then `memwall bench alloc` on the random mix against
# cuMemAlloc and cuMemAllocAsync on 1, 4 and 16 goroutines (~60 s).
# (Replays need no GPU: they run on the simulator with the H200's driver
# costs.) Run from the repository root after scripts/gpu-build.sh; logs
# go to $OUT/pool/, a short table is printed last; each step is under
# timeout. Also cuda.Wrap's test (a pool on an adopted context and stream, ~2 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/pool
mkdir -p "$dir"
bin=$PWD/${BIN:-gpubin}
log=$dir/log.txt
: >"$log"
status=()
run() { # run NAME SECONDS CMD...: time-limited, logged, pass/fail remembered
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" >>"$log"
  local t0 t1 r
  t0=$(date +%s.%N)
  if timeout -k 5 "$limit" "$@" >>"$log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  t1=$(date +%s.%N)
  status+=("$(printf '%-40s %-9s %6.1fs' "$name" "$r" "$(awk "BEGIN{print $t1 - $t0}")")")
}

if [ -x "$bin/pool.test" ]; then
  run "pool suite (cuda)" 210 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.short -test.v -test.timeout 200s >'$dir/suite.txt' 2>&1; rc=\$?; tail -n 5 '$dir/suite.txt'; exit \$rc"
else
  status+=("$(printf '%-40s %-9s' "pool suite (cuda)" "MISSING")")
fi
if [ -x "$bin/device_cuda.test" ]; then
  run "cuda.Wrap runs the pool (cuda)" 60 bash -c "cd device/cuda && '$bin/device_cuda.test' -test.run 'TestWrap' -test.v -test.timeout 50s >'$dir/wrap.txt' 2>&1"
fi
run "bench alloc (random mix, 1/4/16 goroutines)" 150 bash -c \
  "'$bin/memwall' bench alloc --device cuda --mixes random --policies virtual,virtual-keep --goroutines 1,4,16 --pairs 20000 --out '$dir/alloc.json' >'$dir/alloc.txt' 2>&1"
echo
echo "pool suite failures (if any):"
grep -E '^(--- FAIL|FAIL|panic)' "$dir/suite.txt" 2>/dev/null | head -n 10
echo
echo "bench alloc (random mix):"
head -n 40 "$dir/alloc.txt" 2>/dev/null
echo
printf '%s\n' "${status[@]}"
