#!/usr/bin/env python3
"""bench/ab: two builds of infer on one model (or one build on two models), in interleaved rounds.

For each prompt length, every round runs build A and build B once each (a fresh process per run,
the order flipping every round, so a drifting machine load falls on both), reads prefill and
decode tokens/s from infer's --stats-json, and prints each cell's rounds, medians and B/A.

  python3 bench/ab.py --a /tmp/before/infer --b build/bin/infer -m MODEL [--model-b MODEL_B] \\
      [--prompt-tokens 14,64,256] [--tokens 8] [--threads 2] [--rounds 3] [-- extra infer flags]

--model-b gives B its own model (the same build twice: two encodings of one model). --ids sends
prompts of token ids instead (synth_model's models ship no tokenizer): id i is (7919 i + 11) mod
the model's vocab_size.

Prompts are the words of bench/peer.py's long prompt (one token each in Qwen3's vocabulary; the
table shows the count infer reports). Exit status 1 when a run fails.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import long_prompt  # noqa: E402


def ids_prompt(model: str, n: int) -> str:
    vocab = json.loads((Path(model) / "model.json").read_text())["vocab_size"]
    return ",".join(str((7919 * i + 11) % vocab) for i in range(n))


def run(infer: str, model: str, prompt: str, a, stats: Path) -> dict:
    stats.unlink(missing_ok=True)
    cmd = [infer, "-m", model, *(["--prompt-ids"] if a.ids else ["-p"]), prompt, "-n", str(a.tokens), "--temp", "0", "--ignore-eos",
           "-t", str(a.threads), "--stats-json", str(stats), *(["--print-ids"] if a.ids else []), *a.extra]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0 or not stats.is_file():
        sys.exit(f"bench/ab: {infer} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(stats.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="infer of the build before")
    ap.add_argument("--b", required=True, help="infer of the build after")
    ap.add_argument("-m", "--model", required=True, help="a pack folder or a GGUF file")
    ap.add_argument("--model-b", help="B's model (default: --model)")
    ap.add_argument("--ids", action="store_true", help="prompts of token ids (a model without a tokenizer)")
    ap.add_argument("--prompt-tokens", default="14,64,256", help="prompt lengths in words, comma-separated")
    ap.add_argument("--tokens", type=int, default=8, help="greedy decode tokens per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="flags for both builds, after --")
    a = ap.parse_args()
    lengths = [int(n) for n in a.prompt_tokens.split(",") if n]
    if not lengths or min(lengths) < 1 or a.rounds < 1 or a.tokens < 1:
        ap.error("--prompt-tokens, --rounds and --tokens must be positive")
    builds = {"A": a.a, "B": a.b}
    models = {"A": a.model, "B": a.model_b or a.model}
    print(f"bench/ab: A {a.a} on {models['A']}, B {a.b} on {models['B']}; {a.threads} threads, {a.tokens} decode tokens, "
          f"{a.rounds} interleaved rounds; extra flags: {' '.join(a.extra) or 'none'}")
    print("| prompt tokens | phase | A tok/s (rounds) | B tok/s (rounds) | B/A |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench_ab.") as work:
        stats = Path(work) / "stats.json"
        for n in lengths:
            prompt = ids_prompt(a.model, n) if a.ids else long_prompt(n)
            got = {k: {"prefill": [], "decode": []} for k in builds}
            prompt_tokens = None
            for rnd in range(a.rounds):
                for k in (list(builds) if rnd % 2 == 0 else list(builds)[::-1]):
                    st = run(builds[k], models[k], prompt, a, stats)
                    prompt_tokens = st["prefill"]["tokens"]
                    got[k]["prefill"].append(st["prefill"]["tokens_per_s"])
                    got[k]["decode"].append(st["decode"]["tokens_per_s"])
            for phase in ("prefill", "decode"):
                med = {k: statistics.median(got[k][phase]) for k in builds}
                cells = [f"{med[k]:.2f} ({'/'.join(f'{v:.2f}' for v in got[k][phase])})" for k in builds]
                print(f"| {prompt_tokens} | {phase} | {cells[0]} | {cells[1]} | **{med['B'] / med['A']:.3f}** |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
