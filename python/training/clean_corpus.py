# Turns the unpacked Debian documentation/text packages under ROOT into plain English documents
# and splits them deterministically into data/corpus/train.txt and data/corpus/heldout.txt.
"""Corpus cleaner for the demo model.

Each source package has its own extractor (rst, POD, HTML, dictd, WordNet glosses, SWORD zText,
R lazy-load data, fortune files). Every extractor yields (doc_name, text) pairs; the text is then
normalised (NFC, markup removed, whitespace collapsed) and cut into documents of at most
DOC_BYTES at paragraph boundaries. A document goes to the held-out split when
crc32("source/name#index") % HELDOUT_MOD == 0, so the split does not depend on file order or
on the machine. Documents are separated by a blank line pair ("\n\n\n"): inside a document
paragraphs are separated by exactly one blank line, so the separator is unambiguous.
"""
import argparse
import gzip
import html
import html.parser
import json
import os
import re
import struct
import sys
import unicodedata
import zlib
from pathlib import Path

DOC_BYTES = 16384      # documents short enough that the split mixes all sources
HELDOUT_MOD = 50       # 1 document in 50 (2 %) is held out
DOC_SEP = "\n\n\n"


# ----------------------------------------------------------------------------- generic cleanup
def normalise(text):
    """NFC, unify newlines and quotes, drop control characters, collapse blank runs."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = text.replace("\t", " ").replace("\u00a0", " ")
    text = "".join(c for c in text if c == "\n" or unicodedata.category(c)[0] != "C")
    lines = [re.sub(r" {2,}", " ", ln).strip() for ln in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def is_prose(par):
    """A paragraph counts as English prose when most of its characters are letters/spaces."""
    if len(par) < 2:
        return False
    letters = sum(c.isalpha() or c == " " for c in par)
    return letters / len(par) >= 0.75


def split_docs(text, max_bytes=DOC_BYTES):
    """Cuts a normalised text into documents of <= max_bytes at paragraph boundaries."""
    docs, cur, size = [], [], 0
    for par in text.split("\n\n"):
        if not is_prose(par):
            continue
        n = len(par.encode("utf-8")) + 2
        if cur and size + n > max_bytes:
            docs.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(par)
        size += n
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def read_maybe_gz(path):
    data = path.read_bytes()
    if path.suffix in (".gz", ".dz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- reStructuredText
RST_DIRECTIVE = re.compile(r"^\.\. ")
RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}\s*$")
RST_ROLE = re.compile(r":[\w:.-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")
RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_{1,2}")


def clean_rst(text):
    """Drops directives, literal blocks, tables and section underlines; unwraps inline markup."""
    out, skip_indent = [], None
    lines = text.split("\n")
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if stripped == "" or indent > skip_indent:
                continue
            skip_indent = None
        if RST_DIRECTIVE.match(stripped) or stripped.endswith("::") and not stripped[:-2].strip():
            skip_indent = indent  # the directive's body (or a bare literal block) is indented
            out.append("")
            continue
        if stripped.endswith("::"):
            out.append(line.rstrip()[:-1])  # "Example::" -> "Example:" then a literal block
            skip_indent = indent
            continue
        if RST_UNDERLINE.match(stripped) or stripped.startswith(("+-", "|", "+=")):
            out.append("")
            continue
        if stripped.startswith(">>>") or stripped.startswith("$ "):
            continue
        out.append(line)
    text = "\n".join(out)
    text = RST_LINK.sub(r"\1", text)
    text = RST_ROLE.sub(r"\1", text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`]+)`_?", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    text = re.sub(r"(?<!\w)\*([^*\s][^*]*)\*(?!\w)", r"\1", text)
    text = re.sub(r"\[#?\w*\]_", "", text)
    text = re.sub(r"\|(\w[\w -]*)\|", r"\1", text)
    return unwrap(text)


def unwrap(text):
    """Joins hard-wrapped lines inside a paragraph and strips list bullets."""
    pars = []
    for par in re.split(r"\n\s*\n", text):
        lines = [re.sub(r"^([-*+•]|\d+[.)]|#\.)\s+", "", ln.strip()) for ln in par.split("\n")]
        pars.append(" ".join(ln for ln in lines if ln))
    return "\n\n".join(p for p in pars if p)


# ----------------------------------------------------------------------------- POD (perl-doc)
def clean_pod(text):
    out, in_verbatim = [], False
    for par in re.split(r"\n\s*\n", text):
        if par.startswith("="):
            cmd = par.split(None, 1)
            if cmd[0] in ("=head1", "=head2", "=head3", "=head4", "=item") and len(cmd) > 1:
                out.append(cmd[1].strip())
            continue
        if par[:1] in (" ", "\t"):
            continue  # verbatim (code) paragraph
        out.append(par)
    text = "\n\n".join(out)
    for _ in range(3):  # nested formatting codes: B<I<x>> and C<< a->b >>
        text = re.sub(r"[A-Z]<<+\s+(.*?)\s+>>+", r"\1", text)
        text = re.sub(r"L<(?:[^|>]*\|)?([^>]*)>", r"\1", text)
        text = re.sub(r"E<(\w+)>", lambda m: html.unescape(f"&{m.group(1)};"), text)
        text = re.sub(r"[BICFSXZ]<([^<>]*)>", r"\1", text)
    return unwrap(text)


# ----------------------------------------------------------------------------- HTML (django)
class _HtmlText(html.parser.HTMLParser):
    SKIP = {"script", "style", "pre", "head", "nav", "footer", "table", "code"}
    BLOCK = {"p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "br", "tr",
             "section", "blockquote", "ul", "ol", "dl"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skip:
            self.skip -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data.replace("\n", " "))


def clean_html(text):
    # Sphinx code blocks and sidebars: cut them out before parsing (nested divs confuse a
    # tag counter); they are never prose.
    text = re.sub(r'<div class="(?:highlight|sphinxsidebar|related|footer)[^"]*".*?</div>\s*</div>',
                  " ", text, flags=re.S)
    p = _HtmlText()
    p.feed(text)
    body = "".join(p.parts)
    body = body.replace("¶", "")
    return "\n\n".join(re.sub(r"\s+", " ", par).strip() for par in body.split("\n\n"))


# ----------------------------------------------------------------------------- dictd dictionaries
def clean_dictd(text, source):
    """GCIDE/FOLDOC entries: drop pronunciation and etymology markup, keep definitions."""
    entries = re.split(r"\n(?=\S)", text)  # an entry starts at a non-indented line
    out = []
    for e in entries:
        if e.startswith("00-database") or e.startswith("00database"):
            continue
        head, _, body = e.partition("\n")
        head = re.sub(r"\\[^\\]*\\", "", head)           # GCIDE \Pro*nun"ci*a`tion\
        body = re.sub(r"\[1913 Webster\]|\[Webster 1913 Suppl\.\]|\[PJC\]|\[WordNet 1\.5\]", "",
                      body)
        body = re.sub(r"^\s*\[[^\]]*\]\s*$", "", body, flags=re.M)  # FOLDOC editorial notes
        body = re.sub(r"^\s*\(\d{4}-\d{2}-\d{2}\)\s*$", "", body, flags=re.M)
        body = re.sub(r"\{([^{}]*)\}", r"\1", body)
        body = re.sub(r"<(\w[\w ]*)>", r"(\1)", body)
        if source == "dict-gcide":
            body = re.sub(r"\[(?:L\.|Gr\.|F\.|OE\.|AS\.|Cf\.|See|Prob\.|From|Of|It\.|Sp\.)[^\]]*\]",
                          "", body)
        text_e = unwrap(head.strip().rstrip(",") + "\n\n" + body)
        out.append(text_e)
    return "\n\n".join(out)


# ----------------------------------------------------------------------------- WordNet glosses
def wordnet_glosses(path):
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("  ") or "|" not in line:
            continue  # licence header
        fields, gloss = line.split("|", 1)
        f = fields.split()
        n_words = int(f[3], 16)
        words = [f[4 + 2 * i].replace("_", " ") for i in range(n_words)]
        gloss = gloss.strip().rstrip(";")
        out.append(f"{', '.join(words)}: {gloss}.")
    return "\n\n".join(out)


# ----------------------------------------------------------------------------- SWORD zText
def sword_ztext(module_dir):
    """SWORD zText: .bzs holds (offset, size, uncompressed size) u32 triples per zlib block."""
    parts = []
    for testament in ("ot", "nt"):
        bzs = (module_dir / f"{testament}.bzs").read_bytes()
        bzz = (module_dir / f"{testament}.bzz").read_bytes()
        if len(bzs) % 12:
            raise ValueError(f"{module_dir}/{testament}.bzs: size {len(bzs)} is not a multiple of 12")
        for i in range(len(bzs) // 12):
            off, size, usize = struct.unpack_from("<III", bzs, 12 * i)
            if off + size > len(bzz):
                raise ValueError(f"{module_dir}/{testament}.bzz: block {i} at {off}+{size} "
                                 f"past end {len(bzz)}")
            block = zlib.decompress(bzz[off:off + size]).decode("utf-8", errors="replace")
            block = re.sub(r"<note\b.*?</note>", "", block, flags=re.S)   # footnotes
            block = re.sub(r"<title\b[^>]*>(.*?)</title>", r"\n\n\1\n\n", block, flags=re.S)
            block = re.sub(r"<(?:p|lb|div)\b[^>]*/?>", "\n\n", block)
            block = re.sub(r"<[^>]+>", " ", block)
            parts.append(html.unescape(block))
    text = "".join(parts)
    return "\n\n".join(re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text))


# ----------------------------------------------------------------------------- R lazy-load data
def r_rdb_strings(rdb_path, min_len=1000):
    """Character vectors of >= min_len elements from an R lazy-load database (.rdb).

    Each object is stored as a 4-byte big-endian length followed by a zlib stream of an R XDR
    serialisation. A STRSXP is: flags (low byte 16), int32 length, then per element a CHARSXP:
    flags (low byte 9), int32 byte length (-1 = NA), bytes. Only long string vectors are taken:
    the novels' lines.
    """
    data = rdb_path.read_bytes()
    pos, vectors = 0, []
    while pos + 4 < len(data):
        d = zlib.decompressobj()
        raw = d.decompress(data[pos + 4:])
        consumed = len(data) - pos - 4 - len(d.unused_data)
        pos += 4 + consumed
        i = 0
        while i + 8 <= len(raw):
            flags, n = struct.unpack_from(">ii", raw, i)
            if flags & 0xFF == 16 and n >= min_len and i + 16 <= len(raw) and \
                    raw[i + 11] == 9:
                j, strings = i + 8, []
                for _ in range(n):
                    cflags, ln = struct.unpack_from(">ii", raw, j)
                    if cflags & 0xFF != 9:
                        raise ValueError(f"{rdb_path}: CHARSXP expected at {j}, flags {cflags:#x}")
                    j += 8
                    if ln < 0:
                        strings.append("")
                        continue
                    strings.append(raw[j:j + ln].decode("utf-8", errors="replace"))
                    j += ln
                vectors.append(strings)
                i = j
            else:
                i += 1
    return vectors


# ----------------------------------------------------------------------------- fortunes
def fortunes(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    return "\n\n".join(unwrap(f) for f in text.split("\n%\n") if f.strip())


# ----------------------------------------------------------------------------- sources
def extract(root):
    """Yields (source, name, text) for every text the packages hold."""
    share = root / "usr/share"
    for p in sorted((share / "doc/linux-doc-6.1/html/_sources").rglob("*.rst.txt")):
        yield "linux-doc-6.1", str(p.relative_to(share)), clean_rst(p.read_text(errors="replace"))
    for p in sorted((share / "doc/python3.11/html/_sources").rglob("*.rst.txt")):
        yield "python3.11-doc", str(p.relative_to(share)), clean_rst(p.read_text(errors="replace"))
    for p in sorted((share / "perl/5.36.0/pod").glob("*.pod")):
        yield "perl-doc", str(p.relative_to(share)), clean_pod(p.read_text(errors="replace"))
    django = share / "doc/python-django-doc/html"
    for p in sorted(django.rglob("*.html")):
        rel = p.relative_to(django)
        if rel.parts[0] in ("_modules", "_static", "_images") or rel.name in ("genindex.html",
                                                                               "search.html",
                                                                               "py-modindex.html"):
            continue
        yield "python-django-doc", str(rel), clean_html(p.read_text(errors="replace"))
    for name in ("gcide", "foldoc"):
        src = f"dict-{name}"
        yield src, name, clean_dictd(read_maybe_gz(share / f"dictd/{name}.dict.dz"), src)
    for pos in ("noun", "verb", "adj", "adv"):
        yield "wordnet-base", pos, wordnet_glosses(share / f"wordnet/data.{pos}")
    yield "sword-text-web", "engWEB2015eb", sword_ztext(
        share / "sword/modules/texts/ztext/engWEB2015eb")
    rdb = root / "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
    for k, lines in enumerate(r_rdb_strings(rdb)):
        # Lines of a novel: an empty line ends a paragraph.
        yield "r-cran-janeaustenr", f"novel{k}", "\n".join(lines).replace("\n\n", "\0") \
            .replace("\n", " ").replace("\0", "\n\n")
    for p in sorted((share / "games/fortunes").iterdir()):
        if p.is_file() and not p.suffix and not p.is_symlink():
            yield "fortunes", p.name, fortunes(p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="folder the .deb files were unpacked into")
    ap.add_argument("out", type=Path, help="folder for train.txt, heldout.txt, stats.json")
    args = ap.parse_args()
    stats = {}
    with open(args.out / "train.txt.tmp", "w", encoding="utf-8") as ftr, \
            open(args.out / "heldout.txt.tmp", "w", encoding="utf-8") as fho:
        first = {"train": True, "heldout": True}
        for source, name, text in extract(args.root):
            s = stats.setdefault(source, {"train_bytes": 0, "heldout_bytes": 0, "docs": 0})
            for k, doc in enumerate(split_docs(normalise(text))):
                split = "heldout" if zlib.crc32(f"{source}/{name}#{k}".encode()) % HELDOUT_MOD == 0 \
                    else "train"
                f = fho if split == "heldout" else ftr
                f.write(("" if first[split] else DOC_SEP) + doc)
                first[split] = False
                s[f"{split}_bytes"] += len(doc.encode("utf-8"))
                s["docs"] += 1
        for f in (ftr, fho):
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())  # temp + fsync + rename: a crash never leaves half a corpus
    for split in ("train", "heldout"):
        (args.out / f"{split}.txt.tmp").replace(args.out / f"{split}.txt")
    (args.out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    for source, s in stats.items():
        print(f"{source:20s} train {s['train_bytes'] / 1e6:7.2f} MB  heldout "
              f"{s['heldout_bytes'] / 1e6:6.2f} MB  docs {s['docs']}")
    tot = sum(s["train_bytes"] for s in stats.values()), sum(s["heldout_bytes"] for s in stats.values())
    print(f"{'total':20s} train {tot[0] / 1e6:7.2f} MB  heldout {tot[1] / 1e6:6.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
