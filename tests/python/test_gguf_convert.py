"""`convert_model` on a GGUF (issue 18, item 1's last sentence) and `--dense-quant` for Hugging Face
imports (item 3).

A GGUF converted to a pack keeps every tensor's ggml type: the pack must compute exactly what the
GGUF computes in place (same bytes, same kernels), so logits are compared for equality, not within
a tolerance, and greedy tokens from `infer` must be identical. Covered: a plain file, the mixed-type
fixture (types differing per layer and between gate/up/down), llama's interleaved Q/K rows
(Mixtral), OLMoE, and a split set given by its middle shard; cluster_experts on a converted pack;
corrupt headers. Then `--dense-quant bf16|q8|f32` on a small random Hugging Face checkpoint
written here: every variant runs, pack sizes shrink as the types say, and bf16 / q8 stay within
stated tolerances of f32.
"""
import json
import pathlib
import shutil
import struct

import numpy as np
import pytest

import moestream
from gguf_copy import copy_gguf

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
MANIFEST = FIXTURES / "manifest.json"

# (fixture, the file given to convert_model)
CASES = [
    ("qwen3moe-tiny-Q8_0", "qwen3moe-tiny-Q8_0.gguf"),
    ("qwen3moe-k-mixed", "qwen3moe-k-mixed.gguf"),
    ("mixtral-tiny-Q8_0", "mixtral-tiny-Q8_0.gguf"),
    ("olmoe-tiny-F32", "olmoe-tiny-F32.gguf"),
    ("qwen3moe-tiny-Q8_0-split", "qwen3moe-tiny-Q8_0-split-00002-of-00003.gguf"),
]

GGML_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10,
            "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30,
            "MXFP4": 39}



def _dense(cfg):
    """model.json's dense entry without its checksum (test_dense_checksum.py checks that value)."""
    d = dict(cfg["dense"])
    assert len(d.pop("xxh3")) == 16
    return d

def entry(name):
    return next(e for e in json.loads(MANIFEST.read_text())["fixtures"] if e["name"] == name)


def expected(name):
    return json.loads((FIXTURES / entry(name)["expected"]).read_text())


def convert(tool, src, out, *extra):
    r = tool("convert_model", "-q", src, out, *extra)
    assert r.returncode == 0, r.stderr
    return r


