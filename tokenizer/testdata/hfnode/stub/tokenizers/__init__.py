"""A stand-in for the part of HF tokenizers' Python API that
scripts/gpu/tokenizer-check.py uses, answered by the package's Node.js
binding (the same Rust library) through ../../server.js.

It does not train: train_from_iterator loads the already trained file of
that kind from $HF_BASE (tokenizer/testdata/hf), chosen by the trainer's
first special token. Everything after training (the variants, the test
strings, the ids and decodes) is computed as in the real run.
"""
import json
import os
import subprocess

__version__ = "0.23.2 (Node.js binding)"
_HERE = os.path.dirname(os.path.abspath(__file__))
_SERVER = os.path.join(_HERE, "..", "..", "server.js")
_proc = None


def _call(**req):
    global _proc
    if _proc is None:
        _proc = subprocess.Popen(["node", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 cwd=os.path.dirname(_SERVER))
    _proc.stdin.write((json.dumps(req) + "\n").encode())
    _proc.stdin.flush()
    res = json.loads(_proc.stdout.readline())
    if "error" in res:
        raise RuntimeError(res["error"])
    return res


class _Encoding:
    def __init__(self, ids):
        self.ids = ids


class Tokenizer:
    pre_tokenizer = None  # the pieces are not recorded here

    def __init__(self, handle, text):
        self._h, self._text = handle, text

    @staticmethod
    def from_str(s):
        return Tokenizer(_call(op="from_str", s=s)["h"], s)

    @staticmethod
    def from_file(path):
        with open(path, encoding="utf-8") as f:
            return Tokenizer.from_str(f.read())

    def save(self, path):
        _call(op="save", h=self._h, path=os.path.abspath(path))

    def to_str(self):
        return self._text

    def train_from_iterator(self, corpus, trainer=None):
        kind = {"<|endoftext|>": "gpt2", "<|begin_of_text|>": "llama3", "<unk>": "llama2"}[trainer.kw["special_tokens"][0]]
        with open(os.path.join(os.environ["HF_BASE"], kind, "tokenizer.json"), encoding="utf-8") as f:
            t = Tokenizer.from_str(f.read())
        self._h, self._text = t._h, t._text

    def encode(self, s, add_special_tokens=True):
        return _Encoding(_call(op="encode", h=self._h, s=s, add=add_special_tokens)["ids"])

    def decode(self, ids, skip_special_tokens=False):
        return _call(op="decode", h=self._h, ids=ids, skip=skip_special_tokens)["s"]

    def token_to_id(self, t):
        return _call(op="token_to_id", h=self._h, t=t)["id"]

    def get_vocab_size(self):
        return _call(op="vocab_size", h=self._h)["n"]
