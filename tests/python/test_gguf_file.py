"""The GGUF reader (loader/format/gguf_file.h) against the `gguf` PyPI package: files written by
gguf.GGUFWriter (every metadata value type, arrays, tensors of several types including quantised
ones, a split set) read back by moestream with exactly the metadata and tensors that were written,
and the tensor placement that gguf.GGUFReader sees."""
import numpy as np
import pytest

moestream = pytest.importorskip(
    "moestream", reason="moestream module not built (configure with -DMOESTREAM_PYTHON=ON, "
    "PYTHONPATH=<build>/python)")
gguf = pytest.importorskip("gguf", reason="the gguf package (PyPI) writes the files under test")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

_moestream = moestream._moestream

# (key, value, value type, array element type): one entry per GGUF value type, and arrays.
SCALARS = [
    ("t.u8", 250, V.UINT8), ("t.i8", -120, V.INT8), ("t.u16", 65000, V.UINT16),
    ("t.i16", -32000, V.INT16), ("t.u32", 4_000_000_000, V.UINT32), ("t.i32", -2_000_000_000, V.INT32),
    ("t.f32", 0.1, V.FLOAT32), ("t.bool", True, V.BOOL), ("t.false", False, V.BOOL),
    ("t.string", "héllo wörld ✓", V.STRING), ("t.u64", 2**64 - 1, V.UINT64), ("t.i64", -(2**62), V.INT64),
    ("t.f64", 1e-300, V.FLOAT64),
]
ARRAYS = [
    ("a.u8", [0, 1, 255], V.UINT8), ("a.i8", [-128, 127], V.INT8), ("a.u16", [7, 65535], V.UINT16),
    ("a.i16", [-1, 2], V.INT16), ("a.u32", [1, 2**32 - 1], V.UINT32), ("a.i32", [-5, 5, 0], V.INT32),
    ("a.f32", [0.5, -1.25, 3.1], V.FLOAT32), ("a.bool", [True, False, True], V.BOOL),
    ("a.u64", [2**63], V.UINT64), ("a.i64", [-(2**63)], V.INT64), ("a.f64", [2.5, 1e200], V.FLOAT64),
    ("a.string", ["a", "", "<|im_start|>", "Ġthe", "日本"], V.STRING),
]
TYPE_NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32",
              V.INT32: "i32", V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string", V.UINT64: "u64",
              V.INT64: "i64", V.FLOAT64: "f64"}


def _expected(value, vtype):
    return float(np.float32(value)) if vtype == V.FLOAT32 else value


