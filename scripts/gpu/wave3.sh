#!/usr/bin/env bash
# Wave 3's figures on the GPU machine, in three phases that fit one device
# call each on a machine kept warm between them (from the repo root):
#
#   scripts/gpu/wave3.sh 1   builds the PTX with nvcc (kernels_sm90/80.ptx.gz
#                            come back in $OUT to be committed),
#                            then starts llama.cpp's build in the background
#                            (llama-bench, llama-quantize, llama-batched-bench
#                            from $ANCHORS, ~5 min; it outlives the call),
#                            writes the 7B-shaped bf16 and Q4_K_M GGUFs, runs
#                            the GPU tests against the new PTX (quantized
#                            products, step-state kernels, the captured
#                            decode step, flash-decoding) and a
#                            compute-sanitizer memcheck of the quantized ones
#   scripts/gpu/wave3.sh 2   waits for the build, then memwall against
#                            llama-bench on the same files, nothing else
#                            running: --device cpu against -ngl 0; bf16 and
#                            Q4_K_M resident (512 and 4,096 tokens of context)
#                            against -ngl 99; --vram 8GiB against -ngl 18, 19
#                            with nvidia-smi sampled
#   scripts/gpu/wave3.sh 5   on a fresh machine: PTX; the RoPE that reads
#                            GGUF's Q/K order and the decode attention
#                            unrolled per head count, checked bit for bit
#                            against what they replace and timed (32/8 and
#                            32/32 heads), memcheck; llama-bench's build
#                            started in the background
#   scripts/gpu/wave3.sh 6   right after 5: bf16, Q4_K_M and the Llama-3-8B shape resident against
#                            llama-bench on the same files
#   scripts/gpu/wave3.sh 9   on a fresh machine: PTX; the 8-bit-activation
#                            decode products in their three layouts (staged,
#                            grouped, grouped-r4) checked, timed per product
#                            against the float32 path and sanitized; the
#                            engine's quantized references; the 7B Q4_K_M
#                            resident with each layout (and profiled);
#                            llama-bench's build started in the background
#                            and llama-bench run if it is done in time
#   scripts/gpu/wave3.sh 8   llama-bench on the same Q4_K_M once the build
#                            is done
#   scripts/gpu/wave3.sh 3   memwall quantize against llama-quantize
#                            (scripts/gpu/quantize.sh) and the Q4_K_M at
#                            --vram 3GiB against llama-bench's -ngl sweep
#
# Needs gpubin/ (GPU_PKGS=device/cpu/hostmath scripts/gpu/pack.sh, unpacked
# from gpupack/bin.tar.xz when absent) and, in $ANCHORS (default gpurun/),
# build-llama.cpp.sh and llama.cpp-src.tgz. Every phase keeps its logs in
# /tmp/wave3 on the machine, packs them into $OUT/wave3-phaseN.tgz (and the
# PTX into $OUT/) and prints a table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=/tmp/wave3
mkdir -p "$dir" "$OUT"
[ -d gpubin ] || tar -xJf gpupack/bin.tar.xz 2>/dev/null || tar -xJf gpupack/bin-ab.tar.xz
bin=$PWD/gpubin
anchors=${ANCHORS:-$PWD/gpurun}
models=${MODELS:-/dev/shm/mw}
mkdir -p "$models"
bf=$models/llama-7b.gguf
q4=$models/llama-7b-q4_k_m.gguf
l3=$models/llama3-8b.gguf
lc=/tmp/lc
ptx=/tmp/wave3-sm90.ptx
[ -f "$ptx" ] && export MEMWALL_KERNELS_PTX=$ptx
log=$dir/phase$1.log
source scripts/gpu/lib.sh
rows=()
row() { rows+=("$(printf '%-52s %s' "$1" "$2")"); }

# json FILE EXPR: a value of memwall's --json output ("-" when absent).
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo -; }

# sampled NAME CMD...: CMD with nvidia-smi's memory.used (MiB) sampled
# every 100 ms; the peak goes to $dir/NAME.peak.
sampled() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$dir/$name.smi" 2>/dev/null &
  local smi=$!
  "$@"
  local rc=$?
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  sort -n "$dir/$name.smi" | tail -1 >"$dir/$name.peak"
  return $rc
}

# mwrun NAME MODEL ARGS...: memwall run with --json into $dir/NAME.json.
mwrun() {
  local name=$1 m=$2; shift 2
  local unset=()
  # (the CPU device runs Go kernels and refuses a PTX file)
  [[ " $* " == *" --device cpu "* ]] && unset=(-u MEMWALL_KERNELS_PTX)
  sampled "$name" env "${unset[@]}" timeout 300 "$bin/memwall" run "$m" --ignore-eos --json "$@" >"$dir/$name.json" 2>"$dir/$name.err" ||
    { echo "memwall run $name failed:" >>"$log"; tail -5 "$dir/$name.err" >>"$log"; }
  row "memwall $name" "prefill $(json "$dir/$name.json" "'%.1f' % j['prefill_tokens_per_s']")  decode $(json "$dir/$name.json" "'%.2f' % j['decode_tokens_per_s']") tok/s  smi $(cat "$dir/$name.peak" 2>/dev/null) MiB"
}

# lbench NAME ARGS...: llama-bench -o json into $dir/NAME.json; a row per
# test it ran.
lbench() {
  local name=$1; shift
  sampled "$name" timeout 400 "$lc/llama-bench" "$@" -o json >"$dir/$name.json" 2>"$dir/$name.err" ||
    { echo "llama-bench $name failed:" >>"$log"; tail -5 "$dir/$name.err" >>"$log"; }
  while read -r line; do row "llama.cpp $name" "$line  smi $(cat "$dir/$name.peak" 2>/dev/null) MiB"; done < <(python3 - "$dir/$name.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
    if r.get("n_depth"):
        kind += f"@d{r['n_depth']}"
    print(f"{kind} {r['avg_ts']:.2f} tok/s")
PY
)
}

prompt() { python3 -c "import sys; n=int(sys.argv[1]); print(','.join(str(3 + (i * 7919) % 31000) for i in range(n)))" "$1"; }

# gtest NAME PKG SECONDS BINARY ARGS...: a test binary on the GPU, in its
# package's directory.
gtest() {
  local name=$1 pkg=$2 limit=$3; shift 3
  pushd "$pkg" >/dev/null || return
  MEMWALL_TEST_DEVICE=cuda run "$name" "$limit" "$@" -test.count 1
  popd >/dev/null || return
}

