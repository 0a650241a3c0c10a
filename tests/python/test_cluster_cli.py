"""`infer --collect-routing` and `cluster_experts` end to end on a copy of the demo model: routing
logs append across runs, clustering + repack keeps the output tokens, and bad input (a log of
another model, a corrupt log, a map that is not a permutation) exits 1 with a clear message, and
the order depends on the inputs only (a move budget, no clock)."""
import json
import pathlib
import shutil
import struct

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
PROMPT = "1,9,25,300,17,4,88,1024"


@pytest.fixture
def model(tmp_path):
    if not (DEMO / "experts" / "layer_000.bin").exists():
        pytest.skip(f"demo model {DEMO} absent")
    dst = tmp_path / "demo"
    shutil.copytree(DEMO, dst, ignore=shutil.ignore_patterns("figures", "routing", "heldout*.txt"))
    return dst


def tokens(tool, model_dir, log=None):
    args = ["-m", model_dir, "--prompt-ids", PROMPT, "-n", "12", "--temp", "0", "--print-ids",
            "--ignore-eos"]
    if log:
        args += ["--collect-routing", log]
    r = tool("infer", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def xxh64(data, seed=0):
    """XXH64 (the reference algorithm), for writing a .map file with a valid checksum."""
    P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                          0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
    M = (1 << 64) - 1
    rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M  # noqa: E731
    def rnd(acc, lane):
        return (rotl((acc + lane * P2) & M, 31) * P1) & M
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            for j in range(4):
                v[j] = rnd(v[j], struct.unpack_from("<Q", data, i + 8 * j)[0])
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = ((h ^ rnd(0, x)) * P1 + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1 & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ (data[i] * P5 & M), 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return h ^ (h >> 32)


RECORD = 24 + 6 * 4 + 8  # demo: top-4, no router inputs


def test_routing_log_appends_and_repack_keeps_tokens(tool, model, tmp_path):
    log = tmp_path / "r.bin"
    want = tokens(tool, model, log)
    size1 = log.stat().st_size
    assert size1 == 64 + 8 * (8 + 12 - 1) * RECORD  # 8 layers, prompt + 11 fed-back tokens
    tokens(tool, model, log)
    assert log.stat().st_size == 64 + 2 * (size1 - 64)  # appended, header once

    r = tool("cluster_experts", "--routing", log, "--model", model, "--method", "seriation",
             "--repack", "--json", "--search-moves", "3000")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["repacked"] is True
    assert summary["train"]["chosen"]["read_ops_per_token"] <= summary["train"]["identity"]["read_ops_per_token"]
    assert all((model / "experts" / f"layer_{l:03d}.map").exists() for l in range(8))
    assert not (model / "experts.repack").exists()
    assert tokens(tool, model) == want
    r = tool("infer", "-m", model, "--prompt-ids", PROMPT, "-n", "12", "--temp", "0", "--print-ids",
             "--ignore-eos", "--io", "uring")
    assert r.returncode == 0 and r.stdout.strip() == want, r.stderr


def test_log_of_another_model_is_refused(tool, model, tmp_path):
    log = tmp_path / "r.bin"
    tokens(tool, model, log)
    cfg = json.loads((model / "model.json").read_text())
    cfg["rms_norm_eps"] = 1e-5  # another model: model.json differs
    (model / "model.json").write_text(json.dumps(cfg))
    r = tool("cluster_experts", "--routing", log, "--model", model)
    assert r.returncode == 1
    assert "routing log of another model" in r.stderr and str(log) in r.stderr
    r = tool("infer", "-m", model, "--prompt-ids", "1,2", "-n", "1", "--print-ids",
             "--collect-routing", log)
    assert r.returncode == 1 and "another model" in r.stderr


def test_corrupt_log_is_refused_and_truncated_tail_warned(tool, model, tmp_path):
    log = tmp_path / "r.bin"
    tokens(tool, model, log)
    data = bytearray(log.read_bytes())
    cut = tmp_path / "cut.bin"
    cut.write_bytes(bytes(data[:-7]))
    r = tool("cluster_experts", "--routing", cut, "--model", model, "--search-moves", "1000")
    assert r.returncode == 0, r.stderr
    assert "truncated tail" in r.stderr
    data[64 + RECORD + 26] ^= 0xFF  # second record's ids
    log.write_bytes(bytes(data))
    r = tool("cluster_experts", "--routing", log, "--model", model)
    assert r.returncode == 1
    assert "corrupt routing record" in r.stderr and f"offset {64 + RECORD}" in r.stderr


def test_xxh64_matches_a_map_written_by_cluster_experts(tool, model, tmp_path):
    log = tmp_path / "r.bin"
    tokens(tool, model, log)
    r = tool("cluster_experts", "--routing", log, "--model", model, "--maps-out", tmp_path / "maps",
             "--search-moves", "1000")
    assert r.returncode == 0, r.stderr
    data = (tmp_path / "maps" / "experts" / "layer_000.map").read_bytes()
    assert struct.unpack("<Q", data[-8:])[0] == xxh64(data[:-8])


def test_map_that_is_not_a_permutation_is_refused(tool, model, tmp_path):
    log = tmp_path / "r.bin"
    tokens(tool, model, log)
    slots = list(range(32))
    slots[3] = 7  # slot 7 twice
    body = b"MOEXMAP\0" + struct.pack("<II", 1, 32) + struct.pack("<32I", *slots)
    (model / "experts" / "layer_002.map").write_bytes(body + struct.pack("<Q", xxh64(body)))
    r = tool("cluster_experts", "--routing", log, "--model", model)
    assert r.returncode == 1
    assert "layer_002.map" in r.stderr and "not a permutation" in r.stderr


def test_same_inputs_give_the_same_maps_and_the_budget_is_reported(tool, model, tmp_path):
    log = tmp_path / "r.bin"
    tokens(tool, model, log)
    outs = []
    for i in range(2):
        r = tool("cluster_experts", "--routing", log, "--model", model, "--maps-out", tmp_path / f"m{i}",
                 "--search-moves", "2000", "--io-direct", "--direct-max-read-kb", "128", "--json")
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    for l in range(8):
        name = pathlib.Path("experts") / f"layer_{l:03d}.map"
        assert (tmp_path / "m0" / name).read_bytes() == (tmp_path / "m1" / name).read_bytes()
    assert outs[0] == outs[1]
    geo = outs[0]["geometry"]
    assert geo["direct"] is True and geo["direct_max_read_bytes"] == 128 << 10
    # 2,000 moves a layer, 8 layers, seriation only (identity and greedy do not search)
    assert 0 < outs[0]["search"]["moves"] <= 8 * 2000
    assert outs[0]["search"]["max_moves_per_layer"] == 2000
    r = tool("cluster_experts", "--help")
    assert "--search-moves" in r.stdout and "--search-seconds" not in r.stdout
    assert "--direct-max-read-kb" in r.stdout and "--io-direct" in r.stdout


def test_maps_out_map_next_to_unrepacked_files_is_refused(tool, model, tmp_path):
    """Issue 17: a valid map copied next to layer files not repacked in its order read other experts
    with exit 0. Each map is bound to the file it describes: this is now a clear error naming both."""
    log = tmp_path / "r.bin"
    want = tokens(tool, model, log)
    r = tool("cluster_experts", "--routing", log, "--model", model, "--maps-out", tmp_path / "maps",
             "--search-moves", "1000")
    assert r.returncode == 0, r.stderr
    for m in (tmp_path / "maps" / "experts").iterdir():
        shutil.copy(m, model / "experts" / m.name)
    r = tool("infer", "-m", model, "--prompt-ids", PROMPT, "-n", "12", "--temp", "0", "--print-ids")
    assert r.returncode == 1 and r.stdout.strip() == ""
    assert "layer_000.map does not describe" in r.stderr and "layer_000.bin" in r.stderr, r.stderr
    r = tool("cluster_experts", "--routing", log, "--model", model, "--repack")
    assert r.returncode == 1 and "does not describe" in r.stderr, r.stderr
    assert not (model / "experts.repack").exists()
    for m in (tmp_path / "maps" / "experts").iterdir():
        (model / "experts" / m.name).unlink()
    assert tokens(tool, model) == want  # the files themselves were never touched


def test_legacy_map_is_refused_until_bound(tool, model, tmp_path):
    """A model repacked by the previous version (version-1 maps, no binding) is refused with the way
    out; --bind-legacy-maps binds its maps and it reads as before."""
    log = tmp_path / "r.bin"
    want = tokens(tool, model, log)
    r = tool("cluster_experts", "--routing", log, "--model", model, "--repack", "--search-moves", "1000")
    assert r.returncode == 0, r.stderr
    for l in range(8):
        p = model / "experts" / f"layer_{l:03d}.map"
        data = p.read_bytes()
        assert struct.unpack_from("<I", data, 8)[0] == 2 and len(data) == 32 + 4 * 32
        body = b"MOEXMAP\0" + struct.pack("<II", 1, 32) + data[16:16 + 4 * 32]
        p.write_bytes(body + struct.pack("<Q", xxh64(body)))
    r = tool("infer", "-m", model, "--prompt-ids", PROMPT, "-n", "12", "--temp", "0", "--print-ids")
    assert r.returncode == 1 and "version-1 map" in r.stderr and "--bind-legacy-maps" in r.stderr, r.stderr
    r = tool("cluster_experts", "--model", model, "--bind-legacy-maps")
    assert r.returncode == 0 and "bound 8 version-1 map(s)" in r.stderr, r.stderr
    assert tokens(tool, model) == want


PROFILE = {"format": "moestream-io-profile", "version": 1, "op_latency_us": 400.0, "iops_limit": 3000.0,
           "queue_depth": 64, "bandwidth_gbps": 0.25, "single_read_gbps": 0.25}


def test_io_profile_keeps_tokens_and_a_bad_profile_is_refused(tool, model, tmp_path):
    """--io-profile changes which reads are merged, never the bytes: the same tokens as without;
    cluster_experts plans with it; a profile with a bad field exits 1 naming the file and field."""
    good = tmp_path / "profile.json"
    good.write_text(json.dumps(PROFILE))
    base = tokens(tool, model)
    r = tool("infer", "-m", model, "--prompt-ids", PROMPT, "-n", "12", "--temp", "0", "--print-ids",
             "--ignore-eos", "--io", "pread", "--io-direct", "--io-profile", good)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == base
    log = tmp_path / "r.bin"
    tokens(tool, model, log)
    r = tool("cluster_experts", "--routing", log, "--model", model, "--json", "--io-direct",
             "--io-profile", good)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["geometry"]["merge_rule"] is True
    assert out["io_profile"]["iops_limit"] == 3000.0
    for field, value in (("iops_limit", -1), ("bandwidth_gbps", None), ("op_latency_us", "fast")):
        bad = tmp_path / f"bad_{field}.json"
        bad.write_text(json.dumps({**PROFILE, field: value}))
        for t, args in (("infer", ["-m", model, "--prompt-ids", PROMPT, "-n", "1"]),
                        ("cluster_experts", ["--routing", log, "--model", model])):
            r = tool(t, *args, "--io-profile", bad)
            assert r.returncode == 1, (t, field, r.stdout)
            assert field in r.stderr and str(bad) in r.stderr, r.stderr
    missing = {k: v for k, v in PROFILE.items() if k != "queue_depth"}
    (tmp_path / "missing.json").write_text(json.dumps(missing))
    r = tool("infer", "-m", model, "--prompt-ids", PROMPT, "-n", "1", "--io-profile", tmp_path / "missing.json")
    assert r.returncode == 1 and "queue_depth is missing" in r.stderr, r.stderr
