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
        "infer": ["-m", m, "-p", "hi", "-n", "1", "-t", "1"],
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
    jobs = [(flag, v) for flag, kind, lo, hi in numeric_flags(tool) for v in bad_values(kind, lo, hi)]
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
