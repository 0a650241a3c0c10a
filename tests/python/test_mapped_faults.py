"""Mapped model files that fail under a running process (issue 47, docs/reliability.md): a file
truncated while infer, the server or the Python module computes from its mapping must give an
error naming the file and the offset (a 5xx for the server, which stays up; moestream.IoError in
Python; exit 1 from infer), never a death by SIGBUS; a file rewritten in place is refused.
Each case is deterministic (the file is cut between two calls, or while the process is stopped)
and bounded (a tiny model, timeouts of seconds)."""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import exe
from test_server import Server

ROOT = pathlib.Path(__file__).resolve().parents[2]
GGUF = ROOT / "tests" / "fixtures" / "gguf" / "olmoe-tiny-Q8_0.gguf"
PROMPT = "Once upon a time"


def _cut(path, keep):
    """Truncates path in place (the inode the process maps) to `keep` of its size."""
    os.truncate(path, int(path.stat().st_size * keep))


# The Python module in a child process: before the fix the SIGBUS killed the interpreter.
_PY = r"""
import os, sys, moestream
model, victim, keep, prompt = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
m = moestream.Model(model, threads=1)
first = m.generate([1, 2, 3], 4, temperature=0) if model.endswith(".gguf") else m.generate(prompt, 4, temperature=0)
os.truncate(victim, int(os.path.getsize(victim) * keep))
try:
    m.generate([4, 5, 6, 7] * 8, 8, temperature=0) if model.endswith(".gguf") else m.generate(prompt + " again", 8, temperature=0)
except moestream.IoError as e:
    print("IoError:", e)
    sys.exit(0)
except Exception as e:
    print(type(e).__name__ + ":", e)
    sys.exit(2)
print("no error")
sys.exit(3)
"""


def _python(model, victim, keep):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", _PY, str(model), str(victim), str(keep), PROMPT],
                          capture_output=True, text=True, timeout=120, env=env)


def test_python_gets_an_ioerror_naming_the_truncated_dense_file(demo):
    pytest.importorskip("moestream", reason="moestream module not built (PYTHONPATH=<build>/python)")
    victim = demo / "dense.safetensors"
    r = _python(demo, victim, 0.5)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)  # -7: killed by SIGBUS
    assert r.stdout.startswith("IoError:") and str(victim) in r.stdout, r.stdout


def test_python_gguf_truncated_in_place_is_an_ioerror(tmp_path):
    pytest.importorskip("moestream", reason="moestream module not built (PYTHONPATH=<build>/python)")
    if not GGUF.exists():
        pytest.skip(f"{GGUF} absent")
    g = tmp_path / GGUF.name
    shutil.copy(GGUF, g)
    r = _python(g, g, 0.5)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.startswith("IoError:") and str(g) in r.stdout and "offset" in r.stdout, r.stdout


def test_python_dense_file_rewritten_in_place_is_refused(demo):
    moestream = pytest.importorskip("moestream", reason="moestream module not built (PYTHONPATH=<build>/python)")
    dense = demo / "dense.safetensors"
    os.utime(dense, (1000, 1000))  # an mtime the rewrite below cannot share
    m = moestream.Model(demo, threads=1)
    want = m.generate(PROMPT, 4, temperature=0)
    data = bytearray(dense.read_bytes())
    data[-1000] ^= 0x40  # same size, one weight changed: before the fix, different text and no error
    with open(dense, "r+b") as f:
        f.write(data)
    with pytest.raises(moestream.IoError, match="changed while this process had it mapped"):
        m.generate(PROMPT, 4, temperature=0)
    assert want  # the first call ran


def test_infer_exits_1_naming_the_file_when_dense_is_truncated_mid_run(demo):
    dense = demo / "dense.safetensors"
    p = subprocess.Popen([exe("infer"), "-m", str(demo), "-p", PROMPT, "-n", "3000", "--ignore-eos", "-t", "1",
                          "--temp", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        got = b""
        while len(got) <= len(PROMPT) + 8:  # the prompt, then generated text: decoding runs
            chunk = os.read(p.stdout.fileno(), 4096)
            assert chunk, p.stderr.read()
            got += chunk
        p.send_signal(signal.SIGSTOP)
        assert p.poll() is None, "infer finished before the file could be cut"
        _cut(dense, 0.5)
        p.send_signal(signal.SIGCONT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err.decode()
    assert p.returncode == 1, (p.returncode, err)  # -7 before: SIGBUS
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and str(dense) in lines[0] and "at offset" in lines[0], err


def test_server_answers_5xx_and_stays_up_when_dense_is_truncated(demo):
    s = Server(model=demo)
    try:
        body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        assert s.post("/v1/completions", body).status_code == 200
        _cut(demo / "dense.safetensors", 0.5)
        r = s.post("/v1/completions", body)
        assert r.status_code >= 500, (r.status_code, r.text)  # before: no answer, the server died
        assert s.get("/health").status_code == 200
        assert s.proc.poll() is None
        r = s.post("/v1/completions", body)  # still refused: the mapping stays poisoned
        assert r.status_code >= 500, (r.status_code, r.text)
    finally:
        s.stop()
    log = s.proc.stderr.read()
    assert s.proc.returncode == 0, log  # a clean exit on SIGTERM, not a signal
    assert str(demo / "dense.safetensors") in log and "at offset" in log, log
