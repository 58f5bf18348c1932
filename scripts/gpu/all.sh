#!/usr/bin/env bash
# Runs the GPU checks of several areas in one go on a machine with an NVIDIA GPU,
# from binaries built beforehand by scripts/gpu-build.sh (packed into
# gpupack/bin.tar.xz by scripts/gpu/pack.sh). Each area's script is
# scripts/gpu/<area>.sh; it writes under $OUT/<area>/ and prints a short table.
#
#   AREAS="tokenizer kernels engine" scripts/gpu/all.sh
#
# OUT (default ./gpu-out) receives one results-<area>.tar.gz per area and
# summary.txt; every area runs under its own time limit (LIMIT_<area>
# seconds, with - in the area name written _, default 240) so one hang does not cost the others.
set -uo pipefail
cd "$(dirname "$0")/../.."
final=${OUT:-$PWD/gpu-out}
mkdir -p "$final"
work=$(mktemp -d /tmp/memwall-gpu.XXXXXX)
export OUT=$work
if [ -f gpupack/bin.tar.xz ]; then
  tar -xJf gpupack/bin.tar.xz
fi
export BIN=${BIN:-gpubin}
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$work/nvidia-smi.csv"
summary=()
for area in ${AREAS:-tokenizer kernels}; do
  script=scripts/gpu/$area.sh
  mkdir -p "$work/$area"
  if [ ! -f "$script" ]; then summary+=("$(printf '%-12s %s' "$area" "no script")"); continue; fi
  lim_var=LIMIT_${area//-/_}; lim=${!lim_var:-240}
  t0=$(date +%s)
  timeout --kill-after=10 "$lim" bash "$script" >"$work/$area/console.txt" 2>&1
  rc=$?
  t1=$(date +%s)
  summary+=("$(printf '%-12s rc=%-3s %4ss' "$area" "$rc" "$((t1 - t0))")")
  echo "== $area (rc=$rc, $((t1 - t0))s)"; tail -n 25 "$work/$area/console.txt"
done
for area in ${AREAS:-tokenizer kernels}; do
  [ -d "$work/$area" ] || continue
  tar -C "$work" -czf "$final/results-$area.tar.gz" "$area"
  sz=$(stat -c %s "$final/results-$area.tar.gz")
  if [ "$sz" -gt 16000000 ]; then
    split -b 15M "$final/results-$area.tar.gz" "$final/results-$area.tar.gz.part-" && rm "$final/results-$area.tar.gz"
  fi
done
cp "$work/nvidia-smi.csv" "$final/" 2>/dev/null
echo; echo "== summary"; printf '%s\n' "${summary[@]}" | tee "$final/summary.txt"
