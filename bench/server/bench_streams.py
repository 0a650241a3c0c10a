#!/usr/bin/env python3
"""Concurrent streams against moestream-server --parallel N (issue 22, item 5): for N in 1, 2, 4,
8, 16 streams (the server started with --parallel N), aggregate decode tokens/s, p50/p99
inter-token latency and expert bytes read per generated token, as medians over interleaved
rounds, with the ratios against one stream.

Each cell starts its own server (loopback, free port), sends a warm-up round (N streams of
--warmup-tokens, so the host cache holds what steady decoding keeps), then the measured round:
N streaming /v1/completions requests sent at once, greedy, ignore_eos, --max-tokens each, every
stream its own prompt (text for a model with a tokenizer, --prompt-ids random token ids without).

  aggregate tok/s   sum over streams of (tokens - 1) / (last stream's end - first first-token)
  ITL               gaps between a stream's successive token-carrying events, over all streams
                    (an event carrying m tokens adds one gap and m - 1 zeros: what a client sees)
  bytes/token       moestream_expert_bytes_read_total delta over the round / tokens generated
                    (the engine's own counter; prefill reads included: keep prompts short)
  batch             mean sequences per batch step (moestream_batch_sequences_total / steps) and
                    the largest moestream_sequences_running seen while the round ran
  phases            moestream_forward_seconds_total{phase} deltas: where the time goes

Optionally the same streams against llama-server --parallel N on a GGUF of the same model
(--llama-server, --llama-model): aggregate tok/s and ITL (it has no expert counters).

--memory-cap-mb MB runs every server, of both engines, in a cgroup capped at MB (page cache
included; scripts/with_memory_cap.sh), each cell from the model's files dropped from the page
cache: a model larger than the cap is streamed by whichever engine can, and peak_mb is the
cgroup's peak.

--replay-routing LOG|DIR (issue 22): the server replays a routing log (infer --collect-routing;
a directory of them) per request, so a synthetic model of a real shape carries a trained model's
routing: stream i of the measured round replays log request i, of the warm-up round log request
N + i (the log needs 2 x the most streams requests; e.g. infer --perplexity --ctx 128 --stride 128
writes one request per window).

  python3 bench/server/bench_streams.py --model models/demo --max-tokens 16 --rounds 3
  python3 bench/server/bench_streams.py --model /var/tmp/olmoe-l2 --prompt-ids 4 \\
      --server-args "-t 2 --io-direct --host-cache-mb 128" --max-tokens 8 --rounds 2
  python3 bench/server/bench_streams.py --model /var/tmp/qwen3-l2 --prompt-ids 4 \\
      --replay-routing /var/tmp/demo_req128.bin --server-args "-t 2 --io-direct" --max-tokens 8
"""
import argparse
import json
import pathlib
import random
import statistics
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHASES = ("attention", "router", "expert_io", "expert_compute", "other")
TEXT_PROMPTS = ["The kernel keeps a table of pages", "Once upon a time a river", "In the morning the scheduler",
                "A file system stores", "The cache line was", "Memory is divided into", "The disk spun up and",
                "Every process has its own", "The old lighthouse keeper", "When the network went down",
                "The compiler turned the loop", "She opened the door to the", "Far away in the mountains",
                "The library closed at", "Two trains left the station", "The recipe calls for"]


# ---- pure parts (tests/python/test_bench_streams.py) ----

