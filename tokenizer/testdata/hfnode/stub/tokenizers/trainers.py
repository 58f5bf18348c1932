class BpeTrainer:
    """Keeps its arguments; the stand-in Tokenizer reads special_tokens."""

    def __init__(self, **kw):
        self.kw = kw
