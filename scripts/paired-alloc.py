#!/usr/bin/env python3
"""Reads the runs of scripts/paired-alloc.sh and prints, per mix and memwall
configuration, the ratio of memwall's batch p50 to the C-timed
cuMemAllocAsync batch p50 on the same request stream (32 live blocks), each
memwall run against the mean of the driver runs just before and after it
on the same CPU: the median ratio, its range, and how many runs met 0.1x."""
import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict

out = sys.argv[1]
ratios = defaultdict(list)  # (mix, allocator) -> [(ratio, cpu, round, memwall ns, driver ns)]
driver_ns = defaultdict(list)
for path in sorted(glob.glob(os.path.join(out, "memwall-cpu*-r*.json"))):
    cpu, r = map(int, re.search(r"cpu(\d+)-r(\d+)", path).groups())
    drv = {}
    for k in (r, r + 1):
        with open(os.path.join(out, f"driver-cpu{cpu}-r{k}.jsonl")) as f:
            for line in f:
                o = json.loads(line)
                if o.get("allocator") == "cuMemAllocAsync (C)" and o.get("live") == 32:
                    drv.setdefault(o["mix"], []).append(o["batch_p50_ns"])
    with open(path) as f:
        rep = json.load(f)
    for res in rep["results"]:
        if not res["allocator"].startswith("memwall") or res["goroutines"] != 1:
            continue
        d = drv.get(res["mix"])
        if not d or len(d) != 2:
            continue
        mean = sum(d) / 2
        ratios[(res["mix"], res["allocator"])].append((res["batch_p50_ns"] / mean, cpu, r, res["batch_p50_ns"], mean))
        driver_ns[res["mix"]].extend(d)

# "fastest" divides memwall's fastest run by the driver's fastest, per CPU,
# and reports the median over CPUs: the ratio with the host's slow bursts
# taken out of both sides.
print(f"{'mix':<20} {'memwall configuration':<28} {'runs':>4} {'memwall p50 ns':>15} {'driver p50 ns':>15} "
      f"{'ratio median':>12} {'ratio range':>17} {'<=0.1x':>7} {'fastest':>8}")
for (mix, alloc), xs in sorted(ratios.items()):
    rs = [x[0] for x in xs]
    ms = [x[3] for x in xs]
    ds = [x[4] for x in xs]
    ok = sum(r <= 0.1 for r in rs)
    fastest = statistics.median(
        min(x[3] for x in xs if x[1] == c) / min(x[4] for x in xs if x[1] == c) for c in sorted({x[1] for x in xs}))
    print(f"{mix:<20} {alloc:<28} {len(rs):>4} {min(ms):>6.0f}-{max(ms):<8.0f} {min(ds):>6.0f}-{max(ds):<8.0f} "
          f"{statistics.median(rs):>12.3f} {min(rs):>8.3f}-{max(rs):<8.3f} {ok:>3}/{len(rs)} {fastest:>8.3f}")
