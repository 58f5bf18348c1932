#!/usr/bin/env bash
# Pool policy (issue 13, item 2) on the GPU. Expected time on an NVIDIA H200:
# about 60-80 s: the driver's cost of one growth step at handle sizes of
# 2-256 MiB (cuMemCreate, cuMemMap+SetAccess, cuMemUnmap, cuMemRelease of
# one multi-page handle; pool.test -test.run TestMapCost, ~1 s), then more
# allocation traces recorded from PyTorch (scripts/gpu/record-traces.py,
# 10 s of calls each, ~20 s per workload with its model build; run 1
# recorded t5_generate, gpt2_varbatch, unet_sd, moe_generate, in
# testdata/traces now; this records resnet_varbatch, whisper_generate,
# llama_long, or the workloads in $TRACES). Run from the repository root after
# scripts/gpu-build.sh. Logs and traces go to $OUT/pool-policy/; a short
# table is printed last; every step is under timeout.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/pool-policy
mkdir -p "$dir/traces"
bin=$PWD/${BIN:-gpubin}
py=python3
for c in /opt/*/.venv/bin/python3; do [ -x "$c" ] && py=$c; done
status=()
step() { # step NAME SECONDS LOG CMD...
  local name=$1 limit=$2 log=$3; shift 3
  local t0 t1 r
  t0=$(date +%s.%N)
  if timeout -k 5 "$limit" "$@" >"$log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  t1=$(date +%s.%N)
  status+=("$(printf '%-36s %-9s %6.1fs' "$name" "$r" "$(awk "BEGIN{print $t1 - $t0}")")")
}
if [ -x "$bin/pool.test" ]; then
  step "map cost per handle size (cuda)" 40 "$dir/mapcost.txt" \
    bash -c "cd pool && MEMWALL_TEST_DEVICE=cuda '$bin/pool.test' -test.run '^TestMapCost$' -test.v -test.timeout 35s"
else
  status+=("$(printf '%-36s %-9s' "map cost per handle size (cuda)" "MISSING")")
fi
step "record traces" 150 "$dir/record.txt" \
  "$py" scripts/gpu/record-traces.py --out-dir "$dir/traces" --seconds 10 \
  --only "${TRACES:-resnet_varbatch,whisper_generate,llama_long}"
echo "map cost (median µs per call):"
grep -E 'MiB|handle' "$dir/mapcost.txt" 2>/dev/null | sed 's/^ *mapcost_test.go:[0-9]*: //'
echo
echo "traces:"
tail -n 8 "$dir/record.txt" 2>/dev/null
ls -la "$dir/traces" 2>/dev/null | tail -n +2
echo
printf '%s\n' "${status[@]}"
