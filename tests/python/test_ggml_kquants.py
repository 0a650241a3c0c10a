"""ggml's 256-element super-block types (Q2_K..Q6_K, IQ4_XS, the lattice types IQ2_XXS, IQ2_XS,
IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and the ternary TQ1_0, TQ2_0) computed by moestream against
the `gguf` package: dequantisation bit for bit equal to gguf.quants.dequantize (which also checks
the lattice tables of kernels/cpu/ggml_iq*_grid*.h entry by entry), and the int8-activation
products within the rounding bound of f64 maths on the dequantised weights (docs/format.md)."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("moestream", reason="moestream module not built (configure with -DMOESTREAM_PYTHON=ON, "
                    "PYTHONPATH=<build>/python)")
gguf = pytest.importorskip("gguf", reason="the gguf package (the block-format oracle) is not installed")
from gguf import quants as gq  # noqa: E402
from moestream import _moestream as _m  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Block bytes and the byte offsets of each block's f16 factors (d, and dmin where the type has one;
# IQ1_M's d is spread over the top nibbles of the four u16 at 48, see put_f16).
TYPES = {
    "Q2_K": (84, [80, 82]),
    "Q3_K": (110, [108]),
    "Q4_K": (144, [0, 2]),
    "Q5_K": (176, [0, 2]),
    "Q6_K": (210, [208]),
    "IQ4_XS": (136, [0]),
    "IQ2_XXS": (66, [0]),
    "IQ2_XS": (74, [0]),
    "IQ2_S": (82, [0]),
    "IQ3_XXS": (98, [0]),
    "IQ3_S": (110, [0]),
    "IQ1_S": (50, [0]),
    "IQ1_M": (56, [48]),
    "TQ1_0": (54, [52]),
    "TQ2_0": (66, [64]),
}
# The types whose levels come from a table (loader/format/ggml_iq1_grid.h, ggml_iq2_iq3_grids.h).
LATTICE = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]
# Rounding an activation to a step s leaves an error uniform in [-s/2, s/2] (variance s^2/12), so
# the product's error has the predicted deviation sqrt(sum w^2 s^2 / 12). The RMS of the errors
# measured in units of it is ~1 for a correct kernel (0.6-1.25 here); a wrong one gives >> 1.
RMS_RATIO_TOL = 1.6

# f16 bit patterns at the edges: +-0, the smallest and largest subnormals, the smallest normal,
# the largest finite, one.
EXTREME_F16 = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00],
                       dtype=np.uint16)


def qtype(name):
    return gguf.GGMLQuantizationType[name]


def put_f16(name, raw, off, h):
    """Writes the f16 patterns h (one per block) as the factor at byte `off` of each block."""
    if name != "IQ1_M":
        raw[:, off:off + 2] = h.astype("<u2").view(np.uint8).reshape(-1, 2)
        return
    words = raw[:, off:off + 8].copy().view("<u2")  # the 3-bit scales stay in the low 12 bits
    for w in range(4):
        words[:, w] = (words[:, w] & 0x0FFF) | (((h.astype(np.uint16) >> (4 * w)) & 0xF) << 12)
    raw[:, off:off + 8] = words.view(np.uint8)


def random_blocks(name, n_blocks, rng, f16_values=None):
    """Random bytes with finite f16 factors (random finite patterns unless f16_values is given)."""
    block_bytes, f16_at = TYPES[name]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in f16_at:
        if f16_values is None:
            h = rng.integers(0, 1 << 16, size=n_blocks, dtype=np.uint16)
            h = np.where((h & 0x7C00) == 0x7C00, h & ~np.uint16(0x4000), h)  # inf/NaN -> finite
        else:
            h = f16_values[rng.integers(0, len(f16_values), size=n_blocks)]
        put_f16(name, raw, off, h)
    return raw


def dequantize_both(name, raw):
    n = raw.shape[0] * 256
    ours = _m._ggml_dequantize(name, raw.tobytes(), n)
    ref = gq.dequantize(raw.reshape(1, -1), qtype(name)).reshape(-1).astype(np.float32)
    return np.asarray(ours, dtype=np.float32), ref


def assert_same_bits(name, ours, ref):
    a, b = ours.view(np.uint32), ref.view(np.uint32)
    bad = np.flatnonzero(a != b)
    assert bad.size == 0, (f"{name}: {bad.size} of {a.size} values differ, first at {bad[0]} "
                           f"(block {bad[0] // 256}): {ours[bad[0]]!r} vs gguf {ref[bad[0]]!r}")


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_random_blocks_bit_exact(name):
    rng = np.random.default_rng(1000 + list(TYPES).index(name))
    ours, ref = dequantize_both(name, random_blocks(name, 512, rng))
    assert_same_bits(name, ours, ref)


@pytest.mark.parametrize("name", LATTICE)
def test_dequantize_meets_every_grid_entry_bit_exact(name):
    """Enough random blocks that every entry of the type's grid is used (a wrong table entry, a
    wrong sign byte or a wrong index bit shows as differing values)."""
    rng = np.random.default_rng(3000 + LATTICE.index(name))
    ours, ref = dequantize_both(name, random_blocks(name, 4096, rng))
    assert_same_bits(name, ours, ref)


def test_grid_headers_match_the_gguf_package():
    """kernels/cpu's generated tables are what scripts/gen_ggml_iquant_grids.py makes of the
    installed gguf package."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_ggml_iquant_grids.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_extreme_scales_bit_exact(name):
    rng = np.random.default_rng(2000 + list(TYPES).index(name))
    raw = random_blocks(name, 400, rng, EXTREME_F16)
    ours, ref = dequantize_both(name, raw)
    assert_same_bits(name, ours, ref)
    # Negative zero really occurs (and must keep its sign), as do values from subnormal factors.
    assert np.any(ref.view(np.uint32) == 0x80000000)


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_rejects_a_wrong_size(name):
    with pytest.raises(_m.ConfigError):
        _m._ggml_dequantize(name, b"\0" * (TYPES[name][0] - 1), 256)