def parse_prometheus(text):
    """Prometheus text exposition -> {name{labels}: float}; comments and blank lines skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if not key:
            raise ValueError(f"metrics line without a value: {line!r}")
        out[key] = float(value)
    return out


def sse_payloads(lines):
    """(arrival_s, line) of an SSE body -> [(arrival_s, json)] of its data events, [DONE] and
    comments left out."""
    out = []
    for t, line in lines:
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            continue
        out.append((t, json.loads(data)))
    return out


def event_tokens(ev):
    """Tokens an SSE completion chunk carries: its token_ids when given (moestream without a
    tokenizer), else 1 when it carries text, else 0. Errors raise."""
    if "error" in ev:
        raise RuntimeError(f"stream failed: {ev['error']}")
    n = 0
    for c in ev.get("choices") or []:
        if "token_ids" in c:
            n += len(c["token_ids"])
        elif c.get("text") or (c.get("delta") or {}).get("content"):
            n += 1
    return n


def stream_stats(t_sent, events):
    """One stream's [(arrival_s, json)] -> its token count (the usage when given), time of its
    first and last token, inter-token gaps (s) and server timings."""
    gaps, first, last, counted, usage, timings = [], None, None, 0, None, {}
    for t, ev in events:
        if ev.get("usage"):
            usage = ev["usage"]
            timings = ev.get("timings") or {}
        n = event_tokens(ev)
        if n == 0:
            continue
        if first is None:
            first = t
        else:
            gaps.append(t - last)
        gaps.extend([0.0] * (n - 1))
        last = t
        counted += n
    tokens = usage["completion_tokens"] if usage else counted
    return {"tokens": tokens, "sent": t_sent, "first": first, "last": last, "gaps": gaps, "timings": timings}


def pct(xs, p):
    """The p-th percentile by the nearest rank (no interpolation); 0 for no data."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


def aggregate(streams, m0, m1, max_running):
    """A round's row from its streams (stream_stats) and the /metrics before and after."""
    ok = [s for s in streams if s["first"] is not None]
    if len(ok) != len(streams):
        raise RuntimeError(f"{len(streams) - len(ok)} of {len(streams)} streams produced no token")
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)  # noqa: E731
    tokens = sum(s["tokens"] for s in ok)
    window = max(s["last"] for s in ok) - min(s["first"] for s in ok)
    gaps = [g for s in ok for g in s["gaps"]]
    steps = d("moestream_batch_steps_total")
    row = {"streams": len(ok), "tokens": tokens,
           "agg_tok_s": sum(s["tokens"] - 1 for s in ok) / window if window > 0 else 0.0,
           "itl_p50_ms": 1e3 * pct(gaps, 50), "itl_p99_ms": 1e3 * pct(gaps, 99),
           "ttft_p50_s": statistics.median(s["first"] - s["sent"] for s in ok),
           "bytes_per_token": d("moestream_expert_bytes_read_total") / tokens if tokens else 0.0,
           "io_wait_s": d("moestream_expert_io_wait_seconds_total"),
           "mean_batch": d("moestream_batch_sequences_total") / steps if steps else (1.0 if m1 else 0.0),
           "max_running": max_running, "wall_s": max(s["last"] for s in ok) - min(s["sent"] for s in ok)}
    for ph in PHASES:
        row[f"{ph}_s"] = d(f'moestream_forward_seconds_total{{phase="{ph}"}}')
    return row


def medians(rows):
    """Rows of one cell over rounds -> one row of medians (numbers only)."""
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def with_ratios(cells):
    """{streams: median row} -> rows in stream order with agg_x and bytes_x against 1 stream."""
    base = cells.get(1)
    out = []
    for n in sorted(cells):
        r = dict(cells[n])
        r["agg_x"] = r["agg_tok_s"] / base["agg_tok_s"] if base and base["agg_tok_s"] else 0.0
        r["bytes_x"] = r["bytes_per_token"] / base["bytes_per_token"] if base and base["bytes_per_token"] else 0.0
        out.append(r)
    return out


def round_order(streams, rnd):
    """Interleaving: odd rounds run the stream counts up, even rounds down (load drifts)."""
    return list(streams) if rnd % 2 == 1 else list(reversed(streams))


# ---- the run ----

def prompts_for(model, n, prompt_ids, seed):
    if prompt_ids:
        vocab = json.loads((pathlib.Path(model) / "model.json").read_text())["vocab_size"]
        rng = random.Random(seed)
        return [[rng.randrange(vocab) for _ in range(prompt_ids)] for _ in range(n)]
    return [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] + ("" if i < len(TEXT_PROMPTS) else f" ({i})") for i in range(n)]


