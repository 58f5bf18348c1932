#!/usr/bin/env bash
# Quantized products on the GPU machine (issue 27), from the repo root: the
# memwall_qmatmul_* / memwall_qembed_* kernels built from this checkout's
# kernels.cu (compute_90, ~1-2 min of nvcc) and checked by the kernels
# package's Quant tests on the GPU (every quantized dtype, random shapes,
# against quant.Dot's float64 sum and quant.Dequantize bit for bit; ~20 s
# with the PTX JIT); then a tiny Q4_K_M GGUF from gen-model (Q4_K, Q6_K and
# 16-bit matrices) run greedily with --device cuda (that PTX), sim and cpu,
# the generated tokens compared; last, the three embedded modules rebuilt
# (ARCHS 90 80 70) into $OUT/quant/ptx/ for committing as kernels/*.ptx.gz.
#
#   OUT=/some/dir scripts/gpu/quant.sh
#
# Needs gpubin/memwall and gpubin/kernels.test (GPU_PKGS= scripts/gpu-build.sh)
# and nvcc. Writes under $OUT/quant/: build.txt, test.txt, run-*.json/.log,
# tokens.txt (the table it prints last), ptx/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/quant
mkdir -p "$dir"
bin=${BIN:-gpubin}
[[ $bin == /* ]] || bin=$PWD/$bin
for b in memwall kernels.test; do
  [ -x "$bin/$b" ] || { echo "quant: $bin/$b missing (run GPU_PKGS= scripts/gpu-build.sh)"; exit 1; }
done
rc=0
ptx=/tmp/k90.ptx

# 1. The compute_90 module of this kernels.cu.
if ! ARCH=90 timeout 400 scripts/build-ptx.sh "$ptx" >"$dir/build.txt" 2>&1; then
  echo "quant: nvcc failed:"; tail -n 30 "$dir/build.txt"; exit 1
fi
grep -c '^.visible .entry memwall_q' "$ptx" | sed 's/^/quant: quantized entries in the PTX: /'

# 2. The kernels' Quant tests on the GPU (TestQuantCUDA), and on sim/cpu.
(cd kernels && MEMWALL_TEST_DEVICE=cuda MEMWALL_KERNELS_PTX=$ptx \
  timeout --kill-after=5 240 "$bin/kernels.test" -test.run 'Quant' -test.v -test.timeout 240s) >"$dir/test.txt" 2>&1
r=$?
grep -E '^(--- |ok|FAIL|PASS)' "$dir/test.txt"
[ $r -ne 0 ] && { rc=1; echo "quant: tests rc=$r"; grep -v '^=== ' "$dir/test.txt" | tail -n 20; }

# 3. A tiny Q4_K_M model, greedy, on cuda, sim and cpu.
model=$dir/tiny-q4_k_m.gguf
rm -f "$model"
if ! timeout 120 "$bin/memwall" gen-model --preset tiny --dtype q4_k_m --format gguf --out "$model" --json >"$dir/gen-model.json" 2>"$dir/gen-model.log"; then
  echo "quant: gen-model failed:"; tail -n 10 "$dir/gen-model.log"; exit 1
fi
ids=1,15,31,29,590,7,100,3
for dev in cuda sim cpu; do
  # Only cuda loads the fresh PTX (sim and cpu run the Go twins and would
  # refuse a PTX file).
  if [ "$dev" = cuda ]; then export MEMWALL_KERNELS_PTX=$ptx; else unset MEMWALL_KERNELS_PTX; fi
  timeout 180 "$bin/memwall" run "$model" --device "$dev" --prompt-ids "$ids" \
    --max-new 32 --ignore-eos --json >"$dir/run-$dev.json" 2>"$dir/run-$dev.log" \
    || { [ "$dev" = cpu ] || rc=1; echo "quant: run --device $dev failed:"; tail -n 10 "$dir/run-$dev.log"; }
done
python3 - "$dir" <<'PY' | tee "$dir/tokens.txt"
import json, os, sys
d = sys.argv[1]
runs = {}
for dev in ("cuda", "sim", "cpu"):
    try:
        with open(os.path.join(d, "run-%s.json" % dev)) as f:
            runs[dev] = json.load(f)
    except (OSError, ValueError):
        pass
ref = runs.get("sim")
print("%-5s %-7s %-9s %10s %10s  %s" % ("dev", "same", "first≠", "prefill/s", "decode/s", "tokens"))
for dev, r in runs.items():
    t = r["tokens"]
    same = first = "-"
    if ref is not None:
        same = "%d/%d" % (sum(a == b for a, b in zip(t, ref["tokens"])), len(ref["tokens"]))
        first = next((str(i) for i, (a, b) in enumerate(zip(t, ref["tokens"])) if a != b), "none")
    print("%-5s %-7s %-9s %10.1f %10.1f  %s" % (dev, same, first, r.get("prefill_tokens_per_s", 0),
          r.get("decode_tokens_per_s", 0), ",".join(map(str, t))))
if "cuda" not in runs or ref is None:
    print("quant: cuda or sim run missing")
PY
if ! python3 -c 'import json,sys; a,b=(json.load(open(sys.argv[i]))["tokens"] for i in (1,2)); sys.exit(a!=b)' \
  "$dir/run-cuda.json" "$dir/run-sim.json" 2>/dev/null; then
  rc=1; echo "quant: cuda and sim tokens differ (or a run is missing)"
fi

# 4. The embedded modules, for kernels/kernels_sm{90,80,70}.ptx.gz.
mkdir -p "$dir/ptx"
timeout 500 scripts/build-ptx.sh "$dir/ptx" >>"$dir/build.txt" 2>&1 || { rc=1; echo "quant: embedded PTX build failed"; tail -n 10 "$dir/build.txt"; }
ls -l "$dir/ptx"
exit $rc
