# Tests of the demo-model tooling (corpus cleaner, routing statistics) and of the shipped
# artefacts it made: models/demo (packed model, tokenizer, held-out text) and tests/fixtures.
import json
import random
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "training"))

import clean_corpus  # noqa: E402
import routing_stats  # noqa: E402

DEMO = ROOT / "models" / "demo"
FIXTURES = ROOT / "tests" / "fixtures"


# ------------------------------------------------------------------------------ routing stats
def brute_force_lru(experts, E, c):
    """Reference LRU: look up a token's k experts, then move them to the front, top-1 last."""
    T, L, k = experts.shape
    hits = 0
    for l in range(L):
        cache = []  # least recent first
        for t in range(T):
            s = [int(e) for e in experts[t, l]]
            hits += sum(e in cache for e in s)
            cache = [e for e in cache if e not in s] + s[::-1]
            cache = cache[-c:]
    return hits / (T * L * k)


def test_lru_hit_rates_match_a_brute_force_lru_at_every_capacity():
    rng = np.random.default_rng(7)
    E, k = 10, 3
    # Skewed, correlated routing: not just uniform, so recency order really matters.
    base = rng.permutation(E)
    experts = np.empty((400, 2, k), dtype=np.uint8)
    for t in range(400):
        for l in range(2):
            pool = base[:6] if rng.random() < 0.7 else rng.permutation(E)
            experts[t, l] = rng.choice(pool, size=k, replace=False)
    hits = routing_stats.lru_hit_rates(experts, E)
    for c in range(1, E + 1):
        assert hits[:, c].mean() == pytest.approx(brute_force_lru(experts, E, c), abs=1e-12)


def test_uniform_routing_gives_the_expected_overlap_and_hit_rate():
    E, k = 32, 4
    tr = routing_stats.uniform_trace(20000, 2, k, E, seed=3)
    assert np.mean(routing_stats.consecutive_overlap(tr)) == pytest.approx(k / E, abs=0.01)
    hits = routing_stats.lru_hit_rates(tr, E)
    for c in (4, 8, 16, 24):
        assert hits[:, c].mean() == pytest.approx(c / E, abs=0.01)


def test_load_stats_of_a_collapsed_router_show_it():
    E, k = 16, 2
    experts = np.tile(np.array([[[0, 1]]], dtype=np.uint8), (100, 1, 1))  # always experts 0, 1
    st = routing_stats.load_stats(experts, E)[0]
    assert st["max_over_mean"] == pytest.approx(E / k)
    assert st["min_over_mean"] == 0
    assert st["entropy_norm"] == pytest.approx(np.log(2) / np.log(E))
    assert routing_stats.consecutive_overlap(experts) == [1.0]


# ------------------------------------------------------------------------------ corpus cleaner
def test_rst_cleaner_keeps_prose_and_drops_code_and_directives():
    rst = """Title
=====

This is *plain* prose with ``code`` and a :ref:`link <target>`.

.. code-block:: c

   int main(void) { return 0; }

Example::

    $ make -j2

After the example.
"""
    out = clean_corpus.clean_rst(rst)
    assert "This is plain prose with code and a link." in out
    assert "After the example." in out
    assert "int main" not in out and "make -j2" not in out and "code-block" not in out
    assert "=====" not in out


def test_pod_cleaner_strips_formatting_codes_and_verbatim_blocks():
    pod = "=head1 NAME\n\nperlintro - a B<brief> I<intro> with C<< $a->b >>\nand L<perltoc>.\n\n" \
          "    my $x = 1;   # verbatim\n\n=cut\n"
    out = clean_corpus.clean_pod(pod)
    assert out.startswith("NAME")
    assert "perlintro - a brief intro with $a->b and perltoc." in out
    assert "my $x" not in out


def test_dictd_cleaner_drops_pronunciation_and_sources():
    text = 'Abjure \\Ab*jure"\\, v. t.\n   To renounce upon oath; to {forswear}.\n   [1913 Webster]\n'
    out = clean_corpus.clean_dictd(text, "dict-gcide")
    assert "Ab*jure" not in out and "1913 Webster" not in out
    assert "To renounce upon oath; to forswear." in out


