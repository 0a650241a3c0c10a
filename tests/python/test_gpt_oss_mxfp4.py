"""gpt-oss's MXFP4 experts (tests/fixtures/gpt_oss_mxfp4, the released checkpoints' layout) converted
by convert_model without requantisation: the pack's expert payloads, read straight from the layer
files and dequantised by the `gguf` package (not by moestream), equal transformers' own
dequantisation (mxfp4_dequantized.safetensors, made by convert_moe_packed_tensors) bit for bit, and
the f32 bias section after down holds the checkpoint's biases (docs/format.md)."""
import json
import struct
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package (scripts/setup.sh installs it)")
from gguf import GGMLQuantizationType as Q  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "gpt_oss_mxfp4"


def read_safetensors(path):
    """name -> numpy array (F32 and U8 only, what the fixture holds)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        dt = {"F32": np.float32, "U8": np.uint8}[t["dtype"]]
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=dt).reshape(t["shape"])
    return out


def align(x, a=64):
    return (x + a - 1) // a * a


def test_mxfp4_payload_dequantises_bit_exactly_to_transformers(tool, tmp_path):
    if not FIXTURE.exists():
        pytest.skip("fixture gpt_oss_mxfp4 absent (python/training/make_fixtures.py makes it)")
    r = tool("convert_model", "-q", FIXTURE, tmp_path / "p")
    assert r.returncode == 0, r.stderr
    model = json.loads((tmp_path / "p" / "model.json").read_text())
    assert model["architecture"] == "gpt_oss" and model["experts"]["quant"] == "MXFP4"
    assert model["experts"]["bias"] is True and model["format_version"] == 2
    D, F, E = model["hidden_size"], model["moe_intermediate_size"], model["n_experts"]
    deq = read_safetensors(FIXTURE / "mxfp4_dequantized.safetensors")
    ck = read_safetensors(FIXTURE / "model.safetensors")
    row_gu, row_d = D // 32 * 17, F // 32 * 17  # one MXFP4 row: 17 bytes per 32 elements
    up_off = align(F * row_gu)
    down_off = up_off + align(F * row_gu)
    bias_off = align(down_off + D * row_d)
    for l in range(model["n_layers"]):
        blob = (tmp_path / "p" / "experts" / f"layer_{l:03d}.bin").read_bytes()
        assert blob[:8] == b"MOEXPRT\0"
        version, = struct.unpack_from("<I", blob, 8)
        stride, data_offset = struct.unpack_from("<QQ", blob, 40)
        flags, = struct.unpack_from("<I", blob, 72)
        assert version == 2 and flags == 3  # biases, XXH3 slot checksums
        gu = deq[f"layers.{l}.gate_up_proj"]  # [E, D, 2F]: x @ W, columns 2f gate and 2f+1 up
        dn = deq[f"layers.{l}.down_proj"]     # [E, F, D]
        p = f"model.layers.{l}.mlp.experts."
        for e in range(E):
            pay = np.frombuffer(blob, dtype=np.uint8, count=stride, offset=data_offset + e * stride)

            def mat(off, rows, row_bytes):
                return gguf.quants.dequantize(pay[off:off + rows * row_bytes].reshape(rows, row_bytes), Q.MXFP4)
            gate, up, down = mat(0, F, row_gu), mat(up_off, F, row_gu), mat(down_off, D, row_d)
            np.testing.assert_array_equal(gate.view(np.uint32), gu[e][:, 0::2].T.copy().view(np.uint32))
            np.testing.assert_array_equal(up.view(np.uint32), gu[e][:, 1::2].T.copy().view(np.uint32))
            np.testing.assert_array_equal(down.view(np.uint32), dn[e].T.copy().view(np.uint32))
            bias = pay[bias_off:bias_off + (2 * F + D) * 4].view(np.float32)
            np.testing.assert_array_equal(bias[:F], ck[p + "gate_up_proj_bias"][e, 0::2])
            np.testing.assert_array_equal(bias[F:2 * F], ck[p + "gate_up_proj_bias"][e, 1::2])
            np.testing.assert_array_equal(bias[2 * F:], ck[p + "down_proj_bias"][e])
