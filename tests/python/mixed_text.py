"""Deterministic mixed-text corpus for tokenizer conformance tests and the tokenizer benchmark.

Documents mix English prose, source code, whitespace runs, digits, punctuation, CJK, emoji,
"invalid-looking" sequences (mojibake, controls, U+FFFD, escapes) given as valid UTF-8, random
code points from all planes, other
scripts with decomposed accents, special-token look-alikes and very long words. No NUL bytes:
the `tokenize` CLI separates documents with NUL.
"""
import random
import unicodedata

WORDS = (
    "the of and to in is was that for it as with be on not he by this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no will more "
    "about can said out up time them some could into its then two only other new these may like "
    "first any people after over also now very years most way made state such where between many "
    "through should because world government each system while under however during number "
    "tokenizer expert streaming mixture router latency bandwidth throughput kernel cache memory "
    "naïve café résumé coöperate façade jalapeño Zürich São Paulo Ærøskøbing Straße fiancée "
    "don't won't it's I'm we're they've she'll he'd DON'T IT'S WE'LL You'Re y'all o'clock"
).split()

CODE = [
    "def {n}(x, y=None):\n    \"\"\"Return {n} of x.\"\"\"\n    if y is None:\n        return x * 2\n    return [i ** 2 for i in range(x) if i % 3 == 0]\n",
    "for (int i = 0; i < n; ++i) {{\n\tsum += a[i] * b[i];  // {n}\n\tif (sum > 1e9) break;\n}}\n",
    "#include <vector>\nstd::vector<int32_t> {n}(std::string_view s) {{ return {{}}; }}\n",
    "{{\"name\": \"{n}\", \"values\": [1, 2.5, -3e-4, null, true], \"nested\": {{\"k\": \"v\\n\"}}}}\n",
    "<div class=\"{n}\">\n  <a href=\"https://example.com/{n}?q=1&amp;r=2#frag\">link</a>\n</div>\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%{n}%' ORDER BY id DESC;\n",
    "    x = self.{n}[idx]\n    y += x    \n\n\n    return y\t\t\n",
    "fn {n}(&mut self) -> Result<(), Box<dyn Error>> {{ Ok(()) }}\n",
    "$ ./build/bin/tokenize encode -t tokenizer.json -i {n}.txt --split-nul && echo ok\n",
]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u000b", "\u000c",
              "\u0085", "\u2028", "\u2029", "\u1680", "\u202f", "\u205f", "    ", "\n\n\n", " \n "]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("…“”‘’—–«»¿¡·•§¶†‡※‰′″€£¥©®™°±×÷")
OTHER_SCRIPTS = [
    "Привет, как дела? Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε· ἐν ἀρχῇ ἦν ὁ λόγος.",
    "مرحبا بالعالم، هذا نص عربي للاختبار ١٢٣٤٥.",
    "שלום עולם, זהו טקסט בעברית.",
    "नमस्ते दुनिया, यह हिंदी पाठ है। १२३",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Tiếng Việt có dấu: Xin chào thế giới, cộng hòa xã hội chủ nghĩa.",
    "Ελληνικά ΚΕΦΑΛΑΙΑ και ſtraße ﬁnance ﬀ Kelvin K Ångström Å",
]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|im_",
            "<|vision_start|>", "<tool_call>", "<think>\n", "</think>", "<<s>>", "<|im_end|><|im_end|>"]
EMOJI_SEQ = ["👨‍👩‍👧‍👦", "👍🏽", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "🏳️‍🌈", "🧑🏿‍💻", "☕", "✅", "🙂🙃"]


def _cjk(r, n):
    out = []
    for _ in range(n):
        k = r.random()
        if k < 0.6:
            out.append(chr(r.randint(0x4E00, 0x9FA5)))
        elif k < 0.75:
            out.append(chr(r.randint(0x3041, 0x3096)))
        elif k < 0.85:
            out.append(chr(r.randint(0x30A1, 0x30FA)))
        elif k < 0.95:
            out.append(chr(r.randint(0xAC00, 0xD7A3)))
        else:
            out.append(r.choice("。、「」『』！？（）：；"))
    return "".join(out)


def _prose(r):
    words = []
    for _ in range(r.randint(5, 40)):
        w = r.choice(WORDS)
        if r.random() < 0.1:
            w = w.capitalize()
        if r.random() < 0.03:
            w = w.upper()
        words.append(w)
        if r.random() < 0.08:
            words[-1] += r.choice([",", ";", ":", " -", "'s", "'S", "'ll"])
    return " ".join(words) + r.choice([". ", "! ", "? ", ".\n", "...\n\n", ". "])


def _digits(r):
    k = r.random()
    if k < 0.3:
        return str(r.randint(0, 10 ** r.randint(1, 40)))
    if k < 0.5:
        return f"{r.uniform(-1e6, 1e6):.{r.randint(0, 8)}f}"
    if k < 0.6:
        return f"+1 ({r.randint(100, 999)}) {r.randint(100, 999)}-{r.randint(1000, 9999)}"
    if k < 0.7:
        return f"{r.randint(1900, 2100)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T12:{r.randint(0, 59):02d}:00Z"
    return "".join(r.choice("٠١٢٣٤٥٦٧٨٩０１２３４５６７８９²³¹½¾ⅫⅣ0123456789") for _ in range(r.randint(1, 12)))


