"""`infer --cache-aware` end to end on the demo model with O_DIRECT and a host cache holding ~23%
of the experts: tolerance 0 equals the plain run (ids and perplexity), telemetry is consistent
with the store's reads, a wider tolerance substitutes, bad values are one clear error."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
BASE = ["--io-direct", "--host-cache-mb", "4", "-t", "2"]


def infer(*args):
    exe = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / "infer"
    if not exe.exists():
        pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
    if not (DEMO / "model.json").exists():
        pytest.skip(f"demo model {DEMO} absent")
    return subprocess.run([str(exe), "-m", str(DEMO), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def gen(tmp_path, name, *extra):
    stats = tmp_path / f"{name}.json"
    r = infer(*BASE, "-p", "The history of the city", "-n", 48, "--temp", 0, "--ignore-eos",
              "--print-ids", "--stats-json", stats, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(stats.read_text())


def test_tolerance_zero_gives_the_plain_run_and_consistent_telemetry(tmp_path):
    plain_ids, plain = gen(tmp_path, "plain")
    ids0, s0 = gen(tmp_path, "zero", "--cache-aware", "--cache-tolerance", 0)
    assert ids0 == plain_ids
    assert "cache_aware" not in plain["decode"]
    ca = s0["decode"]["cache_aware"]
    assert ca["substitutions"] == 0 and ca["agreement"] == 1.0
    assert ca["misses_before"] == ca["misses_after"] > 0
    assert ca["misses_after"] == s0["decode_experts"]["experts_read"]


def test_wider_tolerance_substitutes_and_reads_less(tmp_path):
    _, s0 = gen(tmp_path, "zero", "--cache-aware", "--cache-tolerance", 0)
    _, s5 = gen(tmp_path, "wide", "--cache-aware", "--cache-tolerance", 0.5)
    ca = s5["decode"]["cache_aware"]
    assert ca["substitutions"] > 0 and 0.5 < ca["agreement"] < 1.0
    assert ca["misses_after"] < ca["misses_before"]
    assert ca["misses_after"] == s5["decode_experts"]["experts_read"]
    assert ca["substitutions_per_token"] == pytest.approx(ca["substitutions"] / s5["decode"]["tokens"])


def test_perplexity_at_tolerance_zero_equals_the_plain_run(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text((DEMO / "heldout_head.txt").read_text()[:1500])
    args = [*BASE, "--perplexity", f, "--ctx", 128, "--batch", 1]
    a, b = infer(*args), infer(*args, "--cache-aware", "--cache-tolerance", 0, "--timing")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout  # "perplexity X over N tokens ..."
    assert "routing agreement 1.0000" in b.stderr


def test_bad_tolerance_and_help():
    r = infer("--prompt-ids", "1", "--cache-aware", "--cache-tolerance", -1)
    assert r.returncode == 1 and "--cache-tolerance" in r.stderr
    h = infer("--help")
    assert "--cache-aware" in h.stdout and "--cache-tolerance" in h.stdout and "LOGIT" in h.stdout
