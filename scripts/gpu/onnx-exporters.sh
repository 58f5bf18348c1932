#!/usr/bin/env bash
# (Formerly scripts/gpu/paths.sh.) Planner on real exporters and ONNX Runtime settings from a plan (issue 16),
# from the repo root on the GPU machine: python3 with torch, transformers,
# onnx, onnxscript and onnxruntime; gpubin/memwall built by
# scripts/gpu-build.sh. No Go, no network, no GPU use (ORT's CPU provider).
# Expected run time: about 80-120 s (8 exports of ~1-7 s, then ~30 ORT runs
# of ~1.5 s and ~40 memwall plans of < 1 s; the second run took 60 s); every step has a timeout and
# the whole stays under 180 s.
#
#   OUT=/some/dir scripts/gpu/onnx-exporters.sh
#
# Writes under $OUT/onnx-exporters/: ship/*.onnx (the exported graphs, without their
# data and with it inline: these go to testdata/onnx/dynamo/),
# manifest.json (what was exported, how), plan/*.json (memwall plan --ort
# --json of every graph), ort.jsonl (one line per ORT run), summary.json and
# summary.md (the table for BENCHMARKS.md), log.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
dir=$OUT/onnx-exporters
mkdir -p "$dir/plan"
BIN=${BIN:-gpubin}
t0=$(date +%s)
log=$dir/log.txt
python3 -c 'import torch, transformers, onnx, onnxruntime, sys; print("torch", torch.__version__, "transformers", transformers.__version__, "onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, "python", sys.version.split()[0])' >"$log" 2>&1

# 1. Export (the slow part: under 100 s).
timeout 100 python3 scripts/gpu/onnx-export.py export --out "$dir" >>"$log" 2>&1
echo "export rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$log"

