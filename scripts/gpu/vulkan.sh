#!/usr/bin/env bash
# The Vulkan backend on the H200 through NVIDIA's Vulkan driver, headless
# (issue 17). Expected time: about 100 s (at most 120), every step under timeout:
#   setup: the Debian Vulkan loader unpacked from .gl/*.deb (the machine has
#          NVIDIA's ICD but no loader), VK_DRIVER_FILES if no driver is found  ~3 s
#   memwall info --device vulkan (text and --json)                            ~2 s
#   device/vulkan's tests: the device conformance suite (32 MiB copies), the
#          pool data test, plan/bind lifetimes of real graphs with shuffled
#          submission orders, the dropped-barrier test, weight streaming,
#          20 more opens in a row (TestReopen: the driver kept loaded), the
#          suite again with copies split over 3 copy queues                   ~40 s
#   opens without the driver kept loaded, alone in a process, with the
#          loader's log: the VK_ERROR_INCOMPATIBLE_DRIVER account           ~20 s
#   the transfer candidates: every queue family x cached/uncached/imported
#          host memory x 1 region/16 regions/16 submits/2-4 queues, and D2D
#          by vkCmdCopyBuffer on each queue and by a shader (256 MiB)         ~15 s
#   the same with MEMWALL_VULKAN_SPARSE=1: virtual memory over sparse binding ~10 s
#   memwall bench transfer --device vulkan next to --device cuda (256 MiB)   ~15 s
#   memwall bench alloc --device vulkan: the pool vs vkAllocateMemory         ~8 s
# Run from the repository root after scripts/gpu-build.sh; logs go to
# $OUT/vulkan/, a short table is printed last (Vulkan H2D pinned as a
# fraction of CUDA's: the goal is >= 0.90).
set -uo pipefail
cd "$(dirname "$0")/../.."
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; ldconfig
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/vulkan
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

# A driver? The loader finds ICDs in the standard places; NVIDIA's
# container toolkit may put its manifest elsewhere.
if ! timeout 20 "$bin/memwall" info --device vulkan >"$dir/info.txt" 2>&1; then
  for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
    if [ -f "$icd" ]; then export VK_DRIVER_FILES=$icd; break; fi
  done
  export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
  echo "no Vulkan driver found by default; VK_DRIVER_FILES=$VK_DRIVER_FILES" >>"$log"
fi
{ ldconfig -p | grep -i vulkan; ls -la /usr/local/nvidia/share/vulkan/icd.d /etc/vulkan/icd.d /usr/share/vulkan/icd.d 2>&1; } >"$dir/setup.txt" 2>&1
# The loader's own account of the drivers it tried (read when info fails).
VK_LOADER_DEBUG=error,warn,driver timeout 20 "$bin/memwall" info --device vulkan >"$dir/loader-debug.txt" 2>&1

run "memwall info --device vulkan" 20 bash -c "'$bin/memwall' info --device vulkan >'$dir/info.txt' 2>&1 && '$bin/memwall' info --device vulkan --json >'$dir/info.json'"
if [ -x "$bin/device_vulkan.test" ]; then
  run "device/vulkan tests (conformance, pool, bind, streaming)" 120 bash -c \
    "cd device/vulkan && MEMWALL_TEST_DEVICE=vulkan MEMWALL_VULKAN_REOPEN=20 '$bin/device_vulkan.test' -test.v -test.timeout 110s -test.run 'TestConformance\$|TestConformanceSplitCopies|TestSplitCopiesRandom|TestInfo|TestStructSizes|TestPoolData|TestBindLifetimes|TestDroppedBarrierIsCaught|TestStreamWeights|TestSpin|TestRandomOps|TestHostRegisterUnaligned|TestAllocPriority|TestDeviceSelection|TestNaturalAlignment|TestCopyDtoDRandom|TestReopen\$|TestPriorit' >'$dir/tests.txt' 2>&1; rc=\$?; tail -n 3 '$dir/tests.txt'; exit \$rc"
  # What the pin prevents, in a process of its own: the loader's log says
  # why vkCreateInstance stops finding the driver.
  run "device/vulkan reopen unpinned (diagnostic)" 40 bash -c \
    "cd device/vulkan && VK_LOADER_DEBUG=error,warn MEMWALL_VULKAN_REOPEN_UNPINNED=60 '$bin/device_vulkan.test' -test.v -test.timeout 35s -test.run 'TestReopenUnpinned' >'$dir/reopen-unpinned.txt' 2>&1; rc=\$?; grep -E 'unpinned:' '$dir/reopen-unpinned.txt'; exit \$rc"
  run "device/vulkan transfer candidates (256 MiB)" 90 bash -c \
    "cd device/vulkan && MEMWALL_TEST_DEVICE=vulkan MEMWALL_VULKAN_XFER=1 MEMWALL_VULKAN_XFER_OUT='$dir/candidates.json' '$bin/device_vulkan.test' -test.v -test.timeout 85s -test.run 'TestTransferCandidates' >'$dir/candidates.txt' 2>&1"
else
  status+=("$(printf '%-44s %-9s' "device/vulkan tests" "MISSING")")
