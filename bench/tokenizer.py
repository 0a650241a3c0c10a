#!/usr/bin/env python3
"""Tokenizer benchmark: encode MB/s of moestream's C++ tokenizer vs Hugging Face `tokenizers`.

Same text (the seeded mixed corpus of the conformance test, plus models/demo/heldout.txt when
present), same machine, one run each, single thread on both sides: `tokenize encode --time`
times only the encode loop in C++; `tokenizers` runs with RAYON_NUM_THREADS=1 and
TOKENIZERS_PARALLELISM=false, timed around encode calls (the faster of a per-document
`encode` loop and `encode_batch_fast`, when that exists, is reported).

usage: python3 bench/tokenizer.py [--bin build/bin] [--mb 5]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import mixed_text  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

SHARED = ROOT.parent / "shared" / "tokenizers"


def gpt2_json(out_dir):
    src = SHARED / "gpt2"
    tok = Tokenizer(models.BPE.from_file(str(src / "encoder.json"), str(src / "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path = pathlib.Path(out_dir) / "gpt2_tokenizer.json"
    tok.save(str(path))
    return path


def ours_mb_s(exe, tj, docs_path):
    res = subprocess.run([str(exe), "encode", "-t", str(tj), "-i", str(docs_path), "--split-nul",
                          "-o", "-", "--time"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         check=True, text=True)
    return json.loads(res.stderr.strip().splitlines()[-1])["mb_per_s"]


def hf_mb_s(tj, docs, n_bytes):
    tok = Tokenizer.from_file(str(tj))
    t0 = time.perf_counter()
    for d in docs:
        tok.encode(d)
    best = n_bytes / 1e6 / (time.perf_counter() - t0)
    method = "encode"
    if hasattr(tok, "encode_batch_fast"):
        tok = Tokenizer.from_file(str(tj))  # fresh cache, as for the first timing
        t0 = time.perf_counter()
        tok.encode_batch_fast(docs)
        mb = n_bytes / 1e6 / (time.perf_counter() - t0)
        if mb > best:
            best, method = mb, "encode_batch_fast"
    return best, method


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    ap.add_argument("--mb", type=float, default=5.0, help="size of the mixed corpus in MB")
    args = ap.parse_args()
    exe = pathlib.Path(args.bin) / "tokenize"
    if not exe.exists():
        sys.exit(f"{exe} not found: build the `tokenize` target first")
    with tempfile.TemporaryDirectory() as tmp:
        corpora = {"mixed": mixed_text.make_documents(int(args.mb * 1e6), seed=20261129)}
        heldout = ROOT / "models" / "demo" / "heldout.txt"
        if heldout.exists():
            corpora["demo-heldout"] = [p for p in heldout.read_text().split("\n\n") if p]
        vocabs = {}
        if SHARED.exists():
            vocabs["qwen3"] = SHARED / "qwen3" / "tokenizer.json"
            vocabs["llama2"] = SHARED / "llama2" / "tokenizer.json"
            vocabs["gpt2"] = gpt2_json(tmp)
        demo = ROOT / "models" / "demo" / "tokenizer.json"
        if demo.exists():
            vocabs["demo"] = demo
        print(f"{'vocabulary':<10} {'corpus':<13} {'MB':>6} {'moestream MB/s':>15} "
              f"{'tokenizers MB/s':>16} {'ratio':>6}  (tokenizers method)")
        for cname, docs in corpora.items():
            path = pathlib.Path(tmp) / f"{cname}.txt"
            path.write_bytes("\0".join(docs).encode())
            n_bytes = sum(len(d.encode()) for d in docs)
            for vname, tj in vocabs.items():
                ours = ours_mb_s(exe, tj, path)
                hf, method = hf_mb_s(tj, docs, n_bytes)
                print(f"{vname:<10} {cname:<13} {n_bytes / 1e6:6.2f} {ours:15.2f} {hf:16.2f} "
                      f"{ours / hf:6.2f}  ({method})", flush=True)


if __name__ == "__main__":
    main()
