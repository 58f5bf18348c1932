#!/usr/bin/env python3
"""GPU check of `memwall run` against transformers (issue 15), run by
scripts/gpu/engine.sh on the GPU machine.

Phase 1 runs memwall (this process does not touch the GPU then, so that
nvidia-smi's memory.used during the 7B run is memwall's alone); phase 2 loads
the same files in transformers' LlamaForCausalLM (bf16 or f16 as the model
is, on the GPU) and compares:

- tokens, position by position: transformers' logits are computed with one
  forward over prompt + memwall's tokens (teacher forcing), and a position
  agrees when memwall's token is transformers' argmax there. A position where
  transformers' best logit exceeds its logit for memwall's token by less than
  MARGIN is a near-tie and is skipped (counted apart); anything else is a
  mismatch. transformers' own greedy generate is reported too (how many
  leading tokens equal memwall's).
- the first step's logits (memwall --logits-out vs transformers at the last
  prompt position): max abs difference and cosine similarity.

Also: GGUF vs safetensors tokens for the tiny models, streaming (a --vram
just above the minimum memwall states) vs resident, compute-sanitizer memcheck
and racecheck on a short tiny run; in full mode the 7B-shaped models at
--vram 8GiB with nvidia-smi sampled every 100 ms and `memwall fit`'s
prediction. Everything has a timeout; results go to OUT/results.json and a
table is printed last.
"""
import argparse
import gc
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time

MARGIN = 0.1  # logits; the synthetic models' logits have a standard deviation of about 1.8
GEMM_TFLOPS = 790  # cuBLASLt bf16 on the 7B's prefill shapes, H200 (kernels check, BENCHMARKS.md)


def log(*a):
    print(*a, flush=True)