def greedy_body(prompt, max_tokens):
    """A greedy streaming /v1/completions body that ignores EOS and reports its usage."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def post_stream(url, body, label):
    """POSTs a streaming completion: (time sent, [(arrival_s, json)] of its data events)."""
    import requests
    t0 = time.monotonic()
    lines = []
    with requests.post(url + "/v1/completions", data=json.dumps(body), stream=True, timeout=3600,
                       headers={"Content-Type": "application/json"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{label}: HTTP {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            lines.append((time.monotonic(), line))
    return t0, sse_payloads(lines)


def one_stream(url, prompt, max_tokens, out, i, start, llama, replay=None):
    body = greedy_body(prompt, max_tokens)
    if llama:
        body["n_predict"] = max_tokens
    if replay is not None:
        body["replay_request"] = replay
    start.wait()
    out[i] = stream_stats(*post_stream(url, body, f"stream {i}"))


def metrics(url):
    import requests
    return parse_prometheus(requests.get(url + "/metrics", timeout=30).text)


def run_round(url, prompts, max_tokens, llama=False, replay_base=None):
    """All prompts streamed at once (stream i replaying log request replay_base + i when given);
    returns (stream_stats list, metrics before, after, max running)."""
    m0 = {} if llama else metrics(url)
    out, errors, start = [None] * len(prompts), [], threading.Event()
    done, max_running = threading.Event(), [0]

    def guarded(i):
        try:
            one_stream(url, prompts[i], max_tokens, out, i, start, llama,
                       None if replay_base is None else replay_base + i)
        except Exception as e:  # noqa: BLE001 (reported after the join)
            errors.append(e)

    def poll():  # the running-batch gauge while the round runs
        while not done.wait(0.05):
            try:
                max_running[0] = max(max_running[0], int(metrics(url).get("moestream_sequences_running", 0)))
            except Exception:  # noqa: BLE001 (a busy server: the next poll)
                pass

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(len(prompts))]
    poller = threading.Thread(target=poll) if not llama else None
    for t in threads:
        t.start()
    if poller:
        poller.start()
    start.set()
    for t in threads:
        t.join()
    done.set()
    if poller:
        poller.join()
    if errors:
        raise errors[0]
    return out, m0, ({} if llama else metrics(url)), max_running[0]


class LlamaServer:
    """llama-server --parallel N on a GGUF (optional column): same streams, no expert counters."""

    def __init__(self, exe, model, parallel, ctx, extra, prefix=()):
        import subprocess
        import socket
        import requests
        from bench_server import StderrDrain
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([*map(str, prefix), exe, "-m", model, "--host", "127.0.0.1", "--port", str(port),
                                      "--parallel", str(parallel), "-c", str(ctx * parallel), "--no-webui",
                                      *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._err = StderrDrain(self.proc)  # llama-server logs every request
        for _ in range(1200):
            if self.proc.poll() is not None:
                sys.exit(f"llama-server exited: {self._err.text()[-2000:]}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.proc.kill()
        sys.exit("llama-server did not become ready in 600 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        return self._err.text()


CAP_SCRIPT = ROOT / "scripts" / "with_memory_cap.sh"


def model_files(path):
    p = pathlib.Path(path)
    return sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]


def cap_peak_mb(stderr):
    """The peak memory scripts/with_memory_cap.sh printed on exit (MiB), or None."""
    import re
    m = re.findall(r"^with_memory_cap: .* peak (\d+) MiB, oom_kill (\d+)", stderr, re.M)
    if not m:
        return None
    if int(m[-1][1]):
        sys.exit(f"bench_streams: the server was OOM-killed under the memory cap: {stderr[-1500:]}")
    return float(m[-1][0])


def cell(a, n, rnd, llama=False, server_args=None):
    from bench_server import Server
    from page_cache import drop_file_cache
    prompts = prompts_for(a.model, n, a.prompt_ids, seed=1000 * rnd + n)
    prefix = ()
    if a.memory_cap_mb:
        # Pages cached by an earlier cell stay charged to its (removed) cgroup and would be free
        # hits here: every cell starts from the model's files out of the page cache.
        for f in model_files(a.llama_model if llama else a.model):
            drop_file_cache(f)
        prefix = ("bash", CAP_SCRIPT, a.memory_cap_mb, "--")
    if llama:
        s = LlamaServer(a.llama_server, a.llama_model, n, a.ctx, a.llama_args.split(), prefix)
    else:
        replay = ["--replay-routing", a.replay_routing] if a.replay_routing else []
        args = (a.server_args if server_args is None else server_args).split()
        s = Server(a.exe, a.model, args + replay + ["--parallel", str(n), "--queue-size", str(n),
                                                                     "--ctx", str(a.ctx)], prefix)
    replaying = a.replay_routing and not llama
    err = ""
    try:
        if a.warmup_tokens:
            run_round(s.url, prompts_for(a.model, n, a.prompt_ids, seed=-1000 * rnd - n), a.warmup_tokens, llama,
                      n if replaying else None)
        streams, m0, m1, running = run_round(s.url, prompts, a.max_tokens, llama, 0 if replaying else None)
    finally:
        err = s.stop()
    row = aggregate(streams, m0, m1, running)
    if a.memory_cap_mb:
        row["peak_mb"] = cap_peak_mb(err) or 0.0
    return row


COLS = [("streams", "{:.0f}"), ("agg_tok_s", "{:.2f}"), ("agg_x", "{:.2f}"), ("itl_p50_ms", "{:.0f}"),
        ("itl_p99_ms", "{:.0f}"), ("ttft_p50_s", "{:.2f}"), ("bytes_per_token", "{:.3g}"), ("bytes_x", "{:.2f}"),
        ("io_wait_s", "{:.2f}"), ("mean_batch", "{:.2f}"), ("max_running", "{:.0f}"), ("wall_s", "{:.1f}")]


# Columns only moestream's counters give (llama-server has none).
MOESTREAM_ONLY = {"bytes_per_token", "bytes_x", "io_wait_s", "mean_batch", "max_running"}


def per_round_ratio(rows, base_rows, key="agg_tok_s"):
    """Median over the rounds both have of rows[i][key] / base_rows[i][key]; None without one."""
    r = [x[key] / b[key] for x, b in zip(rows, base_rows) if b.get(key)]
    return statistics.median(r) if r else None


def parse_variants(text):
    """'NAME=ARGS;NAME=ARGS' -> {NAME: ARGS}, in order; names unique, not llama-server."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, eq, args = part.partition("=")
        name = name.strip()
        if not eq or not name or name == "llama-server" or name in out:
            raise SystemExit(f"--variants: '{part}' is not NAME=ARGS with a new NAME (llama-server is taken)")
        out[name] = args.strip()
    if not out:
        raise SystemExit("--variants: no NAME=ARGS given")
    return out


