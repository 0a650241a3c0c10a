"""Fixtures shared by the pytest suites."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tool():
    """tool(name, *args): runs a CLI of the build (in $MOESTREAM_BIN_DIR, else build/bin) with a
    300 s limit; returns its CompletedProcess (text). The test is skipped when the CLI is not built."""
    def run(name, *args):
        exe = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / name
        if not exe.exists():
            pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
        return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=300)
    return run