def test_wordnet_glosses_become_sentences(tmp_path):
    f = tmp_path / "data.noun"
    f.write_text("  1 licence header line\n00039211 04 n 02 interplay 0 give_and_take 0 001 @ "
                 "00039021 n 0000 | reciprocal action and reaction  \n")
    assert clean_corpus.wordnet_glosses(f) == "interplay, give and take: reciprocal action and reaction."


def test_sword_ztext_blocks_are_decompressed_and_stripped(tmp_path):
    blocks = [b'<title type="x">Genesis 1</title><verse>In the beginning God created.</verse>',
              b'<p/>Jesus wept.<note>a footnote</note>']
    for testament, block in zip(("ot", "nt"), blocks):
        z = zlib.compress(block)
        (tmp_path / f"{testament}.bzz").write_bytes(z)
        (tmp_path / f"{testament}.bzs").write_bytes(struct.pack("<III", 0, len(z), len(block)))
    out = clean_corpus.sword_ztext(tmp_path)
    assert "Genesis 1" in out and "In the beginning God created." in out
    assert "Jesus wept." in out and "footnote" not in out and "<" not in out


def test_sword_ztext_rejects_a_block_past_the_end(tmp_path):
    for testament in ("ot", "nt"):
        (tmp_path / f"{testament}.bzz").write_bytes(b"x" * 10)
        (tmp_path / f"{testament}.bzs").write_bytes(struct.pack("<III", 4, 100, 100))
    with pytest.raises(ValueError, match="ot.bzz: block 0"):
        clean_corpus.sword_ztext(tmp_path)


def test_r_lazy_load_strings_are_read_from_the_serialised_vector(tmp_path):
    lines = [f"line {i} of the novel" for i in range(1200)] + [""]
    body = b"X\n" + struct.pack(">iii", 2, 0x030400, 0x020300)
    body += struct.pack(">ii", 16, len(lines))  # STRSXP
    for s in lines:
        b = s.encode()
        body += struct.pack(">ii", 0x00040009, len(b)) + b  # CHARSXP, UTF-8 flag
    blob = struct.pack(">i", len(body)) + zlib.compress(body)
    f = tmp_path / "Rdata.rdb"
    f.write_bytes(blob + blob)  # two objects back to back
    vectors = clean_corpus.r_rdb_strings(f)
    assert len(vectors) == 2 and vectors[0] == lines


def test_documents_respect_the_size_limit_and_drop_code_paragraphs():
    random.seed(1)
    pars = [" ".join(random.choice(["alpha", "beta", "gamma"]) for _ in range(60)) for _ in range(50)]
    text = "\n\n".join(pars + ["{ x[0] = 1; y[1] = 2; }"])
    docs = clean_corpus.split_docs(text, max_bytes=2000)
    assert len(docs) > 1
    assert all(len(d.encode()) <= 2000 for d in docs)
    assert not any("x[0]" in d for d in docs)
    assert sum(d.count("\n\n") + 1 for d in docs) == 50


# ------------------------------------------------------------------------------ shipped demo model
def test_shipped_demo_model_has_the_required_shape_and_fits_32_mb():
    cfg = json.loads((DEMO / "model.json").read_text())
    assert cfg["architecture"] == "qwen3_moe"
    assert cfg["n_layers"] >= 6 and cfg["n_experts"] >= 32 and cfg["n_experts_per_tok"] >= 4
    packed = [DEMO / "model.json", DEMO / cfg["dense"]["file"], DEMO / "tokenizer.json",
              DEMO / "tokenizer_config.json"] + sorted((DEMO / cfg["experts"]["dir"]).glob("layer_*.bin"))
    assert len(packed) == 4 + cfg["n_layers"]
    assert sum(p.stat().st_size for p in packed) <= 32 * 1000 * 1000
    assert (DEMO / "heldout.txt").stat().st_size <= 2_000_000


