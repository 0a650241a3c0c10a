# Held-out perplexity of a Hugging Face checkpoint with transformers, by the same sliding-window
# recipe as `infer --perplexity` (window 512, stride 256, text file encoded whole).
"""Usage: eval_perplexity.py HF_DIR TOKENIZER_JSON TEXT... [--out JSON] [--device cpu|cuda].
On the CPU only f32 is scored (bf16 autocast is the GPU's)."""
import argparse
import json
import os
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from train_moe import perplexity


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("hf_dir")
    ap.add_argument("tokenizer")
    ap.add_argument("texts", nargs="+")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    tok = Tokenizer.from_file(args.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).to(device)
    res = {"hf_dir": args.hf_dir, "device": device.type, "window": args.window, "stride": args.stride,
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "texts": {}}
    for path in args.texts:
        ids = tok.encode(Path(path).read_text(encoding="utf-8")).ids
        p32, n = perplexity(model, ids, args.window, args.stride, device, torch.float32)
        res["texts"][path] = {"tokens": len(ids), "scored": n, "ppl_f32": p32}
        line = f"{path}: {len(ids)} tokens, perplexity f32 {p32:.4f}"
        if device.type == "cuda":
            pbf, _ = perplexity(model, ids, args.window, args.stride, device, torch.bfloat16)
            res["texts"][path]["ppl_bf16_autocast"] = pbf
            line += f", bf16 autocast {pbf:.4f}"
        print(line)
    if args.out:
        tmp = Path(str(args.out) + ".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
