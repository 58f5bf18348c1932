class DecodeStream:
    """HF's DecodeStream.step (tokenizers/src/tokenizer/mod.rs,
    step_decode_stream) over the binding's decode, which is all it calls."""

    def __init__(self, ids=None, skip_special_tokens=False):
        self.skip = skip_special_tokens
        self.ids = list(ids or [])
        self.prefix = ""
        self.prefix_index = 0

    def step(self, tok, id):
        if self.prefix == "" and self.ids:
            p = tok.decode(self.ids, skip_special_tokens=self.skip)
            if not p.endswith("\ufffd"):
                self.prefix, self.prefix_index = p, len(self.ids)
        self.ids.append(id)
        s = tok.decode(self.ids, skip_special_tokens=self.skip)
        if len(s.encode()) > len(self.prefix.encode()) and not s.endswith("\ufffd"):
            if not s.startswith(self.prefix):
                raise RuntimeError("InvalidPrefix")
            new = s[len(self.prefix):]
            n = len(self.ids) - self.prefix_index
            self.ids = self.ids[self.prefix_index:]
            self.prefix = tok.decode(self.ids, skip_special_tokens=self.skip)
            self.prefix_index = n
            return new
        return None
