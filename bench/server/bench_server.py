#!/usr/bin/env python3
"""Bounded load test of moestream-server on loopback (issue 10):
  1. N concurrent clients x M requests: p50/p99 latency, tokens/s, failures (503s counted apart);
  2. warm caches: the same 4 questions for 3 rounds, decode tokens/s and expert reads per round,
     starting from expert files dropped from the page cache;
  3. a growing chat (12 short turns, or document-sized turns up to a target length such as 20k
     tokens with a raised --ctx) with KV prefix reuse vs without: prompt tokens processed and wall
     time per turn.
Prints markdown tables. Starts its own servers (loopback, free port) unless --url is given."""
import argparse
import json
import os
import pathlib
import random
import select
import signal
import statistics
import subprocess
import sys
import threading
import time

import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/, for page_cache
from page_cache import drop_file_cache  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


class StderrDrain:
    """Reads a process's stderr to its end on a daemon thread (a server that logs much would
    otherwise block on a full pipe); text() waits for the end and returns it all."""

    def __init__(self, proc):
        self._lines = []
        self._thread = threading.Thread(target=lambda: self._lines.extend(proc.stderr), daemon=True)
        self._thread.start()

    def text(self):
        self._thread.join(timeout=10)
        return "".join(self._lines)


class Server:
    """moestream-server on a free loopback port. prefix: a wrapper the server runs under (e.g.
    scripts/with_memory_cap.sh MB --), which must pass SIGTERM on and print to stderr; stop()
    returns the server's stderr."""

    def __init__(self, exe, model, extra, prefix=()):
        self.proc = subprocess.Popen([*map(str, prefix), exe, "-m", model, "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        line = self.proc.stdout.readline() if ready else ""
        if "listening on http://" not in line:
            self.proc.kill()
            sys.exit(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = "http://" + line.split("http://")[1].split()[0]
        self._err = StderrDrain(self.proc)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return self._err.text()


def metrics(url):
    out = {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def load_test(url, clients, per_client, max_tokens):
    lat, toks, statuses, lock = [], [], {}, threading.Lock()

    def client(i):
        s = requests.Session()
        for j in range(per_client):
            body = {"messages": [{"role": "user", "content": f"Client {i} asks question {j}: what is a page cache?"}],
                    "max_tokens": max_tokens, "temperature": 0.7, "seed": i * 1000 + j, "ignore_eos": True}
            t0 = time.monotonic()
            r = s.post(url + "/v1/chat/completions", data=json.dumps(body), timeout=600)
            dt = time.monotonic() - t0
            with lock:
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code == 200:
                    lat.append(dt)
                    toks.append(r.json()["usage"]["completion_tokens"])
                elif r.status_code == 503:
                    time.sleep(float(r.headers.get("Retry-After", "1")))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"clients": clients, "requests": clients * per_client, "ok": statuses.get(200, 0),
            "503": statuses.get(503, 0), "failed": sum(v for k, v in statuses.items() if k not in (200, 503)),
            "p50_s": statistics.median(lat) if lat else 0, "p99_s": pct(lat, 99) if lat else 0,
            "tokens_per_s": sum(toks) / wall, "wall_s": wall}


def drop_page_cache(model):
    for f in sorted((pathlib.Path(model) / "experts").glob("*")):
        if f.is_file():
            drop_file_cache(f)


QUESTIONS = ["What does the kernel scheduler do?", "Explain virtual memory in one paragraph.",
             "How does a file system store a file?", "Why are caches faster than disks?"]


def id_questions(model, n_tokens):
    """Four fixed token-id prompts for a model without a tokenizer (synth_model's)."""
    vocab = json.loads((pathlib.Path(model) / "model.json").read_text())["vocab_size"]
    rng = random.Random(1234)
    return [[rng.randrange(vocab) for _ in range(n_tokens)] for _ in QUESTIONS]


def warm_rounds(url, max_tokens, id_prompts=None):
    rows = []
    for rnd in range(1, 4):
        m0 = metrics(url)
        dec_tok, dec_s, first_tps = 0, 0.0, 0.0
        t0 = time.monotonic()
        for i, q in enumerate(QUESTIONS):
            if id_prompts:  # token ids to /v1/completions (OpenAI allows a list of ids as the prompt)
                path, body = "/v1/completions", {"prompt": id_prompts[i]}
            else:
                path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": q}]}
            r = requests.post(url + path, data=json.dumps(
                {**body, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}), timeout=3600).json()
            dec_tok += r["usage"]["completion_tokens"] - 1
            dec_s += r["timings"]["decode_s"]
            if not first_tps:  # the round's first request: in round 1 it meets the cold caches
                first_tps = (r["usage"]["completion_tokens"] - 1) / max(r["timings"]["decode_s"], 1e-9)
        wall = time.monotonic() - t0
        m1 = metrics(url)
        d = lambda k: m1.get(k, 0) - m0.get(k, 0)
        rows.append({"round": rnd, "decode_tok_s": dec_tok / dec_s if dec_s else 0, "first_q_tok_s": first_tps,
                     "experts_requested": d("moestream_expert_requests_total"),
                     "host_cache": d('moestream_expert_hits_total{tier="host_cache"}'),
                     "page_cache": d('moestream_expert_hits_total{tier="page_cache"}'),
                     "storage": d('moestream_expert_hits_total{tier="storage"}'),
                     "MB_read": d("moestream_expert_bytes_read_total") / 1e6,
                     "io_wait_s": d("moestream_expert_io_wait_seconds_total"), "round_wall_s": wall})
    return rows


def passages(path, words):
    """Successive slices of about `words` words of a text file: documents a user pastes into a chat."""
    text = pathlib.Path(path).read_text(errors="replace").split()
    i = 0
    while True:
        if i + words > len(text):
            i = 0
        yield " ".join(text[i:i + words])
        i += words


def chat_turn(url, msgs, max_tokens):
    t0 = time.monotonic()
    resp = requests.post(url + "/v1/chat/completions", data=json.dumps(
        {"messages": msgs, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}), timeout=3600)
    wall = time.monotonic() - t0
    if resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded":
        return None
    resp.raise_for_status()
    r = resp.json()
    u = r["usage"]
    return {"prompt": u["prompt_tokens"], "processed": u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"],
            "prefill_s": r["timings"]["prefill_s"], "wall_s": wall, "reply": r["choices"][0]["message"]["content"]}


def growing_chat(url, turns, max_tokens, passage=None, target_tokens=0):
    """Grows one conversation turn by turn; returns per-turn rows and the messages of each turn."""
    msgs, rows, prompts = [], [], []
    for t in range(turns):
        q = f"Turn {t + 1}: tell me more about how operating systems manage memory."
        if passage is not None:
            q = f"Turn {t + 1}: here is the next part of the document.\n\n{next(passage)}\n\nWhat does it say about memory?"
        msgs.append({"role": "user", "content": q})
        row = chat_turn(url, msgs, max_tokens)
        if row is None:
            print(f"(turn {t + 1}: the conversation no longer fits the context; the chat ends at turn {t})\n")
            break
        prompts.append(list(msgs))
        msgs.append({"role": "assistant", "content": row.pop("reply")})
        rows.append({"turn": t + 1, **row})
        if target_tokens and row["prompt"] >= target_tokens:
            break
    return rows, prompts


def table(rows, fmt):
    keys = list(rows[0].keys())
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(r[k] if isinstance(r[k], str) else fmt.get(k, "{}").format(r[k]) for k in keys) + " |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=str(ROOT / "build" / "bin" / "moestream-server"))
    ap.add_argument("--model", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--server-args", default="", help="extra moestream-server options, e.g. '-t 2 --io pread'")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=5, help="requests per client")
    ap.add_argument("--queue-size", type=int, default=2, help="small enough to show 503s under load")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--turns", type=int, default=12, help="growing chat: most turns")
    ap.add_argument("--chat-passage-words", type=int, default=0,
                    help="growing chat: each user turn pastes this many words of --chat-passage-file (0: a short question)")
    ap.add_argument("--chat-passage-file", default=str(ROOT / "models" / "demo" / "heldout.txt"))
    ap.add_argument("--chat-target-tokens", type=int, default=0,
                    help="growing chat: stop after the turn whose prompt reaches this many tokens (0: --turns)")
    ap.add_argument("--no-reuse-every", type=int, default=1,
                    help="growing chat: run the no-reuse server on turn 1, every Nth turn and the last")
    ap.add_argument("--all-turns", action="store_true", help="growing chat: list every reuse turn, not only sampled ones")
    ap.add_argument("--prompt-ids", type=int, default=0,
                    help="warm rounds: send 4 fixed prompts of this many random token ids to /v1/completions "
                         "(for a model without a tokenizer) instead of the chat questions")
    ap.add_argument("--no-drop-cache", action="store_true",
                    help="do not drop expert files from the page cache between server start and round 1")
    ap.add_argument("--sections", default="load,warm,chat",
                    help="comma-separated subset of load,warm,chat to run (e.g. 'warm' with a small host cache)")
    a = ap.parse_args()
    extra = a.server_args.split()
    sections = set(a.sections.split(","))
    if not sections <= {"load", "warm", "chat"}:
        sys.exit(f"--sections: unknown section in {a.sections!r} (known: load, warm, chat)")

    print(f"## moestream-server load test ({a.model}, server args: '{a.server_args}')\n")
    if "load" in sections:
        load_section(a, extra)
    if "warm" in sections:
        warm_section(a, extra)
    if "chat" in sections:
        chat_section(a, extra)


def load_section(a, extra):
    s = Server(a.exe, a.model, extra + ["--queue-size", str(a.queue_size)])
    try:
        print(f"### {a.clients} clients x {a.requests} requests, max_tokens {a.max_tokens}, queue {a.queue_size}\n")
        table([load_test(s.url, a.clients, a.requests, a.max_tokens)],
              {"p50_s": "{:.3f}", "p99_s": "{:.3f}", "tokens_per_s": "{:.1f}", "wall_s": "{:.2f}"})
    finally:
        s.stop()


def warm_section(a, extra):
    s = Server(a.exe, a.model, extra)
    try:
        # Dropped after the server started (and loaded the dense weights), so round 1 meets cold
        # expert files whatever the server read while starting.
        if not a.no_drop_cache:
            drop_page_cache(a.model)
        print(f"### Warm caches: 4 questions x 3 rounds, max_tokens {a.max_tokens}"
              f"{f', prompts of {a.prompt_ids} token ids' if a.prompt_ids else ''}"
              f"{'' if a.no_drop_cache else ', expert files dropped from the page cache first'}\n")
        ids = id_questions(a.model, a.prompt_ids) if a.prompt_ids else None
        table(warm_rounds(s.url, a.max_tokens, ids), {"decode_tok_s": "{:.1f}", "first_q_tok_s": "{:.1f}", "experts_requested": "{:.0f}",
                                                  "host_cache": "{:.0f}", "page_cache": "{:.0f}",
                                                  "storage": "{:.0f}", "MB_read": "{:.1f}", "io_wait_s": "{:.2f}",
                                                  "round_wall_s": "{:.1f}"})
    finally:
        s.stop()


def chat_section(a, extra):
    # The reuse server grows the conversation; the no-reuse server is sent the same messages (the
    # reuse run's replies included) at every --no-reuse-every-th turn, so both process the same
    # prompts and the no-reuse cost of a long chat can be sampled without replaying all of it.
    passage = passages(a.chat_passage_file, a.chat_passage_words) if a.chat_passage_words else None
    s = Server(a.exe, a.model, extra)
    try:
        reuse, prompts = growing_chat(s.url, a.turns, a.max_tokens, passage, a.chat_target_tokens)
    finally:
        s.stop()
    n = len(reuse)
    sampled = sorted({t for t in range(1, n + 1) if t == 1 or t == n or t % a.no_reuse_every == 0})
    s = Server(a.exe, a.model, extra + ["--no-prefix-reuse"])
    try:
        none = {t: chat_turn(s.url, prompts[t - 1], a.max_tokens) for t in sampled}
    finally:
        s.stop()
    what = f"{a.chat_passage_words}-word document parts per user turn" if passage else "short user turns"
    print(f"### {n}-turn growing chat ({what}), max_tokens {a.max_tokens}: prefix reuse vs none"
          f"{'' if a.no_reuse_every == 1 else f' (none: every {a.no_reuse_every}th turn, same messages)'}\n")
    rows = []
    for r in reuse:
        nr = none.get(r["turn"])
        if nr is None and not a.all_turns:
            continue
        rows.append({"turn": r["turn"], "prompt_tokens": r["prompt"], "processed_reuse": r["processed"],
                     "processed_no_reuse": nr["processed"] if nr else "", "prefill_s_reuse": r["prefill_s"],
                     "prefill_s_no_reuse": nr["prefill_s"] if nr else "", "wall_s_reuse": r["wall_s"],
                     "wall_s_no_reuse": nr["wall_s"] if nr else ""})
    # Totals over the turns both ran; the reuse run's totals over all its turns follow.
    both = [r for r in reuse if r["turn"] in none]
    rows.append({"turn": f"sum of the {len(both)} turns above" if a.no_reuse_every > 1 else "total",
                 "prompt_tokens": sum(r["prompt"] for r in both),
                 "processed_reuse": sum(r["processed"] for r in both),
                 "processed_no_reuse": sum(none[r["turn"]]["processed"] for r in both),
                 "prefill_s_reuse": sum(r["prefill_s"] for r in both),
                 "prefill_s_no_reuse": sum(none[r["turn"]]["prefill_s"] for r in both),
                 "wall_s_reuse": sum(r["wall_s"] for r in both),
                 "wall_s_no_reuse": sum(none[r["turn"]]["wall_s"] for r in both)})
    fmt = {k: "{:.3f}" for k in ("prefill_s_reuse", "prefill_s_no_reuse", "wall_s_reuse", "wall_s_no_reuse")}
    table(rows, {k: v for k, v in fmt.items()})
    print(f"Reuse run, all {n} turns: {sum(r['processed'] for r in reuse)} prompt tokens processed of "
          f"{sum(r['prompt'] for r in reuse)}, prefill {sum(r['prefill_s'] for r in reuse):.1f} s, "
          f"wall {sum(r['wall_s'] for r in reuse):.1f} s; last prompt {reuse[-1]['prompt']} tokens.\n")


if __name__ == "__main__":
    main()
