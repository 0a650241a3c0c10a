"""`infer` end to end: greedy ids against the transformers fixture, seeded sampling, stats output,
and bad input (missing model, bad model.json, truncated / corrupt expert files, bad options):
exit code 1 and one clear line on stderr naming the file and the field."""
import json
import os
import pathlib
import shutil
import struct
import subprocess

import pytest

from conftest import exe

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "olmoe"


def infer(*args):
    return subprocess.run([str(exe("infer")), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    if not (FIXTURE / "reference.json").exists():
        pytest.skip(f"fixture {FIXTURE} absent")
    out = tmp_path_factory.mktemp("infer") / "olmoe_f32"
    r = subprocess.run([str(exe("convert_model")), "-q", str(FIXTURE), str(out), "--quant", "f32", "--dense-quant", "f32"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def model_copy(packed, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(packed, dst)
    return dst


def reference():
    return json.loads((FIXTURE / "reference.json").read_text())


def ids_arg(ids):
    return ",".join(map(str, ids))


def assert_one_line_error(r, *needles):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    assert "Segmentation" not in r.stderr and "terminate" not in r.stderr


def test_greedy_ids_equal_transformers(packed):
    ref = reference()
    for prompt, want in zip(ref["prompts"], ref["greedy"]):
        r = infer("-m", packed, "--prompt-ids", ids_arg(prompt), "-n", len(want), "--temp", 0,
                  "--print-ids", "--ignore-eos")
        assert r.returncode == 0, r.stderr
        assert [int(x) for x in r.stdout.strip().split(",")] == want


def test_seeded_sampling_is_reproducible(packed):
    prompt = ids_arg(reference()["prompts"][0])
    run = lambda seed: infer("-m", packed, "--prompt-ids", prompt, "-n", 24, "--temp", 1.0,
                             "--top-k", 0, "--top-p", 1.0, "--seed", seed, "--print-ids").stdout
    a, b, c = run(5), run(5), run(6)
    assert a == b and len(a.split(",")) == 24
    assert a != c


def test_timing_and_stats_json(packed, tmp_path):
    stats = tmp_path / "stats.json"
    r = infer("-m", packed, "--prompt-ids", "3,4,5,6", "-n", 8, "--temp", 0, "--print-ids",
              "--ignore-eos", "--timing", "--stats-json", stats, "-t", 2)
    assert r.returncode == 0, r.stderr
    assert "decode" in r.stderr and "tokens/s" in r.stderr and "expert I/O" in r.stderr
    j = json.loads(stats.read_text())
    assert j["prefill"]["tokens"] == 4 and j["decode"]["tokens"] == 7
    assert j["threads"] == 2
    for phase in ("prefill", "decode"):
        assert j[phase]["tokens_per_s"] > 0
        assert set(j[phase]["phases_s"]) == {"attention", "router", "expert_io", "expert_compute", "other"}
    # Decode asks for top-k (2) experts in each of 3 layers per token; prefill for each distinct one.
    assert 3 * 2 * (7 + 1) <= j["experts"]["experts_requested"] <= 3 * 2 * (7 + 4)


def test_missing_model_dir(tmp_path):
    missing = tmp_path / "nope"
    assert_one_line_error(infer("-m", missing, "--prompt-ids", "1"), str(missing))


def proc_mem_gives_eio():
    """/proc/self/mem is a regular file whose offset 0 (an unmapped address) reads as EIO: a real
    I/O error at a GGUF header's first byte, without a failing disk."""
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return False
    try:
        os.pread(fd, 4, 0)
    except OSError as e:
        return e.errno == 5
    finally:
        os.close(fd)
    return False


def test_an_io_error_on_the_model_names_errno_and_offset():
    if not proc_mem_gives_eio():
        pytest.skip("/proc/self/mem does not give EIO at offset 0 here")
    r = infer("-m", "/proc/self/mem", "--prompt-ids", "1")
    assert_one_line_error(r, "/proc/self/mem", "offset 0", "Input/output error")
    assert "neither" not in r.stderr


def test_a_device_or_pipe_as_model_says_what_it_is(tmp_path):
    assert_one_line_error(infer("-m", "/dev/urandom", "--prompt-ids", "1"), "/dev/urandom", "is a character device")
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    assert_one_line_error(infer("-m", fifo, "--prompt-ids", "1"), str(fifo), "is a FIFO")
    # An anonymous pipe on stdin, named as a path (a shell's `-m /dev/stdin` or `<(...)`).
    r = subprocess.run([str(exe("infer")), "-m", "/dev/stdin", "--prompt-ids", "1"], input="GGUF",
                       capture_output=True, text=True, timeout=120)
    assert_one_line_error(r, "/dev/stdin", "is a FIFO")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_one_line_error(infer("-m", empty, "--prompt-ids", "1"), str(empty), "is an empty file")
    elf = tmp_path / "x.gguf"
    elf.write_bytes(b"\x7fELF" + bytes(60))
    assert_one_line_error(infer("-m", elf, "--prompt-ids", "1"), str(elf), "starts 0x7f454c46")


def test_missing_model_json_field(model_copy):
    cfg = json.loads((model_copy / "model.json").read_text())
    del cfg["hidden_size"]
    (model_copy / "model.json").write_text(json.dumps(cfg))
    assert_one_line_error(infer("-m", model_copy, "--prompt-ids", "1", "--print-ids"), "model.json", "hidden_size")


def test_truncated_expert_file(model_copy):
    f = model_copy / "experts" / "layer_001.bin"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    assert_one_line_error(infer("-m", model_copy, "--prompt-ids", "1", "--print-ids"), str(f))


def test_wrong_magic(model_copy):
    f = model_copy / "experts" / "layer_000.bin"
    data = bytearray(f.read_bytes())
    data[0:8] = b"NOTMOE\0\0"
    f.write_bytes(bytes(data))
    assert_one_line_error(infer("-m", model_copy, "--prompt-ids", "1", "--print-ids"), str(f), "magic")


def corrupt_every_slot(f):
    data = bytearray(f.read_bytes())
    n_experts, = struct.unpack_from("<I", data, 20)
    stride, data_offset = struct.unpack_from("<QQ", data, 40)
    for s in range(n_experts):  # every slot, whichever the router picks
        data[data_offset + s * stride + 10] ^= 0xFF
    f.write_bytes(bytes(data))


def test_checksum_mismatch(model_copy):
    f = model_copy / "experts" / "layer_002.bin"
    version, = struct.unpack_from("<I", f.read_bytes(), 8)
    flags, = struct.unpack_from("<I", f.read_bytes(), 72)
    assert version == 2 and flags & 2, "a new pack's slot checksums are XXH3 (flags bit 1)"
    corrupt_every_slot(f)
    assert_one_line_error(infer("-m", model_copy, "--prompt-ids", "1,2,3", "--print-ids"), str(f),
                          "checksum")


def test_checksum_mismatch_in_an_xxh64_file(tmp_path):
    """The shipped demo model is version 1 (XXH64 checksums, as earlier builds wrote them)."""
    model = tmp_path / "demo"
    shutil.copytree(ROOT / "models" / "demo", model)
    f = model / "experts" / "layer_002.bin"
    assert struct.unpack_from("<I", f.read_bytes(), 8) == (1,)
    assert infer("-m", model, "--prompt-ids", "1,2,3", "-n", "1", "--print-ids").returncode == 0
    corrupt_every_slot(f)
    assert_one_line_error(infer("-m", model, "--prompt-ids", "1,2,3", "--print-ids"), str(f), "checksum")


def test_bad_options(packed):
    assert_one_line_error(infer("-m", packed, "--prompt-ids", "1", "--temp", -1), "--temp")
    assert_one_line_error(infer("-m", packed, "--prompt-ids", "1,x", "--print-ids"), "--prompt-ids", "'x'")
    assert_one_line_error(infer("-m", packed, "--prompt-ids", "100000", "--print-ids"), "100000", "vocabulary")
    assert_one_line_error(infer("-m", packed, "--prompt-ids", "1"), "tokenizer", "--print-ids")
    assert_one_line_error(infer("-m", packed, "-p", "hello"), "tokenizer")
    r = infer("--prompt-ids", "1")  # -m missing: CLI11's message, still exit code 1
    assert r.returncode == 1 and "model" in r.stderr


DEMO = ROOT / "models" / "demo"


def demo_model():
    if not (DEMO / "model.json").exists() or not (DEMO / "tokenizer.json").exists():
        pytest.skip(f"demo model {DEMO} absent")
    return DEMO


def test_text_prompt_streams_the_prompt_and_seeded_continuation():
    m = demo_model()
    run = lambda seed: infer("-m", m, "-p", "The meaning of the word", "-n", 12, "--seed", seed,
                             "--temp", 0.8, "--ignore-eos")
    a, b = run(3), run(3)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    assert a.stdout.startswith("The meaning of the word")
    assert len(a.stdout) > len("The meaning of the word") + 5


def test_perplexity_of_a_text_file(tmp_path):
    m = demo_model()
    text = (DEMO / "heldout_head.txt").read_text()[:3000]
    f = tmp_path / "t.txt"
    f.write_text(text)
    stats = tmp_path / "ppl.json"
    r = infer("-m", m, "--perplexity", f, "--ctx", 128, "--stride", 64, "--stats-json", stats)
    assert r.returncode == 0, r.stderr
    p = json.loads(stats.read_text())["perplexity"]
    assert p["ctx"] == 128 and p["stride"] == 64
    # A trained model: far better than uniform over its 8192 tokens, and not degenerate.
    assert 2.0 < p["perplexity"] < 200.0
    assert f"perplexity {p['perplexity']:.4f}" in r.stdout
    # Each token after the first is scored once whatever the stride.
    r2 = infer("-m", m, "--perplexity", f, "--ctx", 128, "--stride", 128, "--stats-json", stats)
    p2 = json.loads(stats.read_text())["perplexity"]
    assert p2["tokens_scored"] < p["tokens_scored"]  # disjoint windows skip each window's first
    assert p2["perplexity"] > p["perplexity"] * 0.9


def test_missing_perplexity_file(tmp_path):
    m = demo_model()
    missing = tmp_path / "none.txt"
    assert_one_line_error(infer("-m", m, "--perplexity", missing), str(missing))
