"""The legacy ggml block types (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, NVFP4) against
the `gguf` package's reference: dequantisation bit for bit, and the matrix product within the
tolerance of docs/format.md ("ggml block types") of numpy's on the dequantised weights."""
import numpy as np
import pytest

moestream = pytest.importorskip(
    "moestream", reason="moestream module not built (configure with -DMOESTREAM_PYTHON=ON, "
    "PYTHONPATH=<build>/python)")
gguf = pytest.importorskip("gguf", reason="the gguf package (scripts/setup.sh installs it)")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

M = moestream._moestream
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4", "NVFP4"]
BLOCK_TYPES = TYPES[3:]
# Byte offsets of the float16 fields of a block: the scale d and, where there is one, the min.
SCALE_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0]}
# float16 scales the random blocks must also meet: zero of both signs, the smallest subnormal, a
# subnormal, the largest finite value of both signs, one.
SPECIAL_F16 = np.array([0x0000, 0x8000, 0x0001, 0x03ff, 0x7bff, 0xfbff, 0x3c00], dtype=np.uint16)


def sizes(name):
    return GGML_QUANT_SIZES[Q[name]]


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def ours(name, raw):
    block, type_size = sizes(name)
    return M._ggml_dequantize(name, raw.tobytes(), raw.size // type_size * block)


def theirs(name, raw):
    with np.errstate(over="ignore", invalid="ignore"):
        return gguf.quants.dequantize(raw, Q[name]).reshape(-1)


def random_blocks(name, n_blocks, rng):
    """Random bytes, every float16 field finite (random normal scales, SPECIAL_F16 among them);
    MXFP4 scale bytes cover 0..255, all of E8M0 including its subnormal and largest exponents;
    NVFP4's four scale bytes per block too, all of UE4M3 (subnormals, 0x7F, bit 7 set)."""
    block, type_size = sizes(name)
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if name == "MXFP4":
        raw[:, 0] = np.arange(n_blocks) % 256
    if name == "NVFP4":
        raw[:, :4] = (np.arange(n_blocks * 4) % 256).reshape(n_blocks, 4)
    for off in SCALE_FIELDS.get(name, []):
        h = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16).view(np.uint16)
        k = min(n_blocks, len(SPECIAL_F16))
        h[:k] = SPECIAL_F16[:k]
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_dequantize_random_blocks_bit_exact(name):
    rng = np.random.default_rng(sum(map(ord, name)))
    raw = random_blocks(name, 512, rng)
    got, want = ours(name, raw), theirs(name, raw)
    assert got.shape == want.shape
    mismatch = np.flatnonzero(bits(got) != bits(want))
    assert mismatch.size == 0, f"{name}: {mismatch.size} elements differ, first at {mismatch[:5]}"
    # The special scales did reach the output: -0.0 and subnormal products are there.
    if name != "MXFP4":
        assert np.any(bits(want) == 0x80000000)


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_dequantize_every_16_bit_pattern(name):
    raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)  # infinities and NaN payloads too
    assert np.array_equal(bits(ours(name, raw)), bits(theirs(name, raw)))


def test_dequantize_f32_keeps_bits():
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 1 << 32, size=4096, dtype=np.uint64).astype(np.uint32)
    raw[:4] = [0x7fc00001, 0xff800000, 0x80000000, 0x00000001]  # NaN payload, -inf, -0, subnormal
    assert np.array_equal(bits(ours("F32", raw.view(np.uint8))), raw)


@pytest.mark.parametrize("name", ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"])
def test_dequantize_blocks_of_the_gguf_quantizer(name):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 256)).astype(np.float32)
    w[3] *= 1e-6  # tiny values: subnormal float16 scales
    w[5, 7] = 60000.0  # a block whose scale is near the float16 maximum
    w[6] = 0.0  # zero blocks
    raw = gguf.quants.quantize(w, Q[name]).reshape(-1).view(np.uint8)
    assert np.array_equal(bits(ours(name, raw)), bits(theirs(name, raw)))


