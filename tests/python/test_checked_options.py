"""Numeric options and model.json fields through the one checked conversion (common/checked.h):
infer's flags and Python's keywords out of range, NaN, or overflowing when turned into bytes, and
model.json paths that leave the model directory or token ids outside the vocabulary, each refused
with exit code 1 (or ConfigError/FormatError) and a message naming the option, field or file."""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
U64_MAX = 2 ** 64 - 1


@pytest.fixture(scope="module")
def demo():
    if not (DEMO / "model.json").exists() or not (DEMO / "tokenizer.json").exists():
        pytest.skip(f"demo model {DEMO} absent")
    return DEMO


def linked_model(src, dst, edit_json=None):
    """A model directory whose files hard-link src's (a symbolic link leading out of the model
    directory is refused), with model.json rewritten by edit_json(dict)."""
    dst.mkdir()
    for p in src.iterdir():
        if p.name == "model.json":
            continue
        if p.is_dir():
            shutil.copytree(p, dst / p.name, copy_function=os.link)
        else:
            os.link(p, dst / p.name)
    cfg = json.loads((src / "model.json").read_text())
    if edit_json:
        edit_json(cfg)
    (dst / "model.json").write_text(json.dumps(cfg))
    return dst


def assert_refused(r, *needles):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "unexpected error" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, f"{n!r} not in {r.stderr!r}"


@pytest.mark.parametrize("args,needles", [
    (["--ctx", "-5"], ["--ctx", "-5"]),
    (["-t", "-1"], ["--threads", "-1"]),
    (["--cache-aware", "--cache-tolerance", "nan"], ["--cache-tolerance", "nan"]),
    (["--cache-tolerance", "inf"], ["--cache-tolerance", "inf"]),
    (["--host-cache-mb", str(U64_MAX)], ["--host-cache-mb", str(U64_MAX)]),
    (["--coalesce-gap-kb", str(U64_MAX)], ["--coalesce-gap-kb"]),
    (["--gpu-cache-mb", str(U64_MAX)], ["--gpu-cache-mb"]),
    (["--temp", "nan"], ["--temp", "nan"]),
    (["--min-p", "nan"], ["--min-p", "nan"]),
    (["--typical-p", "0"], ["--typical-p"]),
    (["--repeat-penalty", "inf"], ["--repeat-penalty", "inf"]),
    (["--repeat-last-n", "-2"], ["--repeat-last-n", "-2"]),
    (["--presence-penalty", "nan"], ["--presence-penalty", "nan"]),
    (["--frequency-penalty", "-inf"], ["--frequency-penalty", "inf"]),
    (["--logit-bias", "5:101"], ["--logit-bias", "5:"]),
    (["--logit-bias", "five:1"], ["--logit-bias", "five:1"]),
    (["-n", "-3"], ["--n-predict", "-3"]),
])
def test_infer_refuses_bad_numbers_naming_the_flag(tool, demo, args, needles):
    assert_refused(tool("infer", "-m", demo, "-p", "hi", "-n", 2, *args), *needles)


def test_infer_accepts_the_edges_of_the_ranges(tool, demo):
    r = tool("infer", "-m", demo, "--prompt-ids", "5", "--print-ids", "-n", 2, "--temp", 0, "-t", 1,
             "--ctx", 16, "--cache-tolerance", 0)
    assert r.returncode == 0, r.stderr


def test_other_tools_refuse_bad_numbers(tool, demo, tmp_path):
    assert_refused(tool("convert_model", "-t", "-1", tmp_path / "hf", tmp_path / "out"), "--threads")
    assert_refused(tool("cluster_experts", "--model", demo, "--routing", tmp_path / "r.log",
                        "--bandwidth-gbps", "nan"), "--bandwidth-gbps")
    assert_refused(tool("synth_model", "--shape", "x", "--max-context", 0, tmp_path / "o"), "--max-context")


