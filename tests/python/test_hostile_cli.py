"""Hostile-input probe, command lines and routing logs: every numeric flag of every CLI (found in
its --help, so a new flag is probed without editing this file) given values that are not numbers,
NaN, infinities, out of its range, overflowing its type or its MB/KB-to-bytes conversion, or
empty, must exit 1 with an error naming the flag; the largest values a range admits must end
in a clear error or a normal run (under an address-space limit, so an allocation that cannot be
met fails instead of swapping); routing logs for cluster_experts truncated and flipped at many
offsets must be refused naming the log, or give the clean run's result."""
import json
import os
import pathlib
import re
import resource
import struct
import sys
import subprocess

import pytest

import hostile
from hostile import DEMO, exe, run, run_all, verdict

TOOLS = ["infer", "cluster_experts", "convert_model", "synth_model", "moestream-server"]
# Values no numeric flag may take, whatever its type and range.
NOT_NUMBERS = ["", "abc", "nan", "inf", "-inf", "1e999", "1,5", "5abc"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not (DEMO / "model.json").exists():
        pytest.skip(f"demo model {DEMO} absent")
    return hostile.build_model(tmp_path_factory.mktemp("cli") / "model")


def numeric_flags(tool):
    """(long flag, type, lo, hi) for each numeric option in tool's --help."""
    r = subprocess.run([exe(tool), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    flags = []
    for m in re.finditer(r"^\s+(?:-\w,)?(--[\w-]+)(?:,--[\w-]+)? (INT|UINT|FLOAT)(?::\[([^,\]]+), ([^\]]+)\])?",
                         r.stdout, re.M):
        flags.append((m.group(1), m.group(2), m.group(3), m.group(4)))
    return flags


def base_args(tool, model, tmp):
    """A command line of tool that is valid (or fails late, after flag parsing) without the flag."""
    m, log = model
    return {
        "infer": ["-m", m, "-p", "hi", "-n", "1"],
        "cluster_experts": ["--model", m, "--routing", log],
        "convert_model": [tmp / "no_hf", tmp / "out"],
        "synth_model": ["--shape", "no-such-shape", tmp / "synth"],  # never writes a model
        "moestream-server": ["-m", m, "--port", "0"],
    }[tool]


def bad_values(kind, lo, hi):
    vals = list(NOT_NUMBERS)
    if kind in ("INT", "UINT"):
        vals += ["2.5", "1e3", "0x10", " 7", str(2 ** 64), str(-(2 ** 63) - 1), "9" * 30]
        if lo is not None:
            vals += [str(int(float(lo)) - 1), str(int(float(hi)) + 1)]
        elif kind == "UINT":
            vals += ["-1"]
    else:
        vals += ["1e39", "-1e39"]  # beyond float
        if lo is not None:
            vals += [repr(float(lo) - 1), repr(float(hi) * 2 + 1)]
    return vals


def test_every_cli_lists_numeric_flags():
    for tool in TOOLS:
        assert numeric_flags(tool), tool


@pytest.mark.parametrize("tool", TOOLS)
def test_bad_flag_values_are_refused_naming_the_flag(model, tmp_path, tool):
    # The server shares infer's engine options (tools/engine_cli.h): probed once, through infer.
    shared = {f[0] for f in numeric_flags("infer")} if tool == "moestream-server" else set()
    jobs = [(flag, v) for flag, kind, lo, hi in numeric_flags(tool) if flag not in shared
            for v in bad_values(kind, lo, hi)]
    args = [str(a) for a in base_args(tool, model, tmp_path)]

    def one(job):
        flag, v = job
        o = run(f"{tool} {flag} {v!r}", [exe(tool), *args, f"{flag}={v}"], timeout=10)
        if o.timed_out:
            return (flag, v, "hang (or the value was accepted and the server started)")
        if o.rc != 1 or flag not in o.err or "unexpected error" in o.err:
            return (flag, v, o.rc, o.err[-300:])
        return None

    failures = [f for f in run_all(jobs, one) if f]
    assert failures == [], failures
    assert not (tmp_path / "out").exists() and not (tmp_path / "synth").exists()


def test_corrupt_routing_logs_are_refused_or_change_nothing(model, tmp_path):
    m, log = model
    data = log.read_bytes()
    rec = struct.unpack_from("<I", data, 64 + 4)[0]
    n_rec = (len(data) - 64) // rec
    assert 64 + n_rec * rec == len(data) and n_rec > 20

    def cluster(path):
        o = run("cluster_experts", [exe("cluster_experts"), "--model", str(m), "--routing", str(path),
                                    "--json", "--search-moves", "500"])
        o.out = o.out.replace(str(path).encode(), b"LOG")
        return o
    clean = cluster(log)
    assert clean.rc == 0, clean
    last = 64 + (n_rec - 1) * rec
    # Header, the first records field by field, then spread over the file and the last record.
    offs = list(range(0, 64)) + list(range(64, 64 + 2 * rec)) + hostile.spread(64 + 2 * rec, last, 40)
    offs += hostile.spread(last, len(data), 12)
    # The tag and length of records shortly before the last: corruption, not a torn tail.
    offs += [last - k * rec + f for k in (1, 3, 5) for f in (0, 4, 5)]
    muts = [(l, d, o) for (l, d), o in zip(hostile.flips(data, offs), offs)]
    cuts = [0, 8, 56, 63, 64, 65, 64 + rec // 2, 64 + rec + 3, len(data) // 2 + 1, len(data) - 1]
    # A cut file is what a crash mid-append leaves: its records, then a torn tail (or none).
    muts += [(l, d, last) for l, d in hostile.truncations(data, cuts)]
    muts.append(("garbage appended", data + b"\x01" * 9, len(data)))
    muts.append(("a record's bytes repeated", data + data[64:64 + rec], len(data)))

    def one(job):
        i, (label, d, off) = job
        p = tmp_path / f"r{i}" / "routing.log"
        p.parent.mkdir()
        p.write_bytes(d)
        o = cluster(p)
        # Documented: a bad last record is a torn tail from a crash, skipped with a warning.
        torn = off >= last and o.rc == 0 and (
            "warning" in o.err and "truncated tail" in o.err or (len(d) - 64) % rec == 0)
        why = verdict(o, clean.out, "cluster_experts", ["routing.log"], legal=torn)
        if hostile.sha(p) != hostile.hashlib.sha256(d).hexdigest():
            why = (why or "") + " the log was modified"
        return None if why is None else (label, why, o)

    failures = [f for f in run_all(list(enumerate(muts)), one) if f]
    for f in failures:
        print("PROBE", f[0], f[1], f[2].err[-300:])
    assert failures == [], failures


# Allocation failure: under an address-space limit an allocation that cannot be met must end in
# one error line naming what was being allocated and the option or file that sized it, exit 1.
AS_LIMIT = 1 << 30  # 1 GiB: the demo runs in a few hundred MiB; 1024 thread stacks do not fit


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def limited(tool, *args, timeout=60):
    path = exe(tool)
    with open(path, "rb") as f:
        text = f.read()
        if b"__asan_init" in text or b"__tsan_init" in text:
            pytest.skip("sanitizer build: RLIMIT_AS cannot work under ASan/TSan's shadow memory")
    return run(tool, [path, *map(str, args)], timeout=timeout, preexec_fn=_limit_address_space)


@pytest.mark.parametrize("tool,args,needles", [
    ("infer", ["--ctx", 1 << 24], ["the KV cache", "--ctx", "16777216", "model.json"]),
    ("infer", ["--io-direct", "--host-cache-mb", 100000], ["host cache", "--host-cache-mb", "100000"]),
    ("moestream-server", ["--port", 0, "--ctx", 1 << 24], ["the KV cache", "--ctx", "16777216"]),
    # Threads that cannot start: the pools join what started and name the option.
    ("infer", ["-t", 1024], ["worker threads", "--threads"]),
    ("infer", ["--io", "pread", "--io-threads", 1024], ["worker threads", "--io-threads"]),
    ("moestream-server", ["--port", 0, "--http-threads", 1024], ["HTTP threads", "--http-threads"]),
])
def test_a_failed_allocation_names_what_and_what_sized_it(model, tool, args, needles):
    m, _ = model
    base = ["-m", m] + (["-p", "hi", "-n", 1] if tool == "infer" else [])
    o = limited(tool, *base, *args)
    assert not o.timed_out and o.rc == 1, o
    assert "unexpected error" not in o.err and "bad_alloc" not in o.err, o.err
    for n in needles:
        assert n in o.err, (n, o.err)


def test_python_allocation_failure_is_a_config_error(model):
    m, _ = model
    code = ("import moestream as ms, sys\n"
            "try:\n    ms.Model(sys.argv[1], ctx=1 << 24)\n"
            "except ms.ConfigError as e:\n    print('ConfigError:', e)\n")
    pytest.importorskip("moestream", reason="moestream module not built")
    o = run("python", [sys.executable, "-c", code, str(m)], timeout=60, preexec_fn=_limit_address_space)
    assert o.rc == 0 and b"ConfigError: the KV cache" in o.out and b"ctx" in o.out, o


@pytest.mark.parametrize("tool", ["infer", "cluster_experts"])
def test_the_largest_values_a_range_admits_end_cleanly(model, tmp_path, tool):
    # Each numeric flag at the top of its range (a huge context, cache, thread count, read size)
    # runs normally or ends in a clear error; -n at its top would just generate for a long time.
    jobs = [(flag, hi) for flag, kind, lo, hi in numeric_flags(tool)
            if hi is not None and flag not in ("--n-predict",)]
    args = [str(a) for a in base_args(tool, model, tmp_path)]

    def one(job):
        flag, hi = job
        v = hi if kind_of(tool, flag) == "FLOAT" or "e" not in hi else str(int(float(hi)))
        o = limited(tool, *args, f"{flag}={v}")
        why = None
        if o.timed_out or o.rc not in (0, 1):
            why = "hang" if o.timed_out else f"exit {o.rc}"
        elif o.rc == 1 and ("unexpected error" in o.err or f"{tool}: error: " not in o.err):
            why = "unclear error"
        return None if why is None else (flag, v, why, o.err[-300:])

    failures = [f for f in run_all(jobs, one) if f]
    assert failures == [], failures


def kind_of(tool, flag):
    return {f: k for f, k, _, _ in numeric_flags(tool)}[flag]