def print_table(rows, extra_cols=(), moestream=True):
    cols = [c for c in COLS if moestream or c[0] not in MOESTREAM_ONLY]
    cols += [(c, "{:.0f}" if c == "peak_mb" else "{:.2f}") for c in extra_cols]
    print("| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f.format(r.get(c, 0.0)) for c, f in cols) + " |")
    print()


def main():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench_server (Server)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/page_cache
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=str(ROOT / "build" / "bin" / "moestream-server"))
    ap.add_argument("--model", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--server-args", default="", help="extra moestream-server options, e.g. '-t 2 --io-direct'")
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median of each cell is kept")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per stream in the measured round")
    ap.add_argument("--warmup-tokens", type=int, default=4, help="tokens per stream of the warm-up round (0: none)")
    ap.add_argument("--prompt-ids", type=int, default=0,
                    help="prompts of this many random token ids (a model without a tokenizer); 0: text prompts")
    ap.add_argument("--ctx", type=int, default=256, help="context per sequence")
    ap.add_argument("--llama-server", default="", help="llama-server binary: adds its --parallel N column")
    ap.add_argument("--llama-model", default="", help="GGUF of the same model for llama-server")
    ap.add_argument("--llama-args", default="", help="extra llama-server options, e.g. '-t 2 --no-mmap'")
    ap.add_argument("--replay-routing", default="",
                    help="routing log or directory the server replays per request (stream i: log request i)")
    ap.add_argument("--memory-cap-mb", type=int, default=0,
                    help="run every server (both engines) under a cgroup memory limit of this many MiB, page "
                         "cache included (scripts/with_memory_cap.sh; root), each cell with the model's files "
                         "dropped from the page cache first; adds the peak_mb column")
    ap.add_argument("--variants", default="",
                    help="several moestream-server configurations, interleaved like the engines: "
                         "'NAME=ARGS;NAME=ARGS' (replaces --server-args), e.g. "
                         "'direct=-t 2 --io-direct --host-cache-mb 400;page-cache=-t 2 --no-auto-direct'")
    ap.add_argument("--json", help="write every round's rows and the medians here")
    a = ap.parse_args()
    if a.memory_cap_mb:
        import subprocess
        check = subprocess.run(["bash", str(CAP_SCRIPT), "--check"], capture_output=True, text=True)
        if check.returncode != 0:
            sys.exit(f"--memory-cap-mb: no memory cap on this machine: {check.stdout.strip()}")
    streams = [int(x) for x in a.streams.split(",")]
    if any(n < 1 or n > 64 for n in streams):
        sys.exit("--streams: each count must be in [1, 64]")
    if a.llama_server and not a.llama_model:
        sys.exit("--llama-server needs --llama-model (a GGUF of the same model)")

    variants = parse_variants(a.variants) if a.variants else {"moestream": a.server_args}
    engines = tuple(variants) + (("llama-server",) if a.llama_server else ())
    per = {(e, n): [] for e in engines for n in streams}
    for rnd in range(1, a.rounds + 1):
        for n in round_order(streams, rnd):
            for engine in engines:
                row = cell(a, n, rnd, llama=engine == "llama-server", server_args=variants.get(engine))
                per[(engine, n)].append(row)
                print(f"bench_streams: round {rnd} {engine} {n} streams: " + json.dumps(row), file=sys.stderr, flush=True)
        report(a, per, engines, streams, rnd, variants)  # after every round: a cut-short run keeps its tables


