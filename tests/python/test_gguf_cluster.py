"""`cluster_experts` on a GGUF end to end (cluster/gguf_repack.h): a routing log collected by
`infer` on a fixture GGUF made by llama.cpp, clustering into a new GGUF, and the output checked
with the `gguf` PyPI package's reader (independent of ours): every metadata key other than the
moestream permutation keys and every non-expert tensor byte-identical, each expert slice and
router row of layer l at position i equal to the source's slice perm[l][i], the same alignment,
and the same greedy tokens from `infer`. Then a second repack composes, a log of the original
maps onto a repack, and bad input is refused with a clear message and the source untouched."""
import json
import os
import pathlib
import shutil
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
PERM_KEY = "moestream.expert_permutation."


def fixture(tmp_path, name):
    src = FIXTURES / f"{name}.gguf"
    if not src.exists():
        pytest.skip(f"fixture {src} absent")
    dst = tmp_path / f"{name}.gguf"
    shutil.copyfile(src, dst)
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    return dst, ",".join(str(i) for i in meta["prompt_ids"])


def greedy(tool, model, prompt, log=None):
    args = ["-m", model, "--prompt-ids", prompt, "-n", "16", "--temp", "0", "--print-ids", "--ignore-eos"]
    if log:
        args += ["--collect-routing", log]
    r = tool("infer", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def cluster(tool, model, logs, out, *extra):
    r = tool("cluster_experts", "--model", model, "--routing", *logs, "--out", out, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return r


def field_bytes(f):
    return b"".join(bytes(p.tobytes()) for p in f.parts)


def permutation(reader, n_layers):
    perm = []
    for layer in range(n_layers):
        f = reader.fields[f"{PERM_KEY}{layer}"]
        perm.append([int(f.parts[i][0]) for i in f.data])
    return perm


def expert_layer(name):
    """Layer of an expert-indexed tensor (router, *_exps.*), else None."""
    parts = name.split(".")
    if parts[0] != "blk":
        return None
    rest = ".".join(parts[2:])
    if rest.startswith("ffn_gate_inp.") or "_exps." in rest or rest.startswith("exp_probs_b."):
        return int(parts[1])
    return None


def slices(t, n_experts):
    raw = np.asarray(t.data).view(np.uint8).reshape(-1)
    assert raw.size == t.n_bytes and raw.size % n_experts == 0
    return raw.reshape(n_experts, -1)


def check_repack(src_path, out_path, original_path):
    """out holds, at each position of each layer, the slice of the original expert its
    recorded permutation names; src is the file it was made from (the original, or a repack)."""
    src, out, orig = (gguf.GGUFReader(p) for p in (src_path, out_path, original_path))
    # Metadata: same keys, order, types and values, moestream keys aside.
    def plain(r):
        return [(k, field_bytes(f)) for k, f in r.fields.items()
                if not k.startswith("moestream.") and not k.startswith("GGUF.")]
    assert plain(out) == plain(src)
    assert out.alignment == src.alignment
    arch = str(bytes(src.fields["general.architecture"].parts[-1]), "utf-8")
    n_layers = int(src.fields[f"{arch}.block_count"].parts[-1][0])
    n_experts = int(src.fields[f"{arch}.expert_count"].parts[-1][0])
    perm = permutation(out, n_layers)
    for p in perm:
        assert sorted(p) == list(range(n_experts))
    assert any(p != list(range(n_experts)) for p in perm), "clustering kept every layer in place: a weak test"
    orig_t = {t.name: t for t in orig.tensors}
    assert [(t.name, t.tensor_type, list(t.shape)) for t in out.tensors] == \
           [(t.name, t.tensor_type, list(t.shape)) for t in src.tensors]
    moved = 0
    for t in out.tensors:
        assert t.data_offset % out.alignment == 0, t.name
        o = orig_t[t.name]
        layer = expert_layer(t.name)
        if layer is None:
            assert bytes(np.asarray(t.data).view(np.uint8)) == bytes(np.asarray(o.data).view(np.uint8)), t.name
            continue
        a, b = slices(t, n_experts), slices(o, n_experts)
        for i in range(n_experts):
            assert np.array_equal(a[i], b[perm[layer][i]]), f"{t.name} position {i}"
        moved += 1
    assert moved >= 4 * n_layers  # the router and three expert matrices of every layer
    return perm


@pytest.mark.parametrize("name", ["qwen3moe-tiny-Q8_0", "qwen3moe-k-mixed"])
def test_cluster_writes_an_equivalent_permuted_gguf(tool, tmp_path, name):
    src, prompt = fixture(tmp_path, name)
    log = tmp_path / "routing.log"
    want = greedy(tool, src, prompt, log)
    before = src.read_bytes()
    out = tmp_path / "clustered.gguf"
    r = cluster(tool, src, [log], out)
    assert "permuted the experts of layer 1/" in r.stderr  # progress per layer
    js = json.loads(r.stdout)
    assert js["out"]["bytes"] == out.stat().st_size
    assert src.read_bytes() == before  # the source is never written
    assert not list(tmp_path.glob("*.tmp.*"))
    perm = check_repack(src, out, src)
    assert greedy(tool, out, prompt) == want

    # A second repack, from a log recorded on the original: its ids are mapped through the
    # recorded permutation, and the new permutation is still relative to the original.
    out2 = tmp_path / "again.gguf"
    r2 = cluster(tool, out, [log], out2, "--method", "greedy")
    assert "recorded on the original model" in r2.stderr
    perm2 = check_repack(out, out2, src)
    assert greedy(tool, out2, prompt) == want
    # Both were learnt from the same log: the order on disk differs at most by the method.
    assert len(perm2) == len(perm)
    # A log recorded on the repack itself is accepted as is.
    log2 = tmp_path / "routing2.log"
    assert greedy(tool, out, prompt, log2) == want
    r3 = tool("cluster_experts", "--model", out, "--routing", log2)
    assert r3.returncode == 0, r3.stderr
    assert "recorded on the original model" not in r3.stderr


def test_bad_input_is_refused_and_the_source_kept(tool, tmp_path):
    src, prompt = fixture(tmp_path, "qwen3moe-tiny-Q8_0")
    other, other_prompt = fixture(tmp_path, "qwen3moe-k-mixed")
    log, other_log = tmp_path / "r.log", tmp_path / "other.log"
    greedy(tool, src, prompt, log)
    greedy(tool, other, other_prompt, other_log)
    before = src.read_bytes()

    def refused(*args, needle):
        r = tool("cluster_experts", *args)
        assert r.returncode == 1, r.stderr
        assert needle in r.stderr, r.stderr
        assert src.read_bytes() == before

    refused("--model", src, "--routing", log, "--out", src, needle="refusing to overwrite the source")
    link = tmp_path / "link.gguf"
    link.hardlink_to(src)
    refused("--model", src, "--routing", log, "--out", link, needle="refusing to overwrite the source")
    refused("--model", src, "--routing", other_log, "--out", tmp_path / "x.gguf", needle="routing log of another model")
    refused("--model", src, "--routing", log, "--repack", needle="is a GGUF")
    refused("--model", src, "--routing", log, "--maps-out", tmp_path / "maps", needle="is a GGUF")
    assert not (tmp_path / "x.gguf").exists()
    assert not list(tmp_path.glob("*.tmp.*"))

    # Another architecture's file (general.architecture changed; same length so offsets stay).
    alien = tmp_path / "alien.gguf"
    data = before.replace(b"qwen3moe", b"qwen9moe")
    alien.write_bytes(data)
    refused("--model", alien, "--routing", log, "--out", tmp_path / "y.gguf", needle="qwen9moe")

    # A split set: one output per input shard could be torn by a crash between renames, so it is refused.
    first = FIXTURES / "qwen3moe-tiny-Q8_0-split-00001-of-00003.gguf"
    if not first.exists():
        pytest.skip(f"fixture {first} absent")
    for k in (1, 2, 3):
        shutil.copyfile(FIXTURES / f"qwen3moe-tiny-Q8_0-split-0000{k}-of-00003.gguf",
                        tmp_path / f"qwen3moe-tiny-Q8_0-split-0000{k}-of-00003.gguf")
    split = tmp_path / "qwen3moe-tiny-Q8_0-split-00001-of-00003.gguf"
    split_log = tmp_path / "split.log"
    greedy(tool, split, prompt, split_log)
    refused("--model", split, "--routing", split_log, "--out", tmp_path / "z.gguf", needle="split GGUF set")


def test_python_cluster_on_a_gguf(tool, tmp_path):
    """moestream.cluster() takes a GGUF as cluster_experts does: `out` writes the permuted copy
    (the same file the CLI writes from the same log and method), in-place options are refused."""
    moestream = pytest.importorskip("moestream")
    src, prompt = fixture(tmp_path, "qwen3moe-tiny-Q8_0")
    log = tmp_path / "routing.log"
    want = greedy(tool, src, prompt, log)
    before = src.read_bytes()
    out = tmp_path / "py.gguf"
    res = moestream.cluster(src, [log], out=out, evaluate=log)
    assert res["repacked"] and res["out"]["bytes"] == out.stat().st_size
    assert set(res["heldout"]) == {"identity", "greedy", "chosen"}
    n_layers, n_experts = res["slots"].shape
    assert n_experts > 1 and n_layers >= 1
    perm = check_repack(src, out, src)
    # slots[l][e] is expert e's position; the file records which expert sits at each position.
    for layer in range(n_layers):
        assert [perm[layer][int(p)] for p in res["slots"][layer]] == list(range(n_experts))
    assert greedy(tool, out, prompt) == want
    cli = tmp_path / "cli.gguf"
    cluster(tool, src, [log], cli)
    assert cli.read_bytes() == out.read_bytes()
    assert src.read_bytes() == before
    with pytest.raises(moestream.ConfigError, match="is a GGUF"):
        moestream.cluster(src, [log], repack=True)
    with pytest.raises(moestream.ConfigError, match="is a GGUF"):
        moestream.cluster(src, [log], maps_out=tmp_path / "maps")
    assert src.read_bytes() == before
    with pytest.raises(moestream.ConfigError, match="needs a .gguf model"):
        moestream.cluster(ROOT / "models" / "demo", [log], out=tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_the_model_is_named_for_what_it_is_before_any_option(tool, tmp_path):
    """A --model that is no GGUF and no directory is refused for what it is (not for --out)."""
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    log = tmp_path / "r.log"
    log.write_bytes(b"")
    for model, what in ((fifo, "is a FIFO"), (empty, "is an empty file")):
        r = tool("cluster_experts", "--model", model, "--routing", log, "--out", tmp_path / "out.gguf")
        assert r.returncode == 1, r.stderr
        assert str(model) in r.stderr and what in r.stderr, r.stderr
        assert "--out" not in r.stderr, r.stderr
    assert not (tmp_path / "out.gguf").exists()


def with_extra_keys(src, dst, n_keys):
    """src with u8 keys added after its metadata up to n_keys in all: 32-byte entries, so the tensor
    table and data keep their alignment (the fixture's is 32) and offsets."""
    r = gguf.GGUFReader(src)
    if "general.alignment" in r.fields:
        pytest.skip("the fixture sets its own alignment")
    last = max(r.fields.values(), key=lambda f: f.offset)
    end = last.offset + sum(p.nbytes for p in last.parts)
    data = src.read_bytes()
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    extra = b"".join(struct.pack("<Q", 19) + f"pad.{i:015d}".encode() + struct.pack("<IB", 0, 1)
                     for i in range(n_keys - n_kv))
    dst.write_bytes(data[:16] + struct.pack("<Q", n_keys) + data[24:end] + extra + data[end:])


def test_a_source_at_the_key_limit_gets_no_output_the_reader_would_refuse(tool, tmp_path):
    """The reader takes at most 65,536 keys; a repack adds its permutation keys to the source's, so
    a source at the limit is refused before any output or temp file exists."""
    src, prompt = fixture(tmp_path, "qwen3moe-tiny-Q8_0")
    wide = tmp_path / "wide.gguf"
    with_extra_keys(src, wide, 65536)
    assert sum(not k.startswith("GGUF.") for k in gguf.GGUFReader(wide).fields) == 65536
    log = tmp_path / "wide.log"
    greedy(tool, wide, prompt, log)  # the source itself is read
    out = tmp_path / "out.gguf"
    r = tool("cluster_experts", "--model", wide, "--routing", log, "--out", out)
    assert r.returncode == 1, r.stderr
    assert "metadata keys, over the limit of 65536" in r.stderr, r.stderr
    assert not out.exists()
    assert not list(tmp_path.glob("*.tmp.*"))
