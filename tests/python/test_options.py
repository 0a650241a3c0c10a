"""Every option declared once (issue 39): the option table (runtime/engine/options_table.cpp)
makes infer's and the server's flags and --help sections, Python's keywords and docs/options.md;
errors name an option in the caller's spelling; no code below tools/ and python/ spells a flag."""
import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
BIN = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin")))
SECTIONS = ["Model and run", "Sampling", "I/O and store", "GPU", "Routing and cache-aware", "Benchmarking"]


def tool(name, *args, env=None):
    exe = BIN / name
    if not exe.exists():
        pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR)")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env})


def demo():
    if not (DEMO / "model.json").exists():
        pytest.skip(f"{DEMO} absent")
    return DEMO


def test_help_prints_the_sections_in_order():
    for name, sections in [("infer", SECTIONS), ("moestream-server", ["Model and run", "I/O and store", "GPU",
                                                                      "Routing and cache-aware", "Server"])]:
        out = tool(name, "--help").stdout
        at = [out.find(f"\n{s}:\n") for s in sections]
        assert all(i >= 0 for i in at) and at == sorted(at), (name, at)


def test_docs_options_page_is_what_the_table_makes():
    tool("infer", "--help")  # skips without the tools
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "options_doc.py"), "--check"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "MOESTREAM_BIN_DIR": str(BIN)})
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_table_flag_is_documented_and_every_documented_flag_is_a_flag():
    doc = (ROOT / "docs" / "options.md").read_text()
    listed = {f for cell in re.findall(r"^\| (`-.*?) \|", doc, re.M) for f in re.findall(r"`(-[-\w]+)`", cell)}
    helped = set()
    for name in ("infer", "moestream-server"):
        helped |= {f for line in re.findall(r"^\s+(-[-\w,]+)", tool(name, "--help").stdout, re.M)
                   for f in line.split(",")}
    assert helped - {"-h", "--help", "--help-markdown"} == listed


# Below tools/ and python/, no string literal spells a flag of the table: library code names options
# with marks (common/option_ref.h) and each front end spells them.
def table_flags():
    rows = re.findall(r'\{"([a-z_0-9]+)", "([^"]*)", k\w+, [^,]+, [^,]+, k\w+, [^,]+, (?:true|false), (true|false),',
                      (ROOT / "runtime" / "engine" / "options_table.cpp").read_text())
    flags = set()
    for name, cli, negated in rows:
        flags.add(("--no-" if negated == "true" else "--") + name.replace("_", "-"))
        flags |= {"--" + c for c in cli.split(",") if len(c) > 1}  # the table's names carry no dashes
    assert len(rows) > 50 and "--io-qd" in flags and "--temp" in flags
    return flags


def test_no_library_string_spells_a_flag():
    flags = table_flags()
    literal = re.compile(r'"(?:[^"\\\n]|\\.)*"')
    found = []
    for folder in ("runtime", "loader", "kernels", "cluster", "common"):
        for p in sorted((ROOT / folder).rglob("*")):
            if p.suffix not in (".cpp", ".h", ".cu", ".cuh") or p.name == "options_table.cpp":
                continue
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                code = line
                for m in re.finditer(r"//", line):  # a trailing comment: the // outside any literal
                    if line[:m.start()].count('"') % 2 == 0:
                        code = line[:m.start()]
                        break
                for s in literal.findall(code):
                    for m in re.finditer(r"(?<![\w-])--[a-z][\w-]*", s):
                        # A command line of another tool to type ("run cluster_experts --model DIR
                        # ...") is spelled as that tool takes it, whoever reads the message.
                        if m.group() in flags and not re.search(r"\b(cluster_experts|convert_model|bench_io)\b",
                                                                  s[:m.start()]):
                            found.append(f"{p.relative_to(ROOT)}:{i}: {m.group()}")
    assert not found, "\n".join(found)


# Python: every engine option is a keyword, checked for type and range, errors in its spelling.
@pytest.fixture(scope="module")
def ms():
    return pytest.importorskip("moestream", reason="moestream module not built")