def _weird(r):
    k = r.random()
    if k < 0.2:  # mojibake: UTF-8 read as Latin-1 / cp1252
        s = r.choice(["café", "naïve", "你好", "😀", "Zürich", "—"]).encode("utf-8")
        return s.decode("latin-1") if r.random() < 0.5 else s.decode("cp1252", errors="replace")
    if k < 0.35:
        return "\ufffd" * r.randint(1, 4) + "abc\ufffd"
    if k < 0.5:
        return "".join(chr(r.choice(list(range(1, 9)) + [0x0e, 0x1b, 0x1f, 0x7f] + list(range(0x80, 0xa0))))
                       for _ in range(r.randint(1, 6)))
    if k < 0.6:
        return "\ufeff" + "zero\u200bwidth\u200cjoin\u200dx\u2060y"
    if k < 0.7:
        return r.choice(["\\xff\\xfe\\x00", "\\ud800\\udc00", "%C3%A9%E2%82%AC", "&#x1F600;&amp;", "\\u00e9"])
    if k < 0.8:  # decomposed accents and Hangul jamo: NFC composes these
        return unicodedata.normalize("NFD", r.choice(["Éléphant café naïve", "Ångström Åland", "한국어 텍스트"])) + \
            "\u1100\u1161\u11a8 e\u0301\u0327 \u0301start"
    if k < 0.9:
        return "".join(chr(r.randint(0xE000, 0xE0FF)) for _ in range(3)) + "\uffff\ufffe"
    return "".join(chr(r.randint(0x0300, 0x036F)) for _ in range(r.randint(1, 5)))


def _random_code_points(r):
    """Any scalar value: exercises Unicode-version edges (letters new in 15-16, marks new after 9)."""
    out = []
    for _ in range(r.randint(1, 30)):
        cp = r.randint(0x80, 0x10FFFF) if r.random() < 0.3 else r.randint(0x80, 0x2FFFF)
        if not 0xD800 <= cp <= 0xDFFF:
            out.append(chr(cp))
        if r.random() < 0.2:
            out.append(r.choice(" \n-<[a1"))
    return "".join(out)


def _long_word(r):
    n = r.randint(100, 3000)
    k = r.random()
    if k < 0.2:
        return r.choice("aZx") * n
    if k < 0.4:
        return "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if k < 0.55:
        return "https://example.com/" + "/".join("seg%d" % i for i in range(n // 8)) + "?x=" + "9" * 50
    if k < 0.7:
        return "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(n)) + "=="
    if k < 0.8:
        return _cjk(r, n // 3)
    if k < 0.9:
        return "".join(chr(r.randint(0x1F600, 0x1F64F)) for _ in range(n // 10))
    return " " * (n // 4) + "-" * (n // 4) + "\n" * (n // 50)


def make_documents(total_bytes, seed=1234):
    """Documents (str) whose UTF-8 sizes add up to at least total_bytes."""
    r = random.Random(seed)
    parts = [
        (0.30, _prose),
        (0.12, lambda r: r.choice(CODE).format(n="fn_%d" % r.randint(0, 999))),
        (0.06, lambda r: "".join(r.choice(WHITESPACE) for _ in range(r.randint(1, 12)))),
        (0.08, lambda r: _digits(r) + r.choice([" ", ", ", "\n", "", "% "])),
        (0.05, lambda r: "".join(r.choice(PUNCT) for _ in range(r.randint(1, 10))) + r.choice(["", " "])),
        (0.10, lambda r: _cjk(r, r.randint(5, 80)) + r.choice(["", "\n", " "])),
        (0.06, lambda r: "".join(r.choice(EMOJI_SEQ) if r.random() < 0.4 else chr(r.randint(0x1F300, 0x1F64F))
                                 for _ in range(r.randint(1, 8))) + r.choice(["", " "])),
        (0.06, _weird),
        (0.02, _long_word),
        (0.08, lambda r: r.choice(OTHER_SCRIPTS) + r.choice([" ", "\n"])),
        (0.04, lambda r: r.choice(SPECIALS) + r.choice(["", " ", "\n", "hi"])),
        (0.02, _random_code_points),
    ]
    weights = [w for w, _ in parts]
    gens = [g for _, g in parts]
    docs, size = [], 0
    while size < total_bytes:
        target = r.choice([64, 512, 2048, 4096, 8192])
        buf, n = [], 0
        while n < target:
            s = r.choices(gens, weights)[0](r)
            buf.append(s)
            n += len(s.encode("utf-8"))
        doc = "".join(buf).replace("\x00", "")
        if r.random() < 0.05:
            doc = r.choice(WHITESPACE) + doc  # leading whitespace
        docs.append(doc)
        size += len(doc.encode("utf-8"))
    return docs