def greedy_ids(tool, model, prompt_ids, n=16, log=None):
    args = ["-m", model, "--prompt-ids", ",".join(map(str, prompt_ids)), "-n", n, "--temp", 0,
            "--ignore-eos", "--print-ids", "-t", 2]
    if log:
        args += ["--collect-routing", log]
    r = tool("infer", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def header_types(path):
    data = path.read_bytes()[:80]
    version, gate = struct.unpack_from("<II", data, 8)
    up, down = struct.unpack_from("<II", data, 64)
    return version, (gate, up, down)


@pytest.fixture(scope="module")
def packs(tool, tmp_path_factory):
    """Each case converted once: {fixture: pack directory}."""
    out = {}
    base = tmp_path_factory.mktemp("gguf_packs")
    for name, given in CASES:
        if not (FIXTURES / given).exists():
            pytest.fail(f"fixture {FIXTURES / given} absent")
        out[name] = base / name
        convert(tool, FIXTURES / given, out[name])
    return out


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_pack_computes_exactly_what_the_gguf_computes(tool, packs, name):
    pack = packs[name]
    gguf = FIXTURES / entry(name)["files"][0]
    d = expected(name)
    cfg = json.loads((pack / "model.json").read_text())
    assert cfg["format_version"] == 2 and _dense(cfg) == {"file": "dense.gguf", "dtype": "gguf"}

    # Every layer's expert file carries the GGUF's types, per matrix.
    types = entry(name)["tensor_types"]
    for layer, triple in enumerate(cfg["experts"]["layer_types"]):
        want = [types[f"blk.{layer}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")]
        assert triple == want
        version, got = header_types(pack / "experts" / f"layer_{layer:03d}.bin")
        assert version == 2 and got == tuple(0x100 + GGML_IDS[t] for t in want)

    a, b = moestream.Model(gguf, threads=2), moestream.Model(pack, threads=2)
    # The tokenizer travelled in dense.gguf.
    assert list(b.tokenizer.encode(d["prompt"], True)) == d["prompt_ids"]
    seq = d["prompt_ids"] + d["generated_ids"]
    la, lb = a.logits(seq), b.logits(seq)
    assert la.shape == lb.shape and np.array_equal(la, lb), float(np.abs(la - lb).max())
    assert greedy_ids(tool, pack, d["prompt_ids"]) == greedy_ids(tool, gguf, d["prompt_ids"])


def write_mixed_size_gguf(gguf, src, dst):
    """src's tensors with layer 0's experts re-encoded (gate and up F16, down Q8_0) so that the two
    layers' experts differ in size (the mixed fixture's layers happen to be equal in size)."""
    def replace(t):
        data = np.array(t.data)
        if t.name in ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"):
            return data.astype(np.float16), None
        if t.name == "blk.0.ffn_down_exps.weight":
            return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
        return None
    copy_gguf(gguf, src, dst, replace)


def test_experts_of_several_sizes_share_one_stride_and_compute_the_same(tool, tmp_path):
    gguf = pytest.importorskip("gguf")
    src = tmp_path / "sizes.gguf"
    write_mixed_size_gguf(gguf, FIXTURES / "qwen3moe-tiny-F32.gguf", src)
    pack = tmp_path / "pack"
    convert(tool, src, pack)
    cfg = json.loads((pack / "model.json").read_text())
    assert cfg["experts"]["layer_types"] == [["F16", "F16", "Q8_0"], ["F32", "F32", "F32"]]
    sizes, strides = [], set()
    for f in sorted((pack / "experts").glob("layer_*.bin")):
        expert_bytes, stride = struct.unpack_from("<QQ", f.read_bytes()[:48], 32)
        sizes.append(expert_bytes)
        strides.add(stride)
    assert sizes[0] < sizes[1]
    assert strides == {(max(sizes) + 4095) // 4096 * 4096}
    d = expected("qwen3moe-tiny-F32")
    seq = d["prompt_ids"] + d["generated_ids"]
    la = moestream.Model(src, threads=2).logits(seq)
    lb = moestream.Model(pack, threads=2).logits(seq)
    assert np.array_equal(la, lb)
    prompt = d["prompt_ids"]
    for io in ("simple", "pread"):  # the pread(2) store and the engine, each with its buffer size
        r = tool("infer", "-m", pack, "--io", io, "--prompt-ids", ",".join(map(str, prompt)), "-n", 8,
                 "--temp", 0, "--ignore-eos", "--print-ids", "-t", 2)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == greedy_ids(tool, src, prompt, n=8)
    log = tmp_path / "routing.bin"
    before = greedy_ids(tool, pack, prompt, log=log)
    r = tool("cluster_experts", "--routing", log, "--model", pack, "--repack", "--search-moves", "500")
    assert r.returncode == 0, r.stderr
    assert greedy_ids(tool, pack, prompt) == before


@pytest.mark.parametrize("name", ["qwen3moe-k-mixed", "mixtral-tiny-Q8_0"])
def test_cluster_experts_on_a_converted_pack_keeps_the_tokens(tool, packs, tmp_path, name):
    pack = tmp_path / "pack"
    shutil.copytree(packs[name], pack)
    prompt = expected(name)["prompt_ids"]
    log = tmp_path / "routing.bin"
    before = greedy_ids(tool, pack, prompt, log=log)
    r = tool("cluster_experts", "--routing", log, "--model", pack, "--repack", "--json",
             "--search-moves", "500")
    assert r.returncode == 0, r.stderr
    maps = sorted((pack / "experts").glob("layer_*.map"))
    assert maps, "the repack wrote no maps"
    files = sorted((pack / "experts").glob("layer_*.bin"))
    assert any(f.read_bytes() != (packs[name] / "experts" / f.name).read_bytes() for f in files), \
        "no layer was permuted"
    assert greedy_ids(tool, pack, prompt) == before


def test_chat_template_survives_conversion(packs):
    pack = packs["qwen3moe-tiny-Q8_0"]
    gguf_mod = pytest.importorskip("gguf")
    src = gguf_mod.GGUFReader(str(FIXTURES / "qwen3moe-tiny-Q8_0.gguf"))
    dst = gguf_mod.GGUFReader(str(pack / "dense.gguf"))
    keys = [k for k in src.fields if k.startswith("tokenizer.")]
    assert "tokenizer.chat_template" in keys
    for k in keys:
        a, b = src.fields[k], dst.fields[k]
        assert [bytes(p.tobytes()) for p in a.parts] == [bytes(p.tobytes()) for p in b.parts], k


def test_corrupt_version_fields_are_refused_by_name(tool, packs, tmp_path):
    prompt = expected("qwen3moe-tiny-Q8_0")["prompt_ids"]
    cases = [("experts/layer_001.bin", 8, b"\x03\x00\x00\x00", "'version'"),
             ("experts/layer_001.bin", 64, b"\x05\x01\x00\x00", "'up_quant'"),
             ("experts/layer_000.bin", 68, b"\x09\x00\x00\x00", "'down_quant'"),
             ("experts/layer_000.bin", 72, b"\x06", "'flags'"),      # an undefined flag bit (4)
             ("experts/layer_000.bin", 72, b"\x01", "'expert_bytes'"),  # biases the payload lacks
             ("experts/layer_000.bin", 76, b"\x01", "'reserved'")]
    for i, (rel, off, data, needle) in enumerate(cases):
        pack = tmp_path / f"bad{i}_{off}"
        shutil.copytree(packs["qwen3moe-tiny-Q8_0"], pack)
        with open(pack / rel, "r+b") as f:
            f.seek(off)
            f.write(data)
        r = tool("infer", "-m", pack, "--prompt-ids", ",".join(map(str, prompt)), "-n", 1)
        assert r.returncode != 0
        assert needle in r.stderr and rel.split("/")[1] in r.stderr, r.stderr
    pack = tmp_path / "badjson"
    shutil.copytree(packs["qwen3moe-tiny-Q8_0"], pack)
    j = json.loads((pack / "model.json").read_text())
    j["format_version"] = 3
    (pack / "model.json").write_text(json.dumps(j))
    r = tool("infer", "-m", pack, "--prompt-ids", "1", "-n", 1)
    assert r.returncode != 0 and "'format_version'" in r.stderr and "model.json" in r.stderr


def test_gguf_source_refuses_hf_only_options_and_its_own_directory(tool, tmp_path):
    src = FIXTURES / "qwen3moe-tiny-Q8_0.gguf"
    r = tool("convert_model", "-q", src, tmp_path / "a", "--quant", "q4")
    assert r.returncode != 0 and "--quant" in r.stderr
    r = tool("convert_model", "-q", src, tmp_path / "b", "--dense-quant", "q8")
    assert r.returncode != 0 and "--dense-quant" in r.stderr
    copy = tmp_path / "src" / "m.gguf"
    copy.parent.mkdir()
    shutil.copyfile(src, copy)
    r = tool("convert_model", "-q", copy, tmp_path / "src", "--force")
    assert r.returncode != 0 and "source" in r.stderr
    assert copy.read_bytes() == src.read_bytes()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---- --dense-quant on a Hugging Face checkpoint ----

HF = {"D": 128, "F": 64, "V": 512, "L": 2, "E": 8, "H": 4, "KV": 2, "hd": 32}


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random Qwen3-MoE checkpoint whose rows are whole Q8_0 blocks (D and F multiples of 32)."""
    d = tmp_path_factory.mktemp("hf") / "qwen3"
    d.mkdir()
    cfg = json.loads((ROOT / "tests" / "fixtures" / "qwen3_moe" / "config.json").read_text())
    D, F, V, L, E, H, KV, hd = (HF[k] for k in ("D", "F", "V", "L", "E", "H", "KV", "hd"))
    cfg.update({"hidden_size": D, "moe_intermediate_size": F, "vocab_size": V, "num_hidden_layers": L,
                "num_experts": E, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd,
                "num_experts_per_tok": 2, "tie_word_embeddings": False, "torch_dtype": "float32"})
    (d / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(18)
    w = lambda *s: rng.normal(0, 1 / np.sqrt(s[-1]), s).astype(np.float32)
    norm = lambda n: (1 + 0.1 * rng.normal(size=n)).astype(np.float32)
    t = {"model.embed_tokens.weight": rng.normal(0, 1, (V, D)).astype(np.float32),
         "model.norm.weight": norm(D), "lm_head.weight": w(V, D)}
    for l in range(L):
        p = f"model.layers.{l}."
        t.update({p + "input_layernorm.weight": norm(D), p + "post_attention_layernorm.weight": norm(D),
                  p + "self_attn.q_proj.weight": w(H * hd, D), p + "self_attn.k_proj.weight": w(KV * hd, D),
                  p + "self_attn.v_proj.weight": w(KV * hd, D), p + "self_attn.o_proj.weight": w(D, H * hd),
                  p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
                  p + "mlp.gate.weight": w(E, D)})
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            t.update({q + "gate_proj.weight": w(F, D), q + "up_proj.weight": w(F, D), q + "down_proj.weight": w(D, F)})
    write_safetensors(d / "model.safetensors", t)
    return d


def dense_elements():
    D, V, L, E, H, KV, hd = (HF[k] for k in ("D", "V", "L", "E", "H", "KV", "hd"))
    matrices = 2 * V * D + L * (2 * H * hd * D + 2 * KV * hd * D)
    others = D + L * (2 * D + 2 * hd + E * D)  # norms and routers
    return matrices, others


@pytest.fixture(scope="module")
def dense_packs(tool, hf_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("dense")
    out = {}
    for q in ("f32", "bf16", "q8"):
        out[q] = base / q
        convert(tool, hf_dir, out[q], "--quant", "f32", "--dense-quant", q)
    out["default"] = base / "default"
    convert(tool, hf_dir, out["default"], "--quant", "f32")
    return out


def test_dense_quant_files_and_sizes(dense_packs):
    matrices, others = dense_elements()
    f32 = (dense_packs["f32"] / "dense.safetensors").stat().st_size
    bf16 = (dense_packs["bf16"] / "dense.safetensors").stat().st_size
    q8 = (dense_packs["q8"] / "dense.gguf").stat().st_size
    # Payloads as the types say, plus a header of a few KiB at most.
    assert 0 <= f32 - 4 * (matrices + others) < 16384
    assert 0 <= bf16 - 2 * (matrices + others) < 16384
    assert 0 <= q8 - (matrices * 34 // 32 + 4 * others) < 16384
    assert q8 < 0.55 * bf16 < 0.3 * f32
    # bf16 is the default, in dense.safetensors as before; q8 is a version-2 pack.
    default = json.loads((dense_packs["default"] / "model.json").read_text())
    assert _dense(default) == {"file": "dense.safetensors", "dtype": "bf16"} and default["format_version"] == 1
    q8cfg = json.loads((dense_packs["q8"] / "model.json").read_text())
    assert _dense(q8cfg) == {"file": "dense.gguf", "dtype": "gguf"} and q8cfg["format_version"] == 2
    gguf_mod = pytest.importorskip("gguf")
    r = gguf_mod.GGUFReader(str(dense_packs["q8"] / "dense.gguf"))
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    assert kinds["embed"] == kinds["layers.1.wo"] == kinds["lm_head"] == "Q8_0"
    assert kinds["layers.0.router"] == kinds["final_norm"] == "F32"


# Largest |logit - f32's| over a position, relative to its largest |f32 logit|: bf16 rounds every
# dense weight to 8 mantissa bits (relative error 2^-9), Q8_0 to 1/254 of its block's largest
# magnitude; measured worst over this test's 8 positions: 0.87% (bf16) and 1.95% (q8), top-1 all equal
# (printed with pytest -s).
DENSE_TOL = {"bf16": 0.02, "q8": 0.04}


@pytest.mark.parametrize("q", ["bf16", "q8"])
def test_dense_quant_logits_and_tokens_within_tolerance(tool, dense_packs, q):
    prompt = [5, 77, 301, 12, 9, 440, 3, 250]
    ref = moestream.Model(dense_packs["f32"], threads=2).logits(prompt)
    got = moestream.Model(dense_packs[q], threads=2).logits(prompt)
    rel = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
    top1 = np.mean(got.argmax(axis=1) == ref.argmax(axis=1))
    print(f"[ dense-quant {q} vs f32 ] worst relative |dlogit| {rel.max():.2%}, top-1 equal {top1:.0%}")
    assert rel.max() <= DENSE_TOL[q], rel
    assert top1 >= 0.75
    ids = greedy_ids(tool, dense_packs[q], prompt, n=8)
    assert len(ids.split(",")) == 8


def test_server_chat_uses_the_template_kept_in_dense_gguf(packs):
    pytest.importorskip("requests")
    from test_server import Server  # the suite's server harness

    answers = []
    for model in (FIXTURES / "qwen3moe-tiny-Q8_0.gguf", packs["qwen3moe-tiny-Q8_0"]):
        s = Server(model=model)
        try:
            r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "The cat sat"}],
                                                "max_tokens": 6, "temperature": 0})
            assert r.status_code == 200, r.text
            answers.append((r.json()["choices"][0]["message"]["content"], r.json()["usage"]))
        finally:
            s.stop()
    assert answers[0] == answers[1]
    assert answers[0][1]["prompt_tokens"] > 5  # the template's markup was rendered around the message
