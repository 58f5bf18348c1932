#!/usr/bin/env bash
# The decode step as a device graph (issue 28) on the GPU machine, from the
# repo root, in about 6 minutes on the H200:
#
#   1. the compute_90 module of this checkout's kernels.cu (nvcc, ~1-2 min;
#      the Llama-7B-shaped bf16 GGUF is written meanwhile, ~60 s, or reused
#      from $MODELS);
#   2. with MEMWALL_KERNELS_PTX pointing at it: device/cuda's graph replay
#      test, the kernels' step-state tests (KVWriteAt / AttentionAt bit-equal
#      to KVWrite / Attention over random contexts, block sizes, head counts
#      and GQA ratios, and the float64 reference), the engine's tokens and
#      logits with the graph against plain launches, and compute-sanitizer
#      memcheck and racecheck on a quick pass of the step-state tests;
#   3. `memwall run --vram 20GiB` on the 7B, every weight resident, at 512
#      and 4096 tokens of context (384 + 128 and 3968 + 128), --graph auto
#      and off, with --profile: tok/s, a plain step's and a replay's device
#      time (each queued behind a spin kernel) and the launch gap per token
#      (wall time per token less the plain step's device time).
#
#   OUT=/some/dir scripts/gpu/graph.sh   (or AREAS=graph LIMIT_graph=480 scripts/gpu/all.sh)
#
# Needs gpubin/ from scripts/gpu-build.sh (memwall, device_cuda.test,
# kernels.test, engine.test) and nvcc. Writes under $OUT/graph/: build.txt,
# test-*.txt, memcheck.txt, racecheck.txt, run-CTX-GRAPH.json/.log, and
# table.txt (printed last).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/graph
mkdir -p "$dir"
bin=${BIN:-gpubin}
[[ $bin == /* ]] || bin=$PWD/$bin
for b in memwall device_cuda.test kernels.test engine.test; do
  [ -x "$bin/$b" ] || { echo "graph: $bin/$b missing (run scripts/gpu-build.sh)"; exit 1; }
done
models=${MODELS:-/dev/shm/memwall-graph}
mkdir -p "$models"
m=$models/llama-7b.gguf
ptx=${PTX_OUT:-/tmp/memwall-graph-k90.ptx}
rc=0
t0=$(date +%s)

# 1. PTX and the model, side by side.
ARCH=90 timeout 400 scripts/build-ptx.sh "$ptx" >"$dir/build.txt" 2>&1 &
nvcc_pid=$!
if [ ! -s "$m" ]; then
  timeout 240 "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$m" >"$dir/gen.txt" 2>&1 ||
    { echo "graph: gen-model failed"; tail -n 5 "$dir/gen.txt"; rc=1; }
fi
if ! wait $nvcc_pid; then
  echo "graph: nvcc failed:"; tail -n 30 "$dir/build.txt"; exit 1
fi
grep -c '^.visible .entry memwall_.*_at' "$ptx" | sed 's/^/graph: step-state entries in the PTX: /'
echo "graph: PTX and model ready after $(( $(date +%s) - t0 )) s"
export MEMWALL_KERNELS_PTX=$ptx

# 2. Tests.
gtest() { # NAME DIR SECONDS BINARY -test.run PATTERN...
  local name=$1 pkg=$2 limit=$3; shift 3
  (cd "$pkg" && MEMWALL_TEST_DEVICE=cuda timeout --kill-after=5 "$limit" "$@" -test.v -test.timeout "${limit}s") >"$dir/test-$name.txt" 2>&1
  local r=$?
  grep -E '^(--- |ok|FAIL|PASS)' "$dir/test-$name.txt" | grep -v '^    ' | sed "s/^/graph: $name: /"
  if [ $r -ne 0 ]; then rc=1; echo "graph: $name rc=$r"; grep -v '^=== ' "$dir/test-$name.txt" | tail -n 15; fi
}
gtest cuda device/cuda 60 "$bin/device_cuda.test" -test.run 'TestGraphReplay'
gtest kernels kernels 120 "$bin/kernels.test" -test.run 'TestCUDAStepState|TestAttnSplitRule|TestSimStepState'
gtest engine engine 150 "$bin/engine.test" -test.run 'TestDecodeGraph'
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do
    (cd kernels && MEMWALL_TEST_DEVICE=cuda MEMWALL_TEST_QUICK=1 timeout --kill-after=5 75 compute-sanitizer --tool $tool --error-exitcode 3 \
      "$bin/kernels.test" -test.run 'TestCUDAStepState' -test.v) >"$dir/$tool.txt" 2>&1
    r=$?
    echo "graph: compute-sanitizer $tool rc=$r: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$dir/$tool.txt" | tail -n 1)"
    [ $r -ne 0 ] && rc=1
  done
else
  echo "graph: no compute-sanitizer on PATH: memcheck and racecheck not run"
fi
echo "graph: tests done after $(( $(date +%s) - t0 )) s"

# 3. The 7B resident at 512 and 4096 tokens of context, graph on and off.
ids_of() { python3 -c "import sys; n=int(sys.argv[1]); print(','.join(str(3 + (i*7919) % 31000) for i in range(n)))" "$1"; }
for ctx in 512 4096; do
  ids=$(ids_of $((ctx - 128)))
  for g in auto off; do
    timeout 150 "$bin/memwall" run "$m" --device cuda --vram 20GiB --graph $g --profile --prompt-ids "$ids" \
      --max-new 128 --ignore-eos --json >"$dir/run-$ctx-$g.json" 2>"$dir/run-$ctx-$g.log" ||
      { rc=1; echo "graph: run at $ctx, --graph $g failed:"; tail -n 5 "$dir/run-$ctx-$g.log"; }
  done
done
python3 - "$dir" <<'PY' | tee "$dir/table.txt"
import json, os, sys
d = sys.argv[1]
print("%-7s %-6s %-6s %10s %11s %15s %14s %13s  %s" % ("context", "graph", "steps", "decode/s", "prefill/s", "plain step µs", "graph step µs", "gap/token µs", "tokens = off"))
bad = False
for ctx in (512, 4096):
    runs = {}
    for g in ("auto", "off"):
        try:
            with open(os.path.join(d, "run-%d-%s.json" % (ctx, g))) as f:
                runs[g] = json.load(f)
        except (OSError, ValueError):
            print("%-7d %-6s missing" % (ctx, g)); bad = True
    for g, r in runs.items():
        same = "-" if "off" not in runs else str(r["tokens"] == runs["off"]["tokens"])
        bad |= same == "False"
        print("%-7d %-6s %-6d %10.1f %11.1f %15.1f %14.1f %13.1f  %s%s" % (ctx, g, r.get("decode_graph_steps", 0), r.get("decode_tokens_per_s", 0),
              r.get("prefill_tokens_per_s", 0), 1e6 * r.get("decode_step_device_seconds", 0),
              1e6 * r.get("decode_graph_step_device_seconds", 0), 1e6 * r.get("decode_launch_gap_seconds", 0),
              same, "" if r.get("decode_graph") else "  (plain: %s)" % r.get("decode_graph_reason", "")))
    if "auto" in runs and not runs["auto"].get("decode_graph"):
        print("graph: --graph auto did not replay a graph at %d" % ctx); bad = True
sys.exit(1 if bad else 0)
PY
[ $? -ne 0 ] && rc=1
echo "graph: done after $(( $(date +%s) - t0 )) s, rc=$rc"
exit $rc
