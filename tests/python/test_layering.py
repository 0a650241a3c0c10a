"""The folders' include rules of docs/architecture.md ("Folders": the "may include" column) hold
in the source: every #include "folder/..." of a library folder names itself or a folder its row
allows (common/ is every folder's base). The table is read from the doc, so the doc and the code
cannot drift apart silently."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def folder_rules():
    """{folder: set of folders it may include} for the table's library rows."""
    rules = {}
    in_table = False
    for line in DOC.read_text().splitlines():
        if line.startswith("| folder (library)"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if not in_table or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        folders = re.findall(r"`([a-z_/]+)/`", cells[0])
        allowed = cells[-1]
        if not folders or "anything above" in allowed:
            continue
        names = set()
        for word in re.split(r",\s*", re.sub(r"\(.*?\)", "", allowed)):
            word = word.strip()
            if word and word != "—":
                names.add(word)
        for f in folders:
            rules[f] = names
    return rules


def resolve(name, folders):
    """A short name of the table ("model", "kernels/cpu") as a folder path."""
    for f in folders:
        if f == name or f.endswith("/" + name):
            return f
    raise AssertionError(f"docs/architecture.md names '{name}', which is no folder of its table")


def test_every_include_follows_the_folder_table():
    rules = folder_rules()
    assert {"common", "loader/format", "runtime/model", "runtime/server"} <= rules.keys(), sorted(rules)
    folders = sorted(rules, key=len, reverse=True)  # the longest match first (kernels/cpu before kernels)
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    bad = []
    for folder, allowed in rules.items():
        ok = {folder, "common"} | {resolve(a, folders) for a in allowed}  # common: every folder's base
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in SOURCES:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = include.match(line)
                if not m:
                    continue
                target = next((f for f in folders if m.group(1).startswith(f + "/")), None)
                if target is not None and target not in ok:
                    bad.append(f"{path.relative_to(ROOT)}:{n} includes {m.group(1)} ({folder} may include "
                               f"{', '.join(sorted(allowed)) or 'nothing'})")
    assert not bad, "\n".join(bad)
