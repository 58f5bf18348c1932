"""Random tokenizer.json pipelines over testdata/hf's vocabularies, with
random added tokens, and HF's answers for random strings from oracle.js:
a directory that TestHFDir reads (see README.md).

  python3 tokenizer/testdata/hfnode/random.py OUT SEED [FILES]

Left out because memwall differs from HF there on purpose or HF fails:
a Strip normalizer (HF 0.23.2 hangs or aborts on some strings with added
tokens); any normalizer before a Metaspace with prepend_scheme "first" (HF
calls a piece first when its first character comes from offset 0 of the
input, so after Prepend every piece of the prepended text is first, and
after a deletion at the start none is, nor after a Split that removed the
start; memwall calls the first piece first);
ByteLevel twice, or together with Metaspace; Fuse before ByteFallback (a
decode of fewer ids is then no prefix of the decode of more, which HF's
DecodeStream reports as an error and StreamDecoder cannot stream).
"""
import copy
import gzip
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "hf")
L3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
NORMS = [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
         {"type": "Replace", "pattern": {"String": "\n"}, "content": "▁"}, {"type": "Replace", "pattern": {"String": "ab"}, "content": "ba"}]
BYTELEVEL = [{"type": "ByteLevel", "add_prefix_space": True, "use_regex": True, "trim_offsets": True},
             {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False, "trim_offsets": True}]
METASPACE = [{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
             {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}]
SPLITS = [{"type": "Split", "pattern": {"Regex": L3}, "behavior": "Isolated", "invert": False},
          {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
          {"type": "Split", "pattern": {"String": "a"}, "behavior": "MergedWithNext", "invert": True},
          {"type": "Split", "pattern": {"String": "b"}, "behavior": "Contiguous", "invert": False},
          {"type": "Split", "pattern": {"String": "▁"}, "behavior": "MergedWithPrevious", "invert": False},
          {"type": "Digits", "individual_digits": True}, {"type": "Digits", "individual_digits": False}]
DECS = [{"type": "ByteLevel"}, {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 1},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True}]
FRAG = [" ", "  ", "\t", "\n", "a", "ab", "b", "Hello", "the", "12", "345", "Ⅳ", "²", "'s", "'LL", "é", "中文", "👍",
        "▁", "<0x41>", "\u200d", "x y", "\r\n", ".", "!!"]
ADDED = ["<x>", " y", "z ", "ab", "<S>", "▁q", "  "]


def pipeline(r):
    pres = [copy.deepcopy(r.choice(SPLITS)) for _ in range(r.randint(0, 2))]
    k = r.random()
    if k < 0.35:
        pres.insert(r.randint(0, len(pres)), copy.deepcopy(r.choice(BYTELEVEL)))
    elif k < 0.7:
        pres.insert(r.randint(0, len(pres)), copy.deepcopy(r.choice(METASPACE)))
    norms = [copy.deepcopy(r.choice(NORMS)) for _ in range(r.randint(0, 3))]
    if any(p.get("prepend_scheme") == "first" for p in pres):
        norms = []  # see the module doc
        pres = [p for p in pres if p.get("behavior") != "Removed" and not p.get("invert")]
    decs = [copy.deepcopy(r.choice(DECS)) for _ in range(r.randint(0, 3))]
    kinds = [d["type"] for d in decs]
    if "Fuse" in kinds and "ByteFallback" in kinds[kinds.index("Fuse"):]:
        decs = [d for d in decs if d["type"] != "Fuse"]  # see the module doc
    return norms, pres, decs


def main():
    out, seed = sys.argv[1], int(sys.argv[2])
    nfiles = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    r = random.Random(seed)
    lines = []
    for n in range(nfiles):
        base = r.choice(["gpt2", "llama2", "llama3"])
        with open(os.path.join(SRC, base, "tokenizer.json"), encoding="utf-8") as f:
            d = json.load(f)
        norms, pres, decs = pipeline(r)
        d["normalizer"] = {"type": "Sequence", "normalizers": norms} if norms else None
        d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": pres} if pres else None
        d["decoder"] = {"type": "Sequence", "decoders": decs} if decs else None
        nid = max(max(d["model"]["vocab"].values()), max([a["id"] for a in d["added_tokens"]] or [0])) + 1
        for i, c in enumerate(r.sample(ADDED, r.randint(0, 4))):
            d["added_tokens"].append({"id": nid + i, "content": c, "single_word": r.random() < .3,
                                      "lstrip": r.random() < .3, "rstrip": r.random() < .3,
                                      "normalized": r.random() < .5, "special": r.random() < .5})
        name = "r%d-%d-%s" % (seed, n, base)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        path = os.path.join(out, name, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(d, f, ensure_ascii=False)
        texts = ["".join(r.choice(FRAG + ADDED) for _ in range(r.randint(1, 10))) for _ in range(1000)]
        ids = [[r.randrange(nid + 5) for _ in range(r.randint(0, 12))] for _ in range(100)]
        req = "\n".join([json.dumps({"text": s}) for s in texts] + [json.dumps({"ids": l}) for l in ids]) + "\n"
        p = subprocess.run(["timeout", "60", "node", os.path.join(HERE, "oracle.js"), path], input=req.encode(),
                           capture_output=True, cwd=HERE)
        if p.returncode != 0:
            print(name, "HF could not load it:", p.stderr.decode()[-200:].strip().splitlines()[-1:])
            continue
        for o in p.stdout.decode().split("\n"):
            if o:
                o = json.loads(o)
                if "error" not in o:
                    o["file"] = name + "/tokenizer.json"
                    lines.append(o)
    with gzip.open(os.path.join(out, "expected.jsonl.gz"), "wt", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(len(lines), "lines")


if __name__ == "__main__":
    main()
