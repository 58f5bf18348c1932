# Differential oracle for the hand-written GPT-2 and Llama-3 split matchers
# (see README.md): python3 split-oracle.py scripts/gpu/tokenizer-check.py
# Python's backtracking re with \p{L}, \p{N}, \s spelled out as classes over
# the characters that occur in the strings.
import importlib.util, json, re, sys, unicodedata, random
spec = importlib.util.spec_from_file_location("chk", sys.argv[1])
chk = importlib.util.module_from_spec(spec); spec.loader.exec_module(chk)
tests = chk.make_tests(["<|endoftext|>", "<s>"])
r = random.Random(7)
# extra random strings over a small alphabet that stresses the patterns
alpha = list("aZ09 \t\n\r'sStTlLdDmMrReEvVſ!?.,-_\u00a0\u3000\u2028é\u0301字٣²Ⅻ😀\u200d")
for _ in range(1500):
    tests.append("".join(r.choice(alpha) for _ in range(r.randint(1, 14))))
WS = [chr(c) for c in (9,10,11,12,13,32,0x85,0xa0,0x1680,0x2028,0x2029,0x202f,0x205f,0x3000)] + [chr(c) for c in range(0x2000,0x200b)]
chars = sorted(set("".join(tests)) | set(WS) | set("sStTlLdDmMrReEvV"))
def cls(pred):
    return "".join(re.escape(c) for c in chars if pred(c))
L = cls(lambda c: unicodedata.category(c).startswith("L"))
N = cls(lambda c: unicodedata.category(c).startswith("N"))
S = "".join(re.escape(c) for c in WS)
pats = {
 "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?[%s]+| ?[%s]+| ?[^%s%s%s]+|[%s]+(?![^%s])|[%s]+" % (L, N, S, L, N, S, S, S),
 "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n%s%s]?[%s]+|[%s]{1,3}| ?[^%s%s%s]+[\r\n]*|[%s]*[\r\n]+|[%s]+(?![^%s])|[%s]+" % (L, N, L, N, S, L, N, S, S, S, S),
}
out = []
for name, p in pats.items():
    rx = re.compile(p)
    for s in tests:
        out.append({"pattern": name, "text": s, "pieces": [m.group(0) for m in rx.finditer(s)]})
json.dump(out, sys.stdout, ensure_ascii=False)
print(file=sys.stderr, end="%d cases, unicodedata %s\n" % (len(out), unicodedata.unidata_version))