phase1() {
  mkdir -p "$dir/ptx"
  run "nvcc: PTX for compute_90 and compute_80" 400 scripts/build-ptx.sh "$dir/ptx"
  gunzip -c "$dir/ptx/kernels_sm90.ptx.gz" >"$ptx" && export MEMWALL_KERNELS_PTX=$ptx
  # (after nvcc, which it would slow down; it outlives this call)
  setsid nohup bash -c "'$anchors/build-llama.cpp.sh' $lc llama-bench llama-quantize llama-batched-bench >/tmp/lc.log 2>&1; echo \$? >/tmp/lc.rc" </dev/null >/dev/null 2>&1 &
  [ -f "$bf" ] || run "gen-model 7B bf16" 120 "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf"
  # (the Q4_K_M is quantized on the CPU while the GPU tests run)
  local q4pid=
  [ -f "$q4" ] || { "$bin/memwall" gen-model --preset llama-7b --dtype q4_k_m --out "$q4" >"$dir/gen-q4.log" 2>&1 & q4pid=$!; }
  gtest "device/cuda: graph replay" device/cuda 60 "$bin/device_cuda.test" -test.run 'TestGraphReplay' -test.v
  gtest "kernels: quantized, step-state" kernels 200 "$bin/kernels.test" -test.run 'Quant|StepState|AttnSplitRule' -test.v
  gtest "engine on the GPU: graph, batch, references" engine 300 "$bin/engine.test" -test.run 'TestDecodeGraph|TestBatch|TestAgainstReference|TestQuantizedAgainstReference|TestGroupedBitIdentical|TestDecodeLaunches|TestFormatsAgree|TestHybrid' -test.v
  pushd kernels >/dev/null || return
  MEMWALL_TEST_DEVICE=cuda MEMWALL_TEST_QUICK=1 run "compute-sanitizer memcheck: quantized" 100 \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/kernels.test" -test.run 'QuantCUDA' -test.count 1
  popd >/dev/null || return
  [ -z "$q4pid" ] || { wait "$q4pid"; status+=("gen-model 7B Q4_K_M rc $?"); }
  mwrun q4-smoke "$q4" --vram 20GiB --prompt-ids "$(prompt 64)" --max-new 32
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^--- FAIL' "$log" | head -20
}

phase2() {
  for i in $(seq 1 60); do [ -f /tmp/lc.rc ] && break; sleep 5; done
  [ "$(cat /tmp/lc.rc 2>/dev/null)" = 0 ] || { echo "llama.cpp build: rc $(cat /tmp/lc.rc 2>/dev/null)"; tail -5 /tmp/lc.log; }
  local p16 p448 p3968
  p16=$(prompt 16); p448=$(prompt 448); p3968=$(prompt 3968)
  mwrun cpu-1 "$bf" --device cpu --prompt-ids "$p16" --max-new 32
  mwrun cpu-2 "$bf" --device cpu --prompt-ids "$p16" --max-new 32
  lbench cpu-ngl0 -m "$bf" -ngl 0 -t "$(nproc)" -p 16 -n 32 -r 2
  mwrun bf16-resident "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 128
  mwrun bf16-resident-nograph "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 128 --graph off
  mwrun bf16-ctx4096 "$bf" --vram 20GiB --prompt-ids "$p3968" --max-new 128
  lbench bf16-ngl99 -m "$bf" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  lbench bf16-ngl99-d4096 -m "$bf" -ngl 99 -fa 1 -p 0 -n 128 -d 4096 -r 1
  mwrun q4-resident "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128
  lbench q4-ngl99 -m "$q4" -ngl 99 -fa 1 -p 512,2048 -n 128 -r 2
  mwrun bf16-8g-stream "$bf" --vram 8GiB --placement stream --prompt-ids "$p448" --max-new 64
  mwrun bf16-8g-auto "$bf" --vram 8GiB --placement auto --prompt-ids "$p448" --max-new 64
  lbench bf16-ngl18 -m "$bf" -ngl 18 -fa 1 -p 512 -n 32 -r 1
  lbench bf16-ngl19 -m "$bf" -ngl 19 -fa 1 -p 512 -n 32 -r 1
  serve_bench
}

# serve_bench: memwall serve (bf16, resident) under bench serve's ShareGPT
# mix at 32 clients, and llama-batched-bench at 32 parallel sequences.
serve_bench() {
  "$bin/memwall" serve "$bf" --max-seqs 32 --max-model-len 2048 --kv-tokens 65536 --addr 127.0.0.1:8099 >"$dir/serve.log" 2>&1 &
  local sp=$!
  for i in $(seq 1 120); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8099/health', timeout=2)" 2>/dev/null && break; sleep 1; done
  timeout 200 "$bin/memwall" bench serve --url http://127.0.0.1:8099 --synthetic sharegpt --vocab 32000 --max-len 2048 \
    --concurrency 32 --n 128 --json >"$dir/bench-serve.json" 2>"$dir/bench-serve.err"
  # batched-bench's load: 128-token prompts, 128 tokens out, 32 at once
  python3 -c "import json; [print(json.dumps({'arrival_s': 0, 'prompt_tokens': 128, 'output_tokens': 128})) for _ in range(64)]" >"$dir/fixed.jsonl"
  timeout 100 "$bin/memwall" bench serve --url http://127.0.0.1:8099 --requests "$dir/fixed.jsonl" --vocab 32000 \
    --concurrency 32 --json >"$dir/bench-fixed.json" 2>"$dir/bench-fixed.err"
  curl -s http://127.0.0.1:8099/metrics >"$dir/serve-metrics.txt" 2>/dev/null
  kill -TERM "$sp"; wait "$sp"
  row "memwall serve c32 pp128 tg128" "$(json "$dir/bench-fixed.json" "'out %.0f tok/s  ttft p50 %.3f s  itl p50 %.4f s  failed %d' % (j['output_tokens_per_s'], j['ttft_p50_s'], j['itl_p50_s'], j['failed'])")"
  grep -E '^memwall_serve_step_seconds_(sum|count)' "$dir/serve-metrics.txt" | tr '\n' ' '; echo
  row "memwall serve c32 sharegpt" "$(json "$dir/bench-serve.json" "'out %.0f tok/s  ttft p50 %.3f s  itl p50 %.4f s  failed %d' % (j['output_tokens_per_s'], j['ttft_p50_s'], j['itl_p50_s'], j['failed'])")"
  [ -x "$lc/llama-batched-bench" ] || return 0
  timeout 150 "$lc/llama-batched-bench" -m "$bf" -ngl 99 -fa 1 -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32 >"$dir/batched.txt" 2>&1
  while read -r line; do row "llama.cpp batched-bench" "$line"; done < <(grep -E '^\|\s+[0-9]' "$dir/batched.txt")
}

