#!/usr/bin/env bash
# The pool on the GPU (issue 13). Expected time on an NVIDIA H200: about
# 160 s (each step under its own timeout; give the area 260 s):
#  1. BenchmarkParallelPair on the GPU: the default (a shard per contending
#     processor) against one set of arenas, 4 and 8 shards, and shards that
#     do not balance free pages, keeping every page, and 16 KiB cached
#     classes with a 64 KiB small-block range, on 1/4/16 goroutines, then the default's and
#     keep's 16-goroutine runs again with CPU profiles
#     (cpu16.pprof with mutex16.pprof, cpu16keep.pprof), ~30 s;
#  2. memwall bench alloc --device cuda --mixes random --policies
#     virtual,virtual-keep --strategies bestfit --goroutines 1,4,16 against
#     cuMemAlloc and cuMemAllocAsync in the same run, ~15 s;
#  3. cuda.Wrap's test (a pool on an adopted context and stream, ~1 s);
#  4. last, so that a hang costs the figures nothing: the pool suite on the
#     GPU's own memory (pool.test -test.short, MEMWALL_TEST_DEVICE=cuda: the
#     property test over every configuration, the shard tests, ...),
#     ~100 s; POOL_SUITE=short runs only the shard and property tests
#     (~65 s);
#  5. a table of pairs/s, p50, p99 and the ratios to cuMemAllocAsync
#     (scripts/gpu/pool-table.py), printed last.
# Replays need no GPU: they run on the simulator with the H200's driver
# costs. Run from the repository root after scripts/gpu-build.sh; logs go
# to $OUT/pool/.
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
  status+=("$(printf '%-44s %-9s %6.1fs' "$name" "$r" "$(awk "BEGIN{print $t1 - $t0}")")")
}

if [ -x "$bin/pool.test" ]; then
  run "BenchmarkParallelPair (cuda)" 90 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.run '^\$' -test.bench 'ParallelPair' -test.benchtime 200000x -test.timeout 85s >'$dir/parallel.txt' 2>&1"
  run "profile: default, 16 goroutines (cuda)" 40 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.run '^\$' -test.bench 'ParallelPair/default/g16\$' -test.benchtime 3000000x -test.timeout 35s -test.cpuprofile '$dir/cpu16.pprof' -test.mutexprofile '$dir/mutex16.pprof' >'$dir/profile.txt' 2>&1"
  run "profile: keep, 16 goroutines (cuda)" 40 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.run '^\$' -test.bench 'ParallelPair/keep/g16\$' -test.benchtime 8000000x -test.timeout 35s -test.cpuprofile '$dir/cpu16keep.pprof' >'$dir/profile-keep.txt' 2>&1"
else
  status+=("$(printf '%-44s %-9s' "pool.test" "MISSING")")
fi
run "bench alloc (random mix, 1/4/16 goroutines)" 120 bash -c \
  "'$bin/memwall' bench alloc --device cuda --mixes random --policies virtual,virtual-keep --strategies bestfit --goroutines 1,4,16 --pairs 20000 --out '$dir/alloc.json' >'$dir/alloc.txt' 2>&1"
if [ -x "$bin/device_cuda.test" ]; then
  run "cuda.Wrap runs the pool (cuda)" 60 bash -c "cd device/cuda && '$bin/device_cuda.test' -test.run 'TestWrap' -test.v -test.timeout 50s >'$dir/wrap.txt' 2>&1"
fi
# The suite last: a hang in it costs the figures above nothing.
if [ -x "$bin/pool.test" ]; then
  sel=()
  [ "${POOL_SUITE:-full}" = short ] && sel=(-test.run 'TestShard|TestPropertyBlocks$')
  run "pool tests (cuda) ${POOL_SUITE:-full}" 150 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.short -test.v -test.timeout 140s ${sel[*]@Q} >'$dir/suite.txt' 2>&1; rc=\$?; tail -n 5 '$dir/suite.txt'; exit \$rc"
fi
echo
echo "pool test failures (if any):"
grep -E '^(--- FAIL|FAIL|panic)' "$dir/suite.txt" 2>/dev/null | head -n 10
echo
echo "BenchmarkParallelPair (cuda; pairs/s over all goroutines):"
grep -E '^Benchmark' "$dir/parallel.txt" "$dir/profile.txt" "$dir/profile-keep.txt" 2>/dev/null | sed 's/^[^:]*://' | awk '{printf "%-46s %s %s  %s %s  %s %s  %s %s  %s %s\n", $1, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14}'
echo
echo "bench alloc (random mix), ratios to cuMemAllocAsync:"
python3 scripts/gpu/pool-table.py "$dir/alloc.json" 2>&1 | head -n 20
echo
printf '%s\n' "${status[@]}"
