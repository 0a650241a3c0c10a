#!/usr/bin/env python3
"""A GGUF with more decoder layers, made from a smaller one of the same shapes: its metadata,
tokenizer, embedding and head copied, block_count set, and every layer's tensors written in the
types and shapes of the source's layer 0 with fresh random values (quantized blocks: random
quants, scales drawn around the source's; f32 norms copied, f32 routers random around the
source's spread).

Why: bench/peer's 48-layer Qwen3-30B-A3B-shaped model. The converter route (a bf16 checkpoint,
llama.cpp's converter, its quantizer) needs ~61 GB for the checkpoint, ~61 GB for the bf16 GGUF
and ~32 GB for the Q8_0 one, past the device machine's 64 GB disk; this writes only the 32 GB
Q8_0 file, from the 6-layer one llama.cpp made. Both engines then read the same file (moestream
runs a GGUF in place).

    python3 bench/gguf_deepen.py SRC.gguf OUT.gguf --layers 48 [--seed 1]

Random weights route at random, as the source's do: a speed benchmark, not a language model.
Layers are made in parallel (a process per core, --jobs) and written in order as they come, so
memory holds a few layers, not the file; layer L's values come from the generator seeded with
(--seed, L), the same whatever --jobs. Written to OUT.tmp, fsynced and renamed; progress every
layer on stderr. Types: Q8_0 and F32 tensors (what the converter and llama-quantize Q8_0 write
for qwen3moe); another quantized type is refused, naming the tensor.
"""
import argparse
import collections
import multiprocessing
import os
import re
import sys
import time

import numpy as np

try:
    import gguf
except ImportError:  # the device machine has no pip: llama.cpp's gguf-py travels in .llama
    sys.exit("gguf_deepen: the `gguf` Python package is missing (pip install gguf, or PYTHONPATH=<llama.cpp>/gguf-py)")

Q8_0 = gguf.GGMLQuantizationType.Q8_0
F32 = gguf.GGMLQuantizationType.F32


def field_value(f):
    """A reader field as (value, type, array element type)."""
    vtype = f.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data], vtype, sub
        return [f.parts[i].tolist()[0] for i in f.data], vtype, sub
    if vtype == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8"), vtype, None
    return f.parts[f.data[0]].tolist()[0], vtype, None


def median_scale(template: np.ndarray) -> float:
    """The median |scale| of a Q8_0 tensor's blocks (1e-3 for an empty one)."""
    d = np.abs(template.reshape(-1, 34)[:, :2].copy().view(np.float16).astype(np.float32))
    return float(np.median(d[np.isfinite(d)])) if d.size else 1e-3


def random_q8_0(template: np.ndarray, med: float, rng: np.random.Generator) -> np.ndarray:
    """Q8_0 blocks of the template's shape: quants uniform in [-127, 127], f16 scales scattered
    around `med` (the template's median_scale)."""
    blocks = template.reshape(-1, 34)
    out = np.empty_like(blocks)
    n = blocks.shape[0]
    out[:, 2:] = rng.integers(-127, 128, size=(n, 32), dtype=np.int8).view(np.uint8)
    scale = (med * rng.uniform(0.5, 1.5, size=n)).astype(np.float16)
    out[:, :2] = scale.view(np.uint8).reshape(n, 2)
    return out.reshape(template.shape)


# Each worker's view of the source's layer 0: (tensor, the spread its random values follow: a
# Q8_0 tensor's median scale, the router's standard deviation, None for a norm copied as it is).
_LAYER0: list = []


def _open_source(path: str) -> None:
    """A worker's start: reads the templates' spreads once, not once per layer."""
    for t in gguf.GGUFReader(path).tensors:
        if not t.name.startswith("blk.0."):
            continue
        if t.tensor_type == Q8_0:
            _LAYER0.append((t, median_scale(np.asarray(t.data))))
        elif "ffn_gate_inp" in t.name:
            _LAYER0.append((t, float(np.asarray(t.data, dtype=np.float32).std()) or 1e-2))
        else:
            _LAYER0.append((t, None))


def make_layer(job: tuple[int, int]) -> list[np.ndarray]:
    """Layer `layer`'s tensors in the order of the source's blk.0.* (see the module docstring)."""
    layer, seed = job
    rng = np.random.default_rng([seed, layer])
    out = []
    for t, spread in _LAYER0:
        if t.tensor_type == Q8_0:
            out.append(random_q8_0(np.asarray(t.data), spread, rng))
        elif spread is not None:  # the router: random, the template's spread
            out.append(rng.normal(0.0, spread, size=t.data.shape).astype(np.float32))
        else:  # norms
            out.append(np.array(t.data, dtype=np.float32))
    return out


def tensor_info(w, name: str, t) -> None:
    """Declares a tensor of the template's type and shape (the data follows later, in order)."""
    if t.tensor_type == Q8_0:
        w.add_tensor_info(name, t.data.shape, np.dtype(np.uint8), t.data.nbytes, raw_dtype=Q8_0)
    else:
        w.add_tensor_info(name, t.data.shape, np.dtype(np.float32), t.data.size * 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="the GGUF to copy (one file, not a split set)")
    ap.add_argument("out", help="the GGUF to write")
    ap.add_argument("--layers", type=int, required=True, help="decoder layers of the output")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes making layers (default: the cores)")
    a = ap.parse_args()
    if a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.jobs < 1:
        ap.error("--jobs must be >= 1")
    r = gguf.GGUFReader(a.src)
    arch = field_value(r.fields["general.architecture"])[0]
    if "split.count" in r.fields:
        sys.exit(f"gguf_deepen: {a.src} is one shard of a split set; merge it first")
    layer0 = [t for t in r.tensors if t.name.startswith("blk.0.")]
    other = [t for t in r.tensors if not t.name.startswith("blk.")]
    if not layer0:
        sys.exit(f"gguf_deepen: {a.src} has no blk.0.* tensors")
    for t in layer0 + other:
        if t.tensor_type not in (Q8_0, F32):
            sys.exit(f"gguf_deepen: tensor {t.name} is {t.tensor_type.name}; only Q8_0 and F32 are written")
    tmp = a.out + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer's own
        value, vtype, sub = field_value(f)
        if name == f"{arch}.block_count":
            value = a.layers
        w.add_key_value(name, value, vtype, sub_type=sub)
    # Tensors in the source's order: the head and embedding where they were, then the layers.
    for t in other:
        tensor_info(w, t.name, t)
    for layer in range(a.layers):
        for t in layer0:
            tensor_info(w, re.sub(r"^blk\.0\.", f"blk.{layer}.", t.name), t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in other:
        w.write_tensor_data(np.array(t.data))
    t0 = time.time()
    with multiprocessing.get_context("fork").Pool(min(a.jobs, a.layers), _open_source, (a.src,)) as pool:
        # At most two layers a process in flight: generation outruns the disk, and memory should
        # hold a few layers, not the file.
        pending: collections.deque = collections.deque()
        queued = 0
        for layer in range(a.layers):
            while queued < a.layers and len(pending) < 2 * a.jobs:
                pending.append(pool.apply_async(make_layer, ((queued, a.seed),)))
                queued += 1
            for x in pending.popleft().get():
                w.write_tensor_data(x)
            print(f"gguf_deepen: layer {layer + 1}/{a.layers} written ({time.time() - t0:.0f} s)", file=sys.stderr)
    w.close()
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, a.out)
    print(f"gguf_deepen: wrote {a.out} ({os.path.getsize(a.out) / 1e9:.2f} GB, {a.layers} layers)", file=sys.stderr)


if __name__ == "__main__":
    main()
