"""GGUF files run in place with ggml's lattice and ternary types (IQ1_S..IQ3_S, TQ1_0, TQ2_0) and
NVFP4 in dense and expert tensors, and files holding a type this build does not compute (Q8_K,
Q8_1), refused at load with an error naming the tensor and the type.

The lattice case rewrites the Q4_K fixture with random blocks of those types and compares its
logits with a twin whose tensors are gguf.quants' F32 dequantisation of the same bytes: the only
difference left is the int8 rounding of the activations (docs/format.md, "Products and their
accuracy")."""
import json
import pathlib

import numpy as np
import pytest

moestream = pytest.importorskip("moestream", reason="moestream module not built (PYTHONPATH=<build>/python)")
gguf = pytest.importorskip("gguf", reason="the gguf package (scripts/setup.sh installs it)")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402
from gguf_copy import copy_gguf  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "tests" / "fixtures" / "gguf" / "qwen3moe-k-Q4_K.gguf"
# Byte offset of each type's f16 d in a block (IQ1_M: the top nibbles of the 4 u16 at 48).
D_AT = {"IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "IQ1_S": 0, "IQ1_M": 48,
        "TQ1_0": 52, "TQ2_0": 64, "Q8_K": 0, "Q8_1": 0, "NVFP4": None}
# A type per rewritten tensor: every lattice and ternary type in a dense or an expert matrix.
LATTICE = {
    "token_embd.weight": "TQ2_0",
    "output.weight": "TQ1_0",
    "blk.0.attn_q.weight": "IQ2_XS",
    "blk.0.attn_k.weight": "IQ2_S",
    "blk.0.attn_v.weight": "IQ3_S",
    "blk.0.attn_output.weight": "IQ1_S",
    "blk.0.ffn_gate_exps.weight": "IQ2_XXS",
    "blk.0.ffn_up_exps.weight": "IQ3_XXS",
    "blk.0.ffn_down_exps.weight": "IQ1_M",
    "blk.1.ffn_gate_exps.weight": "IQ1_M",
    "blk.1.ffn_up_exps.weight": "IQ2_XXS",
    "blk.1.ffn_down_exps.weight": "IQ3_XXS",
}


def random_blocks(name, n_blocks, rng, d_scale):
    """Random level bytes and a random f16 d of either sign and magnitude ~d_scale per block."""
    block_bytes = GGML_QUANT_SIZES[Q[name]][1]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if name == "NVFP4":  # four UE4M3 scales 2^-8..2^-5 (half-scales of levels up to 12: weights ~0.1)
        raw[:, :4] = rng.integers(0x10, 0x20, size=(n_blocks, 4), dtype=np.uint8)
    at = D_AT[name]
    if at is None:
        return raw
    h = (rng.uniform(0.5, 1.5, n_blocks) * d_scale * rng.choice([-1, 1], n_blocks)).astype(np.float16)
    h = h.view(np.uint16)
    if name == "IQ1_M":
        words = raw[:, at:at + 8].copy().view("<u2")
        for w in range(4):
            words[:, w] = (words[:, w] & 0x0FFF) | (((h >> (4 * w)) & 0xF) << 12)
        raw[:, at:at + 8] = words.view(np.uint8)
    else:
        raw[:, at:at + 2] = h.astype("<u2").view(np.uint8).reshape(-1, 2)
    return raw


