#!/usr/bin/env python3
"""Cache-aware routing on the batch union (issue 22 item 3): moestream-server --parallel N with N
concurrent greedy streams of held-out prompts, for each tolerance with plain --cache-aware and with
--cache-aware-union, configurations interleaved across rounds (forward, then reversed), medians.

Per configuration and round: a fresh server (base --server-args + --parallel N + --cache-aware
--cache-tolerance X [--cache-aware-union]), a warm-up round (other held-out prompts), then the
measured round. Columns as bench_streams.py (aggregate tok/s, expert bytes per generated token from
the engine's counter), plus the routing's cost:

  slots agreement   moestream_cache_aware_* deltas: share of (token, layer, slot) choices left as
                    exact top-k chose them, and substitutions per generated token
  token agreement   each stream's greedy output against the same prompt run alone (one request at a
                    time, tolerance 0: the exact routing) on a server of the same base args:
                    share of positions whose token event is the same, and how many streams match
                    whole; a stream's events are its tokens when the counts agree (checked:
                    events_per_token is reported, 1.0 when every event carried one token)

The reference runs alone once (greedy, exact routing: deterministic) and gives the one-stream row
(aggregate tok/s and bytes/token of one request at a time).

  python3 bench/server/bench_union.py --model data/wide128 --server-args "-t 2 --io-direct" \\
      --prompts models/demo/heldout.txt --tolerances 0,0.1,0.3,0.5 --max-tokens 48 --rounds 3
"""
import argparse
import json
import pathlib
import statistics
import sys
import threading

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_streams as bs  # noqa: E402  (the stream and metrics helpers)

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---- pure parts (tests/python/test_bench_union.py) ----

def heldout_prompts(text, n, chars, skip=0):
    """n prompts of at most `chars` characters (cut at a word) from the paragraphs of `text` that
    are at least `chars` long, evenly spaced over them, after skipping the first `skip` of the
    spacing (so a warm-up set differs from the measured one)."""
    paras = [p.strip().replace("\n", " ") for p in text.split("\n\n")]
    paras = [p for p in paras if len(p) >= chars]
    if len(paras) < 2 * n:
        raise ValueError(f"need {2 * n} paragraphs of at least {chars} characters, found {len(paras)}")
    step = len(paras) // (2 * n)
    out = []
    for i in range(n):
        p = paras[(2 * i + skip) * step][:chars]
        out.append(p.rsplit(" ", 1)[0] if " " in p else p)
    return out


def event_pieces(events):
    """A stream's [(arrival, json)] -> the text piece of every token-carrying event, in order."""
    out = []
    for _, ev in events:
        if bs.event_tokens(ev) == 0:
            continue
        for c in ev.get("choices") or []:
            if "token_ids" in c:
                out.extend(str(t) for t in c["token_ids"])
            else:
                out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return out


def token_agreement(runs, refs):
    """Per-position agreement of each stream's pieces with its reference: (share of reference
    positions equal, streams equal whole)."""
    same = total = whole = 0
    for got, ref in zip(runs, refs):
        total += len(ref)
        same += sum(1 for a, b in zip(got, ref) if a == b)
        whole += got == ref
    return (same / total if total else 1.0), whole


def config_order(configs, rnd):
    """Interleaving: odd rounds forward, even rounds reversed (load drifts)."""
    return list(configs) if rnd % 2 == 1 else list(reversed(configs))


# ---- the run ----

def stream(url, prompt, max_tokens, out, i, start):
    start.wait()
    t0, events = bs.post_stream(url, bs.greedy_body(prompt, max_tokens), f"stream {i}")
    out[i] = (bs.stream_stats(t0, events), event_pieces(events))


