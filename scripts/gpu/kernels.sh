#!/usr/bin/env bash
# Kernels check on the GPU machine (issue 15, kernels), from the repo root.
# Expected run time: about 95 s (run 3: 86), at most 130: three PTX JIT
# loads of ~16 s each (cached by the driver for the later steps); the
# kernel suite on every module, the Llama kernels and every GEMV variant of
# all three targets against their Go twins, the compute_90 module's
# overlapped chain against the plain one (~70 s with the loads); the GEMV
# sweep with PDL on/off, prefetch sizes and the decoder-layer chain (~5 s);
# MatmulGroup launched plainly against overlapped (~3 s); speed runs; a
# short compute-sanitizer memcheck of the compute_90 module and racecheck
# on the quick GEMV cases while time is left. Every step has its own
# timeout, cut to what is left of the 130 s.
#
#   OUT=/some/dir scripts/gpu/kernels.sh
#
# Needs gpubin/kernels.test (scripts/gpu-build.sh). Writes under
# $OUT/kernels/: check.txt, speed.txt, sweep.txt, group.txt, cublaslt.txt,
# memcheck.txt, racecheck.txt,
# and prints tables: kernel, PTX target, max relative error (vs the Go twin
# and vs the float64 reference); speed; the GEMV sweep (every variant x grid
# x decode shape, GB/s cold and hot, % of the device-to-device copy) with
# the best launch per shape and the one Matmul picks; MatmulGroup launched
# plainly (the default) against overlapped, back to back in both orders.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/kernels
mkdir -p "$dir"
bindir=${BIN:-gpubin}
[[ $bindir == /* ]] || bindir=$PWD/$bindir
bin=$bindir/kernels.test
t0=$(date +%s)
if [ ! -x "$bin" ]; then
  echo "kernels: $bin missing (run scripts/gpu-build.sh)"; exit 1
fi
export MEMWALL_TEST_DEVICE=cuda
unset MEMWALL_KERNELS_PTX
rc=0
budget=130
left() { echo $(( budget - 2 - ($(date +%s) - t0) )); } # seconds left to the budget
step() { # step NAME SECONDS ARGS...: run the test binary in kernels/ (at most the time left)
  local name=$1 secs=$2; shift 2
  local l; l=$(left)
  [ "$l" -lt "$secs" ] && secs=$l
  if [ "$secs" -lt 5 ]; then
    echo "kernels: step $name skipped (time)" | tee "$dir/$name.txt"; rc=1; return 0
  fi
  (cd kernels && timeout --kill-after=5 "$secs" "$bin" -test.timeout "${secs}s" "$@") >"$dir/$name.txt" 2>&1
  local r=$?
  [ $r -ne 0 ] && { rc=1; echo "kernels: step $name rc=$r"; tail -n 15 "$dir/$name.txt"; }
  return 0
}
step check 110 -test.v -test.run 'TestCUDALlamaKernels|TestCUDAMatmulSM70|TestCUDAKernels$|TestCUDAGemvVariants|TestCUDAOverlapChain|TestCUDAFusedNorms'
step sweep 75 -test.v -test.run 'TestCUDAGemvSweep'
step group 30 -test.v -test.run 'TestCUDAGroupOverlap$'
step speed 30 -test.v -test.run 'TestCUDALlamaSpeed'
# cuBLASLt bound through purego, against the float64 reference.
if [ -x "$bindir/device_cuda.test" ]; then
  (cd device/cuda && timeout --kill-after=5 20 "$bindir/device_cuda.test" -test.v -test.run 'CublasLt' -test.timeout 20s) >"$dir/cublaslt.txt" 2>&1 || { rc=1; tail -n 15 "$dir/cublaslt.txt"; }
fi
# compute-sanitizer memcheck on a quick pass of the Llama and GEMV kernels and
# the overlapped chain (compute_90, the module an H200 runs: one JIT under the
# sanitizer).
ms=$(( $(left) - 10 )); [ $ms -gt 60 ] && ms=60
if command -v compute-sanitizer >/dev/null 2>&1 && [ $ms -ge 15 ]; then
  (cd kernels && MEMWALL_TEST_QUICK=1 MEMWALL_TEST_TARGETS=sm90 timeout --kill-after=5 $ms compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$bin" -test.run 'TestCUDALlamaKernels|TestCUDAGemvVariants|TestCUDAOverlapChain' -test.timeout ${ms}s) >"$dir/memcheck.txt" 2>&1
  m=$?
  grep -q "ERROR SUMMARY: 0 errors" "$dir/memcheck.txt" && msum="0 errors" || msum="rc=$m $(grep -m1 'ERROR SUMMARY' "$dir/memcheck.txt")"
  [ $m -eq 124 ] && msum="timed out (no errors before)"
else
  msum="skipped (no compute-sanitizer or time)"
fi
# racecheck (shared-memory hazards) on the quick GEMV cases of the compute_90
# module, only while 25 s are left.
rsum="skipped (time)"
if command -v compute-sanitizer >/dev/null 2>&1 && [ "$(left)" -ge 25 ]; then
  (cd kernels && MEMWALL_TEST_QUICK=1 MEMWALL_TEST_TARGETS=sm90 timeout --kill-after=5 25 compute-sanitizer --tool racecheck --error-exitcode 3 \
    "$bin" -test.run 'TestCUDAGemvVariants' -test.timeout 25s) >"$dir/racecheck.txt" 2>&1
  m=$?
  grep -q "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$dir/racecheck.txt" && [ $m -eq 0 ] && rsum="0 hazards" || rsum="rc=$m $(grep -m1 'SUMMARY' "$dir/racecheck.txt")"
  [ $m -eq 124 ] && rsum="timed out (no hazards before)"
  [ $m -eq 3 ] && rc=1
fi
echo
echo "== kernels: correctness (max relative error over the random cases)"
printf '%-22s %-6s %-11s %-11s %s\n' kernel target vs_twin vs_float64 cases
grep -h '^KCHECK' "$dir/check.txt" | awk '{printf "%-22s %-6s %-11s %-11s %s\n", $2, $3, $4, $5, $6}'
echo "== kernels: launches per kernel and module in the checks above (every kernel of each module; 0 = never ran there)"
echo "   a row _{f32,bf16,f16} counts each dtype's kernel, f32/bf16/f16"
awk '$1=="KRAN" { x=$3; d=""; if (match(x, /_(f32|bf16|f16)$/)) { d=substr(x, RSTART+1); x=substr(x, 1, RSTART-1) "_{f32,bf16,f16}" }
       n[x" "$2" "d]+=$4; if (!(x in seen)) { seen[x]=1; order[++k]=x; dts[x]=(d!="") }
       if ($4==0) z[$3" "$2]=1; else ran[$3" "$2]=1 }
     function cell(x, tg) { return dts[x] ? n[x" "tg" f32"] "/" n[x" "tg" bf16"] "/" n[x" "tg" f16"] : n[x" "tg" "] "" }
     END { printf "%-34s %-16s %-16s %-16s\n", "kernel", "sm90", "sm80", "sm70"
       for (i=1;i<=k;i++) { x=order[i]; printf "%-34s %-16s %-16s %-16s\n", x, cell(x,"sm90"), cell(x,"sm80"), cell(x,"sm70") }
       for (e in z) if (!(e in ran) && e != "memwall_attn_flash sm70") { split(e, a, " "); miss=miss " " a[2] ":" a[1] }
       print "never ran:" (miss=="" ? " none" : miss) " (sm70 memwall_attn_flash, a trap there, is not counted)" }' "$dir/check.txt" | tee "$dir/launches.txt"
echo "== kernels: speed"
printf '%-26s %-6s %-32s %s\n' kernel target shape speed
grep -h '^KPERF' "$dir/speed.txt" | awk '{s=$5" "$6; for(i=7;i<=NF;i++) s=s" "$i; printf "%-26s %-6s %-32s %s\n", $2, $3, $4, s}'
echo "== kernels: GEMV sweep, bf16 ($(grep -m1 -h '^KCOPY' "$dir/sweep.txt" | cut -d' ' -f2-3) copy = 100%)"
echo "   best: the fastest launch cold per target and shape; rule: what Matmul launches"
printf '%-6s %-14s %-20s %6s %6s %6s %6s | %-20s %6s %6s %6s\n' target M,K,T best grid cold hot %copy rule grid cold %copy
awk '$1=="KSWEEP" { k=$2" "$3; if (!(k in b) || $6+0 > bc[k]) { b[k]=$4" "$5; bc[k]=$6+0; bh[k]=$7; bp[k]=$8 } }
     $1=="KSEL" { k=$2" "$3; s[k]=$4" "$5; sc[k]=$6; sp[k]=$8; order[++n]=k }
     END { for (i=1;i<=n;i++) { k=order[i]; split(k,a," "); split(b[k],x," "); split(s[k],y," ");
       printf "%-6s %-14s %-20s %6s %6.0f %6s %6s | %-20s %6s %6s %6s\n", a[1], a[2], x[1], x[2], bc[k], bh[k], bp[k], y[1], y[2], sc[k], sp[k] } }' "$dir/sweep.txt"
echo "== kernels: compute_90, the rule's launch with PDL off/on and L2 prefetch bytes per block (cold GB/s, % copy)"
grep -h '^KPDL' "$dir/sweep.txt" | awk '{k=$2" "$3; if (!(k in seen)) { seen[k]=1; order[++n]=k } c[k]=c[k] sprintf(" %s/%s:%s(%s)", ($4=="1"?"on":"off"), $5, $6, $8) }
  END { for (i=1;i<=n;i++) { split(order[i], a, " "); printf "%-14s %-23s%s\n", a[1], a[2], c[order[i]] } }'
echo "== kernels: decoder-layer chain, cold (RMSNorm, q/k/v grouped, o, RMSNorm, gate/up grouped, SiLU*mul, down)"
printf '%-11s %-19s %4s %8s %9s %8s %7s\n' target model pdl prefetch us/layer GB/s %copy
grep -h '^KCHAIN' "$dir/sweep.txt" | awk '{printf "%-11s %-19s %4s %8s %9s %8s %7s\n", $2, $3, $4, $5, $6, $7, $8}'
echo "== kernels: T = 1 products sharing X, cold: one MatmulGroup launch vs one Matmul each"
printf '%-6s %-22s %9s %9s %7s %7s\n' target M+..,K grouped separate %copy %copy
grep -h '^KFUSE' "$dir/sweep.txt" | awk '{printf "%-6s %-22s %9s %9s %7s %7s\n", $2, $3, $4, $5, $6, $7}'
echo "== kernels: MatmulGroup launched plainly (default) vs overlapped (PDL, 8 KiB prefetch): compute_90, PDL on, cold, % of copy"
echo "   samples in pairs P-O, O-P, O-P, P-O (P plain, O overlapped); gain = O - P in points, per order; winner: both orders agree by >= 1"
printf '%-22s %6s %6s %11s %11s %-10s %s\n' row plain ovl gain:P-first gain:O-first winner 'samples in order'
awk '$1=="KGOVS" { s[$2]=s[$2] sprintf(" %s%s", toupper(substr($4,1,1)), $5) }
     $1=="KGOV" { printf "%-22s %6s %6s %11s %11s %-10s%s\n", $2, $3, $4, $5, $6, $7, s[$2] }' "$dir/group.txt"
echo "   default flip (kernels/kernels.go, Load): s.groupOverlap = true, if both */layer rows say overlapped"
grep -h -- '^--- FAIL' "$dir/check.txt" "$dir/sweep.txt" "$dir/group.txt" "$dir/speed.txt" | head -20
echo "launches: $(grep -c '^memwall' "$dir/launches.txt") kernel rows x 3 modules; $(tail -n 1 "$dir/launches.txt")"
echo "cublaslt: $(grep -m1 -o 'cuBLASLt [0-9]* from .*' "$dir/cublaslt.txt" 2>/dev/null || grep -m1 -i 'skip' "$dir/cublaslt.txt" 2>/dev/null) $(grep -c -- '--- PASS' "$dir/cublaslt.txt" 2>/dev/null) passed, $(grep -c -- '--- FAIL' "$dir/cublaslt.txt" 2>/dev/null) failed"
echo "memcheck: $msum"
echo "racecheck: $rsum"
echo "kernels rc=$rc $(( $(date +%s) - t0 ))s"
exit $rc
