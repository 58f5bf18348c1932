#!/usr/bin/env bash
# Weight-streaming acceptance run (issue 5) on the GPU machine, from the repo
# root, with the binaries scripts/gpu-build.sh built (gpubin/memwall and
# gpubin/bench.test; the streaming benchmark is bench.Stream over residency).
#
#   OUT=/some/dir scripts/gpu-stream.sh
#
# It generates a Llama-7B-shaped bf16 model as safetensors and as GGUF under
# $MODEL_DIR (default /tmp/memwall-stream, about 27 GB; kept for a rerun),
# measures the pinned host-to-device link once with `memwall bench transfer`,
# then for each file and for --tokens 1 (decode) and --tokens 4096 (prefill)
# runs `memwall fit` and `memwall stream --vram 8GiB` with --json (saved under
# $OUT), runs the streaming benchmark's GPU tests, and prints a table: achieved
# GB/s and its share of the pinned link, the step against max(copy, compute),
# fit's predicted peak and step time against the measured ones, and whether
# the products verified. Acceptance (issue 5): ≥ 90% of pinned H2D, step ≤
# 1.05 × max(copy, compute), peak within ±5%, time within ±10%, verified.
# Everything else it prints (device, host memory, sources, per-layer times in
# the JSON) is there to diagnose a failure from one run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
MODEL_DIR=${MODEL_DIR:-/tmp/memwall-stream}
VRAM=${VRAM:-8GiB}
PRESET=${PRESET:-llama-7b} # tiny, with VRAM=5MiB, tries the script anywhere
STEPS=${STEPS:-5}
bin=$(cd "${BIN:-gpubin}" 2>/dev/null && pwd || echo "$PWD/gpubin") # as scripts/gpu-build.sh writes it
mkdir -p "$OUT" "$MODEL_DIR"
log=$OUT/stream-log.txt
: >"$log"
t_start=$(date +%s)

say() { echo "== $*" | tee -a "$log"; }
# step NAME CMD...: run, log stdout+stderr, report the exit status.
step() {
	local name=$1; shift
	local t0=$(date +%s.%N)
	"$@" >>"$log" 2>&1
	local rc=$?
	printf '%-46s rc=%d %6.1fs\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" | tee -a "$log"
	[ $rc -ne 0 ] && tail -n 15 "$log"
	return $rc
}

say "machine"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,pcie.link.gen.current,pcie.link.width.current \
	--format=csv 2>&1 | tee -a "$log"
free -g | tee -a "$log"
df -h "$MODEL_DIR" | tail -n 1 | tee -a "$log"
ulimit -l | sed 's/^/locked-memory limit: /' | tee -a "$log"
"$bin/memwall" info 2>&1 | tee -a "$log" | grep -E "device|host memory|disabled|chosen"
[ -n "${MEMWALL_KERNELS_PTX:-}" ] && echo "kernels from $MEMWALL_KERNELS_PTX" | tee -a "$log"

say "models"
st=$MODEL_DIR/$PRESET.safetensors
gg=$MODEL_DIR/$PRESET.gguf
[ -s "$st" ] || step "gen-model $PRESET safetensors" "$bin/memwall" gen-model --preset "$PRESET" --out "$st"
[ -s "$gg" ] || step "gen-model $PRESET gguf" "$bin/memwall" gen-model --preset "$PRESET" --format gguf --out "$gg"
ls -la "$MODEL_DIR" | tee -a "$log"

say "link"
step "bench transfer" bash -c "'$bin/memwall' bench transfer --json >'$OUT/stream-transfer.json'"
pinned=$(awk '/"name": "h2d_pinned"/{f=1} f&&/"GBps"/{gsub(/[,]/,"");print $2;exit}' "$OUT/stream-transfer.json")
pageable=$(awk '/"name": "h2d_pageable"/{f=1} f&&/"GBps"/{gsub(/[,]/,"");print $2;exit}' "$OUT/stream-transfer.json")
echo "pinned H2D ${pinned:-?} GB/s, pageable ${pageable:-?} GB/s" | tee -a "$log"

