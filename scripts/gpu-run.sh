#!/usr/bin/env bash
# Runs memwall's GPU tests and benchmarks on a machine with an NVIDIA GPU, in
# one go: compiles the kernels to PTX with nvcc, then runs the binaries that
# scripts/gpu-build.sh built. Logs and JSON go to $OUT (default ./gpu-out);
# a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
bin=$PWD/${BIN:-gpubin}
log=$OUT/log.txt
: >"$log"
status=()
run() { # run NAME CMD...: log output, remember pass/fail
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$log"
  local t0=$(date +%s.%N)
  if "$@" >>"$log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  local t1=$(date +%s.%N)
  status+=("$(printf '%-34s %-9s %6.1fs' "$name" "$r" "$(awk "BEGIN{print $t1 - $t0}")")")
  tail -n 3 "$log"
}

nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,pcie.link.gen.max,pcie.link.width.max \
  --format=csv >"$OUT/nvidia-smi.csv" 2>&1 || true
cat "$OUT/nvidia-smi.csv"

if scripts/build-ptx.sh "$OUT/kernels.ptx" >>"$log" 2>&1; then
  export MEMWALL_KERNELS_PTX=$OUT/kernels.ptx
  status+=("$(printf '%-34s %-9s' "nvcc kernels.ptx" PASS)")
else
  status+=("$(printf '%-34s %-9s' "nvcc kernels.ptx" FAIL)")
  tail -n 20 "$log"
fi

run "memwall info" "$bin/memwall" info
"$bin/memwall" info --json >"$OUT/info.json" 2>>"$log"
run "bad MEMWALL_LIBCUDA, --device cuda" bash -c "! MEMWALL_LIBCUDA=/nonexistent/libcuda.so.1 '$bin/memwall' info --device cuda"
run "bad MEMWALL_LIBCUDA, --device auto" bash -c "MEMWALL_LIBCUDA=/nonexistent/libcuda.so.1 '$bin/memwall' info --device auto | grep -q 'sim'"
[ -x "$bin/device_cuda.test" ] && run "device conformance (cuda)" bash -c "cd device/cuda && '$bin/device_cuda.test' -test.v -test.timeout 300s"
[ -x "$bin/kernels.test" ] && run "kernels (cuda)" bash -c "cd kernels && MEMWALL_TEST_DEVICE=cuda '$bin/kernels.test' -test.v -test.timeout 300s"
[ -x "$bin/pool.test" ] && run "pool suite (cuda)" bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.v -test.timeout 300s"
[ -x "$bin/plan_bind.test" ] && run "plan lifetimes on the GPU" bash -c "cd plan/bind && MEMWALL_TEST_DEVICE=cuda '$bin/plan_bind.test' -test.v -test.timeout 300s"
run "bench transfer" bash -c "'$bin/memwall' bench transfer | tee '$OUT/transfer.txt'"
if nvcc -O2 -o "$OUT/anchor-alloc" scripts/anchor-alloc.c -lcuda >>"$log" 2>&1; then
  run "driver allocators from C" bash -c "'$OUT/anchor-alloc' | tee '$OUT/anchor-alloc.jsonl'"
else
  status+=("$(printf '%-34s %-9s' "nvcc anchor-alloc" FAIL)")
fi
run "bench alloc" bash -c "'$bin/memwall' bench alloc --out '$OUT/alloc.json' | tee '$OUT/alloc.txt'"
# The host's speed drifts by minutes: time the driver from C again after the
# bench, so that a ratio can be taken against both sides of it.
[ -x "$OUT/anchor-alloc" ] && run "driver allocators from C, again" bash -c "'$OUT/anchor-alloc' > '$OUT/anchor-alloc-after.jsonl'"
# Ratios that the host's drift does not skew: the driver from C and memwall
# alternately on the same CPUs (scripts/paired-alloc.sh).
run "paired driver/memwall rounds" env OUT="$OUT" BIN="$bin" scripts/paired-alloc.sh
[ -n "${EXTRA:-}" ] && run "extra" bash -c "$EXTRA"

echo
echo "== summary"
printf '%s\n' "${status[@]}" | tee "$OUT/summary.txt"