def report(a, per, engines, streams, rounds_done, variants):
    replay = f"; replaying {a.replay_routing}" if a.replay_routing else ""
    replay += f"; memory cap {a.memory_cap_mb} MiB, page cache included" if a.memory_cap_mb else ""
    args = f"server args '{a.server_args}'" if not a.variants else f"{len(variants)} configurations"
    print(f"## moestream-server, concurrent streams ({a.model}; {args}{replay}; "
          f"{a.max_tokens} tokens per stream, warm-up {a.warmup_tokens}; medians of {rounds_done} interleaved "
          f"round{'s' if rounds_done > 1 else ''})\n")
    result = {}
    for engine in engines:
        rows = with_ratios({n: medians(per[(engine, n)]) for n in streams})
        result[engine] = rows
        print(f"### {engine}" + (f" (server args '{variants[engine]}')" if engine in variants else "") + "\n")
        ours = engine != "llama-server"
        extra = [f"{ph}_s" for ph in PHASES] if ours else []
        print_table(rows, extra + (["peak_mb"] if a.memory_cap_mb else []), moestream=ours)
    if len(engines) > 1:  # each engine against the first, round by round (the rounds interleave them)
        base = engines[0]
        print(f"### aggregate tok/s against {base} (median of the per-round ratios)\n")
        print("| streams | " + " | ".join(engines[1:]) + " |")
        print("|---|" + "---|" * (len(engines) - 1))
        for n in streams:
            cells = [per_round_ratio(per[(e, n)], per[(base, n)]) for e in engines[1:]]
            print(f"| {n} | " + " | ".join("-" if c is None else f"{c:.2f}x" for c in cells) + " |")
        print()
    sys.stdout.flush()
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"args": vars(a), "rounds_done": rounds_done, "medians": result,
                                                    "rounds": {f"{e}/{n}": v for (e, n), v in per.items()}},
                                                   indent=1))


if __name__ == "__main__":
    main()