def rewrite(dst, retype, rng, dequantised=False):
    """SRC with the tensors of `retype` (name -> type) replaced by random blocks of that type, or by
    their F32 dequantisation (the same rng draws) when `dequantised`."""
    def replace(t):
        if t.name not in retype:
            return None
        qt = Q[retype[t.name]]
        block = GGML_QUANT_SIZES[qt][0]
        ne = [int(x) for x in t.shape]  # row length first
        rows = int(np.prod(ne[1:]))
        # Weights of ~0.1: the lattice types' levels reach 8 x 2s+1 x 43 times d, the ternary ones 1.
        d_scale = 2.0 ** -3 if qt.name.startswith("TQ") else 2.0 ** -9
        raw = random_blocks(qt.name, rows * ne[0] // block, rng, d_scale).reshape(*reversed(ne[1:]), -1)
        return (gguf.quants.dequantize(raw, qt).astype(np.float32), None) if dequantised else (raw, qt)
    copy_gguf(gguf, SRC, dst, replace)


def assert_computes_as_dequantisation(tmp_path, retype, seed):
    """The logits of SRC rewritten with `retype` against those of its F32 dequantisation twin."""
    a, b = tmp_path / "quantised.gguf", tmp_path / "f32.gguf"
    rewrite(a, retype, np.random.default_rng(seed))
    rewrite(b, retype, np.random.default_rng(seed), dequantised=True)
    seq = [1, 17, 230, 5, 99, 311, 42, 7]
    la = moestream.Model(a, threads=2).logits(seq).astype(np.float64)
    lb = moestream.Model(b, threads=2).logits(seq).astype(np.float64)
    assert np.all(np.isfinite(la)) and np.std(lb) > 0
    # The rounded activations move logits by up to ~0.2 std here (lattice seeds 40-42: 0.16-0.21;
    # random weights and near-tied expert choices amplify them), correlation >= 0.999; unrelated
    # weights of the same types give ~6 std and correlation ~0. The kernels' own bounds are tighter
    # (tests/ggml_kquants_test.cpp, test_ggml_kquants.py); this checks the wiring of every path.
    err = np.abs(la - lb).max() / np.std(lb)
    assert err < 0.5, f"max |logit difference| = {err:.3f} std"
    assert np.corrcoef(la.ravel(), lb.ravel())[0, 1] > 0.995


def test_lattice_and_ternary_tensors_compute_as_their_dequantisation(tmp_path):
    assert_computes_as_dequantisation(tmp_path, LATTICE, seed=40)


def test_nvfp4_tensors_compute_as_their_dequantisation(tmp_path):
    # Only the int8 rounding of the activations differs, as for the lattice types.
    retype = {"blk.0.attn_q.weight": "NVFP4", "output.weight": "NVFP4", "blk.0.ffn_gate_exps.weight": "NVFP4",
              "blk.1.ffn_down_exps.weight": "NVFP4"}
    assert_computes_as_dequantisation(tmp_path, retype, seed=43)


def test_a_pack_converted_from_them_computes_exactly_what_the_gguf_computes(tool, tmp_path):
    # convert_model keeps every expert matrix's type per layer (gate NVFP4 next to up IQ2_XXS and
    # down IQ3_XXS in layer 1): the pack reads the same bytes with the same kernels.
    retype = dict(LATTICE, **{"blk.1.ffn_gate_exps.weight": "NVFP4", "blk.1.attn_q.weight": "NVFP4"})
    src, pack = tmp_path / "lattice.gguf", tmp_path / "pack"
    rewrite(src, retype, np.random.default_rng(44))
    r = tool("convert_model", "-q", src, pack)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((pack / "model.json").read_text())
    assert cfg["experts"]["layer_types"] == [[retype[f"blk.{layer}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")]
                                             for layer in (0, 1)]
    seq = [1, 17, 230, 5, 99, 311, 42, 7]
    la = moestream.Model(src, threads=2).logits(seq)
    lb = moestream.Model(pack, threads=2).logits(seq)
    assert la.shape == lb.shape and np.array_equal(la, lb), float(np.abs(la - lb).max())


@pytest.mark.parametrize("tensor,type_name", [
    ("blk.0.attn_q.weight", "Q8_K"),
    ("blk.1.ffn_down_exps.weight", "Q8_K"),
    ("output.weight", "Q8_1"),
    ("blk.0.ffn_gate_exps.weight", "Q8_1"),
])
def test_a_type_this_build_does_not_compute_is_refused_by_name(tmp_path, tensor, type_name):
    path = tmp_path / "x.gguf"
    rewrite(path, {tensor: type_name}, np.random.default_rng(1))
    with pytest.raises(moestream.ConfigError, match=f"tensor '{tensor}' has type {type_name}, which this build "
                       "cannot compute"):
        moestream.Model(path, threads=2)