def _tensors(rng):
    """name -> (array to write, raw_dtype or None, ggml type name, ne (row length first))."""
    x = rng.standard_normal((6, 256)).astype(np.float32)
    out = {
        "f32": (x[:3, :40].copy(), None, "F32", [40, 3]),
        "f16": (x[:2].astype(np.float16), None, "F16", [256, 2]),
        "i32.3d": (rng.integers(-9, 9, (2, 3, 5)).astype(np.int32), None, "I32", [5, 3, 2]),
    }
    for qt in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.MXFP4):
        out[qt.name.lower()] = (gguf.quants.quantize(x, qt), qt, qt.name, [256, 6])
    # The package has no k-quant quantizer: random blocks of the right size (the reader checks
    # layout, not values).
    for qt in (Q.Q2_K, Q.Q4_K, Q.Q6_K):
        block, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (4, 2, 512 // block * block_bytes), dtype=np.uint8)
        out[qt.name.lower()] = (raw, qt, qt.name, [512, 2, 4])
    return out


def _write(path, tensors, split_max_tensors=0, n_tokens=150_000):
    w = gguf.GGUFWriter(str(path), "qwen3moe", split_max_tensors=split_max_tensors)
    for key, value, vtype in SCALARS:
        w.add_key_value(key, value, vtype)
    for key, value, vtype in ARRAYS:
        w.add_key_value(key, value, V.ARRAY, sub_type=vtype)
    w.add_key_value("a.nested", [[1, 2], [3], [4, 5, 6]], V.ARRAY)
    w.add_key_value("a.nested_str", [["x", "yz"], ["w"]], V.ARRAY)
    w.add_key_value("tokenizer.ggml.tokens", [f"tok{i}" for i in range(n_tokens)], V.ARRAY, sub_type=V.STRING)
    for name, (arr, raw, _, _) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _check_metadata(info, n_tokens=150_000):
    md, types = info["metadata"], info["types"]
    assert md["general.architecture"] == "qwen3moe"
    for key, value, vtype in SCALARS:
        assert types[key] == TYPE_NAMES[vtype], key
        assert md[key] == _expected(value, vtype), key
        assert type(md[key]) is type(value), key
    for key, value, vtype in ARRAYS:
        assert types[key] == f"array<{TYPE_NAMES[vtype]}>", key
        assert md[key] == [_expected(v, vtype) for v in value], key
    assert types["a.nested"] == "array<array>"
    assert md["a.nested"] == [[1, 2], [3], [4, 5, 6]]
    assert md["a.nested_str"] == [["x", "yz"], ["w"]]
    tokens = md["tokenizer.ggml.tokens"]
    assert tokens == [f"tok{i}" for i in range(n_tokens)]


def _reference_tensors(readers):
    """name -> (shard, gguf.ReaderTensor) as the gguf package reads the files."""
    seen = {}
    for shard, r in enumerate(readers):
        for t in r.tensors:
            seen[t.name] = (shard, t)
    return seen


def _check_tensors(info, tensors, paths, seen):
    """The tensors as written, placed where gguf.GGUFReader finds them, bytes identical."""
    assert set(info["tensors"]) == set(tensors)
    assert set(seen) == set(tensors)
    for name, (arr, _, type_name, ne) in tensors.items():
        got = info["tensors"][name]
        shard, ref = seen[name]
        assert got["type"] == type_name == ref.tensor_type.name, name
        assert got["dims"] == ne == [int(d) for d in ref.shape], name
        assert got["n_elements"] == int(ref.n_elements), name
        assert got["bytes"] == int(ref.n_bytes) == arr.nbytes, name
        assert got["offset"] == int(ref.data_offset), name
        assert got["shard"] == shard, name
        with open(paths[shard], "rb") as f:
            f.seek(got["offset"])
            assert f.read(got["bytes"]) == arr.tobytes(), name


def test_single_file_matches_what_was_written(tmp_path):
    tensors = _tensors(np.random.default_rng(1))
    path = tmp_path / "model.gguf"
    _write(path, tensors)
    info = _moestream._gguf_info(str(path))
    assert len(info["shards"]) == 1
    assert info["shards"][0]["version"] == 3 and info["shards"][0]["alignment"] == 32
    _check_metadata(info)
    # Every key the gguf package reads, in the same order, none more (its reader is slow on the
    # 150k-entry array: one instance).
    reader = gguf.GGUFReader(str(path))
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]  # the reader's pseudo-fields
    assert list(info["metadata"]) == keys
    _check_tensors(info, tensors, [path], _reference_tensors([reader]))


def test_split_set_from_any_shard(tmp_path):
    tensors = _tensors(np.random.default_rng(2))
    _write(tmp_path / "model.gguf", tensors, split_max_tensors=4, n_tokens=1000)
    paths = sorted(tmp_path.glob("model-*-of-*.gguf"))
    seen = _reference_tensors([gguf.GGUFReader(str(p)) for p in paths])
    n = len(paths)
    assert n == 3 and paths[0].name == "model-00001-of-00003.gguf"
    for p in paths:
        info = _moestream._gguf_info(str(p))
        assert [s["path"] for s in info["shards"]] == [str(q) for q in paths]
        _check_metadata(info, n_tokens=1000)  # from the first shard
        assert info["metadata"]["split.count"] == n and info["metadata"]["split.no"] == 0
        assert info["types"]["split.count"] == "u16" and info["types"]["split.tensors.count"] == "i32"
        _check_tensors(info, tensors, paths, seen)


def test_corrupt_and_incomplete_sets_raise(tmp_path):
    tensors = _tensors(np.random.default_rng(3))
    _write(tmp_path / "model.gguf", tensors, split_max_tensors=4, n_tokens=10)
    paths = sorted(tmp_path.glob("model-*-of-*.gguf"))
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[:100])
    with pytest.raises(moestream.FormatError, match=r"model-00002-of-00003\.gguf: .*truncated"):
        _moestream._gguf_info(str(paths[0]))
    paths[1].unlink()
    with pytest.raises(moestream.FormatError, match=r"shard 2 of 3 .* is missing"):
        _moestream._gguf_info(str(paths[2]))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(moestream.FormatError, match="GGUF version 1 is not supported"):
        _moestream._gguf_info(str(bad))
