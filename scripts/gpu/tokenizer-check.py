#!/usr/bin/env python3
"""Train small tokenizers with HF `tokenizers` and record the ids it gives.

Expected run time: about 15 s (training three small BPE tokenizers on a ~1 MB
corpus, then encoding 1,300 strings and decoding 300 id lists with each of
the fifteen files).

The Go package tokenizer/ must give the same ids as HF `tokenizers` for the
same tokenizer.json. Go does not run where `tokenizers` does, so this script
writes everything the Go test needs to compare, and the Go test runs wherever
Go does:

  OUT/tokenizer.json files, one per kind, under OUT/<kind>/tokenizer.json:
    gpt2         ByteLevel BPE, the GPT-2 pre-tokenizer (its regex), no BOS
    gpt2-prefix  the same vocabulary with add_prefix_space=true
    llama3       ByteLevel BPE after a Split on the Llama-3 pattern,
                 ignore_merges, BOS <|begin_of_text|> from a TemplateProcessing
    llama2       SentencePiece-style BPE with <0xNN> byte fallback: normalizer
                 Prepend("▁") + Replace(" ", "▁"), decoder Replace, ByteFallback,
                 Fuse, Strip, BOS <s> (the pipeline of Llama-2's tokenizer.json)
    llama2-metaspace  the same vocabulary with no normalizer and a Metaspace
                 pre-tokenizer (prepend_scheme "first"), as newer conversions of
                 Llama-2-family tokenizers have
    gpt2-added, llama2-added  a few added tokens with lstrip, rstrip,
                 single_word, normalized
    <kind>-flags for gpt2, gpt2-prefix, llama3, llama2, llama2-metaspace,
                 and gpt2-digits, llama2-gemma, llama2-metaspace-always
                 (flag_pipelines): 64 added tokens, two for each combination
                 of lstrip, rstrip, single_word, normalized and special
                 (flag_tokens), and 1,300 strings dense with them (flag_tests)
  OUT/expected.jsonl.gz, one JSON object a line:
    {"file": "<kind>/tokenizer.json", "text": s, "ids": [...]  (add_special_tokens=True),
     "ids_plain": [...] (add_special_tokens=False), "decode": ..., "decode_skip": ...,
     "stream": [what DecodeStream(skip_special_tokens=True).step gives for each of ids, null for nothing]}
    and for id lists drawn at random (decode only):
    {"file": ..., "decode_ids": [...], "decode": ..., "decode_skip": ...}
  OUT/transformers-gguf.jsonl.gz (optional, when transformers' GGUF converter
    imports): {"file": "llama2/tokenizer.json", "text": s, "ids_plain": [...]} for
    the llama2 vocabulary written as GGUF tokenizer.ggml.* metadata and read by
    transformers' converter.
  OUT/summary.json: versions, vocabulary sizes, counts, seconds.

The corpus and the test strings are generated here from fixed seeds (English
prose, code, text in many scripts, emoji with ZWJ sequences, runs of spaces,
tabs and newlines, digits, punctuation). Test strings also hold characters the
training corpus never has (so byte fallback and unknown pieces are exercised)
and, in some strings, the tokenizer's special tokens.

  python3 scripts/gpu/tokenizer-check.py --out DIR          # the full run
  python3 scripts/gpu/tokenizer-check.py --out DIR --dry-run # corpus and strings only (no tokenizers needed)
"""

import argparse
import copy
import gzip
import json
import os
import random
import sys
import time

CORPUS_SEED = 20261201
TEST_SEED = 15003
N_CORPUS_LINES = 6000
N_TEST_STRINGS = 1300
N_DECODE_LISTS = 300

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# ---------------------------------------------------------------- text mix

WORDS = """the of and to in is was he for it with as his on be at by had are but from or have an they
which one you were all we her she there would their will when who him been has more if no out do so
can what up said about other into than its time only could new them man some these then two first
may any like now my such make over our even most me state after also made many did must before back
see through way where get much go well your know should down work year because come people just say
long little very still own find between here take life never old last both world us great while same
memory kernel tensor device stream pool planner weights budget token model layer attention cache
Hello World Paris London Tokyo Monday January Alice Bob GPU CPU HBM PCIe NVIDIA Llama BPE JSON HTTP
naïve café résumé façade coöperate jalapeño Zürich São Ångström""".split()

