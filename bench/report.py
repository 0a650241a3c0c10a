#!/usr/bin/env python3
"""bench/report: runs the benchmarks that fit this machine and writes the generated part of
docs/results.md (between the report:begin / report:end markers; the hand-written sections
outside them are kept) with tables and PNG plots under docs/figures/report_*.png.

Sections: I/O bandwidth by method (bench_io), decode tokens/s vs memory cap on a real-shape
synthetic model (bench/decode.py), expert-cache hit rate by policy vs Belady (cache_sim on a
demo decode trace), clustering read ops (bench/cluster.sh), cache-aware routing's quality/miss
trade (bench/cache_aware.py). Each figure names the machine, the date and the command.

  python3 bench/report.py --bin build/bin --work /var/tmp/moestream_report
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"


def log(msg):
    print(f"report: {msg}", file=sys.stderr, flush=True)


REUSE_DIR = None  # set by --reuse: a command whose saved stdout is there is not run again
REUSED = []  # commands whose earlier output was reused (named in the generated header)


def sh(cmd, **kw):
    text = cmd if isinstance(cmd, str) else " ".join(shlex.quote(c) for c in cmd)
    saved = None
    if REUSE_DIR:
        import hashlib
        saved = os.path.join(REUSE_DIR, "stdout_" + hashlib.sha1(text.encode()).hexdigest()[:16] + ".txt")
        if os.path.exists(saved):
            log("reusing the saved output of $ " + text)
            REUSED.append(text)
            return open(saved).read()
    log("$ " + text)
    out = subprocess.run(cmd, check=True, text=True, capture_output=True, cwd=ROOT, **kw).stdout
    if saved:
        open(saved, "w").write(out)
    return out


def machine():
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
    return f"{platform.node()} ({os.cpu_count()} CPUs, {mem / 2**20:.0f} GiB, Linux {platform.release()})"


class Report:
    def __init__(self, args):
        self.args = args
        self.md = []
        self.date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        self.machine = machine()
        os.makedirs(args.figures, exist_ok=True)

    def figure(self, fig, name, command, footer=None):
        """Saves fig with a footer naming machine, date and command; returns the markdown link."""
        fig.text(0.01, 0.005, f"{footer or self.machine + ', ' + self.date}\n$ {command}", fontsize=6, va="bottom",
                 family="monospace", wrap=True)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        path = os.path.join(self.args.figures, f"report_{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        rel = os.path.relpath(path, os.path.dirname(self.args.results))
        return f"![{name}]({rel})"

    def section(self, title, command, body):
        self.md += [f"### {title}", "", f"Command: `{command}`", ""] + body + [""]

    # ---- I/O bandwidth by method ----
    def io(self):
        a = self.args
        out = os.path.join(a.work, "bench_io.json")
        cmd = [os.path.join(a.bin, "bench_io"), "--file", os.path.join(a.work, "report_io.bin"),
               "--size-mb", str(a.io_mb), "--seconds", "0.2", "--blocks", "64K,1M", "--json", out]
        sh(cmd)
        j = json.load(open(out))
        if "expert" not in j:  # bench_io skips the pattern when the file holds fewer than top-k experts
            sys.exit(f"report: bench_io measured no expert reads: --io-mb {a.io_mb} holds fewer than "
                     f"{j['params']['top_k']} experts of {j['params']['expert_bytes']} bytes")
        cells = [c for c in j["expert"] if c["section"] == "expert"]
        engines = sorted({c["engine"] for c in cells}, key=lambda e: [c["engine"] for c in cells].index(e))
        caches = ["page_cache", "device", "device_mmap"]
        val = {(c["engine"], c["cache"]): c["gbps"] for c in cells}
        rows = ["| engine | " + " | ".join(f"{c} GB/s" for c in caches) + " |",
                "|---|" + "---|" * len(caches)]
        for e in engines:
            rows.append(f"| {e} | " + " | ".join(f"{val[(e, c)]:.2f}" if (e, c) in val else "-"
                                                  for c in caches) + " |")
        lim = [c for c in j["expert"] if c["section"] == "limit" and c["cache"] == "device"]
        fig, ax = plt.subplots(figsize=(7, 3.6))
        width = 0.38
        for i, cache in enumerate(["page_cache", "device"]):
            xs = [k + (i - 0.5) * width for k in range(len(engines))]
            ax.bar(xs, [val.get((e, "device_mmap" if cache == "device" and e.startswith("mmap") else cache), 0)
                        for e in engines], width, label=cache)
        ax.set_xticks(range(len(engines)), engines, rotation=20)
        ax.set_ylabel("GB/s")
        ax.set_title(f"Expert reads (top-{j['params']['top_k']} of {j['params']['expert_bytes']} B) by method")
        ax.legend()
        link = self.figure(fig, "io_bandwidth", " ".join(cmd))
        body = rows + [""]
        if lim:
            best = max(lim, key=lambda c: c["gbps"])
            body.append(f"Device limit for expert-sized reads (64 in flight, O_DIRECT): "
                        f"{best['gbps']:.2f} GB/s ({best['engine']}).")
        self.section("I/O bandwidth by method (bench_io)", " ".join(cmd), body + ["", link])

    # ---- decode tokens/s vs memory cap ----
    def decode(self):
        a = self.args
        out = os.path.join(a.work, "decode.json")
        cmd = [sys.executable, "bench/decode.py", "--bin", a.bin, "--work", os.path.join(a.work, "decode"),
               "--shape", a.shape, "--cap-mb", str(a.cap_mb), "--sweep-mb", a.sweep_mb,
               "--tokens", str(a.tokens), "--rounds", str(a.rounds), "--json", out]
        if a.layers:
            cmd[cmd.index("--shape"):cmd.index("--shape")] = ["--layers", str(a.layers)]
        text = sh(cmd)
        self.render_decode(json.load(open(out)), text, " ".join(cmd), "decode_vs_cap",
                           "Decode tokens/s vs memory cap (bench/decode.py, replayed routing)")

    def decode_device(self):
        """The same section from a decode.json measured elsewhere (scripts/device_decode.sh's $OUT),
        named with that machine and date."""
        a = self.args
        if not a.device_decode or not os.path.exists(a.device_decode):
            self.md += ["### Decode on the device machine", "",
                        f"Not included: no --device-decode JSON ({a.device_decode or 'none given'}).", ""]
            return
        j = json.load(open(a.device_decode))
        txt = os.path.join(os.path.dirname(a.device_decode), "decode.txt")
        text = open(txt).read() if os.path.exists(txt) else "(decode.txt not found beside the JSON)"
        m = j["machine"]
        self.render_decode(j, text, j["command"], "decode_device",
                           f"Decode on the device machine ({m['host']}, {m['cpus']} CPUs, {j['date']})",
                           footer=f"{m['host']} ({m['cpus']} CPUs, Linux {m['kernel']}), {j['date']}")

    def render_decode(self, j, text, command, name, title, footer=None):
        runs = j["runs"] + j["sweep"]
        fig, ax = plt.subplots(figsize=(7, 3.8))
        capped = j["cap"]["mode"].startswith("cgroup")
        for method, style, color in (("engine", "o-", "C0"), ("mmap", "s--", "C1"), ("pread", "^:", "C2"),
                                     ("engine_buffered", "d-.", "C3")):
            pts = sorted((r["cap_mb"], r["tokens_per_s"]) for r in runs if r["method"] == method)
            if not pts:
                continue
            if method == "engine_buffered" or (not capped and method != "engine"):
                # Uncapped runs (no cgroup here): a level, not a point at some cap.
                ax.axhline(pts[0][1], linestyle=style[1:], color=color, label=f"{method} (page cache uncapped)")
            else:
                ax.plot(*zip(*pts), style, color=color, label=method)
        lim = sorted((r["cap_mb"], r["io_limit_tokens_per_s"]) for r in runs
                     if r["method"] == "engine" and r["io_limit_tokens_per_s"])
        if lim:
            ax.plot(*zip(*lim), "k-", alpha=0.4, label="engine I/O-bound limit")
        warm = [r for r in runs if r["method"] == "warm"]
        if warm:
            ax.axhline(warm[0]["tokens_per_s"], color="g", alpha=0.5,
                       label="all experts in the page cache (buffered pread)")
        cpu = sorted((r["cap_mb"], 1 / r["cpu_s_per_token"]) for r in runs
                     if r["method"] == "engine" and r.get("cpu_s_per_token"))
        if cpu:
            ax.plot(*zip(*cpu), "k:", alpha=0.5, label="engine CPU ceiling (1 / CPU s per token)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("expert memory budget (MiB)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{j['model']['shape']} ({j['model']['layers']} layers, {j['model']['quant']}, "
                     f"{j['model']['bytes'] / 1e9:.1f} GB): tokens/s vs memory cap\n"
                     f"cap: {j['cap']['mode']}; routing replayed from the demo model", fontsize=9)
        ax.legend(fontsize=7)
        link = self.figure(fig, name, command, footer)
        # The goals, from the JSON: tokens/s against the I/O-bound limit, and the I/O path alone
        # (device bytes per second of exposed I/O wait: above the bandwidth when reads overlap
        # compute), which a CPU-bound machine does not hide.
        bw = j["device_bandwidth_bytes_per_s"]
        goal = ["| method | budget | tok/s | of I/O limit | device MB/token | I/O-bound s/token | "
                "exposed I/O wait s/token | device GB per s of wait | CPU s/token |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in runs:
            if r["method"] == "warm":
                continue
            wait = r.get("io_wait_s_per_token") or 0
            rate = r["device_bytes_per_token"] / wait / 1e9 if wait > 0 else float("nan")
            frac = r.get("fraction_of_limit")
            goal.append(f"| {r['method']} | {r['cap_mb'] if r['method'] == 'engine' or capped else 'uncapped'} | "
                        f"{r['tokens_per_s']:.2f} | {frac * 100:.0f}% | "
                        f"{r['device_bytes_per_token'] / 1e6:.1f} | {r['io_bound_s_per_token']:.3f} | "
                        f"{wait:.3f} | {rate:.2f} | {r['cpu_s_per_token']:.3f} |" if frac is not None else
                        f"| {r['method']} | - | {r['tokens_per_s']:.2f} | - | - | - | {wait:.3f} | - | "
                        f"{r['cpu_s_per_token']:.3f} |")
        summary = [f"Device bandwidth {bw / 1e9:.2f} GB/s. Goals (issue 11): engine >= 85% of its I/O "
                   f"limit, >= 3x mmap, model >= 2x the cap (here {j['cap']['model_over_cap']:.1f}x the "
                   f"expert budget; cap mode: {j['cap']['mode']})."]
        if "engine_over_mmap" in j:
            summary.append(f"engine / mmap tokens/s: {j['engine_over_mmap']:.2f}x"
                           + ("" if capped else " (mmap uncapped: no cgroup here)") + ".")
        if "engine_buffered_over_mmap" in j:
            summary.append(f"engine_buffered / mmap on the same uncapped page cache: "
                           f"{j['engine_buffered_over_mmap']:.2f}x.")
        body = ["```", text.rstrip(), "```", "", " ".join(summary), ""] + goal + ["", link]
        self.section(title, command, body)
        return j

    # ---- hit rate by policy vs Belady ----
    def hit_rates(self):
        a = self.args
        sim = os.path.join(a.bin, "cache_sim")
        if not os.path.exists(sim):
            self.md += ["### Expert-cache hit rate by policy vs Belady", "",
                        f"Not run: {sim} is not built.", ""]
            return
        trace = os.path.join(a.work, "decode_trace.bin")
        tcmd = f"bench/gpu_cache_trace.sh {os.path.dirname(a.bin)} {trace} {a.trace_prompts} {a.trace_tokens}"
        if not os.path.exists(trace):
            sh(["bash", "bench/gpu_cache_trace.sh", os.path.dirname(a.bin), trace, str(a.trace_prompts),
                str(a.trace_tokens)])
        cmd = [sim, "--routing", trace]
        text = sh(cmd)
        # The first table: capacity | % of expert bytes | LRU | LFRU | Belady | ...
        lines = [l for l in text.splitlines() if l.strip()]
        first = next((i for i, l in enumerate(lines) if l.startswith("| capacity")), 0)
        end = next((i for i in range(first + 2, len(lines)) if not lines[i].startswith("|")), len(lines))
        table = [tuple(float(x) for x in l.strip("| ").split("|")[:5]) for l in lines[first + 2:end]]
        fig, ax = plt.subplots(figsize=(7, 3.6))
        if table:
            pct = [t[1] for t in table]
            for col, name, style in ((2, "LRU", "s--"), (3, "LFRU (engine GPU policy)", "o-"), (4, "Belady (optimal)", "k-")):
                ax.plot(pct, [t[col] for t in table], style, label=name)
        ax.set_xlabel("cache capacity (% of expert bytes)")
        ax.set_ylabel("hit rate (%)")
        ax.set_title("Expert-cache hit rate by policy vs Belady, demo decode trace")
        ax.legend(fontsize=8)
        link = self.figure(fig, "hit_rate", " ".join(cmd))
        body = [f"Trace: `{tcmd}` ({a.trace_prompts} generations of {a.trace_tokens} tokens on the demo model).",
                ""] + lines[:first] + [""] + lines[first:end] + [""] + lines[end:end + 1] + ["", link]
        self.section("Expert-cache hit rate by policy vs Belady (cache_sim)", " ".join(cmd), body)

    # ---- clustering read ops ----
    def clustering(self):
        a = self.args
        work = os.path.join(a.work, "cluster")
        # The raw device only: the emulated IOPS-limited volume needs root and a cgroup io/blkio
        # controller (bench/cluster.sh measures it when EMULATE is not 0).
        env = dict(os.environ, TRAIN_BYTES=str(a.cluster_train_bytes), REPLAY_TOKENS="1000", ROUNDS="2", EMULATE="0")
        cmd = f"TRAIN_BYTES={a.cluster_train_bytes} REPLAY_TOKENS=1000 ROUNDS=2 EMULATE=0 bash bench/cluster.sh {os.path.dirname(a.bin)} {work}"
        text = sh(["bash", "bench/cluster.sh", os.path.dirname(a.bin), work], env=env)
        c = json.load(open(os.path.join(work, "demo", "clustered.json")))
        methods = [m for m in ("identity", "greedy", "chosen") if m in c.get("heldout", {})]
        fig, ax = plt.subplots(figsize=(6, 3.4))
        for i, trace in enumerate(("train", "heldout")):
            vals = [c[trace][m]["read_ops_per_token"] for m in methods]
            ax.bar([k + (i - 0.5) * 0.38 for k in range(len(methods))], vals, 0.38, label=trace)
        ax.set_xticks(range(len(methods)), ["identity" if m == "identity" else
                                            "greedy chain" if m == "greedy" else "seriation" for m in methods])
        ax.set_ylabel("read ops per token")
        ax.set_title("Clustering: expert read ops per token (demo model, coalesced)")
        ax.legend()
        link = self.figure(fig, "cluster_read_ops", cmd)
        self.section("Clustering read ops (bench/cluster.sh)", cmd, ["```", text.rstrip(), "```", "", link])

    # ---- cache-aware quality/miss trade ----
    def cache_aware(self):
        a = self.args
        cmd = [sys.executable, "bench/cache_aware.py", "--bin", a.bin, "--budgets-mb", "4,8",
               "--tolerances", "0,0.05,0.1,0.2", "--n-decode", "64", "--ppl-chars", "4000",
               "--out", os.path.join(a.work, "cache_aware")]
        text = sh(cmd)
        rows = []
        for line in text.splitlines():
            cells = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(cells) == 12 and cells[0].endswith(")") and "MiB" in cells[0]:
                rows.append((cells[0].split()[0], float(cells[1]), float(cells[6]),
                             float(cells[9].rstrip("%")), float(cells[10])))
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        for mb in sorted({r[0] for r in rows}, key=int):
            pts = [r for r in rows if r[0] == mb]
            ax.plot([r[2] for r in pts], [r[3] for r in pts], "o-", label=f"host cache {mb} MiB")
            for r in pts:
                ax.annotate(f"tol {r[1]:g}", (r[2], r[3]), fontsize=6)
        ax.set_xlabel("miss rate (perplexity run)")
        ax.set_ylabel("perplexity change vs tolerance 0 (%)")
        ax.set_title("Cache-aware routing: misses vs quality (demo model)")
        ax.legend(fontsize=8)
        link = self.figure(fig, "cache_aware", " ".join(cmd))
        self.section("Cache-aware routing: quality/miss trade (bench/cache_aware.py)", " ".join(cmd),
                     [l for l in text.splitlines() if l.strip()] + ["", link])

    def write(self, ran):
        a = self.args
        head = [BEGIN, "", "## Generated report (bench/report.py)", "",
                f"Generated {self.date} on {self.machine} by "
                f"`{' '.join(shlex.quote(x) for x in sys.argv)}` (sections: {', '.join(ran)}). "
                "Everything between the report markers is rewritten by that command; the sections "
                "after it are hand-written.", ""]
        if REUSED:
            head += [f"With --reuse: the output of {len(REUSED)} command(s) was taken from an earlier "
                     "run of this script on the same machine (their files under --work): "
                     + "; ".join(f"`{c[:90]}{'...' if len(c) > 90 else ''}`" for c in REUSED), ""]
        block = "\n".join(head + self.md + [END]) + "\n"
        text = open(a.results).read() if os.path.exists(a.results) else "# Measured results\n"
        if BEGIN in text and END in text:
            pre, rest = text.split(BEGIN, 1)
            post = rest.split(END, 1)[1].lstrip("\n")
            new = pre + block + "\n" + post
        else:  # first run: after the title and index, before the first hand-written section
            m = re.search(r"^## ", text, re.M)
            at = m.start() if m else len(text)
            new = text[:at] + block + "\n" + text[at:]
        tmp = a.results + ".tmp"
        with open(tmp, "w") as f:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, a.results)
        log(f"wrote {a.results}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--work", default="/var/tmp/moestream_report")
    ap.add_argument("--results", default=os.path.join(ROOT, "docs", "results.md"))
    ap.add_argument("--figures", default=os.path.join(ROOT, "docs", "figures"))
    ap.add_argument("--sections", default="io,decode,decode_device,hit_rates,clustering,cache_aware")
    ap.add_argument("--device-decode", default=os.path.join(ROOT, "docs", "figures", "device", "decode.json"),
                    help="decode.json from scripts/device_decode.sh (copied with its decode.txt); "
                         "shown as its own section when present")
    ap.add_argument("--io-mb", type=int, default=1024)
    ap.add_argument("--shape", default="olmoe-1b-7b")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--cap-mb", type=int, default=1024)
    ap.add_argument("--sweep-mb", default="256,2048")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="decode runs per cell (median kept)")
    ap.add_argument("--trace-prompts", type=int, default=8)
    ap.add_argument("--trace-tokens", type=int, default=128)
    ap.add_argument("--cluster-train-bytes", type=int, default=100000)
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the saved output of commands run before with the same arguments "
                         "(after a failed section; the figures then show the earlier run)")
    args = ap.parse_args()
    global REUSE_DIR
    args.bin = os.path.abspath(args.bin)
    args.work = os.path.abspath(args.work)
    args.results = os.path.abspath(args.results)
    args.figures = os.path.abspath(args.figures)
    os.makedirs(args.work, exist_ok=True)
    REUSE_DIR = os.path.join(args.work, "saved")
    os.makedirs(REUSE_DIR, exist_ok=True)
    if not args.reuse:  # outputs are still saved, for a later --reuse
        for f in os.listdir(REUSE_DIR):
            os.remove(os.path.join(REUSE_DIR, f))
    r = Report(args)
    ran = []
    for name in args.sections.split(","):
        getattr(r, name)()
        ran.append(name)
    r.write(ran)


if __name__ == "__main__":
    main()
