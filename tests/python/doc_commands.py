"""The commands README.md and docs/*.md tell a user to run, found by scanning the markdown: fenced
blocks, inline code and prose (test_docs_smoke.py's first test holds every one to a smoke case)."""
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

DOCS = ["README.md", "docs/*.md"]


def _executables():
    """Names of the CLIs and bench programs the build makes (add_executable in tools/, bench/)."""
    names = set()
    for cm in ("tools/CMakeLists.txt", "bench/CMakeLists.txt"):
        names |= set(re.findall(r"add_executable\(\s*([\w.+-]+)", (ROOT / cm).read_text()))
    return names


_BIN_RE = re.compile(r"(?<![\w/.-])(?:\./)?build[\w.-]*/bin/([\w.+-]*\w)")
_PATH_RE = re.compile(r"(?<![\w/.-])(?:\./)?((?:bench|scripts|python)/[\w/.-]*\w\.(?:sh|py)|\.ci/run)(?![\w/-])")
_SPAN_RE = re.compile(r"`([^`\n]+)`")
# The program a command line starts with: after a `$ ` prompt, `(cd DIR &&`, VAR=value
# assignments, sudo, and a bash/python3 interpreter.
_LEAD_RE = re.compile(r"^\s*(?:\$\s+)?(?:\(?\s*cd\s+(\S+)\s*&&\s*)?(?:[A-Za-z_]\w*=\S*\s+)*(?:sudo\s+)?"
                      r"(?:(?:bash|sh|python3?)\s+)?(\S+)")
_FENCE_RE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


def _leading_command(text, exes):
    m = _LEAD_RE.match(text)
    if not m:
        return []
    cd, word = m.group(1), m.group(2).rstrip(");")
    if cd and re.search(r"\.(sh|py)$", word):  # `(cd python/training && python3 x.py)`
        path = os.path.normpath(os.path.join(cd, word))
        if re.match(r"(bench|scripts|python)/", path):
            return [path]
    if word in exes:
        return ["bin/" + word]
    if word == "pip" and re.search(r"\binstall\s+\./python\b", text):
        return ["pip install ./python"]
    if word == "curl" and re.search(r"https?://", text):  # a request, not the word
        return ["curl"]
    return []


def documented_commands(path, text, exes):
    """Yields (line number, line, key) for every command found in one markdown file."""
    fence = lang = None
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE_RE.match(line)
        if m and (fence is None or line.strip().startswith(fence)):
            if fence is None:
                fence, lang = m.group(1), m.group(2).lower()
                if lang in ("python", "py", "python3"):
                    yield n, line, f"python example in {path}"
            else:
                fence = None
            continue
        keys = ["bin/" + b for b in _BIN_RE.findall(line)] + _PATH_RE.findall(line)
        if fence is not None:
            if lang not in ("python", "py", "python3"):
                keys += _leading_command(line, exes)
        else:
            for span in _SPAN_RE.findall(line):
                keys += _leading_command(span, exes)
        for key in dict.fromkeys(keys):
            yield n, line.strip(), key


def all_documented_commands():
    exes = _executables()
    files = sorted({p for pattern in DOCS for p in ROOT.glob(pattern)})
    for p in files:
        rel = p.relative_to(ROOT).as_posix()
        for n, line, key in documented_commands(rel, p.read_text(encoding="utf-8"), exes):
            yield rel, n, line, key
