#!/usr/bin/env python3
"""Prints how close moestream comes to llama.cpp on every GGUF fixture (tests/fixtures/gguf/):
per fixture, the largest logit error over llama.cpp's top-20 at every position (teacher-forced on
llama.cpp's sequence), relative to the position's largest |logit|, the top-1 agreement, and
whether infer's greedy tokens equal llama.cpp's. The figures of docs/results.md ("GGUF").

Usage: MOESTREAM_BIN_DIR=build/bin PYTHONPATH=build/python python3 bench/gguf_oracle.py [DIR]
"""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

import moestream

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
    fixtures = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "gguf"
    infer = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", ROOT / "build" / "bin")) / "infer"
    print(f"| fixture | types (experts) | max rel. logit error | top-1 agreement | greedy tokens equal |")
    print("|---|---|---|---|---|")
    for path in sorted(p for p in fixtures.glob("*.json") if p.name != "manifest.json"):
        d = json.loads(path.read_text())
        top = d["top"] if isinstance(d["top"], list) else json.loads(d["top"])
        model = path.parent / d["files"][0]
        m = moestream.Model(model, threads=2)
        logits = m.logits(d["prompt_ids"] + d["generated_ids"])
        worst, agree = 0.0, 0
        for pos, t in enumerate(top):
            ids = [i for i, _ in t]
            ref = np.array([v for _, v in t], dtype=np.float64)
            worst = max(worst, float(np.abs(logits[pos, ids] - ref).max() / np.abs(ref).max()))
            agree += int(np.argmax(logits[pos]) == ids[0])
        r = subprocess.run([str(infer), "-m", str(model), "--prompt-ids", ",".join(map(str, d["prompt_ids"])),
                            "-n", str(len(d["generated_ids"])), "--temp", "0", "--ignore-eos", "--print-ids",
                            "-t", "2"], capture_output=True, text=True, check=True)
        ours = [int(t) for t in r.stdout.strip().splitlines()[-1].split(",")]
        same = next((i for i, (a, b) in enumerate(zip(ours, d["generated_ids"])) if a != b), None)
        greedy = "16/16" if same is None else f"first {same}/16"
        cfg = m.config
        print(f"| {path.stem} | {cfg.get('expert_quant', '?')} | {worst:.1e} | {agree}/{len(top)} | {greedy} |")


if __name__ == "__main__":
    main()