CONTRACTIONS = ["don't", "it's", "we'll", "I'm", "they're", "you've", "she'd", "can't", "won't",
                "I'M", "They'RE", "WE'LL", "It'S", "you'D", "Ma'am", "rock'n'roll", "o'clock",
                "'tis", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'LL", "'xyz",
                "John's", "JOHN'S", "dogs'", "ſ's", "'ſ", "x'ſ", "'Ve", "'lL"]

SCRIPTS = {
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自之着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンーッャュョ",
    "hangul": "한국어는대한민국의공용어입니다안녕하세요감사합니다사랑해요서울부산학교컴퓨터메모리",
    "cyrillic": "Съешь же ещё этих мягких французских булок да выпей чаю Привет мир Москва Україна ґ є ї Беларусь ў",
    "greek": "Ξεσκεπάζω τὴν ψυχοφθόρα βδελυγμία Γειά σου Κόσμε αβγδεζηθικλμνξοπρστυφχψω ΑΒΓΔ ς ϐϑϕ",
    "arabic": "صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت مرحبا بالعالم العربية ٠١٢٣٤٥٦٧٨٩",
    "hebrew": "דג סקרן שט בים מאוכזב ולפתע מצא חברה שלום עולם עִבְרִית",
    "devanagari": "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम नमस्ते दुनिया ०१२३४५६७८९ क्षत्रिय",
    "thai": "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า สวัสดีชาวโลก ภาษาไทย ๑๒๓",
    "tamil": "யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம் வணக்கம்",
    "georgian": "გამარჯობა მსოფლიო ქართული ენა",
    "armenian": "Բարեւ աշխարհ հայերեն",
    "ethiopic": "ሰላም ለዓለም አማርኛ",
    "latin_ext": "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğĠġĢģĤĥĦħĨĩĪīĬĭĮįİıĲĳĴĵĶķĸĹĺĻļĽľĿŀŁłŃńŅņŇňŉŊŋŌōŎŏŐőŒœŔŕŖŗŘřŚśŜŝŞşŠšŢţŤťŦŧŨũŪūŬŭŮůŰűŲųŴŵŶŷŸŹźŻżŽžſƒǅǆǈǉǊǋǌẞß",
    "decomposed": "e\u0301a\u0300o\u0302u\u0308n\u0303c\u0327i\u0304A\u030aZ\u030c",
    "math": "∀∂∃∅∇∈∉∋∏∑−∓∗∘√∝∞∠∧∨∩∪∫≈≠≡≤≥⊂⊃⊆⊇⊕⊗⊥⋅ℕℤℚℝℂ𝔸𝕏𝒜ℵ℘ℑℜ±×÷²³¹¼½¾ⅠⅡⅢⅣⅫ",
    "symbols": "€£¥₹₽¢©®™°§¶†‡•…‰′″‹›«»“”‘’„‚–—¡¿※☃★☆♠♣♥♦♪♫✓✗←↑→↓↔⇒⇔",
    "fullwidth": "ＡＢＣａｂｃ０１２３４５６７８９！？（）",
    "spaces": "\u00a0\u2003\u2009\u3000\u200b\u202f\u2028\u0085\u000b\u000c",
}

EMOJI = ["😀", "😂", "🥲", "😍", "🤔", "🙃", "🔥", "✨", "🎉", "🚀", "💾", "🧠", "👍", "👍🏽", "👋🏿",
         "👨\u200d👩\u200d👧\u200d👦", "👩\u200d💻", "🧑\u200d🔬", "🏳️\u200d🌈", "🏴\u200d☠️", "❤️", "❤️\u200d🔥",
         "🇯🇵", "🇫🇷", "🇺🇸", "1️⃣", "#️⃣", "☺️", "✌🏼", "👁️\u200d🗨️", "🐈\u200d⬛", "🫠", "🪐"]