fi
# Opt-in virtual memory over sparse binding: the suite again (its
# VirtualMemory subtest runs then), the pool data test on GrowVirtual too,
# and plan/bind over a pool that grows virtually.
if [ -x "$bin/device_vulkan.test" ]; then
  run "device/vulkan sparse VM (MEMWALL_VULKAN_SPARSE=1)" 60 bash -c \
    "cd device/vulkan && MEMWALL_TEST_DEVICE=vulkan MEMWALL_VULKAN_SPARSE=1 '$bin/device_vulkan.test' -test.v -test.timeout 50s -test.run 'TestConformance\$|TestInfo|TestPoolData|TestBindLifetimes' >'$dir/sparse.txt' 2>&1; rc=\$?; tail -n 3 '$dir/sparse.txt'; exit \$rc"
fi
run "bench transfer --device vulkan" 60 bash -c "'$bin/memwall' bench transfer --device vulkan --size 256MiB --reps 10 --json >'$dir/transfer-vulkan.json' 2>'$dir/transfer-vulkan.err'"
run "bench transfer --device vulkan, 2 copy queues" 60 bash -c "MEMWALL_VULKAN_COPY_QUEUES=2 '$bin/memwall' bench transfer --device vulkan --size 256MiB --reps 10 --json >'$dir/transfer-vulkan-q2.json' 2>'$dir/transfer-vulkan-q2.err'"
run "bench transfer --device cuda" 60 bash -c "'$bin/memwall' bench transfer --device cuda --size 256MiB --reps 10 --json >'$dir/transfer-cuda.json' 2>'$dir/transfer-cuda.err'"
run "bench alloc --device vulkan (pool vs vkAllocateMemory)" 90 bash -c \
  "'$bin/memwall' bench alloc --device vulkan --mixes random,4KiB --policies chunks --goroutines 1,4 --pairs 4000 --out '$dir/alloc.json' >'$dir/alloc.txt' 2>&1"

echo "memwall info --device vulkan:"
head -n 30 "$dir/info.txt" 2>/dev/null
if ! grep -q '^vulkan ' "$dir/info.txt" 2>/dev/null; then
  echo "(no Vulkan device: the loader's log, $dir/loader-debug.txt, ends with)"
  grep -iE 'error|warn|driver|icd' "$dir/loader-debug.txt" | tail -n 15
fi
echo
echo "device/vulkan test results:"
grep -E '^(--- |ok|FAIL|panic)|    --- FAIL' "$dir/tests.txt" 2>/dev/null | head -n 30
grep -E 'corrupted|live blocks|tensors checked|MiB, Vulkan|spin of' "$dir/tests.txt" 2>/dev/null | head -n 8
echo "reopen without the driver kept loaded:"
grep -E 'unpinned:' "$dir/reopen-unpinned.txt" 2>/dev/null
grep -iE 'error|warn' "$dir/reopen-unpinned.txt" 2>/dev/null | grep -v '^=== ' | sort | uniq -c | sort -rn | head -n 6
echo "sparse VM run:"
grep -E '^(--- |ok|FAIL|panic)|    --- (FAIL|SKIP)|VirtualMemory|disabled' "$dir/sparse.txt" 2>/dev/null | head -n 12
echo
echo "bench alloc --device vulkan:"
head -n 24 "$dir/alloc.txt" 2>/dev/null
echo
echo "bench transfer (256 MiB, median GB/s):"
python3 - "$dir/transfer-vulkan.json" "$dir/transfer-cuda.json" "$dir/candidates.json" "$dir/transfer-vulkan-q2.json" <<'EOF' || true
import json, sys
def load(p):
    try:
        return {r["name"]: r["GBps"] for r in json.load(open(p))["results"]}
    except Exception as e:
        print(f"  {p}: {e}")
        return {}
vk, cu, q2 = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[4])
for name in sorted(set(vk) | set(cu)):
    v, c, v2 = vk.get(name), cu.get(name), q2.get(name)
    ratio = f"{v / c:.2f}" if v and c else "-"
    ratio2 = f"{v2 / c:.2f}" if v2 and c else "-"
    print(f"  {name:14s} vulkan {v or 0:7.2f}  cuda {c or 0:7.2f}  vulkan/cuda {ratio}   2 copy queues {v2 or 0:7.2f} ({ratio2})")
v, c = vk.get("h2d_pinned"), cu.get("h2d_pinned")
if v and c:
    print(f"  H2D pinned: Vulkan is {v / c:.2f} of CUDA ({'meets' if v >= 0.9 * c else 'misses'} the 0.90 goal)")
# The transfer candidates, best first per direction, as fractions of CUDA.
try:
    cands = json.load(open(sys.argv[3]))
except Exception as e:
    cands = []
    print(f"  {sys.argv[3]}: {e}")
ref = {"h2d": cu.get("h2d_pinned"), "d2h": cu.get("d2h_pinned"), "d2d": cu.get("d2d")}
for d in ("h2d", "d2h", "d2d"):
    rows = sorted((r for r in cands if r["dir"] == d), key=lambda r: -r["GBps"])
    if not rows:
        continue
    print(f"  {d} candidates (median GB/s, fraction of CUDA pinned {ref[d] or 0:.2f}):")
    for r in rows[:6]:
        fr = f"{r['GBps'] / ref[d]:.2f}" if ref[d] else "-"
        print(f"    fam {r['family']} {r['family_flags'][:28]:28s} {r['host']:8s} {r['mode'][:26]:26s} {r['timing']:6s} {r['GBps']:8.2f}  {fr}")
EOF
echo
printf '%s\n' "${status[@]}"
