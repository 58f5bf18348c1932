#!/usr/bin/env bash
# The default pool's one-goroutine speed, repeated (issue 13, item 3): is
# the figure's spread over passes the pool or the host? Expected time on an
# NVIDIA H200: about 120 s (REPS=6; give the area 200 s). DEVICE=sim tries
# the script on a machine without a GPU.
#
# Each repetition runs `memwall bench alloc --device cuda --mixes random
# --policies virtual,virtual-keep --goroutines 1` once in every
# configuration below, in turn (so a slow minute of the host falls on every
# configuration alike):
#   plain      as a user runs it
#   node0      numactl --cpunodebind=0 --membind=0 (threads and memory on
#              one NUMA node; skipped without numactl or a second node)
#   node1      the same on node 1
#   gmp1       GOMAXPROCS=1 (one processor: the goroutine cannot move to
#              another processor's cache)
#   long       --pairs 200000 (a timed window of ~100 ms instead of ~10)
#   gcoff      GOGC=off (no collection can start in the timed window)
#   alt        ALT_BIN, when set: another memwall binary (a patched build)
#              run as plain is (with ALT_ENV, NAME=VALUE words, set), for
#              an A/B in the same run
# With PERCPU=1 it then runs the same bench once per CPU and repetition,
# the whole process pinned to that CPU (taskset -c N; PERCPU_REPS rounds,
# default 2), beside the simulator's BenchmarkPair pinned the same way
# (gpubin/pool.test; pure CPU work, no driver): is a CPU of the host slower
# than another, and does it stay so? (+16 s a round on 16 CPUs.)
# CONFIGS (words) picks among plain, node0, node1, gmp1, long, gcoff and alt
# (default all). The host's topology (lscpu, numactl -H) is logged first, and the summary
# (scripts/gpu/pool-speed.py) prints per configuration the median, minimum
# and maximum of the default's and keep's p50 and pairs/s, the driver's,
# and how many passes met the goals. Logs go to $OUT/pool-speed/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/pool-speed
mkdir -p "$dir"
bin=$PWD/${BIN:-gpubin}
reps=${REPS:-6}
{
  lscpu
  echo
  numactl -H 2>&1 || echo "numactl: not installed"
  echo
  cat /sys/devices/system/cpu/smt/active 2>/dev/null | sed 's/^/smt active: /'
  grep -m1 'model name' /proc/cpuinfo
  nproc
} >"$dir/topology.txt" 2>&1
nodes=0
if command -v numactl >/dev/null 2>&1; then
  nodes=$(numactl -H 2>/dev/null | awk '/^available:/{print $2}')
fi
one() { # one CONFIG REP PREFIX... -- extra bench flags
  local cfg=$1 rep=$2 exe=$bin/memwall; shift 2
  [ "$cfg" = alt ] && exe=$ALT_BIN
  local pre=() extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do pre+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  extra=("$@")
  timeout -k 5 60 "${pre[@]}" "$exe" bench alloc --device "${DEVICE:-cuda}" --mixes random \
    --policies virtual,virtual-keep --strategies bestfit --goroutines 1 --pairs 20000 "${extra[@]}" \
    --out "$dir/$cfg-$rep.json" >"$dir/$cfg-$rep.txt" 2>&1 || echo "$cfg $rep: rc=$?" >>"$dir/errors.txt"
}
t0=$(date +%s)
configs=" ${CONFIGS:-plain node0 node1 gmp1 long gcoff alt} "
want() { [[ $configs == *" $1 "* ]]; }
for rep in $(seq 1 "$reps"); do
  want plain && one plain "$rep" env --
  if [ "${nodes:-0}" -ge 2 ]; then
    want node0 && one node0 "$rep" numactl --cpunodebind=0 --membind=0 --
    want node1 && one node1 "$rep" numactl --cpunodebind=1 --membind=1 --
  fi
  want gmp1 && one gmp1 "$rep" env GOMAXPROCS=1 --
  want long && one long "$rep" env -- --pairs 200000
  want gcoff && one gcoff "$rep" env GOGC=off --
  [ -n "${ALT_BIN:-}" ] && want alt && one alt "$rep" env ${ALT_ENV:-} --
done
if [ "${PERCPU:-0}" = 1 ]; then
  ncpu=$(nproc)
  for rep in $(seq 1 "${PERCPU_REPS:-2}"); do
    for c in $(seq 0 $((ncpu - 1))); do
      one "cpu$c" "$rep" taskset -c "$c" --
      if [ -x "$bin/pool.test" ]; then
        (cd pool && timeout 30 taskset -c "$c" "$bin/pool.test" -test.run '^$' -test.bench 'Pair/virtual-bestfit$' \
          -test.benchtime 100000x -test.cpu 1 2>&1 | awk -v c="$c" -v r="$rep" '/ns\/op/{print "sim", r, c, $3}') >>"$dir/percpu-sim.txt"
      fi
    done
  done
fi
t1=$(date +%s)
grep -o 'always \[madvise\] never\|\[always\] madvise never\|always madvise \[never\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null | sed 's/^/transparent huge pages: /'
echo "topology:"
grep -E '^(Socket|Core|Thread|NUMA node|CPU\(s\)|Model name)' "$dir/topology.txt" | sed 's/^/  /'
echo "repetitions: $reps, $((t1 - t0)) s"
[ -f "$dir/errors.txt" ] && { echo "errors:"; cat "$dir/errors.txt"; }
python3 scripts/gpu/pool-speed.py "$dir"
if [ -s "$dir/percpu-sim.txt" ]; then
  echo "simulator BenchmarkPair pinned to each CPU (ns a pair; one row per round):"
  awk '{v[$2] = v[$2] sprintf(" %4.0f", $4)} END {for (r in v) print "  round " r ":" v[r]}' "$dir/percpu-sim.txt" | sort
fi
