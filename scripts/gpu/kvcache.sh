#!/usr/bin/env bash
# KV cache check on the GPU machine (issue 14), from the repo root.
# Expected run time: about 25 s (bench kv ~15 s: the block manager at 10^3..10^6
# blocks, then 1 GiB swapped out and in 3 times per layout; the kvcache GPU
# tests ~5 s; two simulations ~3 s). Every step has its own timeout (at most
# 150 s in all).
#
#   OUT=/some/dir scripts/gpu/kvcache.sh
#
# Needs gpubin/memwall and gpubin/kvcache.test (scripts/gpu-build.sh).
# Writes under $OUT/kvcache/: bench-kv.json, tests.txt, sim-sharegpt.json,
# sim-long-system-prompts.json, log.txt; prints a table last: ns per op and
# flatness, swap GB/s of both layouts against one pinned copy each way (the
# target: the cache's layout at >= 80% of the link both ways, bytes verified).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/kvcache
mkdir -p "$dir"
bindir=${BIN:-gpubin}
[[ $bindir == /* ]] || bindir=$PWD/$bindir
log=$dir/log.txt
: >"$log"
t_start=$(date +%s)
for b in memwall kvcache.test; do
	[ -x "$bindir/$b" ] || echo "kvcache: $bindir/$b missing (run scripts/gpu-build.sh)" | tee -a "$log"
done

# step NAME SECONDS CMD...: run with a timeout, log stderr.
step() {
	local name=$1 secs=$2; shift 2
	local t0=$(date +%s)
	timeout --kill-after=5 "$secs" "$@" 2>>"$log"
	local r=$?
	echo "step $name rc=$r $(($(date +%s) - t0))s" | tee -a "$log" >&2
	return $r
}

nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >>"$log" 2>&1

step bench-kv 90 "$bindir/memwall" bench kv --device "${KV_DEVICE:-cuda}" --json >"$dir/bench-kv.json"
bench_rc=$?

( export MEMWALL_TEST_DEVICE=cuda; cd kvcache && timeout --kill-after=5 60 "$bindir/kvcache.test" -test.v -test.timeout 60s \
	-test.run 'TestCacheForkCopiesOnDevice|TestCacheSwapRoundTrip|TestConfigOffset' ) >"$dir/tests.txt" 2>&1
tests_rc=$?
echo "step tests rc=$tests_rc" | tee -a "$log"
[ $tests_rc -ne 0 ] && grep -E "FAIL|panic|Error" "$dir/tests.txt" | head -n 12

step sim-sharegpt 30 "$bindir/memwall" kv simulate --synthetic sharegpt --model llama-7b --vram 40GiB --json >"$dir/sim-sharegpt.json"
step sim-long 30 "$bindir/memwall" kv simulate --requests testdata/kv/long-system-prompts.jsonl --model llama-7b --vram 40GiB --json >"$dir/sim-long-system-prompts.json"

python3 - "$dir" "$bench_rc" "$tests_rc" <<'PY'
import json, os, sys
d, bench_rc, tests_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except Exception as e:
        return {"_error": str(e)}
b = load("bench-kv.json")
print("== kvcache summary (%s, %s)" % (b.get("device", "?"), b.get("backend", "?")))
print("%10s %8s %8s %8s %8s %8s   (ns per op)" % ("blocks", "alloc", "free", "fork", "touch", "evict"))
for r in b.get("ops", []):
    print("%10d %8.1f %8.1f %8.1f %8.1f %8.1f" % (r["blocks"], r["alloc_ns"], r["free_ns"], r["fork_ns"], r["touch_ns"], r.get("evict_ns", 0)))
fl = b.get("flatness", {})
print("flatness (max/min): " + ", ".join("%s %.2fx" % (k, fl[k]) for k in sorted(fl)))
four = [k for k in ("alloc", "free", "fork", "touch") if k in fl]
worst = max([max(r["alloc_ns"], r["free_ns"], r["fork_ns"], r["touch_ns"]) for r in b.get("ops", [])] or [0])
wf = max([fl[k] for k in four] or [0])
print("per-op target, alloc/free/fork/touch (flat within 1.5x, <= 100 ns): %s (worst flatness %.2fx, worst op %.1f ns)" %
      ("PASS" if four and wf <= 1.5 and worst <= 100 else "FAIL", wf, worst))
for s in b.get("swap", []):
    print("swap %-21s copy %9d B x %6d: out %6.1f GB/s, in %6.1f GB/s, verified %s" %
          (s["layout"], s["copy_bytes"], s["copies_per_swap"], s["out_GBps"], s["in_GBps"], s["verified"]))
print("pinned link (one copy): d2h %.1f GB/s, h2d %.1f GB/s" % (b.get("link_d2h_GBps", 0), b.get("link_h2d_GBps", 0)))
ok = b.get("swap_over_link", 0) >= 0.8 and all(s.get("verified") for s in b.get("swap", [])) and b.get("swap")
print("swap target (>= 80%% of the link both ways, verified): %s (%.2f)" % ("PASS" if ok else "FAIL", b.get("swap_over_link", 0)))
for name in ("sim-sharegpt.json", "sim-long-system-prompts.json"):
    s = load(name)
    p, c = s.get("paged", {}), s.get("contiguous", {})
    print("%-30s paged waste %.4f batch %.1f vs %.1f, hit %.3f" % (name, p.get("waste_ratio", -1), p.get("mean_batch", 0), c.get("mean_batch", 0), s.get("prefix_hit_rate", 0)))
print("bench rc %d, GPU tests rc %d" % (bench_rc, tests_rc))
if "_error" in b:
    print("bench json:", b["_error"])
PY
echo "kvcache: $(($(date +%s) - t_start)) s"
