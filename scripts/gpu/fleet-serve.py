#!/usr/bin/env python3
"""Alternating requests to a `memwall serve MODEL MODEL` (one at a time),
then the budget halved through POST /admin/budget while both models
serve at once. Prints one JSON line per request and a table last.

usage: fleet-serve.py URL VRAM_BYTES NAME NAME [SWITCHES [VOCAB]]
"""
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


def request(url, model, prompt, max_tokens):
    """Streams one completion; returns (ttft, seconds, tokens)."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "return_token_ids": True})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{model}: {r.status} {r.read()[:300]}")
    first, n = None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ids = [i for ch in json.loads(line[6:])["choices"] for i in ch.get("token_ids") or []]
        if ids and first is None:
            first = time.perf_counter()
        n += len(ids)
    end = time.perf_counter()
    c.close()
    return first - t0, end - first, n


def admin(url, method, body=None):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    t0 = time.perf_counter()
    c.request(method, "/admin/budget", json.dumps(body) if body else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    return r.status, out, time.perf_counter() - t0


def main():
    url, vram, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:5]
    switches = int(sys.argv[5]) if len(sys.argv) > 5 else 6
    vocab = int(sys.argv[6]) if len(sys.argv) > 6 else 32000
    rng = random.Random(7)
    rows = []
    for k in range(switches):
        m = names[k % 2]
        ttft, secs, n = request(url, m, [3 + rng.randrange(vocab - 3) for _ in range(32)], 32)
        row = {"phase": "switch", "model": m, "ttft_s": ttft, "decode_tok_s": (n - 1) / secs if secs > 0 else 0, "tokens": n}
        rows.append(row)
        print(json.dumps(row), flush=True)
    # Both serving while the budget halves.
    done = {}

    def both(m):
        done[m] = request(url, m, [3 + rng.randrange(vocab - 3) for _ in range(32)], 256)

    ts = [threading.Thread(target=both, args=(m,)) for m in names]
    for t in ts:
        t.start()
    time.sleep(0.3)
    status, out, took = admin(url, "POST", {"vram_bytes": vram // 2})
    print(json.dumps({"halve_status": status, "halve_seconds": took, "shares": [(s["name"], s["grant_bytes"], s["streamed_groups"]) for s in out.get("models", [])]}), flush=True)
    for t in ts:
        t.join()
    for m in names:
        ttft, secs, n = done[m]
        row = {"phase": "halving", "model": m, "ttft_s": ttft, "decode_tok_s": (n - 1) / secs if secs > 0 else 0, "tokens": n}
        rows.append(row)
        print(json.dumps(row), flush=True)
    # After the halving, each alone again (the other idle).
    for m in names:
        ttft, secs, n = request(url, m, [3 + rng.randrange(vocab - 3) for _ in range(32)], 64)
        row = {"phase": "halved", "model": m, "ttft_s": ttft, "decode_tok_s": (n - 1) / secs if secs > 0 else 0, "tokens": n}
        rows.append(row)
        print(json.dumps(row), flush=True)
    _, out, _ = admin(url, "GET")
    print(json.dumps({"budget": out.get("vram_bytes"), "moves": out.get("moves")}))
    for r in rows:
        print(f"{r['phase']:8s} {r['model']:24s} TTFT {r['ttft_s']:.3f} s  decode {r['decode_tok_s']:7.2f} tok/s  tokens {r['tokens']}")


if __name__ == "__main__":
    main()
