#!/usr/bin/env bash
# memwall's SPIR-V product kernel on NVIDIA's Vulkan driver (issue 25: stream
# and fit --plain on Vulkan), from the repo root: the kernels package's
# TestVulkanMatmul against the float64 reference (~10 s), then `memwall
# stream` and `memwall fit --plain` with --device vulkan on a gen-model
# model, next to --device cuda (~40 s). Needs gpubin/memwall and
# gpubin/kernels.test, and the Vulkan loader's .deb files in .gl/ (see
# scripts/gpu/vulkan.sh). Writes under $OUT/vulkan-products/.
set -uo pipefail
cd "$(dirname "$0")/../.."
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; ldconfig
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/vulkan-products
mkdir -p "$dir"
bin=$PWD/${BIN:-gpubin}
# NVIDIA's container toolkit puts the driver's manifest where the loader
# does not look.
timeout 20 "$bin/memwall" info --device vulkan >"$dir/info.txt" 2>&1
if ! grep -q '^vulkan ' "$dir/info.txt"; then
  for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
    if [ -f "$icd" ]; then export VK_DRIVER_FILES=$icd; break; fi
  done
  [ -n "${VK_DRIVER_FILES:-}" ] || export VK_DRIVER_FILES=$(find / -xdev -name 'nvidia_icd*.json' 2>/dev/null | head -n 1)
  echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-none found}"
  ldconfig -p | grep -i -e vulkan -e libGLX_nvidia | head -n 5
  timeout 20 "$bin/memwall" info --device vulkan >"$dir/info.txt" 2>&1; head -n 3 "$dir/info.txt"
fi
(cd kernels && MEMWALL_TEST_DEVICE=vulkan timeout 60 "$bin/kernels.test" -test.v -test.run 'TestVulkanMatmul') >"$dir/matmul.txt" 2>&1
echo "TestVulkanMatmul: $(grep -E '^(--- |ok|FAIL|PASS)' "$dir/matmul.txt" | tr '\n' ' ')"
m=$(mktemp -d)/model.safetensors
"$bin/memwall" gen-model --layers 8 --hidden 2048 --inter 5632 --heads 16 --out "$m" >"$dir/gen.txt" 2>&1
for dev in vulkan cuda; do
  timeout 60 "$bin/memwall" stream "$m" --vram 2GiB --device $dev --steps 5 --json >"$dir/stream-$dev.json" 2>"$dir/stream-$dev.err"
  echo "stream --device $dev: rc=$? $(tail -c 300 "$dir/stream-$dev.err")"
  timeout 60 "$bin/memwall" fit "$m" --plain --vram 2GiB --device $dev --json >"$dir/fit-$dev.json" 2>"$dir/fit-$dev.err"
  echo "fit --plain --device $dev: rc=$? $(tail -c 300 "$dir/fit-$dev.err")"
done
python3 - "$dir" <<'PY'
import json, sys, os
d = sys.argv[1]
print(f"{'':16s} {'predicted peak':>15s} {'measured peak':>14s} {'step s':>9s} {'predicted s':>12s} {'GB/s':>7s} verified")
for dev in ("vulkan", "cuda"):
    try:
        j = json.load(open(os.path.join(d, f"stream-{dev}.json")))
    except Exception as e:
        print(f"stream {dev}: {e}"); continue
    pred = next((j[k] for k in j if k.startswith("predicted_peak")), 0)
    print(f"stream {dev:9s} {pred:15,} {j.get('peak_bytes', 0):14,} {j.get('seconds_per_step', 0):9.4f} "
          f"{j.get('predicted_steady_seconds_per_step', 0):12.4f} {j.get('achieved_GBps', 0):7.2f} {j.get('verified')}")
PY
