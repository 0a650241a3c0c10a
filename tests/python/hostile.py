"""Shared machinery of the hostile-input probe (test_hostile_probe*.py): a packed copy of the demo
model with routing logs and bound .map files, systematic mutations of its files, and the verdict
on one run of a CLI against a mutated input.

The verdict (docs/testing.md, "Hostile-input probe"): the process must exit before its timeout
(else a hang) and not by a signal (a crash); a refused input exits 1 with one
"<tool>: error: ..." line that names the problem (never "unexpected error"); an accepted input
must give exactly the clean run's output, unless the mutation is a legal change of the input
(for JSON files: the parsed document differs only at paths the test names as free, such as a
vocabulary string or rms_norm_eps). Anything else is a silent accept."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
MODEL_FILES = ["model.json", "dense.safetensors", "tokenizer.json", "tokenizer_config.json"]
TIMEOUT = 20
PROMPT = "Once upon a time"
ROUTING_PROMPTS = ["Once upon a time", "The little cat", "She said hello"]


def exe(name):
    p = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / name
    if not p.exists():
        pytest.skip(f"{p} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
    return str(p)


class Outcome:
    def __init__(self, what, rc, out, err, timed_out=False):
        self.what, self.rc, self.out, self.err, self.timed_out = what, rc, out, err, timed_out

    def __repr__(self):
        return f"<{self.what}: rc={self.rc} timeout={self.timed_out} err={self.err[-300:]!r}>"


def run(what, args, timeout=TIMEOUT, **kw):
    try:
        r = subprocess.run(args, capture_output=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return Outcome(what, None, e.stdout or b"", e.stderr or b"", timed_out=True)
    return Outcome(what, r.returncode, r.stdout, r.stderr.decode("utf-8", "replace"))


def run_all(jobs, fn):
    """fn over jobs on two worker threads (the machine class has 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(fn, jobs))


def sha(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def tree_hashes(root):
    root = pathlib.Path(root)
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


def build_model(dst):
    """demo's packed files copied to dst, plus routing logs of it and a repack (bound maps)."""
    dst = pathlib.Path(dst)
    dst.mkdir(parents=True)
    for name in MODEL_FILES:
        shutil.copy(DEMO / name, dst / name)
    shutil.copytree(DEMO / "experts", dst / "experts")
    log = dst.parent / "routing.log"
    for p in ROUTING_PROMPTS:
        r = run("collect", [exe("infer"), "-m", str(dst), "-p", p, "-n", "12", "--temp", "0", "-t", "1",
                            "--collect-routing", str(log)])
        assert r.rc == 0, r
    r = run("repack", [exe("cluster_experts"), "--model", str(dst), "--routing", str(log), "--repack"])
    assert r.rc == 0, r
    assert (dst / "experts" / "layer_000.map").exists()
    return dst, log


def variant(base, work, rel, data):
    """A model directory in work whose files hard-link base's, except rel, which holds data.
    Hard links keep it cheap; the test hashes base afterwards, so a run that wrote through a link
    into an input file is caught."""
    base, work = pathlib.Path(base), pathlib.Path(work)
    work.mkdir(parents=True)
    (work / "experts").mkdir()
    for p in base.rglob("*"):
        if p.is_file():
            q = work / p.relative_to(base)
            if str(p.relative_to(base)) != rel:
                os.link(p, q)
    (work / rel).write_bytes(data)
    return work


def flips(data, offsets, bit_of=lambda i: i % 8):
    """(label, bytes) for one flipped bit at each offset (the bit rotates with the offset)."""
    for n, off in enumerate(offsets):
        b = bytearray(data)
        bit = bit_of(n)
        b[off] ^= 1 << bit
        yield f"flip bit {bit} at {off}", bytes(b)


def byte_sets(data, offsets, values=(0x00, 0xFF)):
    for off in offsets:
        for v in values:
            if data[off] != v:
                b = bytearray(data)
                b[off] = v
                yield f"byte {v:#x} at {off}", bytes(b)


def truncations(data, lengths):
    for n in sorted(set(lengths)):
        if 0 <= n < len(data):
            yield f"truncated to {n}", data[:n]


def spread(lo, hi, count):
    """count offsets spread evenly over [lo, hi)."""
    if hi <= lo:
        return []
    step = max(1, (hi - lo) // count)
    return list(range(lo, hi, step))[:count]


def json_diff(a, b, path=""):
    """Paths where two parsed JSON documents differ ('{}' marks a changed key set)."""
    if type(a) is not type(b):
        return [path]
    if isinstance(a, dict):
        out = [] if a.keys() == b.keys() else [path + "{}"]
        for k in a.keys() & b.keys():
            out += json_diff(a[k], b[k], f"{path}.{k}" if path else k)
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [path + "[]"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += json_diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [path]


def verdict(o, clean_out, tool, names, legal=False):
    """None when the outcome is acceptable, else why not. names: words one of which the error
    must contain (the file or field). legal: the mutated input is a legal, different input."""
    if o.timed_out:
        return "hang (timeout)"
    if o.rc < 0:
        return f"crash (signal {-o.rc})"
    if o.rc != 0:
        lines = [l for l in o.err.splitlines() if l.strip()]
        if o.rc != 1:
            return f"exit code {o.rc}"
        if "unexpected error" in o.err or not any(l.startswith(f"{tool}: error: ") for l in lines):
            return "no clear error line"
        if names and not any(n in o.err for n in names):
            return f"error names none of {names}"
        return None
    if o.out == clean_out or legal:
        return None
    return "silent accept (exit 0, output differs from the clean run)"