def test_stub_lists_the_tables_model_keywords(ms):
    tree = ast.parse((ROOT / "python" / "moestream" / "__init__.pyi").read_text())
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    init = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    stub = {a.arg: ast.literal_eval(d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)}
    table = {o["name"]: o["default"] for o in ms.options() if o["where"] == "Model"}
    assert list(stub) == list(table)
    assert stub == table
    gen = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "generate")
    keywords = {a.arg for a in gen.args.args + gen.args.kwonlyargs}
    assert {o["name"] for o in ms.options() if o["where"] == "generate"} <= keywords


def test_gpu_keywords_the_bindings_lacked_are_accepted_and_checked(ms):
    m = demo()
    for kw in ("gpu_sync_layers", "gpu_no_graphs"):
        with pytest.raises(ms.ConfigError, match=f"^{kw}=True needs gpu=True$"):
            ms.Model(m, **{kw: True})
    with pytest.raises(ms.ConfigError, match="^cache_aware_union=True needs cache_aware=True"):
        ms.Model(m, cache_aware_union=True)
    with pytest.raises(ms.ConfigError, match="^replay_routing excludes cache_aware=True"):
        ms.Model(m, replay_routing="x.bin", cache_aware=True)
    with pytest.raises(ms.ConfigError, match="^lookahead_replayed=True needs replay_routing"):
        ms.Model(m, lookahead_replayed=True)


def test_keywords_are_typed_and_ranged(ms):
    m = demo()
    with pytest.raises(TypeError, match="io_direct must be a bool, got int"):
        ms.Model(m, io_direct=1)
    with pytest.raises(TypeError, match="threads must be an int, got float"):
        ms.Model(m, threads=2.0)
    with pytest.raises(TypeError, match="threads must be an int, got bool"):
        ms.Model(m, threads=True)
    with pytest.raises(ms.ConfigError, match=r"^io_qd must be in \[1, 4096\], got -1$"):
        ms.Model(m, io_qd=-1)
    with pytest.raises(ms.ConfigError, match=r"^io_rings must be in \[0, 1024\], got 340282366920938463463374607431768211456$"):
        ms.Model(m, io_rings=2 ** 128)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_predict'"):
        ms.Model(m, n_predict=3)


def test_environment_variable_is_read_when_the_keyword_or_flag_is_absent(ms, monkeypatch):
    m = demo()
    monkeypatch.setenv("MOESTREAM_IO_QD", "0")
    with pytest.raises(ms.ConfigError, match=r"io_qd from MOESTREAM_IO_QD"):
        ms.Model(m, threads=2)
    ms.Model(m, threads=2, io_qd=4)  # the keyword wins
    r = tool("infer", "-m", m, "--prompt-ids", "1", "-n", 1, "--print-ids", env={"MOESTREAM_IO_QD": "0"})
    assert r.returncode == 1 and "--io-qd" in r.stderr, r.stderr
    assert tool("infer", "-m", m, "--prompt-ids", "1", "-n", 1, "--print-ids", "--io-qd", 4,
                env={"MOESTREAM_IO_QD": "0"}).returncode == 0


def test_each_caller_reads_its_own_spelling(ms):
    m = demo()
    cli = tool("infer", "-m", m, "-p", "x", "--gpu-sync-layers")
    assert cli.returncode == 1 and "infer: error: --gpu-sync-layers needs --gpu\n" == cli.stderr, cli.stderr
    cli = tool("infer", "-m", m, "--prompt-ids", "1", "--top-p", 0)
    assert "infer: error: --top-p must be in (0, 1], got 0" in cli.stderr, cli.stderr
    model = ms.Model(m, threads=2)
    with pytest.raises(ms.ConfigError, match=r"^top_p must be in \(0, 1\], got 0"):
        model.generate([1, 2], 1, top_p=0.0)
    with pytest.raises(ms.ConfigError, match=r"^max_tokens must be >= 0"):
        model.generate([1, 2], -1)
