#!/usr/bin/env bash
# The pool's surroundings on the GPU (issue 13 items 4-6). Expected time on
# an NVIDIA H200: about 40-60 s (each step has a timeout; the whole stays
# under 120 s):
#   1. the drivers' bare allocators (device/cuda TestDriverAnchor) and
#      bench's request streams timed through them (bench TestAnchorOnGPU):
#      ~5 s;
#   2. `memwall bench alloc` on the random mix, 1 and 4 goroutines, short:
#      the cuMemAlloc/cuMemAllocAsync rows come out with no note, next to
#      the pool's (~15 s);
#   3. an out-of-memory error on the real device: a python/torch process
#      holds all but ~3 GiB of the GPU while `memwall bench kv --swap-bytes
#      4GiB --oom-snapshot FILE` runs (it needs 8 GiB of device memory): exit
#      1, the message names the file, `memwall replay --html` draws it
#      (~15 s, most of it importing torch);
#      then, the GPU still held, `memwall bench alloc` on 64 MiB blocks runs
#      (exit 0) with working sets sized to the free memory (~5 s);
#   4. `memwall run --pool-log FILE` on a generated tiny Llama on cuda, and
#      `memwall replay FILE` reads the log (~5 s).
# Run from the repository root after scripts/gpu-build.sh (gpubin/); logs go
# to $OUT/paths/, the summary table is printed last.
#
#   OUT=/some/dir scripts/gpu/paths.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/paths
mkdir -p "$dir"
bin=$PWD/${BIN:-gpubin}
mw=$bin/memwall
log=$dir/log.txt
: >"$log"
RUN_WIDTH=52
. scripts/gpu/lib.sh
t00=$(date +%s)

# 1. The anchors.
if [ -x "$bin/device_cuda.test" ]; then
  run "cuda DriverAllocator (TestDriverAnchor)" 40 bash -c \
    "cd device/cuda && '$bin/device_cuda.test' -test.run '^TestDriverAnchor\$' -test.v -test.timeout 35s >'$dir/cuda-anchor.txt' 2>&1"
else
  status+=("$(printf '%-52s %-9s' "cuda DriverAllocator" "MISSING")")
fi
if [ -x "$bin/bench.test" ]; then
  run "bench anchor streams on cuda (TestAnchorOnGPU)" 40 bash -c \
    "cd bench && MEMWALL_TEST_DEVICE=cuda '$bin/bench.test' -test.run '^TestAnchorOnGPU\$' -test.v -test.timeout 35s >'$dir/bench-anchor.txt' 2>&1"
else
  status+=("$(printf '%-52s %-9s' "bench anchor streams" "MISSING")")
fi

# 2. bench alloc's driver rows.
run "bench alloc: driver rows present, no note" 60 bash -c "
  '$mw' bench alloc --device cuda --mixes random --policies virtual --strategies bestfit --goroutines 1,4 --pairs 4000 --json >'$dir/alloc.json' 2>'$dir/alloc.err' || exit 1
  python3 - '$dir/alloc.json' <<'EOF'