def test_demo_tokenizer_is_qwen2_style_byte_level_bpe():
    tok = json.loads((DEMO / "tokenizer.json").read_text())
    assert tok["normalizer"]["type"] == "NFC"
    split, byte_level = tok["pre_tokenizer"]["pretokenizers"]
    assert split["type"] == "Split" and split["behavior"] == "Isolated"
    assert split["pattern"]["Regex"].startswith("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+")
    assert byte_level == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": False}
    assert tok["model"]["type"] == "BPE" and len(tok["model"]["vocab"]) == 8192
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert ids == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    cfg = json.loads((DEMO / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|endoftext|>" and "<|im_start|>" in cfg["chat_template"]


def test_demo_tokenizer_round_trips_the_held_out_text():
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    text = (DEMO / "heldout_head.txt").read_text(encoding="utf-8")
    ids = tok.encode(text).ids
    assert len(ids) == 15834  # the token count the reference perplexities were measured on
    assert tok.decode(ids) == text


# ------------------------------------------------------------------------------ fixtures
def safetensors_names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


@pytest.mark.parametrize("name,layout", [("qwen3_moe", "qwen"), ("olmoe", "qwen"), ("qwen2_moe", "qwen"),
                                         ("gpt_oss", "gpt_oss"), ("gpt_oss_mxfp4", "mxfp4"),
                                         ("mixtral", "mixtral"), ("qwen3_moe_fused", "fused"),
                                         ("glm4_moe", "glm"), ("deepseek_v3", "glm")])
def test_fixture_holds_its_layout_and_a_complete_reference(name, layout):
    d = FIXTURES / name
    cfg = json.loads((d / "config.json").read_text())
    E = cfg.get("num_experts", cfg.get("num_local_experts", cfg.get("n_routed_experts")))
    L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
    assert L >= 3 and E >= 8 and cfg["num_experts_per_tok"] >= 2
    header = safetensors_names(d / "model.safetensors")
    assert all(v["dtype"] == ("U8" if k.endswith(("_blocks", "_scales")) else "F32") for k, v in header.items())
    first_moe = cfg.get("first_k_dense_replace", 0) if layout == "glm" else 0
    for l in range(L):
        p = f"model.layers.{l}"
        if l < first_moe:  # GLM-4.5's dense first layers: an MLP, no experts
            assert f"{p}.mlp.gate_proj.weight" in header and f"{p}.mlp.experts.0.up_proj.weight" not in header
        elif layout == "glm":  # experts as Qwen's, a router bias that is not zero, ungated shared experts
            assert all(f"{p}.mlp.experts.{e}.{w}_proj.weight" in header
                       for e in range(E) for w in ("gate", "up", "down"))
            assert header[f"{p}.mlp.gate.e_score_correction_bias"]["shape"] == [E]
            assert f"{p}.mlp.shared_experts.gate_proj.weight" in header
        elif layout == "qwen":
            assert all(f"{p}.mlp.experts.{e}.{w}_proj.weight" in header
                       for e in range(E) for w in ("gate", "up", "down"))
        elif layout == "mixtral":
            assert all(f"{p}.block_sparse_moe.experts.{e}.w{i}.weight" in header
                       for e in range(E) for i in (1, 2, 3))
            assert f"{p}.block_sparse_moe.gate.weight" in header
        elif layout in ("gpt_oss", "mxfp4"):
            F, D = cfg["intermediate_size"], cfg["hidden_size"]
            assert header[f"{p}.self_attn.sinks"]["shape"] == [cfg["num_attention_heads"]]
            assert header[f"{p}.mlp.experts.gate_up_proj_bias"]["shape"] == [E, 2 * F]
            if layout == "gpt_oss":
                assert header[f"{p}.mlp.experts.gate_up_proj"]["shape"] == [E, D, 2 * F]
                assert header[f"{p}.mlp.experts.down_proj"]["shape"] == [E, F, D]
            else:
                assert header[f"{p}.mlp.experts.gate_up_proj_blocks"]["shape"] == [E, 2 * F, D // 32, 16]
                assert header[f"{p}.mlp.experts.down_proj_scales"]["shape"] == [E, D, F // 32]
        else:
            F = cfg["moe_intermediate_size"]
            assert header[f"{p}.mlp.experts.gate_up_proj"]["shape"] == [E, 2 * F, cfg["hidden_size"]]
            assert header[f"{p}.mlp.experts.down_proj"]["shape"] == [E, cfg["hidden_size"], F]
    ref = json.loads((d / "reference.json").read_text())
    assert len(ref["prompts"]) == 3
    for ids, logits, greedy in zip(ref["prompts"], ref["logits"], ref["greedy"]):
        assert 5 <= len(ids) <= 12 and len(logits) == len(ids) and len(greedy) == 32
        assert all(len(row) == V for row in logits)
        assert int(np.argmax(logits[-1])) == greedy[0]  # the first greedy token is the argmax
    assert sum(p.stat().st_size for p in d.iterdir()) < 1_800_000


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2", "deepseek_v2_grouped"])
def test_deepseek_fixture_has_mla_weights_and_yarn_mscale(name):
    d = FIXTURES / name
    cfg = json.loads((d / "config.json").read_text())
    H, D = cfg["num_attention_heads"], cfg["hidden_size"]
    n, r, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    C, Q = cfg["kv_lora_rank"], cfg["q_lora_rank"]
    header = safetensors_names(d / "model.safetensors")
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}.self_attn"
        if Q:  # DeepSeek-V3: q LoRA
            assert header[f"{p}.q_a_proj.weight"]["shape"] == [Q, D]
            assert header[f"{p}.q_b_proj.weight"]["shape"] == [H * (n + r), Q]
        else:  # DeepSeek-V2-Lite: a plain q_proj
            assert header[f"{p}.q_proj.weight"]["shape"] == [H * (n + r), D]
        assert header[f"{p}.kv_a_proj_with_mqa.weight"]["shape"] == [C + r, D]
        assert header[f"{p}.kv_b_proj.weight"]["shape"] == [H * (n + v), C]
        assert header[f"{p}.o_proj.weight"]["shape"] == [D, H * v]
        assert f"{p}.k_proj.weight" not in header
    rs = cfg["rope_scaling"]
    assert rs["rope_type"] == "yarn" and rs["mscale_all_dim"] != 1  # the softmax scale moves
    if name == "deepseek_v3":
        # Both YaRN magnitude scales set and different: the cos/sin factor is their ratio, not 1.
        assert rs["mscale"] != rs["mscale_all_dim"] and cfg["rope_interleave"] is True
    else:  # DeepSeek-V2: a softmax router without a correction bias, two ungated shared experts
        if name == "deepseek_v2_grouped":  # group-limited greedy: groups that really limit, scaled
            assert cfg["topk_method"] == "group_limited_greedy" and cfg["routed_scaling_factor"] != 1
            assert 1 < cfg["topk_group"] < cfg["n_group"] and cfg["n_routed_experts"] % cfg["n_group"] == 0
        else:
            assert cfg["topk_method"] == "greedy"
        assert cfg["n_shared_experts"] == 2
        assert not any(k.endswith("e_score_correction_bias") for k in header)
        assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in header


def test_deepseek_v3_fp8_fixture_is_in_the_fp8_release_layout():
    d = FIXTURES / "deepseek_v3_fp8"
    cfg = json.loads((d / "config.json").read_text())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "fp8" and q["fmt"] == "e4m3"
    br, bc = q["weight_block_size"]
    header = safetensors_names(d / "model.safetensors")
    fp8 = [k for k, v in header.items() if v["dtype"] == "F8_E4M3"]
    assert len(fp8) > 100  # attention, dense MLP, shared and routed experts
    for k in fp8:
        rows, cols = header[k]["shape"]
        assert header[k + "_scale_inv"]["shape"] == [-(-rows // br), -(-cols // bc)]
        assert header[k + "_scale_inv"]["dtype"] == "F32"
    # Embedding, lm_head, norms and the router stay float, as in DeepSeek-V3's release.
    for k in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight"):
        assert header[k]["dtype"] == "F32"
    assert sum(p.stat().st_size for p in d.iterdir()) < 1_500_000
