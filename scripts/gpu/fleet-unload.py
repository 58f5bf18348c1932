#!/usr/bin/env python3
"""Unloading under `memwall serve MODEL MODEL --unload-after N`: a request
to each model, then both idle until their gauges say unloaded (how long
past N after each one's request that took, and nvidia-smi then), then a request to each again,
whose time to first token includes the load. Prints one JSON line per
step and a table last.

usage: fleet-unload.py URL UNLOAD_AFTER_S NAME NAME [VOCAB]
"""
import http.client
import json
import random
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request


def _fleet_serve():
    """scripts/gpu/fleet-serve.py, whose request() this script shares."""
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location("fleet_serve", os.path.join(os.path.dirname(__file__), "fleet-serve.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


request = _fleet_serve().request


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(memwall_serve_(?:loaded|loads_total|unloads_total|load_seconds_sum|load_seconds_count))\{model_name="([^"]+)"\} (\S+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def smi():
    try:
        return int(subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=10).stdout.split()[0])
    except Exception:
        return -1


def main():
    url, after, names = sys.argv[1], float(sys.argv[2]), sys.argv[3:5]
    vocab = int(sys.argv[5]) if len(sys.argv) > 5 else 32000
    rng = random.Random(11)
    rows = []
    ended = {}

    def one(phase, m):
        ttft, secs, n = request(url, m, [3 + rng.randrange(vocab - 3) for _ in range(32)], 32)
        ended[m] = time.perf_counter()
        row = {"phase": phase, "model": m, "ttft_s": ttft, "decode_tok_s": (n - 1) / secs if secs > 0 else 0,
               "tokens": n, "smi_MiB": smi()}
        rows.append(row)
        print(json.dumps(row), flush=True)

    for m in names:
        one("loaded", m)
    idle_from = time.perf_counter()
    print(json.dumps({"smi_MiB_both_loaded": smi()}), flush=True)
    unloaded_at = {}
    while len(unloaded_at) < len(names) and time.perf_counter() - idle_from < after + 60:
        ms = metrics(url)
        for m in names:
            if m not in unloaded_at and ms.get(("memwall_serve_loaded", m)) == 0:
                unloaded_at[m] = time.perf_counter() - ended[m]
        time.sleep(0.05)
    print(json.dumps({"unloaded_after_own_request_s": unloaded_at, "unload_after_s": after,
                      "smi_MiB_both_unloaded": smi()}), flush=True)
    for m in names:
        one("reloaded", m)
    ms = metrics(url)
    for m in names:
        c = ms.get(("memwall_serve_load_seconds_count", m), 0)
        print(json.dumps({"model": m, "loads": ms.get(("memwall_serve_loads_total", m)),
                          "unloads": ms.get(("memwall_serve_unloads_total", m)),
                          "load_seconds_mean": ms.get(("memwall_serve_load_seconds_sum", m), 0) / c if c else None}), flush=True)
    for r in rows:
        print(f"{r['phase']:8s} {r['model']:10s} TTFT {r['ttft_s']:.3f} s  decode {r['decode_tok_s']:7.2f} tok/s  tokens {r['tokens']}  smi {r['smi_MiB']} MiB")
    for m in names:
        print(f"unloaded {m:10s} {unloaded_at.get(m, float('nan')) - after:+.3f} s after --unload-after from its request's end (polled every 50 ms)")


if __name__ == "__main__":
    main()
