#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_gguf (tests/fuzz/corpus/fuzz_gguf/): small valid GGUF files
written by the `gguf` PyPI package (a few KB each, under fuzz.sh's 64 KiB input limit), covering
every metadata value type, string and nested arrays, a non-default alignment and tensors of plain
and block types. Deterministic: run it again and the files are identical.

    python3 tests/fuzz/make_gguf_seeds.py [OUT_DIR]
"""
import pathlib
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V


def write(path, kvs, tensors, alignment=None):
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in kvs:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "corpus" / "fuzz_gguf")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261201)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    q4k_block, q4k_bytes = gguf.GGML_QUANT_SIZES[Q.Q4_K]

    scalars = [("s.u8", 7, V.UINT8, None), ("s.i8", -7, V.INT8, None), ("s.u16", 700, V.UINT16, None),
               ("s.i16", -700, V.INT16, None), ("s.u32", 70000, V.UINT32, None), ("s.i32", -70000, V.INT32, None),
               ("s.f32", 0.5, V.FLOAT32, None), ("s.bool", True, V.BOOL, None), ("s.str", "qwen3", V.STRING, None),
               ("s.u64", 2**40, V.UINT64, None), ("s.i64", -(2**40), V.INT64, None), ("s.f64", 0.25, V.FLOAT64, None),
               ("qwen3moe.block_count", 2, V.UINT32, None), ("qwen3moe.expert_count", 4, V.UINT32, None)]
    write(out / "all_types.gguf", scalars, [
        ("token_embd.weight", x[:, :16].copy(), None),
        ("blk.0.attn_q.weight", x[:, :32].astype(np.float16), None),
        ("blk.0.ffn_up_exps.weight", gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0),
        ("blk.0.ffn_down_exps.weight",
         rng.integers(0, 256, (2, 256 // q4k_block * q4k_bytes), dtype=np.uint8), Q.Q4_K),
    ])

    tokens = ["<s>", "</s>"] + [f"t{i}" for i in range(60)]
    write(out / "tokenizer.gguf", [
        ("tokenizer.ggml.model", "gpt2", V.STRING, None),
        ("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
        ("tokenizer.ggml.scores", [float(-i) for i in range(len(tokens))], V.ARRAY, V.FLOAT32),
        ("tokenizer.ggml.token_type", [3, 3] + [1] * 60, V.ARRAY, V.INT32),
        ("tokenizer.ggml.merges", ["t 1", "t 2", "Ġ t"], V.ARRAY, V.STRING),
        ("tokenizer.ggml.bos_token_id", 0, V.UINT32, None),
        ("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}", V.STRING, None),
    ], [("output_norm.weight", x[0, :32].copy(), None)])

    write(out / "nested_aligned.gguf", [
        ("n.nested", [[1, 2], [3], [4, 5, 6]], V.ARRAY, None),
        ("n.nested_str", [["a", "bc"], ["d"]], V.ARRAY, None),
        ("n.u64s", [1, 2**63], V.ARRAY, V.UINT64),
        ("n.bools", [True, False], V.ARRAY, V.BOOL),
        ("n.f64s", [1.5, -2.5], V.ARRAY, V.FLOAT64),
    ], [("a", gguf.quants.quantize(x, Q.Q4_0), Q.Q4_0), ("b", gguf.quants.quantize(x, Q.BF16), Q.BF16),
        ("c", rng.integers(-5, 5, (3, 4, 5)).astype(np.int32), None)], alignment=64)

    write(out / "metadata_only.gguf", [("general.name", "empty", V.STRING, None)], [])
    for p in sorted(out.glob("*.gguf")):
        print(p, p.stat().st_size)


if __name__ == "__main__":
    main()
