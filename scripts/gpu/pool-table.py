#!/usr/bin/env python3
"""Summarizes `memwall bench alloc --out FILE` for issue 13's speed goals.

Usage: pool-table.py alloc.json

For every pool row: pairs/s and its ratio to cuMemAllocAsync's on the same
number of goroutines (goal >= 10x), the p50 of a pair (batches of 16 timed
together) over async's on one goroutine and on the same count (goal
<= 0.1x), the p99 of a pair timed alone (goal <= 1 us), and, on 16
goroutines, pairs/s against 6 M.
"""
import json
import sys


def main():
    rep = json.load(open(sys.argv[1]))
    rows = rep["results"]
    asy = {r["goroutines"]: r for r in rows if r["allocator"] == "cuMemAllocAsync"}
    a1 = asy.get(1, {}).get("batch_p50_ns", 0)
    print("%-30s %3s %10s %8s %9s %9s %9s %9s %9s %8s  %s" % (
        "allocator", "gor", "pairs/s", "x async", "p50", "p50/a1", "p50/aN", "p99", "calls/pr", "peak GiB",
        "goals (thr>=10x, p50<=0.1x, p99<=1us, 16 gor>=6M)"))
    for r in rows:
        g = r["goroutines"]
        a = asy.get(g, {})
        thr = r.get("pairs_per_sec", 0)
        ath = a.get("pairs_per_sec", 0)
        p50, p99 = r.get("batch_p50_ns", 0), r.get("p99_ns", 0)
        xa = thr / ath if ath else 0
        r1 = p50 / a1 if a1 else 0
        rn = p50 / a["batch_p50_ns"] if a.get("batch_p50_ns") else 0
        goals = ""
        if r["allocator"].startswith("memwall"):
            ok = [("thr", xa >= 10), ("p50", r1 <= 0.1), ("p99", p99 <= 1000)]
            if g == 16:
                ok.append(("6M", thr >= 6e6))
            goals = " ".join(("%s:%s" % (n, "met" if v else "NOT")) for n, v in ok)
        calls = r.get("device_calls", 0) / r["total_pairs"] if r.get("total_pairs") else 0
        peak = r.get("peak_reserved_bytes", 0) / (1 << 30)
        print("%-30s %3d %10.0f %8.2f %7.0fns %9.3f %9.3f %7.2fus %9.4f %8.2f  %s%s" % (
            r["allocator"][:30], g, thr, xa, p50, r1, rn, p99 / 1000, calls, peak, goals,
            ("  [%s]" % r["note"]) if r.get("note") else ""))


if __name__ == "__main__":
    main()