import json, sys
rep = json.load(open(sys.argv[1]))
rows = {(r['allocator'], r['goroutines']): r for r in rep['results']}
need = [('cuMemAlloc', 1), ('cuMemAlloc (freed at once)', 1), ('cuMemAllocAsync', 1), ('cuMemAllocAsync (freed at once)', 1), ('cuMemAlloc', 4), ('cuMemAllocAsync', 4)]
bad = [k for k in need if k not in rows or rows[k].get('note') or not rows[k].get('batch_p50_ns')]
for k, r in sorted(rows.items()):
    print(f\"{k[0]:34s} x{k[1]:<2d} batch p50 {r.get('batch_p50_ns', 0):9.0f} ns  p99 {r.get('p99_ns', 0):9.0f} ns  {r.get('pairs_per_sec', 0):12.0f} pairs/s  {r.get('note', '')}\")
sys.exit(1 if bad else 0)
EOF"

# 3. A real out-of-memory error: another process holds the memory.
snap=$dir/kv-oom.jsonl
rm -f "$snap" "$dir/hog.ready"
timeout -k 5 60 python3 - "$dir/hog.ready" >"$dir/hog.txt" 2>&1 <<'EOF' &
import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = 3 << 30
x = torch.empty(max(free - keep, 0), dtype=torch.uint8, device="cuda")
free2, _ = torch.cuda.mem_get_info()
print(f"holding {x.numel() / 2**30:.1f} GiB of {total / 2**30:.1f}; {free2 / 2**30:.2f} GiB left free", flush=True)
open(sys.argv[1], "w").write("ready\n")
time.sleep(45)
EOF
hog=$!
for _ in $(seq 1 60); do [ -f "$dir/hog.ready" ] && break; sleep 0.5; done
if [ -f "$dir/hog.ready" ]; then
  run "bench kv OOM: exit 1, message names the snapshot" 40 bash -c "
    '$mw' bench kv --device cuda --blocks 1000 --ops 1000 --reps 1 --swap-bytes 4GiB --oom-snapshot '$snap' >'$dir/kv-oom.out' 2>'$dir/kv-oom.err'; rc=\$?
    cat '$dir/kv-oom.err'; [ \$rc -eq 1 ] && [ -s '$snap' ] && grep -q 'snapshot at the failure is in $snap' '$dir/kv-oom.err'"
  run "bench alloc on the busy GPU: runs, sized to what is free" 40 bash -c "
    '$mw' bench alloc --device cuda --mixes 64MiB --policies virtual --strategies bestfit --goroutines 1,4 --pairs 500 --json >'$dir/alloc-busy.json' 2>'$dir/alloc-busy.err'; rc=\$?
    cat '$dir/alloc-busy.err'; python3 -c 'import json,sys; [print(r[\"allocator\"], r[\"goroutines\"], \"live\", r[\"live\"], r.get(\"note\", \"\")) for r in json.load(open(sys.argv[1]))[\"results\"]]' '$dir/alloc-busy.json'; exit \$rc"
else
  status+=("$(printf '%-52s %-9s' "bench kv OOM (torch could not hold the GPU)" "SKIPPED")")
fi
kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
if [ -s "$snap" ]; then
  run "replay --html/--json reads the OOM snapshot" 30 bash -c "
    '$mw' replay '$snap' --html '$dir/kv-oom.html' --no-search --strategy default >'$dir/kv-oom-replay.txt' 2>&1 &&
    '$mw' replay '$snap' --json --no-search --strategy default >'$dir/kv-oom-replay.json' &&
    grep -q 'out of memory at event' '$dir/kv-oom.html' && tail -n 2 '$dir/kv-oom-replay.txt'"
fi

# 4. A run's pool log, replayed.
model=$dir/tiny
rm -rf "$model"; mkdir -p "$model"
run "run --pool-log on cuda, replay reads the log" 60 bash -c "
  '$mw' gen-model --preset tiny --out '$model/model.safetensors' >/dev/null &&
  '$mw' run '$model' --device cuda --prompt-ids 1,2,3,4,5 --max-new 8 --pool-log '$dir/run-pool.jsonl' --json >'$dir/run.json' &&
  '$mw' replay '$dir/run-pool.jsonl' --no-search --strategy default --json >'$dir/run-pool-replay.json' &&
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(\"run pool log:\", r[\"allocs\"], \"allocs, peak live\", r[\"peak_live_bytes\"]); sys.exit(0 if r[\"allocs\"] > 0 else 1)' '$dir/run-pool-replay.json'"
rm -rf "$model"

echo
echo "== paths summary ($(( $(date +%s) - t00 )) s)"
printf '%s\n' "${status[@]}" | tee "$dir/summary.txt"