def sh(cmd, timeout, out_path=None, env=None):
    """Runs cmd; returns (rc, stdout, stderr, seconds). Never raises."""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, so, se = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout after %ds" % timeout
    except OSError as e:
        rc, so, se = 127, "", str(e)
    dt = time.time() - t0
    if out_path:
        with open(out_path, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n# rc=%d %.1fs\n%s\n--- stderr\n%s\n" % (rc, dt, so, se))
    return rc, so, se, dt


def prompt_ids(n, vocab, seed):
    r = random.Random(seed)
    return [r.randrange(3, vocab) for _ in range(n)]


class Check:
    def __init__(self, a):
        self.bin, self.out, self.models, self.mode = a.bin, a.out, a.models, a.mode
        self.model7b = a.model7b
        self.device = a.device
        self.no_hf = a.no_hf
        self.testing = bool(a.big_presets)  # small stand-ins: small budgets and copies
        self.rows = []      # table rows
        self.results = {}   # everything, for results.json
        self.hf_jobs = []   # (name, model dir, dtype, prompt, memwall json)
        self.rows16, self.first, self.gaps = {}, {}, {}  # per run, from compare for noise
        self.failed = False

    def fail(self, msg):
        log("FAIL:", msg)
        self.failed = True

    # -- models ---------------------------------------------------------
    def gen(self, preset, out, timeout=240):
        if os.path.exists(out):
            return True
        os.makedirs(os.path.dirname(out), exist_ok=True)
        rc, so, se, dt = sh([self.bin, "gen-model", "--preset", preset, "--out", out, "--json"], timeout,
                            os.path.join(self.out, "gen-%s-%s.txt" % (preset, os.path.basename(out))))
        log("gen-model %s -> %s: rc=%d %.1fs" % (preset, out, rc, dt))
        if rc != 0:
            self.fail("gen-model %s: %s" % (preset, se.strip()[-300:]))
        return rc == 0

    # -- memwall runs ---------------------------------------------------
    def run(self, name, model, ids, max_new, vram=None, extra=(), timeout=120, smi=False, env=None):
        """One memwall run; returns its JSON (or None) and stderr. env: extra
        environment variables."""
        logits = os.path.join(self.out, name + ".logits.f32")
        cmd = [self.bin, "run", model, "--device", self.device, "--prompt-ids", ",".join(map(str, ids)),
               "--max-new", str(max_new), "--ignore-eos", "--json", "--logits-out", logits] + list(extra)
        if vram:
            cmd += ["--vram", vram]
        sampler = None
        smi_path = os.path.join(self.out, name + ".smi.csv")
        if smi and shutil.which("nvidia-smi"):
            self.results.setdefault(name, {})["smi_baseline_mib"] = smi_used()
            try:
                sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "100"],
                                           stdout=open(smi_path, "w"), stderr=subprocess.DEVNULL)
            except OSError as e:
                log("nvidia-smi sampling: %s" % e)
        rc, so, se, dt = sh(cmd, timeout, os.path.join(self.out, name + ".txt"), env=dict(os.environ, **env) if env else None)
        if sampler:
            time.sleep(0.2)
            sampler.terminate()
            try:
                sampler.wait(5)
            except subprocess.TimeoutExpired:
                sampler.kill()
            samples = []
            for line in open(smi_path):
                try:
                    samples.append(int(line.strip().split()[0]))
                except (ValueError, IndexError):
                    pass
            r = self.results.setdefault(name, {})
            r["smi_peak_mib"] = max(samples) if samples else None
            r["smi_samples"] = len(samples)
        log("run %s: rc=%d %.1fs" % (name, rc, dt))
        self.save()
        if rc != 0:
            return None, se
        try:
            j = json.loads(so)
        except ValueError:
            self.fail("%s: not JSON: %s" % (name, so[:200]))
            return None, se
        j["wall_seconds"] = dt
        j["logits_file"] = logits
        self.results.setdefault(name, {}).update({k: j[k] for k in j if k not in ("prompt_ids",)})
        return j, se

    def minimum_vram(self, name, model, ids, extra=()):
        """The smallest --vram memwall accepts, from its error at 1 byte."""
        _, se = self.run(name + "-min", model, ids, 64, vram="1", extra=extra, timeout=60)
        m = re.search(r"below the minimum (\d+) bytes", se)
        return int(m.group(1)) if m else None

    def tiny(self, preset, dtype):
        d = os.path.join(self.models, preset)
        st, gg = os.path.join(d, "model.safetensors"), os.path.join(self.models, preset + ".gguf")
        if not (self.gen(preset, st) and self.gen(preset, gg)):
            return
        ids = prompt_ids(32, 768 if preset == "tiny-f16" else 1024, 11)
        chunk = ["--prefill-chunk", "16"]  # prefill in two chunks; a small arena lets a small budget stream
        res, _ = self.run(preset + "-resident", d, ids, 64, vram="4GiB", extra=chunk)
        if res is None:
            return self.fail(preset + " resident run failed")
        self.hf_jobs.append((preset + "-resident", d, dtype, ids, res))
        mn = self.minimum_vram(preset, d, ids, chunk)
        if mn is None:
            self.fail(preset + ": no minimum in the error at --vram 1")
        else:
            for extra in (1 << 20, 0, 4 << 20):
                s, _ = self.run(preset + "-streaming", d, ids, 64, vram=str(mn + extra), extra=chunk)
                if s is not None and s.get("streamed_groups", 0) > 0:
                    break
            if s is not None:
                self.results[preset + "-streaming"]["same_tokens_as_resident"] = s["tokens"] == res["tokens"]
                self.hf_jobs.append((preset + "-streaming", d, dtype, ids, s))
                if s.get("streamed_groups", 0) == 0:
                    self.fail(preset + ": streaming run streamed nothing")
                if s["peak_device_bytes"] > s["budget_bytes"]:
                    self.fail(preset + ": streaming peak above the budget")
        g, _ = self.run(preset + "-gguf", gg, ids, 64, vram="4GiB", extra=chunk)
        if g is not None:
            same = g["tokens"] == res["tokens"]
            self.results[preset + "-gguf"]["same_tokens_as_safetensors"] = same
            first = next((i for i, (a, b) in enumerate(zip(g["tokens"], res["tokens"])) if a != b), None)
            self.results[preset + "-gguf"]["first_difference"] = first
            self.hf_jobs.append((preset + "-gguf", d, dtype, ids, g))
            if not same:
                self.fail("%s: gguf tokens differ from safetensors at %s" % (preset, first))

    def engine_tests(self):
        """The engine package's tests on the GPU (MEMWALL_TEST_DEVICE=cuda):
        tokens and logits against the Go float32 reference of the HF forward,
        GGUF vs safetensors bit for bit, faults freeing every byte."""
        t = os.path.join(os.path.dirname(self.bin), "engine.test")
        if not os.path.exists(t):
            self.results["engine-tests"] = {"rc": None, "summary": "engine.test not built"}
            return
        env = dict(os.environ, MEMWALL_TEST_DEVICE="cuda")
        rc, so, se, dt = sh([t, "-test.run", "TestAgainstReference|TestFormatsAgree|TestSampledSteps|TestLimits|TestGroupedBitIdentical|TestDecodeLaunches|TestProfile|TestResidualNormFused", "-test.v",
                             "-test.timeout", "90s"], 100, os.path.join(self.out, "engine-tests.txt"), env=env)
        fails = re.findall(r"--- FAIL: (\S+)", so + se)
        self.results["engine-tests"] = {"rc": rc, "seconds": dt, "failed": fails}
        log("engine tests on the GPU: rc=%d %.1fs, failed: %s" % (rc, dt, " ".join(fails) or "none"))

    def sanitizer(self, preset):
        d = os.path.join(self.models, preset)
        if shutil.which("compute-sanitizer") is None:
            self.results["sanitizer"] = "compute-sanitizer not found"
            return
        ids = ",".join(map(str, prompt_ids(12, 1024, 3)))
        for tool, new in (("memcheck", 4), ("racecheck", 2)):
            path = os.path.join(self.out, "sanitizer-%s.txt" % tool)
            rc, so, se, dt = sh(["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", self.bin, "run", d, "--device", "cuda",
                                 "--prompt-ids", ids, "--max-new", str(new), "--vram", "2GiB", "--json"], 150, path)
            summ = re.findall(r"(ERROR SUMMARY: .*|RACECHECK SUMMARY: .*)", so + se)
            self.results["sanitizer-" + tool] = {"rc": rc, "seconds": dt, "summary": summ[-1] if summ else ""}
            log("compute-sanitizer %s: rc=%d %.1fs %s" % (tool, rc, dt, summ[-1] if summ else ""))
            if rc != 0:
                self.fail("compute-sanitizer %s rc=%d" % (tool, rc))

    def big(self, preset, dirname, vocab=32000, prefill=2048):
        d = self.model7b if (self.model7b and preset == "llama-7b") else os.path.join(self.models, dirname)
        if d.endswith(".safetensors"):
            d = os.path.dirname(d)
        st = os.path.join(d, "model.safetensors")
        if not self.gen(preset, st, timeout=300):
            return
        ids = prompt_ids(448, vocab, 5)
        name = preset + "-8GiB"
        r, se = self.run(name, d, ids, 64, vram="8GiB", timeout=240, smi=True)
        if r is None:
            return self.fail("%s: %s" % (name, se.strip()[-400:]))
        self.hf_jobs.append((name, d, "bfloat16", ids, r))
        self.fit(name, preset, st, len(ids), 64)
        if prefill:
            # Default flags: the chunk and slots are chosen from the budget.
            p = prompt_ids(prefill, vocab, 6)
            pname = "%s-prefill%d" % (preset, prefill)
            r2, se = self.run(pname, d, p, 2, vram="8GiB", extra=["--timing"], timeout=240, smi=True)
            if r2 is None:
                self.fail("prefill %d: %s" % (prefill, se.strip()[-300:]))
            else:
                self.fit(pname, preset, st, prefill, 2)
                self.prefill_bound(pname, r2, prefill)

    def copy_rate(self):
        """The device's copy bandwidth in this run, the yardstick of decode's
        products: torch copies 1 GiB device to device in a subprocess (this
        process holds no CUDA context, for nvidia-smi's figures), 10 timed
        copies, GB/s = 2 x bytes / median time (each byte read and written).
        Falls back to memwall bench transfer's d2d (same definition)."""
        code = ("import json, torch\n"
                "n = 1 << 30\n"
                "a = torch.empty(n, dtype=torch.uint8, device='cuda'); a.random_(0, 255); b = torch.empty_like(a)\n"
                "for _ in range(3): b.copy_(a)\n"
                "torch.cuda.synchronize(); ts = []\n"
                "for _ in range(10):\n"
                "    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
                "    s.record(); b.copy_(a); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) / 1e3)\n"
                "ts.sort(); assert torch.equal(a[::4093], b[::4093])\n"
                "print(json.dumps({'copy_gbps': 2 * n / ts[len(ts) // 2] / 1e9, 'best_gbps': 2 * n / ts[0] / 1e9, 'source': 'torch copy_ of 1 GiB'}))\n")
        rc, so, se, _ = sh([sys.executable, "-c", code], 90, os.path.join(self.out, "copy-rate.txt"))
        j = None
        if rc == 0:
            try:
                j = json.loads(so.strip().splitlines()[-1])
            except (ValueError, IndexError):
                j = None
        if j is None:
            rc, so, se, _ = sh([self.bin, "bench", "transfer", "--device", self.device, "--size", "64MiB" if self.testing else "1GiB", "--reps", "5", "--json"], 120,
                               os.path.join(self.out, "copy-rate-memwall.txt"))
            try:
                d2d = next(r for r in json.loads(so)["results"] if r["name"] == "d2d")
                j = {"copy_gbps": 2 * d2d["GBps"], "best_gbps": 2 * d2d["best_GBps"], "source": "memwall bench transfer d2d of 1 GiB"}
            except (ValueError, KeyError, StopIteration, TypeError):
                self.fail("copy rate: neither torch nor memwall bench transfer gave one: %s" % se.strip()[-200:])
                return None
        self.results["copy"] = j
        log("device copy: %.0f GB/s (median; best %.0f; %s)" % (j["copy_gbps"], j["best_gbps"], j["source"]))
        return j["copy_gbps"]

    def resident(self, preset, dirname):
        """The 7B model with every weight resident (--vram 20GiB), 384 prompt
        tokens and 128 new ones (512 of context), with --profile: decode tok/s
        and the weight bytes a step's products read per decode time, per
        device step time and per products' time in a profiled step, as % of
        the copy rate measured here; with PDL (MEMWALL_KERNELS_PDL) on and
        off, and with one launch per product (--ungrouped). The variants must
        give the same tokens. About 4 s per run (the 7B model loads from
        /dev/shm in about 2 s), 10 s for the copy rate."""
        d = self.model7b if (self.model7b and preset == "llama-7b") else os.path.join(self.models, dirname)
        if d.endswith(".safetensors"):
            d = os.path.dirname(d)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            return self.fail("resident: no model at %s" % d)
        copy = self.copy_rate()
        ids = prompt_ids(384, 768 if self.testing else 32000, 7)
        variants = [("all-resident", None, []), ("all-resident-pdl-off", {"MEMWALL_KERNELS_PDL": "0"}, []),
                    ("all-resident-ungrouped", None, ["--ungrouped"])]
        first = None
        for suffix, env, extra in variants:
            name = "%s-%s" % (preset, suffix)
            r, se = self.run(name, d, ids, 128, vram="2GiB" if self.testing else "20GiB", extra=["--profile"] + extra, timeout=150, env=env)
            if r is None:
                self.fail("%s: %s" % (name, se.strip()[-400:]))
                continue
            res = self.results[name]
            if r.get("streamed_groups", 0) > 0:
                self.fail("%s: %d groups streamed at 20GiB" % (name, r["streamed_groups"]))
            if first is None:
                first = r["tokens"]
            else:
                res["same_tokens_as_resident"] = r["tokens"] == first
                if r["tokens"] != first:
                    self.fail("%s: tokens differ from the first resident run" % name)
            b = r.get("product_weight_bytes") or 0
            step = r.get("decode_step_device_seconds") or 0
            prof = r.get("decode_profile_seconds") or {}
            if (r.get("decode_profile_queue_seconds") or 0) >= 0.03:
                res["profile_warning"] = "the host queued a profiled step in %.1f ms, past the 30 ms spin (the driver's launch queue holds about a thousand operations): its last segments may hold host gaps" % (
                    r["decode_profile_queue_seconds"] * 1e3)
                log("%s: %s" % (name, res["profile_warning"]))
            if copy and b:
                res["copy_gbps"] = copy
                res["decode_pct_of_copy"] = 100 * b * r["decode_tokens_per_s"] / (copy * 1e9)
                if step:
                    res["step_pct_of_copy"] = 100 * b / step / (copy * 1e9)
                if prof.get("products"):
                    res["products_pct_of_copy"] = 100 * b / prof["products"] / (copy * 1e9)
            want = env is None or env.get("MEMWALL_KERNELS_PDL") != "0"
            if r.get("kernels_overlap") is not None and r["kernels_overlap"] != want:
                res["overlap_warning"] = "kernels_overlap %s, expected %s" % (r["kernels_overlap"], want)
                log("%s: %s" % (name, res["overlap_warning"]))
            log("%s: decode %.2f tok/s (%.1f%% of copy), device step %.1f us (%.1f%%), profiled step %.1f us: %s; products %.1f%% of copy" % (
                name, r["decode_tokens_per_s"], res.get("decode_pct_of_copy", 0), step * 1e6, res.get("step_pct_of_copy", 0),
                (r.get("decode_profile_step_seconds") or 0) * 1e6, " ".join("%s %.1f us" % (k, v * 1e6) for k, v in sorted(prof.items())),
                res.get("products_pct_of_copy", 0)))
            ops = r.get("decode_profile_ops") or {}
            segs = r.get("decode_profile_segments") or 0
            if ops and segs and step:
                # The profile's cost per op: the profiled step (an event
                # before every op) less the unprofiled one (no events), over
                # its segments. "Net" figures take that cost off every op.
                cost = ((r.get("decode_profile_step_seconds") or 0) - step) / segs
                res["profile_cost_per_op_us"] = cost * 1e6

                def net(v):
                    return max(v["seconds"] - v["count"] * cost, 1e-12)

                def op_text(k, v):
                    t = "%s %d x %.1f us (net %.1f)" % (k, v["count"], v["seconds"] / max(v["count"], 1) * 1e6, net(v) / max(v["count"], 1) * 1e6)
                    if v.get("weight_bytes") and v["seconds"] > 0 and copy:
                        t += " %.0f%% of copy net" % (100 * v["weight_bytes"] / net(v) / (copy * 1e9))
                    return t
                res["profile_ops_line"] = "; ".join(op_text(k, v) for k, v in sorted(ops.items(), key=lambda kv: -kv[1]["seconds"]))
                classes = {}
                for v in ops.values():
                    classes[v.get("class", "?")] = classes.get(v.get("class", "?"), 0) + net(v)
                res["profile_net_classes_us"] = {k: v * 1e6 for k, v in classes.items()}
                prod = [v for v in ops.values() if v.get("weight_bytes")]
                pb, pt = sum(v["weight_bytes"] for v in prod), sum(net(v) for v in prod)
                if copy and pt > 0:
                    res["products_net_pct_of_copy"] = 100 * pb / pt / (copy * 1e9)
                log("%s: %d ops, profile cost %.2f us per op; net per class %s; products %.1f%% of copy net: %s" % (
                    name, segs, cost * 1e6, " ".join("%s %.0f us" % kv for kv in sorted(res["profile_net_classes_us"].items())),
                    res.get("products_net_pct_of_copy", 0), res["profile_ops_line"]))
            self.save()

    def fit(self, name, preset, st, prompt, max_new):
        """memwall fit's prediction for the run `name` (the same plan)."""
        rc, so, se, _ = sh([self.bin, "fit", st, "--vram", "8GiB", "--prompt-tokens", str(prompt), "--max-new", str(max_new),
                            "--device", self.device, "--json"], 120, os.path.join(self.out, name + "-fit.txt"))
        if rc != 0:
            return self.fail("%s: fit rc=%d: %s" % (name, rc, se.strip()[-300:]))
        try:
            f = json.loads(so)
        except ValueError:
            return self.fail("%s: fit printed no JSON" % name)
        r = self.results[name]
        r["fit_predicted_peak_bytes"] = f.get("predicted_peak_bytes")
        r["model_bytes"] = f.get("model_bytes")
        # The same computation in two processes: equal up to what the two
        # processes' measured loaded bytes (modules, cuBLASLt) differ by.
        r["fit_minus_run_plan_bytes"] = (f.get("predicted_peak_bytes") or 0) - (r.get("predicted_peak_bytes") or 0)
        r["fit_equals_run_plan"] = r["fit_minus_run_plan_bytes"] == 0
        if abs(r["fit_minus_run_plan_bytes"]) > 8 << 20:
            self.fail("%s: fit predicted %s, run planned %s" % (name, f.get("predicted_peak_bytes"), r.get("predicted_peak_bytes")))
        smi = r.get("smi_peak_mib")
        if smi is not None:
            used = smi - (r.get("smi_baseline_mib") or 0)
            r["fit_vs_smi"] = f["predicted_peak_bytes"] / 2**20 / max(used, 1)
            if used > r["budget_bytes"] / 2**20:
                self.fail("%s: nvidia-smi %d MiB above the budget %d MiB" % (name, used, r["budget_bytes"] / 2**20))
            if abs(r["fit_vs_smi"] - 1) > 0.05:
                self.fail("%s: fit %.0f MiB vs nvidia-smi %d MiB: more than 5%% apart" % (name, f["predicted_peak_bytes"] / 2**20, used))

    def prefill_bound(self, name, r, prompt):
        """The prefill's device time against max(weight copies, products at
        GEMM_TFLOPS over the model's parameters), the issue's 1.15x goal."""
        res = self.results[name]
        params = (res.get("model_bytes") or 0) / 2  # bf16
        gemm = 2.0 * params * prompt / (GEMM_TFLOPS * 1e12)
        copy = r.get("prefill_copy_seconds") or 0
        dev = r.get("prefill_device_seconds") or 0
        bound = max(copy, gemm)
        res["prefill_gemm_seconds"] = gemm
        res["gemm_tflops_assumed"] = GEMM_TFLOPS
        if bound > 0 and dev > 0:
            res["prefill_device_over_bound"] = dev / bound
            res["prefill_wall_over_bound"] = r["prefill_seconds"] / bound
            log("%s: prefill %.4f s on the device (%.4f s wall), copies %.4f s, products %.4f s at %d TFLOP/s: %.3fx the bound (chunk %s, %s slots)" % (
                name, dev, r["prefill_seconds"], copy, gemm, GEMM_TFLOPS, dev / bound, r.get("prefill_chunk"), r.get("slots")))
            if dev / bound > 1.15 and r.get("streamed_groups", 0) > 0:
                self.fail("%s: prefill %.4f s on the device is %.3fx max(copies %.4f s, products %.4f s)" % (name, dev, dev / bound, copy, gemm))
        else:
            self.fail("%s: no prefill timing (--timing)" % name)

    # -- transformers ---------------------------------------------------
    def hf(self):
        if self.no_hf:
            return
        try:
            import torch
            from transformers import LlamaForCausalLM
        except Exception as e:  # noqa: BLE001 — report, do not crash
            self.fail("transformers unavailable: %s" % e)
            return

        def load(d, dtype):
            t0 = time.time()
            dt = getattr(torch, dtype)
            m = None
            for kw in ({"dtype": dt, "device_map": "cuda"}, {"dtype": dt}, {"torch_dtype": dt}):
                try:
                    m = LlamaForCausalLM.from_pretrained(d, **kw)
                    break
                except (TypeError, ImportError, ValueError) as e:
                    log("from_pretrained(%s): %r; trying without it" % (", ".join(kw), e))
            if m is None:
                raise RuntimeError("transformers could not load " + d)
            m = m.to("cuda").eval()
            log("transformers loaded %s (%s) in %.1fs" % (d, dtype, time.time() - t0))
            return m

        groups = {}
        for job in self.hf_jobs:
            groups.setdefault((job[1], job[2]), []).append(job)
        for (d, dtype), jobs in groups.items():
            m = None
            try:
                m = load(d, dtype)
                for name, _, _, ids, res in jobs:
                    self.compare(name, m, ids, res, torch)
                # The reference's own noise: the same weights in float32.
                m = None
                gc.collect()
                torch.cuda.empty_cache()
                m = load(d, "float32")
                for name, _, _, ids, res in jobs:
                    self.noise(name, m, ids, res, torch)
            except Exception as e:  # noqa: BLE001
                self.fail("%s: transformers: %r" % (d, e))
            m = None
            gc.collect()
            torch.cuda.empty_cache()

    def noise(self, name, m32, ids, res, torch):
        """transformers in float32 on memwall's sequence: how far its bf16 run
        (the reference) is from it, and memwall."""
        r = self.results[name]
        rows16 = self.rows16.pop(name, None)
        if rows16 is None:
            return
        toks = res["tokens"]
        seq = torch.tensor([ids + toks[:-1]], device="cuda")
        with torch.no_grad():
            rows32 = m32(input_ids=seq).logits[0].float()[len(ids) - 1:]
        first = self.first.pop(name)
        b32, b16 = rows32.argmax(dim=-1), rows16.argmax(dim=-1)
        mine = torch.tensor(toks, device="cuda")
        r["hf16_vs_hf32_first_max_abs_diff"] = float((rows16[0] - rows32[0]).abs().max())
        r["hf16_vs_hf32_first_cosine"] = float(torch.nn.functional.cosine_similarity(rows16[0], rows32[0], dim=0))
        r["hf16_vs_hf32_flips"] = int((b16 != b32).sum())
        r["memwall_vs_hf32_first_max_abs_diff"] = float((first - rows32[0]).abs().max())
        r["memwall_vs_hf32_first_cosine"] = float(torch.nn.functional.cosine_similarity(first, rows32[0], dim=0))
        r["memwall_vs_hf32_agree"] = int((mine == b32).sum())
        # memwall against HF-bf16 with the margin stated as HF's own bf16
        # noise: the first step's max |bf16 - fp32| logit difference.
        noise = max(MARGIN, r["hf16_vs_hf32_first_max_abs_diff"])
        r["reference_noise_margin"] = noise
        r["mismatches_beyond_reference_noise"] = int(((self.gaps.pop(name)) >= noise).sum())
        log("%s: transformers bf16 vs fp32: first logits max diff %.4f cos %.6f, %d/%d argmax flips; memwall vs fp32: max diff %.4f cos %.6f, %d/%d agree; memwall vs bf16 beyond that noise (%.3f): %d" % (
            name, r["hf16_vs_hf32_first_max_abs_diff"], r["hf16_vs_hf32_first_cosine"], r["hf16_vs_hf32_flips"], len(toks),
            r["memwall_vs_hf32_first_max_abs_diff"], r["memwall_vs_hf32_first_cosine"], r["memwall_vs_hf32_agree"], len(toks),
            noise, r["mismatches_beyond_reference_noise"]))
        self.save()

    def compare(self, name, m, ids, res, torch):
        toks = res["tokens"]
        seq = torch.tensor([ids + toks[:-1]], device="cuda")
        with torch.no_grad():
            logits = m(input_ids=seq).logits[0].float()
        rows = logits[len(ids) - 1:]
        best = rows.argmax(dim=-1)
        mine = torch.tensor(toks, device="cuda")
        lb = rows.gather(1, best[:, None])[:, 0]
        lm = rows.gather(1, mine[:, None])[:, 0]
        agree = (best == mine)
        gap = lb - lm
        # The first step's logits.
        first = torch.tensor(list(struct.unpack("<%df" % (os.path.getsize(res["logits_file"]) // 4),
                                                open(res["logits_file"], "rb").read())), device="cuda")
        ref = rows[0]
        r = self.results[name]
        r["first_logits_max_abs_diff"] = float((first - ref).abs().max())
        r["first_logits_cosine"] = float(torch.nn.functional.cosine_similarity(first, ref, dim=0))
        r["first_logits_max_abs"] = float(ref.abs().max())
        # Near-ties at the stated margin, and at the measured noise: the
        # first step's largest logit difference (bf16 rounding in a different
        # order grows with depth; a 32-layer model's exceeds MARGIN).
        noise = max(MARGIN, r["first_logits_max_abs_diff"])
        near = (~agree) & (gap < MARGIN)
        bad = (~agree) & ~near
        r["positions"] = len(toks)
        r["agree"] = int(agree.sum())
        r["near_ties"] = int(near.sum())
        r["mismatches"] = int(bad.sum())
        r["first_mismatch"] = int(bad.nonzero()[0][0]) if bool(bad.any()) else None
        r["noise_margin"] = noise
        r["mismatches_beyond_noise"] = int(((~agree) & (gap >= noise)).sum())
        self.rows16[name], self.first[name] = rows, first
        self.gaps[name] = torch.where(agree, torch.zeros_like(gap), gap)
        # transformers' own greedy tokens.
        with torch.no_grad():
            g = m.generate(torch.tensor([ids], device="cuda"), max_new_tokens=len(toks), min_new_tokens=len(toks),
                           do_sample=False, pad_token_id=0)
        hg = g[0, len(ids):].tolist()
        r["hf_greedy_same_prefix"] = next((i for i, (a, b) in enumerate(zip(hg, toks)) if a != b), min(len(hg), len(toks)))
        log("%s: %d/%d agree, %d near-ties, %d mismatches at %.2f (%d beyond the noise %.3f); first logits max diff %.4f cos %.6f; greedy prefix %d" % (
            name, r["agree"], len(toks), r["near_ties"], r["mismatches"], MARGIN, r["mismatches_beyond_noise"], noise,
            r["first_logits_max_abs_diff"], r["first_logits_cosine"], r["hf_greedy_same_prefix"]))
        if r["mismatches_beyond_noise"]:
            self.fail("%s: %d mismatches beyond the noise margin %.3f (first at %s)" % (
                name, r["mismatches_beyond_noise"], noise, r["first_mismatch"]))
        self.save()

    def save(self):
        """Writes what is known so far, so that a run killed by an outer
        time limit still leaves its figures."""
        try:
            with open(os.path.join(self.out, "results.json"), "w") as f:
                json.dump(self.results, f, indent=1, default=str)
            with open(os.path.join(self.out, "table.txt"), "w") as f:
                f.write(self.table() + "\n")
        except Exception as e:  # noqa: BLE001
            log("saving results: %r" % e)

    # -- report ---------------------------------------------------------
    def table(self):
        hdr = "%-26s %6s %5s %4s %4s %9s %9s %9s %8s %9s %9s %9s" % (
            "run", "tokens", "agree", "near", "bad", "maxdiff", "cosine", "prefill/s", "decode/s", "peak MiB", "smi MiB", "budget")
        lines = [hdr, "-" * len(hdr)]
        for name, r in self.results.items():
            if not isinstance(r, dict) or "tokens" not in r:
                continue
            smi = ""
            if r.get("smi_peak_mib") is not None:
                smi = "%d" % (r["smi_peak_mib"] - (r.get("smi_baseline_mib") or 0))
            lines.append("%-26s %6d %5s %4s %4s %9s %9s %9.1f %8.2f %9.0f %9s %9.0f" % (
                name, len(r["tokens"]), r.get("agree", "-"), r.get("near_ties", "-"), r.get("mismatches", "-"),
                "%.4f" % r["first_logits_max_abs_diff"] if "first_logits_max_abs_diff" in r else "-",
                "%.6f" % r["first_logits_cosine"] if "first_logits_cosine" in r else "-",
                r["prefill_tokens_per_s"], r["decode_tokens_per_s"], r["peak_device_bytes"] / 2**20, smi,
                r["budget_bytes"] / 2**20))
        for k in ("tiny-streaming", "tiny-f16-streaming"):
            if k in self.results and "tokens" in self.results[k]:
                r = self.results[k]
                lines.append("%s: %s of %s groups streamed, %.1f MiB per token; same tokens as resident: %s" % (
                    k, r.get("streamed_groups"), r.get("groups"), r.get("streamed_bytes_per_token", 0) / 2**20,
                    r.get("same_tokens_as_resident")))
        for k in ("tiny-gguf", "tiny-f16-gguf"):
            if k in self.results:
                lines.append("%s: same tokens as safetensors: %s" % (k, self.results[k].get("same_tokens_as_safetensors")))
        for name, r in self.results.items():
            if isinstance(r, dict) and r.get("fit_predicted_peak_bytes"):
                lines.append("%s: fit predicted %.0f MiB (minus run's plan: %s B), memwall peak %.0f MiB, nvidia-smi %s MiB (fit/smi %s), budget %.0f MiB" % (
                    name, r["fit_predicted_peak_bytes"] / 2**20, r.get("fit_minus_run_plan_bytes"), r["peak_device_bytes"] / 2**20,
                    r.get("smi_peak_mib", 0) - (r.get("smi_baseline_mib") or 0) if r.get("smi_peak_mib") else "-",
                    "%.4f" % r["fit_vs_smi"] if "fit_vs_smi" in r else "-", r["budget_bytes"] / 2**20))
        for name, r in self.results.items():
            if isinstance(r, dict) and r.get("prefill_device_seconds"):
                lines.append("%s: prefill %.4f s wall, %.4f s on the compute stream, weight copies %.4f s of device time, products %.4f s at %s TFLOP/s: device/bound %.3f, wall/bound %.3f (chunk %s%s, %s slots%s)" % (
                    name, r["prefill_seconds"], r["prefill_device_seconds"], r.get("prefill_copy_seconds", 0), r.get("prefill_gemm_seconds", 0),
                    r.get("gemm_tflops_assumed", "-"), r.get("prefill_device_over_bound", 0), r.get("prefill_wall_over_bound", 0),
                    r.get("prefill_chunk"), " chosen" if r.get("prefill_chunk_chosen") else "", r.get("slots"), " chosen" if r.get("slots_chosen") else ""))
        for name, r in self.results.items():
            if isinstance(r, dict) and r.get("decode_step_device_seconds"):
                prof = r.get("decode_profile_seconds") or {}
                lines.append("%s (PDL %s): decode %.2f tok/s = %.1f%% of copy (%s GB/s); unprofiled device step %.1f us = %.1f%% (queued in %.1f ms); profiled step: %s; products %.1f%% of copy%s" % (
                    name, "on" if r.get("kernels_overlap") else "off", r["decode_tokens_per_s"], r.get("decode_pct_of_copy", 0), "%.0f" % r["copy_gbps"] if r.get("copy_gbps") else "-",
                    r["decode_step_device_seconds"] * 1e6, r.get("step_pct_of_copy", 0), (r.get("decode_profile_queue_seconds") or 0) * 1e3,
                    " ".join("%s %.0f us" % (k, v * 1e6) for k, v in sorted(prof.items())), r.get("products_pct_of_copy", 0),
                    "" if r.get("same_tokens_as_resident", True) else "; TOKENS DIFFER"))
                if r.get("profile_ops_line"):
                    lines.append("  %s net of the profile's %.2f us per op ((profiled - unprofiled step) / ops): products %.1f%% of copy; classes %s" % (
                        name, r.get("profile_cost_per_op_us", 0), r.get("products_net_pct_of_copy", 0),
                        " ".join("%s %.0f us" % kv for kv in sorted((r.get("profile_net_classes_us") or {}).items()))))
                    lines.append("  %s ops: %s" % (name, r["profile_ops_line"]))
        disabled = sorted({d for r in self.results.values() if isinstance(r, dict) for d in (r.get("kernels_disabled") or [])})
        if disabled:
            lines.append("kernels turned off by their load-time self-test: " + "; ".join(disabled))
        for t in ("memcheck", "racecheck"):
            if "sanitizer-" + t in self.results:
                s = self.results["sanitizer-" + t]
                lines.append("compute-sanitizer %s: rc=%s %s" % (t, s["rc"], s["summary"]))
        if "engine-tests" in self.results:
            r = self.results["engine-tests"]
            lines.append("engine package tests on the GPU (vs the Go reference): rc=%s failed: %s" % (
                r.get("rc"), " ".join(r.get("failed") or []) or "none"))
        for name, r in self.results.items():
            if isinstance(r, dict) and "hf16_vs_hf32_first_max_abs_diff" in r:
                lines.append("%s: transformers bf16 vs fp32 (the reference's own noise): first max diff %.3f cos %.6f, %d argmax flips; memwall vs fp32: %.3f cos %.6f, %d/%d agree; memwall vs bf16 beyond that noise: %d" % (
                    name, r["hf16_vs_hf32_first_max_abs_diff"], r["hf16_vs_hf32_first_cosine"], r["hf16_vs_hf32_flips"],
                    r["memwall_vs_hf32_first_max_abs_diff"], r["memwall_vs_hf32_first_cosine"], r["memwall_vs_hf32_agree"],
                    r["positions"], r["mismatches_beyond_reference_noise"]))
        for name, r in self.results.items():
            if isinstance(r, dict) and r.get("mismatches"):
                lines.append("%s: %d positions differ by more than %.2f; %d by more than the first step's max logit difference %.3f" % (
                    name, r["mismatches"], MARGIN, r["mismatches_beyond_noise"], r["noise_margin"]))
        lines.append("margin for near-ties: %.2f logits (fails only beyond the first step's own max difference); result: %s" % (
            MARGIN, "FAIL" if self.failed else "ok"))
        return "\n".join(lines)


def smi_used():
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        return int(p.stdout.strip().split()[0])
    except Exception:  # noqa: BLE001
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--mode", choices=["quick", "7b", "full"], default="quick")
    ap.add_argument("--model7b", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers (to test the script without torch)")
    ap.add_argument("--big-presets", default="", help="presets standing in for the 7B models (to test the script)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    c = Check(a)
    t0 = time.time()
    c.tiny("tiny", "bfloat16")
    c.tiny("tiny-f16", "float16")
    if a.device == "cuda":
        c.sanitizer("tiny")
        c.engine_tests()
    if a.mode in ("full", "7b"):
        if a.big_presets:  # testing the script: small presets stand in for the 7B ones
            for p in a.big_presets.split(","):
                c.big(p, p + "-big", vocab=768, prefill=200)
            p = a.big_presets.split(",")[0]
            c.resident(p, p + "-big")
        else:
            c.big("llama-7b", "llama-7b")
            c.resident("llama-7b", "llama-7b")
            if a.mode == "full":
                c.big("llama3-8b-shape", "llama3-8b-shape", prefill=0)
    c.hf()
    c.results["seconds"] = time.time() - t0
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(c.results, f, indent=1, default=str)
    print()
    tab = c.table()
    with open(os.path.join(a.out, "table.txt"), "w") as f:
        f.write(tab + "\n")
    print(tab)
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
