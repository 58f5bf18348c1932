#!/usr/bin/env bash
# The pool on the GPU (issue 13, item 3: the default's speed). Expected
# time on an NVIDIA H200: about 115 s (each step under its own timeout;
# give the area 170 s); run it alone on the host if you can: other
# scripts' CPU load moves the one-goroutine figures by tens of per cent:
#  1. memwall bench alloc --device cuda --mixes random --policies
#     virtual,virtual-keep,virtual-eager --strategies bestfit --goroutines
#     1,4,16: the default (hold time: a hot pool's free pages beyond its
#     target wait for the reclaimer), keeping every page, and the old
#     eager default (HoldTime -1), against cuMemAlloc and cuMemAllocAsync
#     in the same run, ~10 s; then again with the policies in reverse
#     order, ~10 s;
#  2. BenchmarkParallelPair on the GPU: default, eager, one set of arenas,
#     balancing shards, 4 shards, keep with and without shards, on
#     1/4/16 goroutines, ~30 s; then the default's 1-goroutine run again
#     with a CPU profile (cpu1.pprof), ~10 s;
#  3. cuda.Wrap's test (a pool on an adopted context and stream, ~1 s);
#  4. last, so that a hang costs the figures nothing: the pool's shard,
#     reclaimer, property (pools over a pool included), tenant, layer
#     stack and handle tests on the GPU's own memory (pool.test
#     -test.short, MEMWALL_TEST_DEVICE=cuda), ~65 s; POOL_SUITE=full runs
#     the whole suite (~110 s);
#  5. the table: pairs/s, p50, p99, their ratios to cuMemAllocAsync and
#     the goals each row meets (scripts/gpu/pool-table.py), printed last.
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
. scripts/gpu/lib.sh # run NAME SECONDS CMD...: time-limited, logged, pass/fail remembered

run "bench alloc (random mix, 1/4/16 goroutines)" 100 bash -c \
  "'$bin/memwall' bench alloc --device cuda --mixes random --policies virtual,virtual-keep,virtual-eager --strategies bestfit --goroutines 1,4,16 --pairs 20000 --out '$dir/alloc.json' >'$dir/alloc.txt' 2>&1"
# The same in the reverse order of policies: how much of a row's figure is
# its place in the run (the first pool measured after the device opens).
run "bench alloc (reverse order)" 100 bash -c \
  "'$bin/memwall' bench alloc --device cuda --mixes random --policies virtual-eager,virtual-keep,virtual --strategies bestfit --goroutines 1,4,16 --pairs 20000 --out '$dir/alloc-rev.json' >'$dir/alloc-rev.txt' 2>&1"
if [ -x "$bin/pool.test" ]; then
  run "BenchmarkParallelPair (cuda)" 80 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.run '^\$' -test.bench 'ParallelPair' -test.benchtime 600000x -test.timeout 75s >'$dir/parallel.txt' 2>&1"
  run "profile: default, 1 goroutine (cuda)" 30 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.run '^\$' -test.bench 'ParallelPair/default/g1\$' -test.benchtime 2000000x -test.timeout 25s -test.cpuprofile '$dir/cpu1.pprof' >'$dir/profile.txt' 2>&1"
else
  status+=("$(printf '%-44s %-9s' "pool.test" "MISSING")")
fi
if [ -x "$bin/device_cuda.test" ]; then
  run "cuda.Wrap runs the pool (cuda)" 60 bash -c "cd device/cuda && '$bin/device_cuda.test' -test.run 'TestWrap' -test.v -test.timeout 50s >'$dir/wrap.txt' 2>&1"
fi
# The suite last: a hang in it costs the figures above nothing.
if [ -x "$bin/pool.test" ]; then
  sel=()
  [ "${POOL_SUITE:-short}" = short ] && sel=(-test.run 'TestShard|TestReclaim|TestPropertyBlocks$|TestTenant|TestStack|TestPoolOverPool|TestHandle|Example')
  run "pool tests (cuda) ${POOL_SUITE:-short}" 130 bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.short -test.v -test.timeout 120s ${sel[*]@Q} >'$dir/suite.txt' 2>&1; rc=\$?; tail -n 5 '$dir/suite.txt'; exit \$rc"
fi
echo
echo "pool test failures (if any):"
grep -E '^(--- FAIL|FAIL|panic)' "$dir/suite.txt" 2>/dev/null | head -n 10
echo
echo "BenchmarkParallelPair (cuda; pairs/s over all goroutines):"
grep -E '^Benchmark' "$dir/parallel.txt" "$dir/profile.txt" 2>/dev/null | sed 's/^[^:]*://' | awk '{printf "%-46s %s %s  %s %s  %s %s  %s %s  %s %s\n", $1, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14}'
echo
echo "bench alloc (random mix), ratios to cuMemAllocAsync:"
python3 scripts/gpu/pool-table.py "$dir/alloc.json" 2>&1 | head -n 30
echo
echo "bench alloc again, policies in reverse order (memwall rows):"
python3 scripts/gpu/pool-table.py "$dir/alloc-rev.json" 2>&1 | grep -E '^(allocator|memwall|cuMemAllocAsync )' | head -n 14
echo
printf '%s\n' "${status[@]}"
