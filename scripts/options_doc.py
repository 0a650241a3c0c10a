#!/usr/bin/env python3
"""Writes docs/options.md from the option table (runtime/engine/options.h), through the tools
that parse it: `infer --help-markdown` gives every option infer takes (the engine's among them),
`moestream-server --help-markdown` adds the server's own section. With --check it writes nothing
and exits 1 when docs/options.md differs from what the table makes (tests/python/test_options.py).

    python3 scripts/options_doc.py [--check]     # MOESTREAM_BIN_DIR: the build's bin (build/bin)
"""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "options.md"
HEAD = """# Options

<!-- Made by scripts/options_doc.py from the option table (runtime/engine/options_table.cpp); do
not edit: change the table and run the script. tests/python/test_options.py checks they agree. -->

Every option of `infer`, `moestream-server` and Python's `moestream.Model(...)` /
`Model.generate(...)` is declared once, in runtime/engine/options_table.cpp: its name, type,
range, group, the tools it applies to, its environment variable and help. The flags, `--help`'s
sections, Python's keywords, the cross-option rules and this page are made from it; each default
is the initial value of the field the option sets.

- A flag's value can also come from its environment variable (`MOESTREAM_<NAME>`), below the
  command line; Python reads the same variable for a keyword not given.
- Errors name an option as its reader writes it: `--io-qd` on the command line, `io_qd` in Python,
  the JSON field (`temperature`) in a server response.
- Sampling options are per request on the server (JSON fields of the same names; docs/server.md).
- Cross-option rules (e.g. `--gpu-cache-mb` needs `--gpu`; `--replay-routing` excludes
  `--cache-aware`) are rows of the same file, checked before any slow work.
"""


def markdown(tool):
    bin_dir = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", ROOT / "build" / "bin"))
    r = subprocess.run([str(bin_dir / tool), "--help-markdown"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit(f"{tool} --help-markdown exited {r.returncode}: {r.stderr}")
    return r.stdout


def sections(text):
    """{title: section text} of ### sections, in order."""
    out, title = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("### "):
            title = line[4:].strip()
            out[title] = ""
        if title:
            out[title] += line
    return out


def document():
    infer = sections(markdown("infer"))
    server = sections(markdown("moestream-server"))
    parts = [HEAD, "\n## Options by group\n"]
    for title, text in infer.items():
        parts.append("\n" + text.rstrip("\n") + "\n")
    for title, text in server.items():
        if title not in infer:  # the server's own (HTTP) options; the rest are infer's rows
            parts.append("\n" + text.rstrip("\n") + "\n")
    return "".join(parts)


def main():
    want = document()
    if "--check" in sys.argv[1:]:
        have = DOC.read_text() if DOC.exists() else ""
        if have != want:
            print(f"{DOC.relative_to(ROOT)} differs from the option table: run python3 scripts/options_doc.py")
            return 1
        return 0
    DOC.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