def run_round(url, prompts, max_tokens, together=True):
    """The prompts streamed at once (together) or one after the other; (stats, pieces, m0, m1)."""
    m0 = bs.metrics(url)
    out, errors = [None] * len(prompts), []

    def guarded(i, start):
        try:
            stream(url, prompts[i], max_tokens, out, i, start)
        except Exception as e:  # noqa: BLE001 (reported after the join)
            errors.append(e)

    if together:
        start = threading.Event()
        threads = [threading.Thread(target=guarded, args=(i, start)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        start.set()
        for t in threads:
            t.join()
    else:
        go = threading.Event()
        go.set()
        for i in range(len(prompts)):
            guarded(i, go)
    if errors:
        raise errors[0]
    return [o[0] for o in out], [o[1] for o in out], m0, bs.metrics(url)


def cache_aware_row(m0, m1, tokens):
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)  # noqa: E731
    slots = d("moestream_cache_aware_slots_total")
    return {"slot_agreement": d("moestream_cache_aware_slots_unchanged_total") / slots if slots else 1.0,
            "subs_per_token": d("moestream_cache_aware_substitutions_total") / tokens if tokens else 0.0,
            "misses_per_token": d("moestream_cache_aware_misses_after_total") / tokens if tokens else 0.0}


def loadavg():
    return float(pathlib.Path("/proc/loadavg").read_text().split()[0])


def serve(a, tol, union, parallel):
    from bench_server import Server
    extra = ["--cache-aware", "--cache-tolerance", str(tol)] + (["--cache-aware-union"] if union else [])
    return Server(a.exe, a.model, a.server_args.split() + extra +
                  ["--parallel", str(parallel), "--queue-size", str(parallel), "--ctx", str(a.ctx)])


def measure(a, tol, union, prompts, warm, together=True):
    s = serve(a, tol, union, a.parallel)
    try:
        if a.warmup_tokens:
            run_round(s.url, warm, a.warmup_tokens, together)
        l0 = loadavg()
        stats, pieces, m0, m1 = run_round(s.url, prompts, a.max_tokens, together)
        l1 = loadavg()
    finally:
        s.stop()
    if together:
        row = bs.aggregate(stats, m0, m1, 0)
    else:  # one at a time: the one-stream rate is each request's own, medianed
        row = bs.aggregate(stats, m0, m1, 0)
        row["agg_tok_s"] = statistics.median((s["tokens"] - 1) / (s["last"] - s["first"]) for s in stats)
    row.update(cache_aware_row(m0, m1, row["tokens"]))
    row["events_per_token"] = sum(len(p) for p in pieces) / row["tokens"] if row["tokens"] else 0.0
    row["load"] = (l0 + l1) / 2
    return row, pieces


COLS = [("agg_tok_s", "{:.2f}"), ("agg_x", "{:.2f}"), ("bytes_per_token", "{:.0f}"), ("bytes_x", "{:.2f}"),
        ("misses_per_token", "{:.1f}"), ("subs_per_token", "{:.1f}"), ("slot_agreement", "{:.3f}"),
        ("token_agreement", "{:.3f}"), ("streams_whole", "{:.0f}"), ("itl_p50_ms", "{:.0f}"),
        ("mean_batch", "{:.2f}"), ("events_per_token", "{:.2f}"), ("load", "{:.1f}")]


def report(a, ref, per, rounds_done):
    print(f"## cache-aware routing on the batch union ({a.model}; server args '{a.server_args}'; "
          f"--parallel {a.parallel}, {len(ref['pieces'])} streams of {a.max_tokens} tokens; medians of "
          f"{rounds_done} interleaved round{'s' if rounds_done > 1 else ''})\n")
    print("| config | " + " | ".join(c for c, _ in COLS) + " |")
    print("|---|" + "---|" * len(COLS))
    base = ref["row"]
    rows = {"alone, tol 0": base}
    for key, rs in per.items():
        if rs:
            rows[key] = bs.medians(rs)
    for key, r in rows.items():
        r = dict(r)
        r["agg_x"] = r["agg_tok_s"] / base["agg_tok_s"] if base["agg_tok_s"] else 0.0
        r["bytes_x"] = r["bytes_per_token"] / base["bytes_per_token"] if base["bytes_per_token"] else 0.0
        print(f"| {key} | " + " | ".join(f.format(r.get(c, 0.0)) for c, f in COLS) + " |")
    print()
    sys.stdout.flush()
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"args": vars(a), "rounds_done": rounds_done, "alone": ref,
                                                    "rounds": per}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=str(ROOT / "build" / "bin" / "moestream-server"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--server-args", default="-t 2 --io-direct")
    ap.add_argument("--prompts", default=str(ROOT / "models" / "demo" / "heldout.txt"),
                    help="held-out text: prompts are cut from its paragraphs")
    ap.add_argument("--prompt-chars", type=int, default=120)
    ap.add_argument("--parallel", type=int, default=8, help="server slots and concurrent streams")
    ap.add_argument("--tolerances", default="0,0.1,0.3,0.5")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--warmup-tokens", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--json", help="write the reference, every round's rows and the settings here")
    a = ap.parse_args()
    if not 1 <= a.parallel <= 64:
        sys.exit("--parallel must be in [1, 64]")
    tols = [float(x) for x in a.tolerances.split(",")]
    text = pathlib.Path(a.prompts).read_text(encoding="utf-8")
    prompts = heldout_prompts(text, a.parallel, a.prompt_chars)
    warm = heldout_prompts(text, a.parallel, a.prompt_chars, skip=1)

    row, ref_pieces = measure(a, 0.0, False, prompts, warm, together=False)
    row["token_agreement"], row["streams_whole"] = 1.0, len(ref_pieces)
    ref = {"row": row, "pieces": ref_pieces}
    print("bench_union: alone: " + json.dumps(row), file=sys.stderr, flush=True)
    configs = [(t, u) for t in tols for u in (False, True)]
    per = {f"{'union' if u else 'plain'}, tol {t:g}": [] for t, u in configs}
    for rnd in range(1, a.rounds + 1):
        for t, u in config_order(configs, rnd):
            row, pieces = measure(a, t, u, prompts, warm)
            row["token_agreement"], row["streams_whole"] = token_agreement(pieces, ref_pieces)
            per[f"{'union' if u else 'plain'}, tol {t:g}"].append(row)
            print(f"bench_union: round {rnd} {'union' if u else 'plain'} {t:g}: " + json.dumps(row),
                  file=sys.stderr, flush=True)
        report(a, ref, per, rnd)


if __name__ == "__main__":
    main()