phase3() {
  OUT=$dir LLAMA_QUANTIZE=$lc/llama-quantize LLAMA_BENCH=$lc/llama-bench MODELS=$models timeout 400 scripts/gpu/quantize.sh >"$dir/quantize.txt" 2>&1
  tail -12 "$dir/quantize.txt"
  local p448
  p448=$(prompt 448)
  mwrun q4-3g "$q4" --vram 3GiB --prompt-ids "$p448" --max-new 64
  lbench q4-ngl16 -m "$q4" -ngl 16 -fa 1 -p 512 -n 32 -r 1
  lbench q4-ngl20 -m "$q4" -ngl 20 -fa 1 -p 512 -n 32 -r 1
}

# phase4: on a fresh machine, the wide-load Q4_K/Q6_K products: PTX, their
# GPU tests and a sanitizer pass, then the 7B Q4_K_M resident (graph and
# plain), profiled, and on the CPU; the bf16 resident step profiled.
phase4() {
  mkdir -p "$dir/ptx"
  run "nvcc: PTX for compute_90 and compute_80" 400 scripts/build-ptx.sh "$dir/ptx"
  gunzip -c "$dir/ptx/kernels_sm90.ptx.gz" >"$ptx" && export MEMWALL_KERNELS_PTX=$ptx
  local q4pid=
  [ -f "$q4" ] || { "$bin/memwall" gen-model --preset llama-7b --dtype q4_k_m --out "$q4" >"$dir/gen-q4.log" 2>&1 & q4pid=$!; }
  gtest "kernels: quantized" kernels 200 "$bin/kernels.test" -test.run 'Quant' -test.v
  gtest "engine on the GPU: quantized, batch" engine 200 "$bin/engine.test" -test.run 'TestQuantizedAgainstReference|TestBatch|TestDecodeGraph' -test.v
  pushd kernels >/dev/null || return
  MEMWALL_TEST_DEVICE=cuda MEMWALL_TEST_QUICK=1 run "compute-sanitizer memcheck: quantized" 100 \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/kernels.test" -test.run 'QuantCUDA' -test.count 1
  popd >/dev/null || return
  [ -f "$bf" ] || run "gen-model 7B bf16" 120 "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf"
  [ -z "$q4pid" ] || { wait "$q4pid"; status+=("gen-model 7B Q4_K_M rc $?"); }
  local p448
  p448=$(prompt 448)
  mwrun q4-resident "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128
  mwrun q4-resident-nograph "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128 --graph off
  mwrun q4-profile "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 32 --profile
  mwrun bf16-profile "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 32 --profile
  mwrun q4-3g "$q4" --vram 3GiB --prompt-ids "$p448" --max-new 64
  mwrun q4-cpu "$q4" --device cpu --prompt-ids "$(prompt 16)" --max-new 32
  grep -E 'ERROR SUMMARY|^--- FAIL' "$log" | head -20
}
# phase5: see the header; phase6 on the same machine right after it.
phase5() {
  mkdir -p "$dir/ptx"
  run "nvcc: PTX for compute_90 and compute_80" 400 scripts/build-ptx.sh "$dir/ptx"
  gunzip -c "$dir/ptx/kernels_sm90.ptx.gz" >"$ptx" && export MEMWALL_KERNELS_PTX=$ptx
  # (after nvcc, which it would slow down; it outlives this call)
  [ -f /tmp/lc.rc ] || setsid nohup bash -c "'$anchors/build-llama.cpp.sh' $lc llama-bench >/tmp/lc.log 2>&1; echo \$? >/tmp/lc.rc" </dev/null >/dev/null 2>&1 &
  [ -f "$bf" ] || run "gen-model 7B bf16" 120 "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf"
  local q4pid=
  [ -f "$q4" ] || { "$bin/memwall" gen-model --preset llama-7b --dtype q4_k_m --out "$q4" >"$dir/gen-q4.log" 2>&1 & q4pid=$!; }
  [ -f "$l3" ] || { "$bin/memwall" gen-model --preset llama3-8b-shape --format gguf --out "$l3" >"$dir/gen-l3.log" 2>&1 & }
  gtest "kernels: llama, rope_gguf, dequant" kernels 240 "$bin/kernels.test" -test.run 'TestCUDALlamaKernels|StepState|TestDequantCUDA|TestQuantCUDA' -test.v
  gtest "kernels: attention speed" kernels 200 "$bin/kernels.test" -test.run 'TestCUDALlamaSpeed' -test.v
  gtest "engine on the GPU" engine 300 "$bin/engine.test" -test.run 'TestRoPEGGUFBitIdentical|TestDecodeLaunches|TestFormatsAgree|TestDecodeGraph|TestAgainstReference|TestQuantizedAgainstReference|TestBatch|TestHybrid' -test.v
  [ -z "$q4pid" ] || { wait "$q4pid"; status+=("gen-model 7B Q4_K_M rc $?"); }
  pushd kernels >/dev/null || return
  MEMWALL_TEST_DEVICE=cuda MEMWALL_TEST_QUICK=1 run "compute-sanitizer memcheck: llama kernels, dequant" 150 \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/kernels.test" -test.run 'TestCUDALlamaKernels|TestDequantCUDA' -test.count 1
  popd >/dev/null || return
  grep -E "ERROR SUMMARY|^--- FAIL|^    [a-z_]+_test.go:[0-9]+:|KPERF attention_decode|KCHECK rope" "$log" | head -60
}

