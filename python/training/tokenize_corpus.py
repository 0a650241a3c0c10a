# Tokenises the corpus splits with the demo tokenizer into flat uint16 token files for training:
# each document's ids followed by <|endoftext|>.
"""Writes OUT/train.bin and OUT/heldout.bin (little-endian uint16) and OUT/meta.json."""
import argparse
import json
import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


def encode_file(tok, src, dst, eos_id, batch=512):
    docs = Path(src).read_text(encoding="utf-8").rstrip("\n").split("\n\n\n")
    parts = []
    for i in range(0, len(docs), batch):
        for enc in tok.encode_batch(docs[i:i + batch], add_special_tokens=False):
            parts.append(np.asarray(enc.ids + [eos_id], dtype=np.uint16))
    ids = np.concatenate(parts)
    tmp = Path(str(dst) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(ids.astype("<u2").tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dst)
    return len(docs), int(ids.size), Path(src).stat().st_size


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokenizer", default="models/demo/tokenizer.json")
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--out", default="data/tokens")
    args = ap.parse_args()
    tok = Tokenizer.from_file(args.tokenizer)
    if tok.get_vocab_size() > 65535:
        raise SystemExit(f"{args.tokenizer}: vocab {tok.get_vocab_size()} does not fit uint16")
    eos_id = tok.token_to_id("<|endoftext|>")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"tokenizer": args.tokenizer, "eos_id": eos_id, "vocab_size": tok.get_vocab_size()}
    for split in ("train", "heldout"):
        n_docs, n_tok, n_bytes = encode_file(tok, Path(args.corpus) / f"{split}.txt",
                                             out / f"{split}.bin", eos_id)
        meta[split] = {"docs": n_docs, "tokens": n_tok, "bytes": n_bytes,
                       "bytes_per_token": round(n_bytes / n_tok, 3)}
        print(f"{split}: {n_docs} docs, {n_tok} tokens, {n_bytes / n_tok:.2f} bytes/token")
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
