#!/usr/bin/env python3
"""Decode cost of structured output (response_format json_schema, runtime/grammar) against the
same server's unconstrained decoding, in interleaved rounds: each round sends one unconstrained
request (ignore_eos, max_tokens N) and one constrained request whose schema asks for about N tokens
(an array of short strings), the order flipping every round so a drifting machine load falls on
both. Reads decode tokens/s from each reply's `timings` and prints the rounds, the medians and
constrained/unconstrained. Also the first constrained request's extra latency (the vocabulary
tables and the schema's compile) against a repeat of it (cached).

  python3 bench/server/bench_constrained.py [-m models/demo] [--tokens 96] [--rounds 7] [-t 1]

Starts its own server (loopback, free port) unless --url is given. Exit status 1 when a request
fails or a constrained output does not parse."""
import argparse
import json
import pathlib
import statistics
import sys
import time

import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_server import ROOT, Server  # noqa: E402

PROMPT = [{"role": "user", "content": "List some words."}]


def schema(tokens):
    # Each item is about 4 tokens ("word", quotes and comma); the object adds a few.
    n = max(1, tokens // 4)
    return {"type": "object", "properties": {"words": {
        "type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 6}, "minItems": n, "maxItems": n}},
        "required": ["words"], "additionalProperties": False}


def request(url, tokens, seed, constrained):
    body = {"messages": PROMPT, "max_tokens": tokens * 3 if constrained else tokens, "seed": seed,
            "temperature": 1.0}
    if constrained:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "w", "schema": schema(tokens), "strict": True}}
    else:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=600)
    wall = time.perf_counter() - t0
    if r.status_code != 200:
        sys.exit(f"bench_constrained: HTTP {r.status_code}: {r.text}")
    j = r.json()
    if constrained:
        c = j["choices"][0]
        if c["finish_reason"] != "stop":
            sys.exit(f"bench_constrained: constrained output cut at max_tokens: {c['message']['content']!r}")
        json.loads(c["message"]["content"])
    return j["timings"]["decode_tokens_per_s"], j["usage"]["completion_tokens"], wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--exe", default=str(ROOT / "build" / "bin" / "moestream-server"))
    ap.add_argument("--url", help="an already running server (the first-request latency is then not cold)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("-t", "--threads", type=int, default=1)
    a = ap.parse_args()
    server = None if a.url else Server(a.exe, a.model, ["-t", str(a.threads), "--ctx", "1024"])
    url = a.url or server.url
    try:
        _, _, cold = request(url, a.tokens, 0, True)
        _, _, warm = request(url, a.tokens, 0, True)
        request(url, a.tokens, 0, False)  # warm-up of the plain path
        rows = []
        for i in range(a.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {c: request(url, a.tokens, i + 1, c) for c in order}
            rows.append((got[False], got[True]))
    finally:
        if server:
            server.stop()
    print(f"model {a.model}, {a.tokens} tokens a request, {a.rounds} interleaved rounds, -t {a.threads}\n")
    print("| round | unconstrained tok/s | constrained tok/s (tokens) | ratio |")
    print("|---|---|---|---|")
    for i, (u, c) in enumerate(rows):
        print(f"| {i + 1} | {u[0]:.1f} | {c[0]:.1f} ({c[1]}) | {c[0] / u[0]:.3f} |")
    mu = statistics.median(u[0] for u, _ in rows)
    mc = statistics.median(c[0] for _, c in rows)
    ratios = sorted(c[0] / u[0] for u, c in rows)
    print(f"\nmedian decode tok/s: unconstrained {mu:.1f}, constrained {mc:.1f}; "
          f"constrained/unconstrained {mc / mu:.3f} (per-round ratios {ratios[0]:.3f}..{ratios[-1]:.3f})")
    print(f"first constrained request {cold * 1000:.0f} ms wall, the same again {warm * 1000:.0f} ms "
          f"(vocabulary tables and schema compile: {max(0.0, cold - warm) * 1000:.0f} ms, once)")


if __name__ == "__main__":
    main()