# phase6: after phase5 (its PTX, models and llama.cpp build), memwall and
# llama-bench resident on the same files, nothing else running.
phase6() {
  for i in $(seq 1 100); do [ -f /tmp/lc.rc ] && break; sleep 5; done
  [ "$(cat /tmp/lc.rc 2>/dev/null)" = 0 ] || { echo "llama.cpp build: rc $(cat /tmp/lc.rc 2>/dev/null)"; tail -5 /tmp/lc.log; }
  local p448 p3968
  p448=$(prompt 448); p3968=$(prompt 3968)
  mwrun bf16-resident "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 128
  mwrun bf16-profile "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 32 --profile
  mwrun bf16-ctx4096 "$bf" --vram 20GiB --prompt-ids "$p3968" --max-new 128
  mwrun q4-resident "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128
  mwrun q4-profile "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 32 --profile
  mwrun q4-quantprefill "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 32 --quant-prefill quantized
  mwrun q4-8g-p2048 "$q4" --vram 8GiB --prompt-ids "$(prompt 2048)" --max-new 32
  lbench bf16-ngl99 -m "$bf" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  lbench bf16-ngl99-d4096 -m "$bf" -ngl 99 -fa 1 -p 0 -n 128 -d 4096 -r 1
  lbench q4-ngl99 -m "$q4" -ngl 99 -fa 1 -p 512,2048 -n 128 -r 2
  mwrun l3-8b-resident "$l3" --vram 30GiB --prompt-ids "$p448" --max-new 128
  lbench l3-8b-ngl99 -m "$l3" -ngl 99 -fa 1 -p 512 -n 128 -r 1
}

