#!/usr/bin/env bash
# Residency check on the GPU machine (issue 15: residency, budget realism),
# from the repo root. Expected run time: about 60 s with $MODEL7B given (the
# 7B stream ~25 s, fit ~10 s, the residency tests ~20 s); generating the
# 7B-shaped model when $MODEL7B is not given adds about 60-120 s and 13.5 GB
# of disk under $MODEL_DIR. Every step has its own timeout (300 s in all at
# most, 150 s with $MODEL7B).
#
#   OUT=/some/dir [MODEL7B=/path/llama-7b.safetensors|/path/llama-7b-dir] scripts/gpu/residency.sh
#
# Needs gpubin/memwall and gpubin/residency.test (scripts/gpu-build.sh).
# Writes under $OUT/residency/: stream-7b.json, fit-7b.json, smi.csv
# (nvidia-smi memory.used every 100 ms, device-wide) and smi-apps.csv (per
# process), tests.txt, log.txt; prints a table last: the budget, the peak
# device memory nvidia-smi saw for the process (and device-wide over the
# idle baseline) against it, memwall's own peak and the context it measured,
# the streamed GB/s, whether the products verified, and the GPU tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/residency
mkdir -p "$dir"
bindir=${BIN:-gpubin}
[[ $bindir == /* ]] || bindir=$PWD/$bindir
MODEL_DIR=${MODEL_DIR:-/tmp/memwall-residency}
VRAM=${VRAM:-8GiB}
log=$dir/log.txt
: >"$log"
t_start=$(date +%s)
for b in memwall residency.test; do
	[ -x "$bindir/$b" ] || { echo "residency: $bindir/$b missing (run scripts/gpu-build.sh)"; exit 1; }
done

# step NAME SECONDS CMD...: run with a timeout, log stdout+stderr.
step() {
	local name=$1 secs=$2; shift 2
	local t0=$(date +%s)
	timeout --kill-after=5 "$secs" "$@" >>"$log" 2>&1
	local r=$?
	echo "step $name rc=$r $(($(date +%s) - t0))s" | tee -a "$log"
	[ $r -ne 0 ] && tail -n 12 "$log"
	return $r
}

nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >>"$log" 2>&1
base_used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)

model=${MODEL7B:-}
if [ -n "$model" ] && [ -d "$model" ]; then
	# An HF model directory: its index when sharded, else its safetensors
	# file, else a GGUF file in it.
	d7=$model
	model=""
	for cand in "$d7/model.safetensors.index.json" "$d7/model.safetensors" "$d7"/*.safetensors "$d7"/*.gguf; do
		[ -f "$cand" ] && { model=$cand; break; }
	done
	[ -n "$model" ] || { echo "residency: no model file in $d7 (want model.safetensors, an index or a .gguf)"; exit 1; }
fi
if [ -z "$model" ]; then
	mkdir -p "$MODEL_DIR"
	model=$MODEL_DIR/llama-7b.safetensors
	[ -s "$model" ] || step gen-model 150 "$bindir/memwall" gen-model --preset llama-7b --out "$model"
fi
echo "model $model" | tee -a "$log"

# fit --plain: the generic plan memwall stream runs, for the same budget (fit_peak + context is what
# nvidia-smi should show).
step fit 40 bash -c "'$bindir/memwall' fit '$model' --plain --vram $VRAM --json >'$dir/fit-7b.json'"

# stream, with nvidia-smi sampling memory in the background.
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 100 >"$dir/smi.csv" 2>/dev/null &
smi=$!
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 100 >"$dir/smi-apps.csv" 2>/dev/null &
smi_apps=$!
timeout --kill-after=5 90 "$bindir/memwall" stream "$model" --vram "$VRAM" --steps 5 --json >"$dir/stream-7b.json" 2>>"$log"
stream_rc=$?
kill "$smi" "$smi_apps" 2>/dev/null
wait "$smi" "$smi_apps" 2>/dev/null
echo "step stream rc=$stream_rc" | tee -a "$log"
[ $stream_rc -ne 0 ] && tail -n 12 "$log"

# The residency suite on the GPU: pool-backed rings of random plans,
# every view's bytes read back and compared with the file; the context.
( export MEMWALL_TEST_DEVICE=cuda; cd residency && timeout --kill-after=5 90 "$bindir/residency.test" -test.v -test.timeout 90s \
	-test.run 'TestCyclesRandomPlans|TestRandomHolds|TestContextBytesGPU|TestPlanBudget' ) >"$dir/tests.txt" 2>&1
tests_rc=$?
echo "step tests rc=$tests_rc" | tee -a "$log"
[ $tests_rc -ne 0 ] && grep -E "FAIL|panic|Error" "$dir/tests.txt" | head -n 12

python3 - "$dir" "$VRAM" "${base_used:-0}" "$stream_rc" "$tests_rc" <<'EOF'
import json, os, sys
d, vram, base, stream_rc, tests_rc = sys.argv[1], sys.argv[2], float(sys.argv[3] or 0), int(sys.argv[4]), int(sys.argv[5])
MiB = 1 << 20
def load(name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except Exception as e:
        return {"_error": str(e)}
st, fit = load("stream-7b.json"), load("fit-7b.json")
def peak(name, col):
    best = 0.0
    try:
        for line in open(os.path.join(d, name)):
            parts = [p.strip() for p in line.split(",")]
            try:
                best = max(best, float(parts[col]))
            except (ValueError, IndexError):
                pass
    except OSError:
        pass
    return best
dev_peak = peak("smi.csv", 1) - base   # device-wide, over the idle baseline
app_peak = peak("smi-apps.csv", 1)       # the process (max over processes)
budget = st.get("budget_bytes", 0) / MiB
rows = [
    ("budget (--vram %s)" % vram, "%.0f MiB" % budget),
    ("nvidia-smi peak, process", "%.0f MiB (%s)" % (app_peak, "within" if 0 < app_peak <= budget else "OVER or unseen")),
    ("nvidia-smi peak, device - idle", "%.0f MiB (%s)" % (dev_peak, "within" if dev_peak <= budget else "OVER")),
    ("memwall peak (pools, driver)", "%.0f MiB" % (st.get("peak_bytes", 0) / MiB)),
    ("memwall context measured", "%.0f MiB (%s)" % (st.get("context_bytes", 0) / MiB, st.get("context_source", "?"))),
    ("memwall footprint (peak+ctx)", "%.0f MiB" % (st.get("peak_footprint_bytes", 0) / MiB)),
    ("memwall footprint (driver)", "%.0f MiB" % (st.get("device_footprint_bytes", 0) / MiB)),
    ("stream predicted peak (pools)", "%.0f MiB" % (st.get("predicted_peak_bytes", 0) / MiB)),
    ("fit predicted peak", "%.0f MiB" % (fit.get("predicted_peak_bytes", 0) / MiB)),
    ("streamed per step", "%.2f GB in %s layers, %s slots, prefetch %s" % (st.get("streamed_bytes", 0) / 1e9, st.get("streamed_layers"), st.get("slots"), st.get("prefetch"))),
    ("achieved", "%.1f GB/s of %.1f pinned (%.0f%%)" % (st.get("achieved_GBps", 0), st.get("pinned_h2d_GBps", 0) or 0, 100 * st.get("achieved_GBps", 0) / max(st.get("pinned_h2d_GBps", 0) or 1e-9, 1e-9))),
    ("step s (steady pred, cold pred)", "%.4f (%.4f, %.4f)" % (st.get("seconds_per_step", 0), st.get("predicted_steady_seconds_per_step", 0), st.get("predicted_seconds_per_step", 0))),
    ("source, verified", "%s, %s %s" % (st.get("source"), st.get("verified"), st.get("verify_note", ""))),
    ("stream rc / GPU tests rc", "%d / %d" % (stream_rc, tests_rc)),
]
if "_error" in st:
    rows.append(("stream json", st["_error"]))
print("== residency summary")
for k, v in rows:
    print("%-34s %s" % (k, v))
EOF
echo "residency: $(($(date +%s) - t_start)) s"
