"""Summarizes scripts/gpu/pool-speed.sh's runs: per configuration, the
default's and keep's one-goroutine p50 and pairs/s (median [min-max] over
the repetitions), the driver's (cuMemAllocAsync on the same requests), and
in how many passes the default met the goals of issue 13 item 3 (>= 10x the
driver's pairs/s, p50 <= 0.1x its p50, p99 <= 1 us).

    python3 scripts/gpu/pool-speed.py DIR
"""
import glob
import json
import os
import statistics
import sys


def rows(path):
    with open(path) as f:
        rep = json.load(f)
    out = {}
    for r in rep["results"]:
        if r["goroutines"] != 1:
            continue
        a = r["allocator"]
        if a.endswith("/virtual"):
            out["default"] = r
        elif a.endswith("/virtual-keep"):
            out["keep"] = r
        elif a == "cuMemAllocAsync":
            out["async"] = r
    for r in rep.get("interleaved") or []:
        if r["pool"].endswith("/virtual") and r.get("goroutines", 1) == 1 and not r.get("note"):
            out["interleaved"] = r
    return out


def span(xs, fmt):
    if not xs:
        return "-"
    return "%s [%s-%s]" % (fmt % statistics.median(xs), fmt % min(xs), fmt % max(xs))


def main(d):
    by = {}
    for p in sorted(glob.glob(os.path.join(d, "*-*.json"))):
        cfg = os.path.basename(p).rsplit("-", 1)[0]
        try:
            by.setdefault(cfg, []).append(rows(p))
        except (OSError, ValueError, KeyError) as e:
            print("%s: %s" % (p, e))
    print("%-6s %4s  %-26s %-26s %-26s %-22s %-22s %s" % (
        "config", "runs", "default p50 ns", "default M pairs/s", "default p99 ns",
        "keep p50 ns", "async p50 ns", "goals met"))
    for cfg in sorted(by, key=lambda c: (c.startswith('cpu'), int(c[3:]) if c[3:].isdigit() and c.startswith('cpu') else 0, c)):
        runs = [r for r in by[cfg] if "default" in r]
        dp = [r["default"]["batch_p50_ns"] for r in runs]
        dt = [r["default"]["pairs_per_sec"] / 1e6 for r in runs]
        d99 = [r["default"]["p99_ns"] for r in runs]
        kp = [r["keep"]["batch_p50_ns"] for r in runs if "keep" in r]
        ap = [r["async"]["batch_p50_ns"] for r in runs if "async" in r]
        met = 0
        for r in runs:
            if "async" not in r:
                continue
            dr, ar = r["default"], r["async"]
            if (dr["pairs_per_sec"] >= 10 * ar["pairs_per_sec"] and dr["batch_p50_ns"] <= 0.1 * ar["batch_p50_ns"]
                    and dr["p99_ns"] <= 1000):
                met += 1
        print("%-6s %4d  %-26s %-26s %-26s %-22s %-22s %d/%d" % (
            cfg, len(runs), span(dp, "%.0f"), span(dt, "%.2f"), span(d99, "%.0f"), span(kp, "%.0f"),
            span(ap, "%.0f"), met, len(runs)))
    print("(median [min-max] over repetitions; p50 over batches of 16 pairs, p99 of pairs timed alone)")
    print("interleaved with cuMemAllocAsync on one goroutine (the same moments of the host):")
    print("%-6s %4s  %-22s %-22s %-22s %-22s %-22s %s" % ("config", "runs", "p50 ratio", "window ratio p50", "pairs/s ratio",
                                                         "pool M pairs/s", "driver M pairs/s", "goals met"))
    for cfg in sorted(by):
        runs = [r for r in by[cfg] if "interleaved" in r and "default" in r]
        if not runs:
            continue
        pr = [r["interleaved"]["p50_ratio"] for r in runs]
        wr = [r["interleaved"]["window_ratio_p50"] for r in runs]
        tr = [r["interleaved"]["throughput_ratio"] for r in runs]
        pp = [r["interleaved"].get("pool_pairs_per_sec", 0) / 1e6 for r in runs]
        dp = [r["interleaved"].get("anchor_pairs_per_sec", 0) / 1e6 for r in runs]
        met = sum(1 for r in runs if r["interleaved"]["p50_ratio"] <= 0.1 and r["interleaved"]["throughput_ratio"] >= 10
                  and r["default"]["p99_ns"] <= 1000)
        print("%-6s %4d  %-22s %-22s %-22s %-22s %-22s %d/%d" % (cfg, len(runs), span(pr, "%.3f"), span(wr, "%.3f"), span(tr, "%.1f"),
                                                             span(pp, "%.2f"), span(dp, "%.3f"), met, len(runs)))
    print("each run in order (rep, config: default / keep / async p50 ns):")
    runs = []
    for p in glob.glob(os.path.join(d, "*-*.json")):
        cfg, rep = os.path.basename(p)[:-5].rsplit("-", 1)
        try:
            r = rows(p)
        except (OSError, ValueError, KeyError):
            continue
        runs.append((os.path.getmtime(p), rep, cfg, r))
    line = []
    for _, rep, cfg, r in sorted(runs):
        line.append("%s %s %s/%s/%s" % (rep, cfg, *(
            "%.0f" % r[k]["batch_p50_ns"] if k in r else "-" for k in ("default", "keep", "async"))))
    for i in range(0, len(line), 4):
        print("  " + "   ".join(line[i:i + 4]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu-out/pool-speed")