# phase10: on a fresh machine, an A/B of the committed binaries (gpubin/)
# against another build (gpubin-b/: memwall and engine.test), both with
# their PTX embedded: the B build's engine tests on the GPU, then bf16 and
# Q4_K_M resident, A and B alternating, and llama-bench on the same files,
# nothing else running (llama-bench and llama-batched-bench build during
# the tests).
phase10() {
  [ -d gpubin-b ] || tar -xJf gpupack/bin-ab.tar.xz
  local b=$PWD/gpubin-b
  [ -f /tmp/lc.rc ] || setsid nohup bash -c "'$anchors/build-llama.cpp.sh' $lc llama-bench llama-batched-bench >/tmp/lc.log 2>&1; echo \$? >/tmp/lc.rc" </dev/null >/dev/null 2>&1 &
  [ -f "$bf" ] || { "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1 & }
  local bfpid=$!
  [ -f "$q4" ] || { "$bin/memwall" gen-model --preset llama-7b --dtype q4_k_m --out "$q4" >"$dir/gen-q4.log" 2>&1 & }
  local q4pid=$!
  gtest "engine on the GPU (B)" engine 240 "$b/engine.test" -test.run 'TestAgainstReference|TestDecodeGraph|TestDecodeLaunches|TestQuantizedAgainstReference|TestBatch|TestResidualNormFused|TestHybrid' -test.v
  wait "$bfpid" "$q4pid"
  # quiet from here: the build done first
  for i in $(seq 1 80); do [ -f /tmp/lc.rc ] && break; sleep 5; done
  status+=("llama-batched-bench build rc $(cat /tmp/lc.rc 2>/dev/null)")
  local p448 i
  p448=$(prompt 448)
  for i in 1 2; do
    mwrun "bf16-A$i" "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 128
    bin=$b mwrun "bf16-B$i" "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 128
    mwrun "q4-A$i" "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128
    bin=$b mwrun "q4-B$i" "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128
  done
  bin=$b mwrun bf16-B-profile "$bf" --vram 20GiB --prompt-ids "$p448" --max-new 32 --profile
  lbench bf16-ngl99 -m "$bf" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  lbench q4-ngl99 -m "$q4" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  grep -E "^--- FAIL|^    [a-z0-9_]+_test.go:[0-9]+:" "$log" | grep -v "first logits within" | head -20
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('step', j.get('decode_graph_step_device_seconds'), 'profile', json.dumps(j.get('decode_profile_seconds')))" "$dir/bf16-B-profile.json" 2>/dev/null
}

# phase11: right after 10 (its files and llama-batched-bench): memwall
# serve under bench serve's ShareGPT mix at 32 clients with the B build,
# its step-time histogram and metrics kept, llama-batched-bench at 1, 8
# and 32 sequences, and bench alloc's random mix on 1 and 16 goroutines.
phase11() {
  [ -d gpubin-b ] || tar -xJf gpupack/bin-ab.tar.xz
  bin=$PWD/gpubin-b serve_bench
  run "bench alloc: random, 1 and 16 goroutines" 200 "$bin/memwall" bench alloc --device cuda --mixes random \
    --policies virtual,virtual-keep --strategies bestfit --goroutines 1,16 --pairs 20000 --out "$dir/alloc.json"
  grep -A40 "=== bench alloc" "$log" | grep -E "virtual|async|live|reserved" | head -20
}

# phase12: on a fresh machine: PTX; the row kernels (a batch's decoding
# sequences written and attended in one launch each) checked bit for bit
# against the per-sequence kernels, with the step-state and llama kernels
# whose code they share, and sanitized; the engine's batch tests; then the
# 7B bf16 resident and memwall serve under bench serve (phase 11's load).
phase12() {
  mkdir -p "$dir/ptx"
  run "nvcc: PTX for compute_90 and compute_80" 300 scripts/build-ptx.sh "$dir/ptx"
  gunzip -c "$dir/ptx/kernels_sm90.ptx.gz" >"$ptx" && export MEMWALL_KERNELS_PTX=$ptx
  local bfpid=
  [ -f "$bf" ] || { "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1 & bfpid=$!; }
  gtest "kernels: rows, step state, llama" kernels 240 "$bin/kernels.test" -test.run 'TestCUDARows|TestCUDAStepState|TestCUDALlamaKernels' -test.v
  pushd kernels >/dev/null || return
  MEMWALL_TEST_DEVICE=cuda MEMWALL_TEST_QUICK=1 run "compute-sanitizer memcheck: rows" 120 \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/kernels.test" -test.run 'TestCUDARows' -test.count 1
  popd >/dev/null || return
  gtest "engine on the GPU: batch, graph, reference" engine 200 "$bin/engine.test" -test.run 'TestBatch|TestDecodeGraph|TestAgainstReference' -test.v
  [ -z "$bfpid" ] || { wait "$bfpid"; status+=("gen-model 7B bf16 rc $?"); }
  mwrun bf16-resident "$bf" --vram 20GiB --prompt-ids "$(prompt 448)" --max-new 128
  serve_bench
  grep -E "ERROR SUMMARY|^--- FAIL|^    [a-z0-9_]+_test.go:[0-9]+:" "$log" | grep -v "first logits within\|tokens \[" | head -30
}

# phase13: on a fresh machine (the PTX embedded): memwall bench batch
# against llama-batched-bench on the same bf16 and Q4_K_M files (1, 8 and
# 32 sequences of 128 + 128 tokens), a decode step of each profiled, and
# memwall serve under bench serve's loads; llama-batched-bench builds while
# the files are written, and everything is measured after it.
phase13() {
  [ -f /tmp/lc.rc ] || setsid nohup bash -c "'$anchors/build-llama.cpp.sh' $lc llama-batched-bench >/tmp/lc.log 2>&1; echo \$? >/tmp/lc.rc" </dev/null >/dev/null 2>&1 &
  local bfpid= q4pid= n
  [ -f "$bf" ] || { "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1 & bfpid=$!; }
  [ -f "$q4" ] || { "$bin/memwall" gen-model --preset llama-7b --dtype q4_k_m --out "$q4" >"$dir/gen-q4.log" 2>&1 & q4pid=$!; }
  [ -z "$bfpid" ] || wait "$bfpid"
  [ -z "$q4pid" ] || wait "$q4pid"
  for i in $(seq 1 90); do [ -f /tmp/lc.rc ] && break; sleep 5; done
  status+=("llama-batched-bench build rc $(cat /tmp/lc.rc 2>/dev/null)")
  for m in bf16:"$bf" q4:"$q4"; do
    n=${m%%:*}
    timeout 200 "$bin/memwall" bench batch "${m#*:}" --vram 40GiB --npl 1,8,32 --npp 128 --ntg 128 --profile --json >"$dir/batch-$n.json" 2>"$dir/batch-$n.err" ||
      { echo "bench batch $n failed:" >>"$log"; tail -5 "$dir/batch-$n.err" >>"$log"; }
    while read -r line; do row "memwall bench batch $n" "$line"; done < <(python3 - "$dir/batch-$n.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["rows"]:
    p = r.get("profile") or {}
    cl = " ".join(f"{k} {1e3*v:.2f}" for k, v in sorted((p.get("classes") or {}).items()))
    print(f"B {r['b']:3d}  S_PP {r['s_pp_tokens_per_s']:9.1f}  S_TG {r['s_tg_tokens_per_s']:8.1f}  S {r['s_tokens_per_s']:8.1f}  step {1e3*p.get('seconds', 0):.2f} ms: {cl}")
PY
)
    [ -x "$lc/llama-batched-bench" ] && timeout 150 "$lc/llama-batched-bench" -m "${m#*:}" -ngl 99 -fa 1 -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32 >"$dir/batched-$n.txt" 2>&1
    while read -r line; do row "llama.cpp batched-bench $n" "$line"; done < <(grep -E '^\|\s+[0-9]' "$dir/batched-$n.txt")
  done
  lc=/nonexistent serve_bench
}

# phase14: on a fresh machine (the PTX embedded): the row kernels checked
# against the per-sequence kernels (bit for bit where a row splits as it
# does alone), then memwall bench batch on the bf16 7B, profiled.
phase14() {
  local bfpid=
  [ -f "$bf" ] || { "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1 & bfpid=$!; }
  gtest "kernels: rows" kernels 200 "$bin/kernels.test" -test.run 'TestCUDARows' -test.v
  [ -z "$bfpid" ] || wait "$bfpid"
  timeout 200 "$bin/memwall" bench batch "$bf" --vram 40GiB --npl 1,8,32 --npp 128 --ntg 128 --profile --json >"$dir/batch-bf16.json" 2>"$dir/batch-bf16.err" ||
    { echo "bench batch failed:" >>"$log"; tail -5 "$dir/batch-bf16.err" >>"$log"; }
  python3 - "$dir/batch-bf16.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["rows"]:
    p = r.get("profile") or {}
    cl = " ".join(f"{k} {1e3*v:.2f}" for k, v in sorted((p.get("classes") or {}).items()))
    print(f"B {r['b']:3d}  S_PP {r['s_pp_tokens_per_s']:9.1f}  S_TG {r['s_tg_tokens_per_s']:8.1f}  S {r['s_tokens_per_s']:8.1f}  step {1e3*p.get('seconds', 0):.2f} ms: {cl}")
PY
  grep -E "^--- FAIL|^    [a-z0-9_]+_test.go:[0-9]+:" "$log" | head -10
}

# phase15: the live budget (issue 31): the residency's and the engine's
# retarget tests on the GPU, then two 7B bf16 models (the generated file
# and a copy, so that each has its own pages to register) sharing
# --vram 20GiB under alternating requests, nvidia-smi sampled.
phase15() {
  local bfpid=
  [ -f "$bf" ] || { "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1 & bfpid=$!; }
  gtest "residency: retarget" residency 120 "$bin/residency.test" -test.run 'Retarget' -test.v
  gtest "engine: set budget" engine 200 "$bin/engine.test" -test.run 'SetBudget' -test.v
  [ -z "$bfpid" ] || { wait "$bfpid"; status+=("gen-model 7B bf16 rc $?"); }
  fleet_bench
  grep -E "^--- FAIL|^    [a-z0-9_]+_test.go:[0-9]+:|^ok|^PASS|^FAIL" "$log" | head -20
}

# phase16: phase 15's bench fleet again (the promoted groups' uploads
# queued with one wait) and memwall serve with the two 7B models in
# --vram 20GiB under alternating streamed requests, then the budget halved
# through POST /admin/budget while both serve; nvidia-smi sampled.
phase16() {
  fleet_bench
  fleet_serve
}

# fleet_bench: bench fleet with the two 7B models in --vram 20GiB.
fleet_bench() {
  [ -f "$bf" ] || "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1
  local bf2=$models/llama-7b-copy.gguf
  [ -f "$bf2" ] || cp "$bf" "$bf2"
  sampled fleet timeout 300 "$bin/memwall" bench fleet "$bf" "$bf2" --vram 20GiB --switches 6 --npp 32 --ntg 32 --json >"$dir/fleet.json" 2>"$dir/fleet.err" ||
    { echo "bench fleet failed:" >>"$log"; tail -5 "$dir/fleet.err" >>"$log"; }
  python3 - "$dir/fleet.json" "$(cat "$dir/fleet.peak" 2>/dev/null)" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"budget {j['vram_bytes']/2**30:.2f} GiB pools {j['pool_budget_bytes']/2**30:.2f} link {j['link_GBps']:.1f} GB/s")
for r in j["rows"]:
    print(f"{r['phase']:7s} {r['model'][:20]:20s} promoted {r['promoted_bytes']/1e9:5.2f} GB upload {r['upload_GBps']:5.1f} GB/s move {r['move_seconds']:.3f} s TTFT {r['ttft_seconds']:.3f} s decode {r['decode_tokens_per_s']:7.2f} predicted {r['predicted_decode_tokens_per_s']:7.2f} streamed {r['streamed_groups']}")
print(f"peak footprint {j['peak_footprint_bytes']/2**20:.0f} MiB, pools {j['peak_pool_reserved_bytes']/2**20:.0f} MiB, nvidia-smi peak {sys.argv[2]} MiB")
PY
}

# fleet_serve: memwall serve with the two 7B models in --vram 20GiB under
# scripts/gpu/fleet-serve.py (alternating streamed requests, then the
# budget halved while both serve), nvidia-smi sampled; the fleet's moves
# are logged in serve2.log.
fleet_serve() {
  serve_two serve2 8098 --max-seqs 4 --max-model-len 512
  timeout 200 python3 scripts/gpu/fleet-serve.py http://127.0.0.1:8098 $((20 << 30)) a b 6 >"$dir/fleet-serve.txt" 2>&1
  stop_serve serve2 8098 "$dir/fleet-serve.txt"
  cat "$dir/serve2.log" | head -5
  tail -14 "$dir/fleet-serve.txt"
  echo "nvidia-smi peak during serve: $(sort -n "$dir/serve2.smi" | tail -1) MiB"
  grep -E '^memwall_serve_grant_bytes' "$dir/serve2-metrics.txt"
  grep -E 'fleet: moved' "$dir/serve2.log" | sed -E 's/time=[^ ]+ //' | tail -12
}

# serve_two NAME PORT ARGS...: memwall serve with the two 7B bf16 models
# (bf2, a copy of the first) as a and b in --vram 20GiB with ARGS (with
# --config, the file names the models instead), its log in $dir/NAME.log
# and nvidia-smi sampled into $dir/NAME.smi; returns once /health
# answers, the server's pid in sp and the sampler's in smi.
bf2=$models/llama-7b-copy.gguf
serve_two() {
  local name=$1 port=$2 given=("$bf" "$bf2" --model-name a,b); shift 2
  [ -f "$bf" ] || "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1
  [ -f "$bf2" ] || cp "$bf" "$bf2"
  [[ " $* " == *" --config "* ]] && given=()
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$dir/$name.smi" 2>/dev/null &
  smi=$!
  "$bin/memwall" serve "${given[@]}" --vram "${SERVE_VRAM:-20GiB}" "$@" --addr "127.0.0.1:$port" >"$dir/$name.log" 2>&1 &
  sp=$!
  for i in $(seq 1 180); do
    kill -0 "$sp" 2>/dev/null || { echo "memwall serve $name exited:"; tail -3 "$dir/$name.log"; break; }
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null && break
    sleep 1
  done
}

# stop_serve NAME PORT FILE: serve_two's metrics into $dir/NAME-metrics.txt,
# then SIGTERM, its exit status appended to FILE, and the sampler stopped.
stop_serve() {
  curl -s "http://127.0.0.1:$2/metrics" >"$dir/$1-metrics.txt" 2>/dev/null
  kill -TERM "$sp"; wait "$sp"; echo "serve exit $?" >>"$3"
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
}

# phase18: the embedding table read in place from the registered file
# (engine.Options.NoMapEmbedding off): the residency's and the engine's
# tests on the GPU, then the 7B bf16 at --vram 8GiB with --embedding auto
# and device, nvidia-smi sampled.
phase18() {
  local bfpid=
  [ -f "$bf" ] || { "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf" >"$dir/gen-bf.log" 2>&1 & bfpid=$!; }
  gtest "residency: mapped, retarget" residency 120 "$bin/residency.test" -test.run 'Mapped|Retarget' -test.v
  gtest "engine: mapped embedding, set budget" engine 240 "$bin/engine.test" -test.run 'MappedEmbedding|SetBudget|TestAgainstReference' -test.v
  [ -z "$bfpid" ] || { wait "$bfpid"; status+=("gen-model 7B bf16 rc $?"); }
  local p448
  p448=$(prompt 448)
  mwrun bf16-8g-mapped "$bf" --vram 8GiB --prompt-ids "$p448" --max-new 64
  mwrun bf16-8g-device "$bf" --vram 8GiB --embedding device --prompt-ids "$p448" --max-new 64
  mwrun bf16-8g-mapped-2 "$bf" --vram 8GiB --prompt-ids "$p448" --max-new 64
  mwrun bf16-8g-device-2 "$bf" --vram 8GiB --embedding device --prompt-ids "$p448" --max-new 64
  for n in bf16-8g-mapped bf16-8g-device; do
    row "$n streamed/token, mapped" "$(json "$dir/$n.json" "'%d B, %d B, resident %d B, tokens %s' % (j['streamed_bytes_per_token'], j.get('mapped_bytes', 0), j['resident_bytes'], j['tokens'][:8])")"
  done
  grep -E "^--- FAIL|^    [a-z0-9_]+_test.go:[0-9]+:" "$log" | grep -v "first logits" | head -10
}

# phase20: issue 31's last pieces: the pool's priorities by purpose through
# NVIDIA's Vulkan driver (the loader unpacked from .gl/*.deb, as
# scripts/gpu/vulkan.sh does); fleet_serve again (a promotion now pauses the
# other model's streaming); then the two 7B models served with
# --unload-after 5 (fleet_unload).
phase20() {
  for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; ldconfig
  if ! timeout 20 "$bin/memwall" info --device vulkan >"$dir/vk-info.txt" 2>&1; then
    nvidia_vulkan
    { ldconfig -p | grep -i -E "vulkan|nvidia-gl|GLX_nvidia"; ls -la /usr/local/nvidia/share/vulkan/icd.d /etc/vulkan/icd.d /usr/share/vulkan/icd.d 2>&1; echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"; } >"$dir/vk-setup.txt" 2>&1
    VK_LOADER_DEBUG=error,warn,driver timeout 20 "$bin/memwall" info --device vulkan >"$dir/vk-loader-debug.txt" 2>&1
    timeout 20 "$bin/memwall" info --device vulkan >"$dir/vk-info.txt" 2>&1
    cat "$dir/vk-setup.txt"; grep -i -E "error|fail|nvidia" "$dir/vk-loader-debug.txt" | head -8
  fi
  head -3 "$dir/vk-info.txt"
  pushd device/vulkan >/dev/null || return
  MEMWALL_TEST_DEVICE=vulkan run "vulkan: priorities by purpose" 60 "$bin/device_vulkan.test" -test.run 'TestPriorit|TestAllocPriority|TestDefaultPool|TestInfo' -test.v -test.count 1
  popd >/dev/null || return
  gtest "engine: set budget from the minimum" engine 200 "$bin/engine.test" -test.run 'TestSetBudgetFromMinimum|TestSetBudgetRandom' -test.v
  fleet_serve
  fleet_unload
  grep -E "^--- |^    [a-z0-9_]+_test.go:[0-9]+:" "$log" | head -20
}

# fleet_unload: memwall serve with the two 7B models in --vram 20GiB and
# --unload-after 5 under scripts/gpu/fleet-unload.py; nvidia-smi sampled.
fleet_unload() {
  serve_two unload 8097 --unload-after 5 --max-seqs 4 --max-model-len 512
  timeout 200 python3 scripts/gpu/fleet-unload.py http://127.0.0.1:8097 5 a b >"$dir/fleet-unload.txt" 2>&1
  stop_serve unload 8097 "$dir/fleet-unload.txt"
  tail -12 "$dir/fleet-unload.txt"
  echo "nvidia-smi peak during serve --unload-after: $(sort -n "$dir/unload.smi" | tail -1) MiB"
  grep -E 'unload|loaded|fleet: moved|paused' "$dir/unload.log" | sed -E 's/time=[^ ]+ //' | tail -12
}

# phase8: llama-bench on the Q4_K_M (after 9, or on a machine with its build).
phase8() {
  for i in $(seq 1 100); do [ -f /tmp/lc.rc ] && break; sleep 5; done
  [ "$(cat /tmp/lc.rc 2>/dev/null)" = 0 ] || { echo "llama.cpp build: rc $(cat /tmp/lc.rc 2>/dev/null)"; tail -5 /tmp/lc.log; }
  lbench q4-ngl99 -m "$q4" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  mwrun q4-resident-2 "$q4" --vram 20GiB --prompt-ids "$(prompt 448)" --max-new 128
}

phase9() {
  mkdir -p "$dir/ptx"
  run "nvcc: PTX for compute_90 and compute_80" 300 scripts/build-ptx.sh "$dir/ptx"
  gunzip -c "$dir/ptx/kernels_sm90.ptx.gz" >"$ptx" && export MEMWALL_KERNELS_PTX=$ptx
  [ -f /tmp/lc.rc ] || setsid nohup bash -c "'$anchors/build-llama.cpp.sh' $lc llama-bench >/tmp/lc.log 2>&1; echo \$? >/tmp/lc.rc" </dev/null >/dev/null 2>&1 &
  (for k in memwall_q8mv memwall_q8mv_r4 memwall_q8mvs_q4_k memwall_q8mvs_q6_k; do
     echo "$k $(ptxas -arch=sm_90 -v -o /dev/null "$ptx" 2>&1 | grep -A5 "entry function '$k'" | grep -m1 Used)"; done >"$dir/q8mv-regs.txt") &
  local q4pid=
  [ -f "$q4" ] || { "$bin/memwall" gen-model --preset llama-7b --dtype q4_k_m --out "$q4" >"$dir/gen-q4.log" 2>&1 & q4pid=$!; }
  gtest "kernels: q8mv, three layouts" kernels 200 "$bin/kernels.test" -test.run 'TestQ8CUDA' -test.v
  gtest "kernels: q8mv speed" kernels 120 "$bin/kernels.test" -test.run 'TestCUDAQ8Speed' -test.v
  pushd kernels >/dev/null || return
  MEMWALL_TEST_DEVICE=cuda MEMWALL_TEST_QUICK=1 run "compute-sanitizer memcheck: q8mv" 150 \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/kernels.test" -test.run 'TestQ8CUDA' -test.count 1
  popd >/dev/null || return
  gtest "engine on the GPU: quantized" engine 200 "$bin/engine.test" -test.run 'TestQuantizedAgainstReference|TestDecodeGraph' -test.v
  [ -z "$q4pid" ] || { wait "$q4pid"; status+=("gen-model 7B Q4_K_M rc $?"); }
  local p448 l
  p448=$(prompt 448)
  for l in staged grouped grouped-r4; do
    MEMWALL_KERNELS_Q8=$l mwrun "q4-$l" "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128
  done
  mwrun q4-profile "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 32 --profile
  while read -r line; do row "ptxas sm_90" "$line"; done <"$dir/q8mv-regs.txt"
  for i in $(seq 1 60); do [ -f /tmp/lc.rc ] && break; sleep 2; done
  [ -f /tmp/lc.rc ] && lbench q4-ngl99 -m "$q4" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  for l in staged grouped grouped-r4; do
    MEMWALL_KERNELS_Q8=$l mwrun "q4-$l-2" "$q4" --vram 20GiB --prompt-ids "$p448" --max-new 128
  done
  grep -E "ERROR SUMMARY|^--- FAIL|^    [a-z0-9_]+_test.go:[0-9]+:|KPERF q8mv" "$log" | grep -v "first logits within" | head -40
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('step', j.get('decode_step_device_seconds'), 'profile', json.dumps(j.get('decode_profile_seconds')))" "$dir/q4-profile.json" 2>/dev/null
}

# nvidia_vulkan: when the loader finds no Vulkan driver, points
# VK_DRIVER_FILES at a copy of NVIDIA's manifest naming libEGL_nvidia.so.0:
# on this machine libGLX_nvidia.so.0 (the manifest's) gives no
# vkCreateInstance, without a display, and the EGL library of the same
# driver does.
nvidia_vulkan() {
  timeout 20 "$bin/memwall" info --device vulkan >/dev/null 2>&1 && return
  local icd
  for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
    [ -f "$icd" ] || continue
    sed 's/libGLX_nvidia\.so\.0/libEGL_nvidia.so.0/' "$icd" >/tmp/nvidia_egl_icd.json
    export VK_DRIVER_FILES=/tmp/nvidia_egl_icd.json
    echo "Vulkan: $icd's libGLX_nvidia.so.0 replaced by libEGL_nvidia.so.0 (VK_DRIVER_FILES)"
    return
  done
}

# phase22: memwall serve --config with the two 7B models, b at priority 2
# and kept forever, a at 1: the shares at start, after a request to a,
# and with both requested at once; nvidia-smi sampled.
phase22() {
  rm -f "$dir/config-exit.txt"
  printf '{"models": [{"path": "%s", "name": "a", "priority": 1, "unload_after_s": 0},\n  {"path": "%s", "name": "b", "priority": 2, "keep_alive_s": -1}]}\n' "$bf" "$bf2" >"$dir/serve.json"
  serve_two config 8096 --config "$dir/serve.json" --max-seqs 4 --max-model-len 512
  local u=http://127.0.0.1:8096 req='"prompt": [1, 3, 5, 7, 9, 11, 13, 15], "max_tokens": 32, "temperature": 0, "ignore_eos": true'
  curl -s "$u/admin/budget" >"$dir/config-budget0.json"
  curl -s "$u/v1/completions" -H 'Content-Type: application/json' -d "{\"model\": \"a\", $req}" >"$dir/config-a.json"
  curl -s "$u/admin/budget" >"$dir/config-budget1.json"
  local m both=()
  for m in a b; do
    curl -s "$u/v1/completions" -H 'Content-Type: application/json' -d "{\"model\": \"$m\", \"prompt\": [2, 4], \"max_tokens\": 256, \"temperature\": 0, \"ignore_eos\": true}" >"$dir/config-both-$m.json" &
    both+=($!)
  done
  sleep 1; curl -s "$u/admin/budget" >"$dir/config-budget2.json"; wait "${both[@]}"
  stop_serve config 8096 "$dir/config-exit.txt"
  head -8 "$dir/config.log"; cat "$dir/config-exit.txt"
  for f in 0 1 2; do
    python3 - "$dir/config-budget$f.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(sys.argv[1].rsplit("/", 1)[-1], " | ".join(f"{m['name']} prio {m['priority']} grant {m['grant_bytes']/2**30:.2f} GiB of {m['full_bytes']/2**30:.2f} (min {m['minimum_bytes']/2**30:.2f}) active {m['active']}" for m in j["models"]))
PY
  done
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('a:', j['usage'])" "$dir/config-a.json" 2>&1 | head -2
  echo "nvidia-smi peak during serve --config: $(sort -n "$dir/config.smi" | tail -1) MiB"
}

# phase21: why NVIDIA's Vulkan driver starts or not (its devices, the
# ICD's entry points called directly), the Vulkan priority tests, the
# embedding gather timed and the 7B bf16 at --vram 8GiB with the table
# placed by the measured gather and kept on the device.
phase21() {
  for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; ldconfig
  { ls -la /dev/nvidia* /dev/dri 2>&1; env | grep -i -E "nvidia|vk_|vulkan" | sort
    ldconfig -p | grep -i -E "vulkan|nvidia"
    find /usr /etc -name "nvidia_icd*.json" -o -name "libGLX_nvidia.so*" 2>/dev/null | head; } >"$dir/vk-env.txt" 2>&1
  timeout 20 python3 - >"$dir/vk-icd.txt" 2>&1 <<'PY'
import ctypes
for lib in ("libGLX_nvidia.so.0", "libEGL_nvidia.so.0"):
    try:
        h = ctypes.CDLL(lib)
    except OSError as e:
        print(lib, "dlopen:", e); continue
    try:
        f = h.vk_icdGetInstanceProcAddr
    except AttributeError:
        print(lib, "has no vk_icdGetInstanceProcAddr"); continue
    f.restype, f.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    for name in (b"vkCreateInstance", b"vkEnumerateInstanceExtensionProperties", b"vkEnumerateInstanceVersion"):
        print(lib, name.decode(), hex(f(None, name) or 0))
PY
  head -60 "$dir/vk-env.txt"; cat "$dir/vk-icd.txt"
  nvidia_vulkan
  VK_LOADER_DEBUG=error,warn,driver timeout 20 "$bin/memwall" info --device vulkan >"$dir/vk-loader-debug.txt" 2>&1
  grep -i -E "error|fail|nvidia" "$dir/vk-loader-debug.txt" | head -8
  pushd device/vulkan >/dev/null || return
  MEMWALL_TEST_DEVICE=vulkan run "vulkan: priorities by purpose" 60 "$bin/device_vulkan.test" -test.run 'TestPriorit|TestAllocPriority|TestDefaultPool|TestInfo' -test.v -test.count 1
  popd >/dev/null || return
  gtest "engine: embedding gather timed, mapped table" engine 120 "$bin/engine.test" -test.run 'TestMeasuredGather|TestMappedEmbedding' -test.v
  [ -f "$bf" ] || run "gen-model 7B bf16" 150 "$bin/memwall" gen-model --preset llama-7b --format gguf --out "$bf"
  local p448
  p448=$(prompt 448)
  mwrun bf-8g-gather "$bf" --vram 8GiB --prompt-ids "$p448" --max-new 64
  mwrun bf-8g-embdev "$bf" --vram 8GiB --prompt-ids "$p448" --max-new 64 --embedding device
  mwrun bf-8g-gather-2 "$bf" --vram 8GiB --prompt-ids "$p448" --max-new 64
  mwrun bf-8g-embdev-2 "$bf" --vram 8GiB --prompt-ids "$p448" --max-new 64 --embedding device
  local n
  for n in bf-8g-gather bf-8g-embdev bf-8g-gather-2 bf-8g-embdev-2; do
    row "$n gather" "$(json "$dir/$n.json" "j.get('embedding_gather')")  mapped $(json "$dir/$n.json" "j.get('mapped_bytes')")  resident $(json "$dir/$n.json" "j['resident_bytes']")"
  done
  grep -E "^--- |^    [a-z0-9_]+_test.go:[0-9]+:" "$log" | head -24
}

case "${1:-}" in
  10) phase10 ;;
  11) phase11 ;;
  12) phase12 ;;
  13) phase13 ;;
  14) phase14 ;;
  15) phase15 ;;
  16) phase16 ;;
  17) fleet_serve ;;
  18) phase18 ;;
  19) fleet_bench ;;
  20) phase20 ;;
  21) phase21 ;;
  22) phase22 ;;
  9) phase9 ;;
  8) phase8 ;;
  1) phase1 ;;
  4) phase4 ;;
  5) phase5 ;;
  6) phase6 ;;
  2) phase2 ;;
  3) phase3 ;;
  *) echo "usage: scripts/gpu/wave3.sh 1|2|3|4|5|6|8|9|10|11|12|13|14|15|16|17|18|19|20|21|22" >&2; exit 2 ;;
esac
printf '%s\n' "${status[@]}" "${rows[@]}" | tee "$dir/table-$1.txt"
cp "$dir"/ptx/*.ptx.gz "$OUT"/ 2>/dev/null
tar -czf "$OUT/wave3-phase$1.tgz" -C "$dir" --exclude ptx .