# 2. memwall plan --ort on every graph, with and without its data.
for m in "$dir"/ship/*.onnx; do
  [ -f "$m" ] || continue
  b=$(basename "$m" .onnx)
  if [ -x "$BIN/memwall" ]; then
    timeout 20 "$BIN/memwall" plan "$m" --ort --json --time-limit 1s >"$dir/plan/$b.json" 2>"$dir/plan/$b.err"
    echo "plan $b rc=$?" >>"$log"
  else
    echo "plan $b: no $BIN/memwall" >>"$log"
  fi
done

# 3. ONNX Runtime, default settings and memwall's, a fresh process each.
: >"$dir/ort.jsonl"
for m in "$dir"/ship/*.inline.onnx; do
  [ -f "$m" ] || continue
  b=$(basename "$m" .onnx)
  timeout 30 python3 scripts/gpu/onnx-export.py ort "$m" --mode default >>"$dir/ort.jsonl" 2>>"$log" ||
    echo "{\"model\": \"$b.onnx\", \"mode\": \"default\", \"ok\": false, \"error\": \"rc $?\"}" >>"$dir/ort.jsonl"
  [ -s "$dir/plan/$b.json" ] || continue
  timeout 30 python3 scripts/gpu/onnx-export.py ort "$m" --mode memwall --settings "$dir/plan/$b.json" >>"$dir/ort.jsonl" 2>>"$log" ||
    echo "{\"model\": \"$b.onnx\", \"mode\": \"memwall\", \"ok\": false, \"error\": \"rc $?\"}" >>"$dir/ort.jsonl"
  # How much ORT needs: limits of weights + arena + 1 MiB + k/2 arenas,
  # k = 0, 1, ..., the first that runs (an experiment, not a setting).
  arena=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["no_inplace_arena_bytes"])' "$dir/plan/$b.json" 2>/dev/null) || continue
  for k in 0 1 2 3 4 5 6; do
    ws=$(( 1048576 + k * arena / 2 ))
    timeout 20 "$BIN/memwall" plan "$m" --ort --ort-workspace "${ws}B" --json --time-limit 0s >"$dir/plan/$b.need.json" 2>>"$log" || break
    line=$(timeout 30 python3 scripts/gpu/onnx-export.py ort "$m" --mode memwall-need --settings "$dir/plan/$b.need.json" 2>>"$log")
    echo "$line" | sed "s/^{/{\"k\": $k, /" >>"$dir/need.jsonl"
    case $line in *'"ok": true'*) break ;; esac
  done
done

# 4. The table.
python3 - "$dir" <<'EOF' 2>>"$log"
import json, os, sys
d = sys.argv[1]
man = {m["name"]: m for m in json.load(open(os.path.join(d, "manifest.json")))} if os.path.exists(os.path.join(d, "manifest.json")) else {}
plans = {}
for f in sorted(os.listdir(os.path.join(d, "plan"))):
    if f.endswith(".json") and not f.endswith(".need.json") and os.path.getsize(os.path.join(d, "plan", f)) > 0:
        try:
            plans[f[:-5]] = json.load(open(os.path.join(d, "plan", f)))
        except Exception:
            pass
need = {}
if os.path.exists(os.path.join(d, "need.jsonl")):
    for line in open(os.path.join(d, "need.jsonl")):
        try:
            r = json.loads(line)
        except Exception:
            continue
        if r.get("ok"):
            need[r["model"].replace(".inline.onnx", "")] = r
runs = {}
for line in open(os.path.join(d, "ort.jsonl")):
    try:
        r = json.loads(line)
    except Exception:
        continue
    runs[(r["model"].replace(".onnx", ""), r["mode"])] = r
rows = []
for name in man:
    row = {"model": name, "exported": man[name].get("ok"), "params": man[name].get("params")}
    for v in ("nodata", "inline"):
        p = plans.get(f"{name}.{v}")
        if p:
            row[v] = {k: p.get(k) for k in ("arena_bytes", "lower_bound_bytes", "no_inplace_arena_bytes", "no_inplace_lower_bound_bytes", "declared_tensors", "weights_bytes", "tensors")}
            row[v]["gpu_mem_limit"] = p.get("ort", {}).get("total_bytes")
        else:
            err = os.path.join(d, "plan", f"{name}.{v}.err")
            row[v] = {"error": open(err).read()[:300]} if os.path.exists(err) else None
    n = need.get(name)
    row["ort_need"] = None if n is None else {"k": n["k"], "limit_bytes": n["settings"]["total_bytes"], "peak_rss_kib": n["peak_rss_kib"]}
    for mode in ("default", "memwall"):
        r = runs.get((f"{name}.inline", mode))
        row["ort_" + mode.replace("-", "_")] = None if r is None else {k: r.get(k) for k in ("ok", "peak_rss_kib", "session_peak_kib", "create_seconds", "run_median_seconds", "error")}
    rows.append(row)
json.dump(rows, open(os.path.join(d, "summary.json"), "w"), indent=1)
mib = lambda b: "-" if b is None else f"{b / 2**20:.2f}"
def g(x, *ks):
    for k in ks:
        x = x.get(k) if isinstance(x, dict) else None
    return x
lines = ["| model | params | arena no-data / inline (MiB) | lower bound (MiB) | declared | ORT default: peak RSS, session (MiB), run (ms) | ORT memwall: peak RSS, session (MiB), run (ms), limit (MiB) | smallest limit ORT ran in (MiB; x arena) |",
         "|---|---|---|---|---|---|---|---|"]
def needcell(r):
    n, a = r.get("ort_need"), g(r, "inline", "no_inplace_arena_bytes")
    if not n:
        return "-"
    return f"{n['limit_bytes'] / 2**20:.1f} (k={n['k']}; {(n['limit_bytes'] - (g(r, 'inline', 'weights_bytes') or 0)) / max(a or 1, 1):.2f}x)"
for r in rows:
    def ortcell(o):
        if not o or not o.get("ok"):
            return "failed: " + (o or {}).get("error", "not run")[:60] if o else "-"
        return f"{o['peak_rss_kib']/1024:.1f}, {o['session_peak_kib']/1024:.1f}, {o['run_median_seconds']*1e3:.2f}"
    lines.append(f"| {r['model']} | {r['params']} | {mib(g(r,'nodata','no_inplace_arena_bytes'))} / {mib(g(r,'inline','no_inplace_arena_bytes'))} | "
                 f"{mib(g(r,'inline','no_inplace_lower_bound_bytes'))} | {g(r,'nodata','declared_tensors')} | {ortcell(r['ort_default'])} | {ortcell(r['ort_memwall'])}, {mib(g(r,'inline','gpu_mem_limit'))} | {needcell(r)} |")
open(os.path.join(d, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
same = all(g(r, "nodata", "no_inplace_arena_bytes") == g(r, "inline", "no_inplace_arena_bytes") for r in rows
           if g(r, "inline", "no_inplace_arena_bytes") is not None and g(r, "nodata", "no_inplace_arena_bytes") is not None)
atlb = all(g(r, v, "no_inplace_arena_bytes") == g(r, v, "no_inplace_lower_bound_bytes") for r in rows for v in ("nodata", "inline") if g(r, v, "no_inplace_arena_bytes") is not None)
print(f"arena same with and without data: {same}; arena = lower bound (no in-place) on every planned graph: {atlb}")
EOF
du -sh "$dir/ship" 2>/dev/null | tee -a "$log"
echo "onnx-exporters total $(( $(date +%s) - t0 ))s"