say "fit and stream, --vram $VRAM"
runs=()
for f in safetensors gguf; do
	file=$MODEL_DIR/$PRESET.$f
	for t in 1 4096; do
		tag=$f-t$t
		step "fit $tag" bash -c "'$bin/memwall' fit '$file' --plain --vram $VRAM --tokens $t --json >'$OUT/fit-$tag.json'"
		step "stream $tag" bash -c "'$bin/memwall' stream '$file' --vram $VRAM --tokens $t --steps $STEPS --json >'$OUT/stream-$tag.json'"
		runs+=("$tag")
	done
done
# Diagnostic: the same decode step from a pinned copy instead of the
# registered mapping (tells a slow registration path from a slow pipeline).
step "stream safetensors-t1 pinned-copy" bash -c "'$bin/memwall' stream '$st' --vram $VRAM --tokens 1 --steps $STEPS --source pinned-copy --json >'$OUT/stream-safetensors-t1-pinned.json'"
runs+=("safetensors-t1-pinned")

say "streaming benchmark GPU tests"
if [ -x "$bin/bench.test" ]; then
	step "stream tests (cuda)" bash -c "cd bench && MEMWALL_TEST_DEVICE=cuda '$bin/bench.test' -test.v -test.run TestCUDAStream -test.timeout 300s >'$OUT/stream-test.txt' 2>&1"
	grep -E "^(=== RUN|--- |\s+stream_test.go|ok|FAIL|PASS)" "$OUT/stream-test.txt" | grep -v "=== RUN" | tail -n 40
else
	echo "no $bin/bench.test: rebuild with scripts/gpu-build.sh" | tee -a "$log"
fi

# top-level JSON value: key at two spaces of indent.
get() { sed -n "s/^  \"$2\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" "$1" 2>/dev/null | head -n 1; }

say "summary (pinned H2D ${pinned:-?} GB/s in this run)"
{
	printf '%-24s %8s %6s %8s %9s %6s %9s %9s %7s %8s %8s %7s %5s %s\n' \
		run GB/s %link step_s 'max(c,k)' ratio peak_pred peak_meas peak% t_pred t_meas t% ok source
	for r in "${runs[@]}"; do
		s=$OUT/stream-$r.json
		fj=$OUT/fit-${r%-pinned}.json
		if [ ! -s "$s" ]; then
			printf '%-24s FAILED (see %s)\n' "$r" "$log"
			continue
		fi
		gbps=$(get "$s" achieved_GBps)
		step_s=$(get "$s" seconds_per_step)
		cp=$(get "$s" copy_seconds_per_step)
		co=$(get "$s" compute_seconds_per_step)
		peak=$(get "$s" peak_bytes)
		ver=$(get "$s" verified)
		src=$(get "$s" source)
		ppeak=$(get "$fj" predicted_peak_bytes)
		pt=$(get "$fj" predicted_seconds_per_step)
		[ -z "$ppeak" ] && ppeak=$(get "$s" predicted_peak_bytes)
		[ -z "$pt" ] && pt=$(get "$s" predicted_seconds_per_step)
		awk -v r="$r" -v g="$gbps" -v pin="${pinned:-0}" -v st="$step_s" -v cp="$cp" -v co="$co" \
			-v pk="$peak" -v pp="$ppeak" -v pt="$pt" -v ver="$ver" -v src="$src" 'BEGIN{
			m = (cp > co) ? cp : co
			printf "%-24s %8.2f %5.1f%% %8.4f %9.4f %6.3f %8.3fG %8.3fG %+6.1f%% %8.4f %8.4f %+6.1f%% %5s %s\n",
				r, g, (pin > 0 ? 100*g/pin : 0), st, m, (m > 0 ? st/m : 0), pp/2^30, pk/2^30,
				(pp > 0 ? 100*(pk-pp)/pp : 0), pt, st, (pt > 0 ? 100*(st-pt)/pt : 0), ver, src}'
	done
	echo
	echo "acceptance: GB/s ≥ 90% of pinned (≥ 50), decode step ≤ 0.12 s, ratio ≤ 1.05, peak% within ±5, t% within ±10, ok = true"
	echo "per-layer copy/compute/stall seconds: \"layers\" in $OUT/stream-*.json; the warm-up step: \"warmup\""
} | tee "$OUT/stream-summary.txt"
echo "total $(( $(date +%s) - t_start ))s; log $log"