def moderate_blocks(name, n_blocks, rng):
    """Weights of a realistic magnitude: factors of either sign in [2^-12, 2^-4]."""
    vals = np.float16(rng.uniform(2.0 ** -12, 2.0 ** -4, 4096) * rng.choice([-1, 1], 4096))
    return random_blocks(name, n_blocks, rng, vals.view(np.uint16))


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("rows,cols,n", [(31, 256, 1), (13, 768, 5), (33, 4096, 1), (9, 2048, 6)])
def test_matmul_within_rounding_bound_of_f64(name, rows, cols, n):
    rng = np.random.default_rng(rows * 1000 + cols + n)
    raw = moderate_blocks(name, rows * cols // 256, rng)
    w = gq.dequantize(raw.reshape(rows, -1), qtype(name)).astype(np.float64)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, rng.integers(0, cols, 3)] *= 8.0  # outliers stress the per-256 activation scale
    y = np.asarray(_m._ggml_matmul(name, raw.tobytes(), rows, cols, x), dtype=np.float64)
    ref = x.astype(np.float64) @ w.T
    # Per super-block the activations are rounded to multiples of amax/127: each column is off by at
    # most half a step, so |y - ref| <= sum over columns of |w| * step / 2 (plus float rounding).
    amax = np.abs(x.astype(np.float64)).reshape(n, -1, 256).max(axis=2)
    half_step = np.repeat(amax / 127.0 / 2.0, 256, axis=1)
    bound = half_step @ np.abs(w).T * 1.0001 + 1e-5 * (np.abs(x) @ np.abs(w).T)
    err = np.abs(y - ref)
    assert np.all(err <= bound), f"{name}: worst error {np.max(err - bound):.3g} above the bound"
    predicted = np.sqrt((half_step * 2) ** 2 / 12.0 @ (w ** 2).T)
    ratio = np.sqrt(np.mean((err / predicted) ** 2))
    assert ratio < RMS_RATIO_TOL, f"{name}: RMS error {ratio:.3f} x the rounding's predicted deviation"


@pytest.mark.parametrize("name", list(TYPES))
def test_matmul_equals_matvec_input_by_input(name):
    rng = np.random.default_rng(77)
    rows, cols, n = 11, 512, 7
    raw = moderate_blocks(name, rows * cols // 256, rng).tobytes()
    x = rng.standard_normal((n, cols)).astype(np.float32)
    y = np.asarray(_m._ggml_matmul(name, raw, rows, cols, x))
    for i in range(n):
        yi = np.asarray(_m._ggml_matmul(name, raw, rows, cols, x[i:i + 1]))
        assert np.array_equal(y[i].view(np.uint32), yi[0].view(np.uint32)), f"{name}: input {i}"
