#!/usr/bin/env bash
# The pool's long property runs on the GPU host's cores (issue 13, item 1),
# on the simulator's shadow device: CPU work only, run there for its cores.
# Expected time: about 150 s on 16 cores (give the area 200 s):
#  1. TestPropertyBlocks -long (10^6 operations per configuration) on the
#     configurations selected by POOL_LONG_RUN (default: the pools over a
#     pool, the defaults' family and the hold-time ones), 16 at a time,
#     within POOL_LONG_S seconds (default 110; every configuration,
#     POOL_LONG_RUN='TestPropertyBlocks$', takes about 150 s);
#  2. the race detector (gpupack/pool.race.test.xz, built with
#     CGO_ENABLED=1 go test -race -c) on POOL_RACE_RUN (default: the
#     layers' tests and the pools over a pool) at POOL_RACE_OPS operations
#     per configuration (default 2x10^5) within POOL_RACE_S seconds
#     (default 80; the default's family and the pools over a pool at 10^6,
#     POOL_RACE_RUN='TestPropertyBlocks$/(over-pool|virtual-bestfit-per-processor|virtual-bestfit-sharded)'
#     POOL_RACE_OPS=1000000, take about 160 s).
# Logs go to $OUT/pool-long/; the last lines are a table.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/pool-long
mkdir -p "$dir"
bin=$PWD/${BIN:-gpubin}
log=$dir/log.txt
: >"$log"
. scripts/gpu/lib.sh
sel=${POOL_LONG_RUN:-'TestPropertyBlocks$/(over-pool|virtual-bestfit-per-processor|virtual-bestfit-sharded).*'}
lim=${POOL_LONG_S:-110}
run "property -long ($sel)" "$lim" bash -c "cd pool && '$bin/pool.test' -test.run '$sel' -long -test.v -test.parallel 16 -test.timeout $((lim - 5))s >'$dir/long.txt' 2>&1; rc=\$?; tail -n 3 '$dir/long.txt'; exit \$rc"
if [ -f gpupack/pool.race.test.xz ]; then
  xz -dc gpupack/pool.race.test.xz >"$dir/pool.race.test" && chmod +x "$dir/pool.race.test"
  rops=${POOL_RACE_OPS:-200000}
  rsel=${POOL_RACE_RUN:-'TestTenant|TestCounter|TestLogLayer|TestStack|TestPoolOverPool|TestPropertyBlocks$/over-pool'}
  rlim=${POOL_RACE_S:-80}
  run "race: $rsel ($rops ops)" "$rlim" bash -c "cd pool && MEMWALL_POOL_OPS=$rops '$dir/pool.race.test' -test.run '$rsel' -test.v -test.parallel 20 -test.timeout $((rlim - 5))s >'$dir/race.txt' 2>&1; rc=\$?; tail -n 3 '$dir/race.txt'; exit \$rc"
  rm -f "$dir/pool.race.test"
else
  status+=("$(printf '%-44s %-9s' "gpupack/pool.race.test.xz" "MISSING")")
fi
echo
echo "configurations (ops, time):"
grep -E '^\s+--- (PASS|FAIL)' "$dir/long.txt" | sed 's/^ *//' | head -n 40
grep -E 'ops in' "$dir/long.txt" | sed 's/^ *//' | sort | head -n 40 | awk '{print "  " $0}' | head -n 5
grep -cE 'DATA RACE' "$dir/race.txt" 2>/dev/null | sed 's/^/data races reported: /'
echo
printf '%s\n' "${status[@]}"
