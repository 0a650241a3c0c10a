"""A pack's dense weights checked as expert payloads are (model.json's dense.xxh3, docs/format.md):
convert_model records the whole-file XXH3-64 (checked against the `xxhash` package, an outside
oracle), a load refuses a dense file that does not match it unless --no-verify, and a malformed
field is refused by name. Before the field existed, a changed dense file ran with exit 0 and
different text."""
import json
import pathlib
import subprocess

import pytest

from conftest import exe

xxhash = pytest.importorskip("xxhash", reason="the xxhash package (scripts/setup.sh installs it)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
FIXTURE = ROOT / "tests" / "fixtures" / "olmoe"


def _infer(model, *extra, prompt=("-p", "Once upon a time")):
    return subprocess.run([exe("infer"), "-m", str(model), *prompt, "-n", "8", "--temp", "0",
                           "-t", "1", *extra], capture_output=True, text=True, timeout=120)


def _recorded(model):
    return json.loads((model / "model.json").read_text())["dense"]["xxh3"]


def test_the_shipped_demo_records_its_dense_checksum():
    assert _recorded(DEMO) == xxhash.xxh3_64_hexdigest((DEMO / "dense.safetensors").read_bytes())


@pytest.mark.parametrize("tool,args", [
    ("convert_model", lambda out: ["-q", str(FIXTURE), str(out), "--quant", "q8"]),
    ("convert_model", lambda out: ["-q", str(FIXTURE), str(out), "--quant", "q8", "--dense-quant", "q8"]),
])
def test_converters_record_the_xxh3_of_the_dense_file(tmp_path, tool, args):
    if not (FIXTURE / "config.json").exists():
        pytest.skip(f"fixture {FIXTURE} absent")
    out = tmp_path / "model"
    r = subprocess.run([exe(tool), *args(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "model.json").read_text())
    assert cfg["dense"]["xxh3"] == xxhash.xxh3_64_hexdigest((out / cfg["dense"]["file"]).read_bytes())
    r = _infer(out, "--print-ids", prompt=("--prompt-ids", "1"))  # the load verifies it
    assert r.returncode == 0, r.stderr


def test_a_changed_dense_file_is_refused_unless_no_verify(demo):
    want = _infer(demo)
    assert want.returncode == 0, want.stderr
    dense = demo / "dense.safetensors"
    data = bytearray(dense.read_bytes())
    data[-1000] ^= 0x40  # one bf16 weight of the last tensor
    dense.write_bytes(data)
    r = _infer(demo)
    assert r.returncode == 1, (r.returncode, r.stdout)  # before: exit 0
    assert str(dense) in r.stderr and "does not match model.json's dense.xxh3" in r.stderr, r.stderr
    assert "--no-verify" in r.stderr
    assert _infer(demo, "--no-verify").returncode == 0


def test_a_malformed_checksum_field_is_refused_by_name(demo):
    cfg = json.loads((demo / "model.json").read_text())
    cfg["dense"]["xxh3"] = "not-hex"
    (demo / "model.json").write_text(json.dumps(cfg))
    r = _infer(demo)
    assert r.returncode == 1 and "dense.xxh3" in r.stderr and "16 lowercase hex digits" in r.stderr, r.stderr