@pytest.mark.parametrize("field,value", [
    ("dense.file", "/etc/passwd"), ("dense.file", "../x"), ("experts.dir", "/tmp"),
    ("tokenizer.file", "../tokenizer.json"), ("tokenizer.config", "/dev/zero"),
])
def test_model_json_paths_stay_inside_the_model_directory(tool, demo, tmp_path, field, value):
    obj, key = field.split(".")
    m = linked_model(demo, tmp_path / "m", lambda c: c[obj].__setitem__(key, value))
    assert_refused(tool("infer", "-m", m, "-p", "hi", "-n", 1), "model.json", field, value)


def test_model_json_eos_beyond_the_vocabulary_is_refused(tool, demo, tmp_path):
    m = linked_model(demo, tmp_path / "m", lambda c: c.__setitem__("eos_token_id", c["vocab_size"]))
    assert_refused(tool("infer", "-m", m, "-p", "hi", "-n", 1), "model.json", "eos_token_id")


def tokenizer_with_far_eos(demo, dst):
    """demo with model.json naming no eos and a tokenizer whose eos token has id 9000 (> vocab)."""
    m = linked_model(demo, dst, lambda c: c.__setitem__("eos_token_id", None))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (m / name).unlink()
    tok = json.loads((demo / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 9000, "content": "<|far_eos|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    (m / "tokenizer.json").write_text(json.dumps(tok))
    tc = json.loads((demo / "tokenizer_config.json").read_text())
    tc["eos_token"] = "<|far_eos|>"
    tc["added_tokens_decoder"]["9000"] = {"content": "<|far_eos|>", "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
    (m / "tokenizer_config.json").write_text(json.dumps(tc))
    return m


def test_tokenizer_eos_beyond_the_vocabulary_is_refused(tool, demo, tmp_path):
    m = tokenizer_with_far_eos(demo, tmp_path / "m")
    assert_refused(tool("infer", "-m", m, "-p", "hi", "-n", 1), "tokenizer", "9000", "vocab")


def test_device_as_model_json_is_refused_not_read_until_memory_runs_out(tool, demo, tmp_path):
    m = linked_model(demo, tmp_path / "m")
    (m / "model.json").unlink()
    (m / "model.json").symlink_to("/dev/zero")
    assert_refused(tool("infer", "-m", m, "-p", "hi", "-n", 1), "model.json", "/dev/zero",
                   "outside the model directory")


# Python keywords: the same checks, in Python's spelling.
@pytest.fixture(scope="module")
def ms():
    return pytest.importorskip("moestream", reason="moestream module not built")


@pytest.mark.parametrize("kw,needle", [
    ({"ctx": -5}, "ctx"), ({"threads": -1}, "threads"), ({"batch": -1}, "batch"),
    ({"cache_aware": True, "cache_tolerance": float("nan")}, "cache_tolerance"),
    ({"host_cache_mb": U64_MAX}, "host_cache_mb"), ({"coalesce_gap_kb": U64_MAX}, "coalesce_gap_kb"),
    ({"gpu_cache_mb": U64_MAX}, "gpu_cache_mb"),
])
def test_model_keywords_raise_config_error_naming_the_keyword(ms, demo, kw, needle):
    with pytest.raises(ms.ConfigError, match=needle):
        ms.Model(demo, **kw)


def test_cluster_keywords_raise_config_error(ms, demo):
    with pytest.raises(ms.ConfigError, match="bandwidth_gbps"):
        ms.cluster(demo, [], bandwidth_gbps=float("nan"))
    with pytest.raises(ms.ConfigError, match="neighbour_weight"):
        ms.cluster(demo, [], neighbour_weight=-1.0)


def test_python_refuses_escaping_paths_and_far_eos(ms, demo, tmp_path):
    m = linked_model(demo, tmp_path / "m", lambda c: c["dense"].__setitem__("file", "../x"))
    with pytest.raises(ms.FormatError, match="dense.file"):
        ms.Model(m)
    far = tokenizer_with_far_eos(demo, tmp_path / "far")
    with pytest.raises(ms.ConfigError, match="9000"):
        ms.Model(far)


# Symbolic links: model.json's files, the experts directory and each layer file and map must stay
# inside the model directory once links are resolved, and be regular files: a link out (even to
# an identical copy), to /dev/zero or to a FIFO is refused naming it, and a FIFO never blocks.
LINKED = ["dense.safetensors", "tokenizer.json", "tokenizer_config.json", "experts",
          "experts/layer_003.bin", "experts/layer_003.map", "model.json"]


def run_infer(m, timeout=30):
    exe = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / "infer"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    return subprocess.run([str(exe), "-m", str(m), "-p", "hi", "-n", "1"], capture_output=True,
                          text=True, timeout=timeout)  # a blocked open is a TimeoutExpired: a failure


@pytest.mark.parametrize("target", ["copy", "/dev/zero", "fifo"])
@pytest.mark.parametrize("rel", LINKED)
def test_symlinks_out_of_the_model_directory_are_refused(demo, tmp_path, rel, target):
    m = linked_model(demo, tmp_path / "m")
    outside = tmp_path / "outside"
    if target == "copy":
        src = demo / rel
        if src.is_dir():
            shutil.copytree(src, outside)
        elif src.exists():
            shutil.copy(src, outside)
        else:
            outside.write_bytes(b"")
    elif target == "fifo":
        os.mkfifo(outside)
    else:
        outside = pathlib.Path(target)
    victim = m / rel
    if victim.is_dir():
        shutil.rmtree(victim)
    elif victim.exists():
        victim.unlink()
    victim.symlink_to(outside)
    assert_refused(run_infer(m), rel.split("/")[-1], "outside the model directory")


@pytest.mark.parametrize("rel", ["dense.safetensors", "tokenizer.json", "experts/layer_001.bin",
                                 "experts/layer_001.map", "model.json"])
def test_a_fifo_or_device_inside_the_model_directory_is_refused_without_blocking(demo, tmp_path, rel):
    m = linked_model(demo, tmp_path / "m")
    (m / rel).unlink(missing_ok=True)
    os.mkfifo(m / rel)
    assert_refused(run_infer(m), rel.split("/")[-1], "not a regular file")


def test_symlinks_inside_the_model_directory_are_followed(demo, tmp_path):
    m = linked_model(demo, tmp_path / "m")
    (m / "weights").mkdir()
    os.replace(m / "dense.safetensors", m / "weights" / "dense.safetensors")
    (m / "dense.safetensors").symlink_to("weights/dense.safetensors")
    os.replace(m / "experts", m / "weights" / "experts")
    (m / "experts").symlink_to(m / "weights" / "experts")  # absolute, still inside
    r, ref = run_infer(m), run_infer(demo)
    assert r.returncode == 0 and r.stdout == ref.stdout, (r.stderr, ref.stderr)


def test_python_refuses_a_symlink_out_of_the_model_directory(ms, demo, tmp_path):
    m = linked_model(demo, tmp_path / "m")
    (m / "tokenizer.json").unlink()
    (m / "tokenizer.json").symlink_to(demo / "tokenizer.json")
    with pytest.raises(ms.FormatError, match="outside the model directory"):
        ms.Model(m)


def test_model_io_profile_is_validated(ms, demo, tmp_path):
    p = tmp_path / "profile.json"
    good = {"format": "moestream-io-profile", "version": 1, "op_latency_us": 90.0, "iops_limit": 20000.0,
            "queue_depth": 64, "bandwidth_gbps": 1.2, "single_read_gbps": 0.6}
    p.write_text(json.dumps({**good, "iops_limit": 0}))
    with pytest.raises(ms.FormatError, match="iops_limit is 0"):
        ms.Model(demo, io_profile=p)
    p.write_text(json.dumps(good))
    assert ms.load_io_profile(p)["iops_limit"] == 20000.0
    ms.Model(demo, io_profile=p, io="pread", io_direct=True)