# Characters only the test strings use: the tokenizers never saw them in
# training, so byte-level pieces stay short and SentencePiece falls back to bytes.
RARE = ("ꙮ𝔘𝔫𝔦𝔠𝔬𝔡𝔢ᏣᎳᎩ⠓⠑⠇⠇⠕ᚠᚢᚦᚨᚱᚲ𐌰𐌱𐌲ꦲꦏ𓀀𓂀ⵣⴰ㊗㍿龘靐齉鬱ǅ\u0345\u20dd\u0489Ꙭꙭ䷀☯⚛"
        "\U0001F9EC\U0001F9FF\U0001FAE0\U0001F6F8ℵ℗℘ⓐⓑⓒ⑴⑵ⅷↂ〇〡〢〣")

CODE = [
    "func (p *Pool) Alloc(size uint64) (Ptr, error) {\n\tif size == 0 {\n\t\treturn 0, ErrZero\n\t}\n\treturn p.alloc(size)\n}\n",
    "def encode(self, text: str) -> list[int]:\n    ids = []\n    for piece in self.split(text):\n        ids.extend(self.bpe(piece))\n    return ids\n",
    "for (int i = 0; i < n; ++i) {\r\n    sum += a[i] * b[i];\r\n}\r\n",
    "const x = arr.map((v, i) => v ** 2 + i).filter(Boolean); // squares\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%bob%';\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "    if err != nil {\n        return fmt.Errorf(\"open %s: %w\", path, err)\n    }\n",
    "x = {'a': [1, 2, 3], \"b\": (4.5, -6e-7), 'c': None}  # dict\n",
    "<div class=\"row\"><span id='x'>&amp; &lt;tag&gt;</span></div>\n",
    "$ go test -run 'TestEncode/.*' -count=1 ./tokenizer/... 2>&1 | tee log.txt\n",
    "\t\t\tcase '\\n', '\\t':\n\t\t\t\tcontinue\n",
    "let s: &str = \"héllo\"; println!(\"{s:?} {}\", s.len());\n",
    "a+=b;c-=d;e*=f;g/=h;i%=j;k<<=1;l>>=2;m&=n;o|=p;q^=r;s&&t||!u;\n",
    "https://example.com/path?q=1&r=%20x#frag user@example.org 192.168.0.1:8080\n",
    "@@ -1,4 +1,5 @@\n-old line\n+new line\n+another\n context\n",
]


def gen_number(r):
    k = r.random()
    if k < 0.3:
        return str(r.randint(0, 9))
    if k < 0.55:
        return str(r.randint(10, 99999))
    if k < 0.7:
        return str(r.randint(10 ** 6, 10 ** 12))
    if k < 0.8:
        return "%d.%0*d" % (r.randint(0, 999), r.randint(1, 6), r.randint(0, 999999))
    if k < 0.9:
        return "%d,%03d,%03d" % (r.randint(1, 999), r.randint(0, 999), r.randint(0, 999))
    return r.choice(["3.14159", "2026-12-01", "08:55:41", "+1-555-0100", "1e-9", "0x1F", "v0.23.2", "50%", "#15", "1/2"])


def gen_word(r):
    k = r.random()
    if k < 0.72:
        w = r.choice(WORDS)
        c = r.random()
        if c < 0.12:
            w = w.capitalize()
        elif c < 0.16:
            w = w.upper()
        return w
    if k < 0.82:
        return r.choice(CONTRACTIONS)
    if k < 0.92:
        return gen_number(r)
    return r.choice(["(", ")", "[", "]", "\"", "'", "-", "--", "...", "!", "?", "?!", ":", ";", "/", "&", "*", "`", "~", "@", "#", "$", "%", "^", "_", "=", "+", "<", ">", "|", "\\"]) + r.choice(WORDS)


def gen_whitespace(r):
    k = r.random()
    if k < 0.55:
        return " "
    if k < 0.65:
        return " " * r.randint(2, 9)
    if k < 0.72:
        return "\n"
    if k < 0.77:
        return "\n" * r.randint(2, 4)
    if k < 0.82:
        return "\t" * r.randint(1, 3)
    if k < 0.86:
        return "\r\n"
    if k < 0.90:
        return "".join(r.choice(" \t\n\r") for _ in range(r.randint(2, 8)))
    if k < 0.94:
        return " \n" + " " * r.randint(1, 8)
    return r.choice(SCRIPTS["spaces"]) + r.choice(["", " ", "\n"])


def gen_prose(r, n):
    out = []
    for i in range(n):
        if i:
            out.append(gen_whitespace(r) if r.random() < 0.25 else " ")
        out.append(gen_word(r))
        if r.random() < 0.1:
            out.append(r.choice([",", ".", ";", ":", "!", "?", "…", " —", "\"", "'"]))
    return "".join(out)


def gen_script_text(r, n):
    name = r.choice(sorted(SCRIPTS))
    chars = SCRIPTS[name]
    out = []
    while len(out) < n:
        if r.random() < 0.6 and " " in chars:
            # a run of the script's own text, words and spaces as written
            start = r.randrange(len(chars))
            out.append(chars[start:start + r.randint(3, 25)])
        else:
            out.extend(r.choice(chars) for _ in range(r.randint(1, 6)))
            out.append(r.choice([" ", "", "", ", ", "。", "\n"]))
    return "".join(out)


def gen_emoji(r, n):
    out = []
    for _ in range(n):
        out.append(r.choice(EMOJI))
        out.append(r.choice(["", "", " ", "  ", "!", gen_word(r) + " "]))
    return "".join(out)


def gen_code(r):
    s = r.choice(CODE)
    if r.random() < 0.3:
        s = s.replace("    ", "\t")
    if r.random() < 0.2:
        s = s.replace("\n", "\r\n")
    return s


def gen_line(r):
    """One piece of text: prose, code, another script, emoji, or a mix."""
    k = r.random()
    if k < 0.35:
        return gen_prose(r, r.randint(3, 40))
    if k < 0.5:
        return gen_code(r)
    if k < 0.7:
        return gen_script_text(r, r.randint(5, 60))
    if k < 0.8:
        return gen_emoji(r, r.randint(1, 8))
    parts = []
    for _ in range(r.randint(2, 5)):
        parts.append(r.choice([gen_prose(r, r.randint(1, 8)), gen_script_text(r, r.randint(2, 15)),
                               gen_emoji(r, r.randint(1, 3)), gen_number(r), gen_whitespace(r)]))
    return r.choice(["", " ", "\n"]).join(parts)


def make_corpus():
    r = random.Random(CORPUS_SEED)
    lines = [gen_line(r) for _ in range(N_CORPUS_LINES)]
    # every script in full at least a few times, so each kind learns it
    for _ in range(3):
        lines.extend(SCRIPTS.values())
        lines.extend(CODE)
    return lines


EDGE = ["", " ", "  ", "\n", "\n\n", "\t", " \t \n ", "\r\n", "a", "A", "0", "1234", "12345678901234567890",
        "'", "''", "'s", "'S", "'ll", "ſ", "'ſ", "don't", "DON'T", "it'S", "x'Ll", " 's", "a's'", "'sss",
        "hello", " hello", "hello ", "  hello  ", "hello\n", "\nhello", "hello world", "hello  world",
        "hello   world", "hello\tworld", "hello\n\nworld", "hello \n world", "hello\r\nworld", "a\n \nb",
        "   ", "     x", "x     ", " \n", "\n ", "  \n  \n", "a  \n", "1 2 3", "1  2", "123456 7", "٣٤٥٦",
        "١٢٣٤٥", "１２３４", "²³", "Ⅻ", "3.14", "-1", "+1", "...", "!!!", "?!?!", "((()))", "a.b,c;d",
        "e\u0301", "\u0301", "\u0301\u0301x", "naïve", "Zürich", "日本語", "中文 文字", "한국어", "Привет",
        "مرحبا", "שלום", "नमस्ते", "สวัสดี", "👍", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🇯🇵🇫🇷",
        "\u200b", "\u00a0", "a\u00a0b", "\u3000", "\u2028", "x\u0085y", "\u000b\u000c", "\ufeffBOM",
        "ꙮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "▁", "▁▁", "a▁b", " ▁", "<0x41>", "<unk>", "\u00ad", "\u007f", "\x01\x02",
        "Ġ", "Ċ", "ĠĠ", "\\n", "\\u0041",
        # Llama-3's contractions are case-insensitive: does ſ fold to s there?
        "'ſup", "'ſt", "x'ſabc", "'ſ'S", "'Sup", "I'LLama", "'REx", "'rEx", "'ﬅ", "'ß", "'ǉ", "'Kx", "'\u212ax"]


def make_tests(specials):
    """Test strings: edge cases, then generated text with rare characters and,
    in about one string in twelve, special tokens spliced in."""
    r = random.Random(TEST_SEED)
    tests = list(EDGE)
    for sp in specials:
        tests += [sp, sp + sp, "a" + sp + "b", " " + sp + " ", sp + "hello", "hello" + sp, sp + " hello",
                  sp[:-1], sp[1:], "x" + sp[:3], "\n" + sp + "\n"]
    while len(tests) < N_TEST_STRINGS:
        s = gen_line(r)
        if r.random() < 0.3:
            s = s[:r.randint(0, len(s))]
        if r.random() < 0.25:
            pos = r.randint(0, len(s))
            rare = "".join(r.choice(RARE) for _ in range(r.randint(1, 4)))
            s = s[:pos] + rare + s[pos:]
        if r.random() < 0.15:
            s = r.choice([" ", "  ", "\n", "\t", " \n"]) + s
        if r.random() < 0.15:
            s = s + r.choice([" ", "  ", "\n", "\n\n", "\t", " \n "])
        if specials and r.random() < 0.08:
            pos = r.randint(0, len(s))
            s = s[:pos] + r.choice(specials) + s[pos:]
        tests.append(s)
    return tests


# ---------------------------------------------------------------- pipelines

def bytelevel(add_prefix_space=False, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": use_regex}


def template(bos, bos_id):
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def empty_bpe(**kw):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
         "vocab": {}, "merges": []}
    m.update(kw)
    return m


def base_json(model, normalizer, pre_tokenizer, decoder):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": decoder, "model": model}


BYTE_TOKENS = ["<0x%02X>" % b for b in range(256)]
SP_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "▁"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
SP_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def kinds():
    """(name, pipeline JSON for training, trainer arguments, special tokens, BOS, model flags after training)."""
    return [
        ("gpt2", base_json(empty_bpe(), None, bytelevel(), bytelevel()),
         dict(vocab_size=2000, special_tokens=["<|endoftext|>"], byte_alphabet=True),
         ["<|endoftext|>"], None, {}),
        ("llama3", base_json(empty_bpe(ignore_merges=True), None,
                             {"type": "Sequence", "pretokenizers": [
                                 {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
                                 bytelevel(use_regex=False)]},
                             bytelevel()),
         dict(vocab_size=3000, special_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                                                "<|start_header_id|>", "<|end_header_id|>"], byte_alphabet=True),
         ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], "<|begin_of_text|>", {"ignore_merges": True}),
        ("llama2", base_json(empty_bpe(fuse_unk=True, byte_fallback=True), SP_NORMALIZER, None, SP_DECODER),
         dict(vocab_size=3000, special_tokens=["<unk>", "<s>", "</s>"] + BYTE_TOKENS, limit_alphabet=400),
         ["<s>", "</s>", "<unk>"], "<s>", {"byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>"}),
    ]


def train(name, pipeline, targs, bos, flags, corpus):
    from tokenizers import Tokenizer, pre_tokenizers, trainers

    tok = Tokenizer.from_str(json.dumps(pipeline))
    kw = dict(vocab_size=targs["vocab_size"], min_frequency=2, show_progress=False,
              special_tokens=targs["special_tokens"])
    if targs.get("byte_alphabet"):
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if "limit_alphabet" in targs:
        kw["limit_alphabet"] = targs["limit_alphabet"]
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(**kw))
    d = json.loads(tok.to_str())
    # The trainer may rebuild the model: state the flags again, exactly.
    d["model"].update(flags)
    # <0xNN> pieces are vocabulary, not added tokens (as in Llama-2's file):
    # the text "<0x41>" is not matched as a token.
    d["added_tokens"] = [a for a in d["added_tokens"] if a["content"] not in BYTE_TOKENS]
    if bos is not None:
        bos_id = d["model"]["vocab"][bos]
        if name == "llama3":
            d["post_processor"] = {"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                template(bos, bos_id)]}
        else:
            d["post_processor"] = template(bos, bos_id)
    elif name == "gpt2":
        d["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    return d


def added(d, tokens):
    """Append added tokens with ids past the vocabulary (as Llama-3's are)."""
    v = copy.deepcopy(d)
    next_id = max(max(v["model"]["vocab"].values()), max(a["id"] for a in v["added_tokens"])) + 1
    for i, (content, special, normalized, flags) in enumerate(tokens):
        a = {"id": next_id + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": normalized, "special": special}
        a.update(flags)
        v["added_tokens"].append(a)
    return v


def variants(name, d):
    """Other pipelines over a trained vocabulary: (name, file, extra strings to splice into tests)."""
    out = []
    if name == "gpt2":
        v = copy.deepcopy(d)
        v["pre_tokenizer"]["add_prefix_space"] = True
        out.append(("gpt2-prefix", v, []))
        toks = [("<mask>", True, False, {"lstrip": True}), ("<|pad|>", True, False, {"rstrip": True}),
                ("[SW]", True, False, {"single_word": True}), ("hello world", False, True, {}),
                ("<|reserved_0|>", True, False, {})]
        out.append(("gpt2-added", added(d, toks), [t[0] for t in toks]))
    if name == "llama2":
        v = copy.deepcopy(d)
        v["normalizer"] = None
        v["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        v["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}]}
        out.append(("llama2-metaspace", v, []))
        # A normalized added token is matched as the normalizer writes it
        # ("<extra>" as "▁<extra>").
        toks = [("<extra>", False, True, {}), ("<sys>", True, False, {"lstrip": True, "rstrip": True}),
                ("hi there", False, True, {})]
        out.append(("llama2-added", added(d, toks), [t[0] for t in toks]))
    return out


# Added tokens with every combination of lstrip, rstrip, single_word,
# normalized and special, two per combination, in shapes that stress the
# matching: word-like ("w3x", "ab7", "é9"), with spaces or newlines at either
# end, whitespace only, spelled with ▁, a token that is a prefix of another
# ("<p1>" and "<p1>x"), and several with one content (the later flags win
# in HF, the first id stays).
FLAG_SHAPES = [lambda i: "<t%d>" % i, lambda i: "w%dx" % i, lambda i: " s%d" % i, lambda i: "e%d " % i,
               lambda i: "\u2581m%d" % i, lambda i: "<p%d>" % (i // 2) + ("x" if i % 2 else ""),
               lambda i: "\u00e7%d\u00e9" % i, lambda i: "a b%d" % i, lambda i: "\n%d\n" % i,
               lambda i: "\u00e9%d" % i, lambda i: " " * (1 + i % 3), lambda i: "\t%d" % i, lambda i: "%d" % i,
               lambda i: "<S%d>" % (i % 4), lambda i: "ab%d" % i]
FLAG_FRAGMENTS = [" ", "  ", "\t", "\n", " \n ", "\u3000", "\u00a0", "a", "ab", "Hello", "x", "_", "9", "42", ".",
                  ",", "!", "'s", "\u0301", "\u200d", "\u200c", "\U0001f44d", "\u4e2d\u6587", "\u2581",
                  "\u2581\u2581", "\u00e9", "\u00df", "\u0903", "\u2163", "\u24d0", "\u203f", "-", "<", ">", "\r\n"]


def flag_tokens(seed):
    out = []
    for i in range(32):
        ls, rs, sw, nm, sp = [(i >> (4 - b)) & 1 for b in range(5)]
        for k in range(2):
            j = 2 * i + k
            out.append((FLAG_SHAPES[(j * 7 + seed) % len(FLAG_SHAPES)](j), bool(sp), bool(nm),
                        {"single_word": bool(sw), "lstrip": bool(ls), "rstrip": bool(rs)}))
    return out


def flag_tests(contents, seed):
    """Each token alone and next to letters, spaces and itself, then random
    strings of tokens (one in ten cut short) and fragments."""
    r = random.Random(seed)
    out = []
    for c in contents:
        out += [c, "a" + c + "b", " " + c + " ", "  " + c + "  " + c, c + c, c.strip() or c, "x" + c[:-1]]
    while len(out) < N_TEST_STRINGS:
        s = ""
        for _ in range(r.randint(1, 12)):
            if r.random() < 0.4:
                c = r.choice(contents)
                if r.random() < 0.1 and len(c) > 1:
                    c = c[:r.randint(1, len(c) - 1)]
                s += c
            else:
                s += r.choice(FLAG_FRAGMENTS)
        out.append(s)
    return out


def flag_pipelines(name, d):
    """Pipelines checked only with flag_tokens: GPT-2 with Digits before
    ByteLevel (HF's Digits splits on Rust's is_numeric: Nd, Nl, No), a
    Gemma-style normalizer (Replace only, no Prepend), and Metaspace that
    always prepends and splits."""
    out = []
    if name == "gpt2":
        v = copy.deepcopy(d)
        v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, bytelevel()]}
        out.append(("gpt2-digits", v))
    if name == "llama2":
        v = copy.deepcopy(d)
        v["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
        v["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
        out.append(("llama2-gemma", v))
        v = copy.deepcopy(d)
        v["normalizer"] = None
        v["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
        v["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]}
        out.append(("llama2-metaspace-always", v))
    return out


def flag_variants(name, d, others):
    """(name, file, tests) with flag_tokens added to the file, to each variant in others and to flag_pipelines."""
    out = []
    files = [(name, d)] + [(vn, vd) for vn, vd, _ in others if not vn.endswith("-added")] + flag_pipelines(name, d)
    for k, (vn, vd) in enumerate(files):
        seed = TEST_SEED + 100 + k + len(vn)
        toks = flag_tokens(seed)
        out.append((vn + "-flags", added(vd, toks), flag_tests(sorted({t[0] for t in toks}), seed)))
    return out


def decode_lists(r, vocab_size, special_ids, n):
    """Random id lists for decode-only checks, biased to the first 300 ids (bytes in llama2) and specials."""
    lists = []
    for _ in range(n):
        ids = []
        for _ in range(r.randint(0, 24)):
            k = r.random()
            if k < 0.4:
                ids.append(r.randrange(min(300, vocab_size)))
            elif k < 0.5 and special_ids:
                ids.append(r.choice(special_ids))
            else:
                ids.append(r.randrange(vocab_size))
        lists.append(ids)
    return lists


def stream_chunks(tok, ids):
    """What HF's DecodeStream(skip_special_tokens=True) gives at each id (None
    for no text yet), or {"error": ...} when it raises (its prefix check)."""
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    ds = DecodeStream(skip_special_tokens=True)
    out = []
    try:
        for i in ids:
            out.append(ds.step(tok, i))
    except BaseException as e:
        return {"error": repr(e)[:200], "at": len(out)}
    return out


def check(name, path, tests, specials, out_lines):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    rel = name + "/tokenizer.json"
    n_ids = 0
    roundtrip_fail = 0
    failed = []
    for s in tests:
        try:
            ids = tok.encode(s).ids
            plain = tok.encode(s, add_special_tokens=False).ids
            dec = tok.decode(plain, skip_special_tokens=False)
            dec_skip = tok.decode(ids, skip_special_tokens=True)
        except BaseException as e:  # a Rust panic arrives as PanicException, a BaseException
            failed.append({"text": s, "error": repr(e)[:200]})
            continue
        line = {"file": rel, "text": s, "ids": ids, "ids_plain": plain, "decode": dec,
                "decode_skip": dec_skip}
        if tok.pre_tokenizer is not None:
            try:  # the pieces before the model, to tell a split mismatch from a merge mismatch
                line["pre"] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(s)]
            except Exception:
                pass
        line["stream"] = stream_chunks(tok, ids)
        out_lines.append(line)
        n_ids += len(ids)
        if dec != s:
            roundtrip_fail += 1
    r = random.Random(TEST_SEED + len(name))
    special_ids = [tok.token_to_id(s) for s in specials if tok.token_to_id(s) is not None]
    for ids in decode_lists(r, tok.get_vocab_size(), special_ids, N_DECODE_LISTS):
        out_lines.append({"file": rel, "decode_ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
                          "decode_skip": tok.decode(ids, skip_special_tokens=True)})
    return {"kind": name, "vocab": tok.get_vocab_size(), "strings": len(tests) - len(failed), "ids": n_ids,
            "decode_differs_from_text": roundtrip_fail, "hf_failed": failed}


def transformers_gguf(d, tests):
    """The llama2 vocabulary as a GGUF file's tokenizer.ggml.* would hold it
    (tokens in id order, scores from merge ranks, token types: bytes 6, added
    tokens 3), through transformers' GGUF tokenizer converter (which builds
    merges from the scores); ids without special tokens. The Go test builds the
    same metadata (ggufOf in tokenizer/gguf_test.go) and compares."""
    from transformers.integrations.ggml import GGUFLlamaConverter

    vocab = d["model"]["vocab"]
    n = max(vocab.values()) + 1
    tokens = [""] * n
    for t, i in vocab.items():
        tokens[i] = t
    scores = [-1e6] * n
    for rank, m in enumerate(d["model"]["merges"]):
        a, b = m if isinstance(m, list) else m.split(" ")
        scores[vocab[a + b]] = float(-rank)
    types = [1] * n
    for i, t in enumerate(tokens):
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types[i] = 6
    for a in d["added_tokens"]:
        types[a["id"]] = 3
    tok = GGUFLlamaConverter({"tokens": tokens, "scores": scores, "token_type": types,
                              "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"]}).converted()
    return [{"file": "llama2/tokenizer.json", "text": s, "ids_plain": tok.encode(s, add_special_tokens=False).ids}
            for s in tests]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="generate the corpus and test strings only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    corpus = make_corpus()
    all_specials = sorted({s for k in kinds() for s in k[3]})
    chars = len(set("".join(corpus)))
    print("corpus: %d lines, %d chars, %d distinct characters" % (len(corpus), sum(map(len, corpus)), chars))
    if args.dry_run:
        for name, _, _, specials, _, _ in kinds():
            tests = make_tests(specials)
            print("%s: %d test strings, %d chars" % (name, len(tests), sum(map(len, tests))))
        with open(os.path.join(args.out, "corpus.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(corpus))
        with open(os.path.join(args.out, "tests.json"), "w", encoding="utf-8") as f:
            json.dump(make_tests(all_specials), f, ensure_ascii=False, indent=0)
        return 0

    import tokenizers
    summary = {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
               "corpus_lines": len(corpus), "kinds": [], "errors": []}
    lines = []
    for name, pipeline, targs, specials, bos, flags in kinds():
        try:
            d = train(name, pipeline, targs, bos, flags, corpus)
        except Exception as e:  # report and go on with the other kinds
            summary["errors"].append("%s: train: %r" % (name, e))
            continue
        others = variants(name, d)
        runs = [(vn, vd, make_tests(specials + extra), specials + extra) for vn, vd, extra in [(name, d, [])] + others]
        runs += [(vn, vd, tests, [a["content"] for a in vd["added_tokens"]]) for vn, vd, tests in flag_variants(name, d, others)]
        for vname, vd, tests, sp in runs:
            try:
                from tokenizers import Tokenizer
                os.makedirs(os.path.join(args.out, vname), exist_ok=True)
                path = os.path.join(args.out, vname, "tokenizer.json")
                Tokenizer.from_str(json.dumps(vd)).save(path)
                summary["kinds"].append(check(vname, path, tests, sp, lines))
            except Exception as e:
                summary["errors"].append("%s: %r" % (vname, e))
        if name == "llama2":
            # Optional: what transformers makes of the same vocabulary as GGUF.
            t1 = time.time()
            try:
                tl = transformers_gguf(d, make_tests(specials))
                with gzip.GzipFile(os.path.join(args.out, "transformers-gguf.jsonl.gz"), "wb", mtime=0) as f:
                    for line in tl:
                        f.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
                summary["transformers_gguf"] = "%d strings, %.1f s" % (len(tl), time.time() - t1)
            except Exception as e:
                summary["transformers_gguf"] = "skipped: %r" % (e,)
    with gzip.GzipFile(os.path.join(args.out, "expected.jsonl.gz"), "wb", mtime=0) as f:
        for line in lines:
            f.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
    summary["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("tokenizers %s, %d expected lines, %.1f s" % (summary["tokenizers"], len(lines), summary["seconds"]))
    print("%-24s %6s %8s %8s %12s %s" % ("kind", "vocab", "strings", "ids", "decode!=text", "hf-failed"))
    for k in summary["kinds"]:
        print("%-24s %6d %8d %8d %12d %d" % (k["kind"], k["vocab"], k["strings"], k["ids"], k["decode_differs_from_text"],
                                             len(k["hf_failed"])))
    print("transformers GGUF converter:", summary.get("transformers_gguf"))
    for e in summary["errors"]:
        print("ERROR", e)
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