def tolerance(name, wq, w, x):
    """Per (input, row): the activation rounding bound plus the summation-order bound."""
    block, type_size = sizes(name)
    rows, cols = w.shape
    aw = np.abs(w.astype(np.float64))
    ax = np.abs(x.astype(np.float64))
    if name == "NVFP4":  # no offset; one float term per sub-block of 16
        nb = cols // 32
        step = ax.reshape(x.shape[0], nb, 32).max(axis=2) / 254
        step_c = np.repeat(step, 32, axis=1)
        act = (step_c * (1 + 1e-5) + ax * 2.0**-20) @ aw.T
        return act + (cols // 16 + 16) * 2.0**-23 * ((ax + step_c) @ aw.T)
    if name in BLOCK_TYPES:
        nb = cols // 32
        blocks = wq.reshape(rows, nb, type_size)
        if name == "MXFP4":
            d = np.ldexp(1.0, blocks[:, :, 0].astype(np.int32) - 128)
        else:
            d = np.abs(blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64))
        offset = {"Q4_0": 8 * d, "Q5_0": 16 * d, "MXFP4": 12 * d}.get(name, 0 * d)
        if name in ("Q4_1", "Q5_1"):
            offset = np.abs(blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float64))
        step = ax.reshape(x.shape[0], nb, 32).max(axis=2) / 254  # half a step of the int8 input
        step_c = np.repeat(step, 32, axis=1)
        act = (step_c * (1 + 1e-5) + ax * 2.0**-20) @ aw.T
        mag = (ax + step_c) @ (aw + 2 * np.repeat(offset, 32, axis=1)).T
        return act + (nb + 16) * 2.0**-23 * mag
    return (cols + 16) * 2.0**-23 * (ax @ aw.T)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows,cols,n", [(1, 32, 1), (7, 32, 3), (13, 96, 1), (37, 512, 5), (9, 2048, 9)])
def test_matmul_within_tolerance_of_numpy(name, rows, cols, n):
    rng = np.random.default_rng(rows * 1000 + cols + n)
    if name == "NVFP4":  # the package cannot quantize NVFP4: random blocks, 64-column rows
        cols = (cols + 63) // 64 * 64
        wq = random_blocks(name, rows * cols // 64, rng)
        wq.reshape(-1, 36)[:, :4] = rng.integers(0x18, 0x48, size=(rows * cols // 64, 4), dtype=np.uint8)
    elif name in ("IQ4_NL",):  # the package cannot quantize IQ4_NL: random blocks
        wq = random_blocks(name, rows * cols // 32, rng)
        wq.reshape(-1, 18)[:, :2] = (rng.standard_normal((rows * cols // 32, 1)) * 0.01).astype(
            np.float16).view(np.uint8)
    else:
        wq = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), Q[name])
    wq = np.ascontiguousarray(wq).reshape(-1).view(np.uint8)
    w = theirs(name, wq).reshape(rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::61] *= 20  # outlier channels: their block's int8 step grows
    y = M._ggml_matmul(name, wq.tobytes(), rows, cols, x)
    assert y.shape == (n, rows) and y.dtype == np.float32
    want = x.astype(np.float64) @ w.astype(np.float64).T
    err = np.abs(y - want)
    tol = tolerance(name, wq, w, x)
    assert np.all(err <= tol), f"{name}: worst error {err.max():.3g}, tolerance there {tol.flat[err.argmax()]:.3g}"


def test_bad_calls_raise_config_error():
    with pytest.raises(moestream.ConfigError, match="does not match"):
        M._ggml_dequantize("Q4_0", b"\0" * 17, 32)
    with pytest.raises(moestream.ConfigError, match="unknown ggml type"):
        M._ggml_dequantize("Q4_9", b"\0" * 18, 32)
    with pytest.raises(moestream.ConfigError, match="not supported"):
        M._ggml_dequantize("Q8_1", b"\0" * 40, 32)  # a known type no kernel computes
    with pytest.raises(moestream.ConfigError, match="n x cols"):
        M._ggml_matmul("Q8_0", b"\0" * 34, 1, 32, np.zeros((2, 64), np.float32))
