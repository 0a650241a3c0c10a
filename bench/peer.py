#!/usr/bin/env python3
"""bench/peer: moestream against llama.cpp on the same weights, as the ratios of issue 19's goals.

One random-weight model with Qwen3-30B-A3B's real shapes and --layers decoder layers in both
formats: a Q8_0 GGUF made by llama.cpp's converter and quantizer from a seeded bf16 checkpoint
(bench/gguf_llama.py makes and caches it), and the moestream pack `convert_model` makes of that
GGUF (experts and dense weights keep their Q8_0 blocks: the same bytes on both sides). llama.cpp
is the test tool of scripts/llama_cpp_tool.sh (llama-completion, default mmap), or the one named
by the LLAMA_CPP_* variables (scripts/device_peer.sh builds it with CUDA on the device machine).

Rows (each a setting whose cells run in interleaved rounds, the order flipping every round, a
fresh process per run; each cell's median, the ratio of moestream's median to llama.cpp's):
  cpu T     warm CPU decode at T threads (--threads; counts above the machine's cores are clamped
            to them): infer -t T against llama-completion -t T -dev none -ngl 0; --cpu-moestream
            cpu,cpu-noverify adds infer --no-verify as a cell of its own (an expert's first use in
            a process is checksummed by default; llama.cpp verifies nothing)
  resident  warm GPU, every expert in VRAM: infer --gpu --gpu-preload (its automatic cache, filled
            with every expert at load, as llama.cpp loads every weight) against -ngl 99
  gpu 25%   GPU with a VRAM expert cache of 25% of the experts over the page cache: infer --gpu
            --gpu-cache-mb (25%) against llama.cpp with experts on the CPU (-ngl 99 -ot exps=CPU)
  cap       under a memory cap of --cap-fraction of the GGUF (scripts/with_memory_cap.sh: cgroup
            v2 where present, v1 otherwise; page cache dropped before each run): moestream's best
            mode against llama.cpp's best mode that runs. Both keep the experts out of VRAM but for
            moestream's 25% cache: a cap stands for a model that fits neither host memory nor VRAM,
            so llama.cpp's full offload is not a candidate
  prefill   prefill tok/s of a --prefill-tokens prompt: with a GPU, the gpu 25% runs (llama.cpp
            with experts on the CPU); without one, CPU against CPU at the most threads
GPU rows need nvidia-smi to list a GPU (and both engines built with CUDA); the cap row needs
with_memory_cap.sh --check to pass. Rows that cannot run print why.

  scripts/llama_cpp_tool.sh build && cmake --build build --target infer convert_model
  python3 bench/peer.py --layers 2 --tokens 8 --prefill-tokens 64 --json /tmp/peer.json
  bash scripts/device_peer.sh build; bash scripts/device_peer.sh model; bash scripts/device_peer.sh run
                                                    # the device machine, three calls of < 600 s
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_llama as gl  # noqa: E402  (the model, llama.cpp's paths, the timed runner)
from page_cache import drop_file_cache, warm_file  # noqa: E402

REPO = gl.REPO

# llama.cpp's perf lines: "prompt eval time = 80.00 ms / 14 tokens (..., 175.00 tokens per second)"
# and "eval time = 1500.00 ms / 31 runs (..., 20.67 tokens per second)".
PROMPT_RE = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens\s*\(\s*[\d.]+ ms per token,\s*"
                       r"([\d.]+) tokens per second")
# Words that are one token each with a leading space in Qwen3's vocabulary: the long prompt.
WORDS = ("time year people way day man thing woman life child world school state family student "
         "group country problem hand part place case week company system program question work "
         "government number night point home water room mother area money story fact month lot "
         "right study book eye job word business issue").split()

# The goals of issue 19, by row.
GOALS = {"cpu": 1.0, "resident": 0.8, "gpu25": 1.5, "cap": 10.0}


def log(msg: str) -> None:
    print(f"peer: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- pure parts (tests/python/test_peer.py)

def parse_threads(text: str, cores: int) -> list[int]:
    """'2,16' -> the thread counts to run, each at most `cores`, without repeats, ascending."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--threads: '{part}' is not a positive thread count")
        out.append(min(int(part), cores))
    return sorted(set(out))


def check_args(a) -> None:
    """Refuses values no run could use (argparse has checked the types)."""
    if not 1 <= a.layers <= 48:
        raise ValueError(f"--layers {a.layers}: Qwen3-30B-A3B has 1..48 layers")
    if a.tokens < 2:
        raise ValueError(f"--tokens {a.tokens}: decode needs at least 2 tokens (the first is prefill's)")
    if a.rounds < 1:
        raise ValueError(f"--rounds {a.rounds}: at least one round")
    if not 0 < a.cap_fraction < 1:
        raise ValueError(f"--cap-fraction {a.cap_fraction}: must be in (0, 1)")
    if not 0 < a.gpu_cache_fraction <= 1:
        raise ValueError(f"--gpu-cache-fraction {a.gpu_cache_fraction}: must be in (0, 1]")
    if a.prefill_tokens < 2:
        raise ValueError(f"--prefill-tokens {a.prefill_tokens}: at least 2")
    for flag, given, known in (("--rows", a.rows, ROWS), ("--cap-moestream", a.cap_moestream, MOESTREAM_MODES),
                               ("--gpu25-moestream", a.gpu25_moestream, MOESTREAM_MODES),
                               ("--cpu-moestream", a.cpu_moestream, CPU_MODES),
                               ("--cap-llama", a.cap_llama, ("l-cpu", "l-exps"))):
        unknown = set(given) - set(known)
        if unknown:
            raise ValueError(f"{flag}: unknown {','.join(sorted(unknown))} (known: {','.join(known)})")
    if a.moestream_gguf and "cpu-noverify" in a.cpu_moestream:
        raise ValueError("--cpu-moestream cpu-noverify with --moestream-gguf: a GGUF carries no expert "
                         "checksums, so --no-verify would run the cpu cell again")


def long_prompt(n: int) -> str:
    return "The" + "".join(" " + WORDS[i % len(WORDS)] for i in range(n - 1))


def round_order(cells: list, rnd: int) -> list:
    """Cells in round rnd: as given in even rounds, reversed in odd ones (a drifting load)."""
    return list(cells) if rnd % 2 == 0 else list(cells)[::-1]


def aggregate(values: list) -> dict:
    """One cell's rounds (tok/s or None for a failed run) -> median over the rounds when every
    round ran (a mode that fails in some round does not count as running), the failures."""
    ok = [v for v in values if v]
    return {"median": statistics.median(ok) if ok and len(ok) == len(values) else None,
            "rounds": list(values), "failed": len(values) - len(ok)}


def ratio(ours, theirs):
    return ours / theirs if ours and theirs else None


def best(cells: list[dict], key: str = "tok_s"):
    """The cell with the highest median `key` among those that ran, or None."""
    ran = [c for c in cells if c.get(key)]
    return max(ran, key=lambda c: c[key]) if ran else None


def gpu_cache_mb(expert_bytes: int, fraction: float) -> int:
    return max(1, int(expert_bytes * fraction) >> 20)


def host_cache_mb(cap_mb: int, dense_bytes: int, kv_bytes: int, slack_mb: int) -> int:
    """The host cache of --io-direct under a cap: what the dense weights, the KV cache and a slack
    (the process, the CUDA runtime) leave of it, at least 64 MiB."""
    return max(64, cap_mb - (dense_bytes >> 20) - (kv_bytes >> 20) - slack_mb)


AUTO_DIRECT = "exceed the memory this process may fill"  # infer's notice of the automatic O_DIRECT choice


def auto_streamed(cell: dict) -> int:
    """The rounds of a cell in which infer streamed by its own choice (the model's files larger
    than the memory room it saw): such a round measured O_DIRECT reads, not the weights at hand."""
    return sum(any(AUTO_DIRECT in n for n in (ns or [])) for ns in cell.get("notices") or [])


def compare(row: str, label: str, ms: list[dict], ll: list[dict], key: str = "tok_s") -> dict:
    """A table row: moestream's best cell against llama.cpp's best, the ratio and its goal. When
    every llama.cpp mode failed and moestream ran, the goal is met without a ratio."""
    m, l_ = best(ms, key), best(ll, key)
    r = ratio(m[key] if m else None, l_[key] if l_ else None)
    goal = GOALS.get(row) if key == "tok_s" else None
    llama_failed = bool(ll) and all(c["failed"] == len(c["rounds"]) for c in ll)
    met = None if goal is None else bool(m and ((r and r >= goal) or (r is None and llama_failed)))
    rounds = "rounds" if key == "tok_s" else "prefill_rounds"
    notes = ["llama.cpp failed in every mode and round"] if llama_failed else []
    if m and (streamed := auto_streamed(m)):
        notes.append(f"moestream streamed by its own choice in {streamed} of {len(m[rounds])} rounds "
                     "(the memory room it saw was below the model: see the cell's notices)")
    return {"row": row, "label": label, "moestream": m and m["mode"], "moestream_tok_s": m and m[key],
            "moestream_rounds": m and m[rounds], "llama": l_ and l_["mode"], "llama_tok_s": l_ and l_[key],
            "llama_rounds": l_ and l_[rounds], "ratio": r, "goal": goal, "met": met, "note": "; ".join(notes)}


def markdown(rows: list[dict], skipped: list[tuple[str, str]]) -> str:
    out = ["| row | moestream | tok/s (rounds) | llama.cpp | tok/s (rounds) | ratio | goal |",
           "|---|---|---|---|---|---|---|"]
    f = lambda v: f"{v:.2f}" if v else "failed"  # noqa: E731

    def cell(v, rounds):
        return f(v) + (" (" + "/".join(f(x) for x in rounds) + ")" if rounds else "")

    for r in rows:
        goal = "" if r["goal"] is None else f">= {r['goal']:g}x: " + ("met" if r["met"] else "NOT met")
        if r["ratio"]:
            rat = f"**{r['ratio']:.2f}x**" + (f" ({r['note']})" if r["note"] else "")
        else:
            rat = r["note"] or "no ratio"
        out.append(f"| {r['label']} | {MODE_TEXT.get(r['moestream'], r['moestream'] or 'every mode failed')} | "
                   f"{cell(r['moestream_tok_s'], r['moestream_rounds'])} | "
                   f"{MODE_TEXT.get(r['llama'], r['llama'] or 'every mode failed')} | "
                   f"{cell(r['llama_tok_s'], r['llama_rounds'])} | {rat} | {goal} |")
    for name, why in skipped:
        out.append(f"| {name} | skipped: {why} | | | | | |")
    return "\n".join(out)


# ---------------------------------------------------------------- modes

ROWS = ("cpu", "resident", "gpu25", "cap", "prefill")
MOESTREAM_MODES = ("cpu", "cpu-direct", "gpu", "gpu25", "gpu25-pin", "gpu25-cpu", "gpu25-cpu-pin", "gpu25-direct", "cpu-noverify")
CPU_MODES = ("cpu", "cpu-noverify")  # the cpu rows' moestream cells (--cpu-moestream)
MODE_TEXT = {"cpu": "CPU", "cpu-direct": "CPU, `--io-direct` + host cache",
             "cpu-noverify": "CPU, `--no-verify` (first use of an expert not checksummed)",
             "gpu": "`--gpu --gpu-preload`, every expert in VRAM", "gpu25": "`--gpu`, 25% VRAM cache",
             "gpu25-pin": "`--gpu`, 25% VRAM cache, `--gpu-pin-page-cache`",
             "gpu25-cpu": "`--gpu`, 25% VRAM cache, `--gpu-cpu-misses` (misses on the CPU threads)",
             "gpu25-cpu-pin": "`--gpu`, 25% VRAM cache, `--gpu-cpu-misses --gpu-pin-page-cache` (pinned prompt copies)",
             "gpu25-direct": "`--gpu`, 25% VRAM cache, `--io-direct` + host cache",
             "l-cpu": "CPU (`-dev none -ngl 0`)", "l-gpu": "all on the GPU (`-ngl 99`)",
             "l-exps": "experts on the CPU (`-ngl 99 -ot exps=CPU`)"}


def moestream_flags(mode: str, a) -> list[str]:
    return {"cpu": [], "cpu-noverify": ["--no-verify"],
            "cpu-direct": ["--io-direct", "--host-cache-mb", str(a.host_cache_mb)],
            "gpu": ["--gpu", "--gpu-preload"], "gpu25": ["--gpu", "--gpu-cache-mb", str(a.gpu_cache_mb)],
            "gpu25-pin": ["--gpu", "--gpu-cache-mb", str(a.gpu_cache_mb), "--gpu-pin-page-cache"],
            "gpu25-cpu": ["--gpu", "--gpu-cache-mb", str(a.gpu_cache_mb), "--gpu-cpu-misses"],
            "gpu25-cpu-pin": ["--gpu", "--gpu-cache-mb", str(a.gpu_cache_mb), "--gpu-cpu-misses", "--gpu-pin-page-cache"],
            "gpu25-direct": ["--gpu", "--gpu-cache-mb", str(a.gpu_cache_mb), "--io-direct",
                             "--host-cache-mb", str(a.host_cache_mb_gpu)]}[mode]


def llama_flags(mode: str) -> list[str]:
    # -fit off: the modes as written, not adjusted to the device's free memory.
    return {"l-cpu": ["-dev", "none", "-ngl", "0", "-fit", "off"], "l-gpu": ["-ngl", "99", "-fit", "off"],
            "l-exps": ["-ngl", "99", "-ot", "exps=CPU", "-fit", "off"]}[mode]


def files_of(path: Path) -> list[Path]:
    return [p for p in sorted(path.rglob("*")) if p.is_file()] if path.is_dir() else [path]


def expert_counts(stats: dict) -> dict:
    """Where a run's experts came from (infer's --stats-json `experts`): computed in place from the
    page cache, read, or from the host cache, and how the store read; what tells a warm run from
    one that read."""
    e = stats.get("experts") or {}
    out = {k: e.get(k) for k in ("experts_requested", "experts_in_place", "experts_read", "host_cache_hits",
                                 "fetches_read_ahead", "verified_in_place")}
    # How the store read: buffered or O_DIRECT with a host cache (the automatic choice for a model
    # larger than the memory room), which decides whether experts can be computed in place.
    out["expert_io"] = stats.get("expert_io")
    return out


def notices(stderr: str) -> list[str]:
    """infer's and the engine's notices in a run's stderr (an automatic choice such as O_DIRECT for
    a model larger than the memory room), kept with the cell: they change what the cell measured."""
    return [line for line in stderr.splitlines() if line.startswith(("infer: ", "moestream: "))][:8]


def run_cell(a, engine: str, mode: str, threads: int, prompt: str, tokens: int, cap_mb) -> dict:
    ctx = a.prefill_tokens + tokens + 64
    if engine == "moestream":
        stats = a.work / "stats.json"
        stats.unlink(missing_ok=True)
        r = gl.timed([a.bin / "infer", "-m", a.pack, "-p", prompt, "-n", str(tokens), "--temp", "0",
                      "--ignore-eos", "-t", str(threads), "--ctx", str(ctx), "--stats-json", stats,
                      *moestream_flags(mode, a)], cap_mb, "infer")
        if r["rc"] != 0 or not stats.is_file():
            return {"tok_s": None, "prefill_tok_s": None, "rc": r["rc"], "err": r["err"][-1500:], "load": r["load"]}
        st = json.loads(stats.read_text())
        return {"tok_s": st["decode"]["tokens_per_s"], "prefill_tok_s": st["prefill"]["tokens_per_s"],
                "prompt_tokens": st["prefill"]["tokens"], "decode_tokens": st["decode"]["tokens"],
                "gpu_cache": st["decode"].get("gpu_cache"), "experts": expert_counts(st),
                "decode_phases_s": st["decode"].get("phases_s"), "rc": 0, "load": r["load"],
                "maxrss_bytes": r["maxrss_bytes"], "cap_line": r["cap_line"], "notices": notices(r["err"])}
    r = gl.timed([a.env["LLAMA_CPP_COMPLETION"], "-m", a.gguf, "-p", prompt, "-n", str(tokens),
                  "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "--temp", "0", "--top-k", "1",
                  "-s", "1", "--ignore-eos", "-no-cnv", "--no-display-prompt", *llama_flags(mode)],
                 cap_mb, "llama-completion")
    text = r["err"] + r["out"]
    ev, pp = list(gl.EVAL_RE.finditer(text)), list(PROMPT_RE.finditer(text))
    if r["rc"] != 0 or not ev or not pp:
        return {"tok_s": None, "prefill_tok_s": None, "rc": r["rc"], "err": r["err"][-1500:], "load": r["load"]}
    return {"tok_s": float(ev[-1].group(3)), "decode_tokens": int(ev[-1].group(2)),
            "prefill_tok_s": float(pp[-1].group(2)), "prompt_tokens": int(pp[-1].group(1)), "rc": 0,
            "load": r["load"], "maxrss_bytes": r["maxrss_bytes"], "cap_line": r["cap_line"]}


def interleaved(a, name: str, cells: list[tuple[str, str]], threads: int, prompt: str, tokens: int,
                cap_mb=None) -> list[dict]:
    """Rounds over the cells; before each run the engine's file is read into the page cache (warm),
    or both files are dropped from it (under the cap: pages cached earlier are charged to another
    cgroup and would be free hits)."""
    runs = {c: [] for c in cells}
    for rnd in range(a.rounds):
        for c in round_order(cells, rnd):
            if cap_mb:
                for f in files_of(a.gguf) + files_of(a.pack):
                    drop_file_cache(f)
            else:
                for f in files_of(a.pack if c[0] == "moestream" else a.gguf):
                    warm_file(f)
            r = run_cell(a, c[0], c[1], threads, prompt, tokens, cap_mb)
            log(f"{name} round {rnd + 1}/{a.rounds} {c[0]} {c[1]}: "
                + (f"{r['tok_s']:.2f} tok/s decode, {r['prefill_tok_s']:.2f} prefill" if r["tok_s"]
                   else f"failed (exit {r['rc']}): {r['err'][-300:]}") + f"; load {r['load']:.2f}"
                + (f"; {r['cap_line']}" if r.get("cap_line") else "")
                + ("; decode s: " + ", ".join(f"{k} {v:.3f}" for k, v in r["decode_phases_s"].items())
                   if r.get("decode_phases_s") else ""))
            runs[c].append(r)
    out = []
    for (engine, mode), rs in runs.items():
        dec, pre = aggregate([r["tok_s"] for r in rs]), aggregate([r["prefill_tok_s"] for r in rs])
        out.append({"engine": engine, "mode": mode, "threads": threads, "tok_s": dec["median"],
                    "rounds": dec["rounds"], "failed": dec["failed"], "prefill_tok_s": pre["median"],
                    "prefill_rounds": pre["rounds"], "prompt_tokens": rs[0].get("prompt_tokens"),
                    "decode_tokens": rs[0].get("decode_tokens"),
                    "errors": [r["err"] for r in rs if r.get("err")][:1],
                    "loads": [r["load"] for r in rs], "gpu_cache": rs[-1].get("gpu_cache"),
                    "experts": [r.get("experts") for r in rs], "notices": [r.get("notices") for r in rs],
                    # Where each moestream run's decode time went (infer's phases: attention,
                    # router, expert I/O, expert compute, other).
                    "decode_phases_s": [r.get("decode_phases_s") for r in rs],
                    "maxrss_bytes": max((r.get("maxrss_bytes") or 0) for r in rs)})
    return out


# ---------------------------------------------------------------- the model in both formats

def ensure_pack(a, gguf: Path) -> Path:
    pack = gguf.parent / (gguf.stem + ".pack")
    if (pack / "model.json").is_file():
        return pack
    tmp = pack.with_name(pack.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    gl.run([a.bin / "convert_model", gguf, tmp, "-q"])
    os.replace(tmp, pack)
    return pack


def gpu_present() -> tuple[bool, str]:
    if not shutil.which("nvidia-smi"):
        return False, "no GPU (nvidia-smi not found)"
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if r.returncode != 0 or "GPU" not in r.stdout:
        return False, "no GPU (nvidia-smi -L lists none)"
    return True, r.stdout.strip().splitlines()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6, help="decoder layers (Qwen3-30B-A3B has 48)")
    ap.add_argument("--threads", default="2,16", help="CPU rows' thread counts, clamped to the cores")
    ap.add_argument("--tokens", type=int, default=32, help="greedy decode tokens per run")
    ap.add_argument("--prefill-tokens", type=int, default=512, help="prompt length of the GPU rows "
                    "(it also fills the VRAM cache) and of the prefill row")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per row (medians kept)")
    ap.add_argument("--rows", default=",".join(ROWS), help="rows to run: " + ",".join(ROWS))
    ap.add_argument("--gpu-cache-fraction", type=float, default=0.25, help="VRAM cache / expert bytes")
    ap.add_argument("--cap-fraction", type=float, default=0.5, help="memory cap / GGUF file size")
    ap.add_argument("--cap-moestream", default="", help="moestream's modes under the cap (default: "
                    "gpu25-direct with a GPU, else cpu,cpu-direct); its best counts")
    ap.add_argument("--gpu25-moestream", default="gpu25,gpu25-pin", help="moestream's modes in the gpu25 "
                    "row (gpu25: misses copied once from the page cache; gpu25-pin: page-locked, no host "
                    "copy; gpu25-cpu: misses computed on the CPU threads; gpu25-cpu-pin: both); its best counts")
    ap.add_argument("--cpu-moestream", default="cpu", help="the cpu rows' moestream modes: cpu (default), "
                    "cpu-noverify (--no-verify: an expert's first use in the process is not checksummed, "
                    "to tell that cost apart); the best counts, each is in the JSON")
    ap.add_argument("--cap-llama", default="", help="llama.cpp's modes under the cap (default: l-exps with "
                    "a GPU, else l-cpu; l-gpu is refused: full offload holds the model in VRAM); its best counts")
    ap.add_argument("--slack-mb", type=int, default=320, help="the cap less dense, KV and this is the "
                    "host cache of --io-direct on the CPU")
    ap.add_argument("--gpu-slack-mb", type=int, default=1024, help="the same with --gpu (the CUDA "
                    "runtime's host memory)")
    ap.add_argument("--seed", type=int, default=1, help="weight seed")
    ap.add_argument("--bin", type=Path, default=REPO / "build" / "bin", help="infer and convert_model")
    ap.add_argument("--cache", type=Path, default=gl.CACHE, help="where the models are kept")
    ap.add_argument("--tokenizers", help="directory with qwen3/tokenizer.json")
    ap.add_argument("--models-only", action="store_true", help="make the GGUF and the pack, then stop")
    ap.add_argument("--gguf", type=Path, default=None, help="use this Q8_0 GGUF of --layers layers (e.g. "
                    "bench/gguf_deepen.py's 48-layer one) instead of making one")
    ap.add_argument("--moestream-gguf", action="store_true", help="moestream reads the GGUF in place "
                    "instead of the pack convert_model makes of it (no second copy on disk)")
    ap.add_argument("--json", help="write every figure here (rewritten after every row)")
    ap.add_argument("--markdown", help="write the table here too")
    a = ap.parse_args()
    a.rows = [r for r in a.rows.split(",") if r]
    a.cap_moestream = [m for m in a.cap_moestream.split(",") if m]
    a.gpu25_moestream = [m for m in a.gpu25_moestream.split(",") if m]
    a.cap_llama = [m for m in a.cap_llama.split(",") if m]
    a.cpu_moestream = [m for m in a.cpu_moestream.split(",") if m]
    try:
        a.thread_list = parse_threads(a.threads, os.cpu_count() or 1)
        check_args(a)
    except ValueError as e:
        ap.error(str(e))
    a.env = gl.tool_env()
    # bench/gguf_llama.py's model and cache; Q8_0 only, its intermediates deleted.
    a.types, a.keep_intermediate = ["Q8_0"], False
    if a.gguf is not None:
        if not a.gguf.is_file():
            ap.error(f"--gguf {a.gguf}: no such file")
    else:
        a.gguf = gl.ensure_models(a, a.env)["Q8_0"]
    a.pack = a.gguf if a.moestream_gguf else ensure_pack(a, a.gguf)
    info = gl.gguf_bytes(a.gguf)
    if a.models_only:
        print(f"{a.gguf} ({info['file'] / 1e9:.2f} GB)\n{a.pack}")
        return
    # A model written just now may still be going to disk; its writeback would slow the first
    # cells (measured on the dev VM: 19.7 tok/s against 45 a minute later).
    os.sync()
    a.work = Path(tempfile.mkdtemp(prefix="peer."))
    top = a.thread_list[-1]
    has_gpu, gpu_text = gpu_present()
    cap = subprocess.run(["bash", str(gl.CAP_SCRIPT), "--check"], capture_output=True, text=True)
    cap_text = cap.stdout.strip()
    cap_mb = int(info["file"] * a.cap_fraction) >> 20
    kv = 2 * a.layers * (a.prefill_tokens + a.tokens + 64) * gl.SHAPE["kv_heads"] * gl.SHAPE["head_dim"] * 4
    a.gpu_cache_mb = gpu_cache_mb(info["experts"], a.gpu_cache_fraction)
    a.host_cache_mb = host_cache_mb(cap_mb, info["dense"], kv, a.slack_mb)
    a.host_cache_mb_gpu = host_cache_mb(cap_mb, info["dense"], kv, a.gpu_slack_mb)
    pack_bytes = sum(f.stat().st_size for f in files_of(a.pack))
    log(f"GGUF {a.gguf} ({info['file'] / 1e9:.2f} GB), pack {a.pack} ({pack_bytes / 1e9:.2f} GB); "
        f"GPU: {gpu_text}; memory cap: {cap_text}")

    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
                       "gpu": gpu_text if has_gpu else None},
           "command": " ".join(shlex.quote(x) for x in sys.argv),
           "llama_cpp": f"{a.env['LLAMA_CPP_VERSION']} ({a.env['LLAMA_CPP_COMMIT']}), llama-completion, mmap",
           "model": {"shape": "Qwen3-30B-A3B", "layers": a.layers, "gguf": str(a.gguf), "gguf_bytes": info["file"],
                     "pack": str(a.pack), "pack_bytes": pack_bytes, "expert_bytes": info["experts"],
                     "dense_bytes": info["dense"], "types": "Q8_0 as llama-quantize wrote it, the same blocks in both files"},
           "memory_cap": cap_text, "tokens": a.tokens, "rounds": a.rounds, "prefill_tokens": a.prefill_tokens,
           "gpu_cache_mb": a.gpu_cache_mb, "cap_mb": cap_mb, "settings": {}, "rows": [], "skipped": []}
    head = (f"bench/peer: Qwen3-30B-A3B shapes, {a.layers} layers, Q8_0 GGUF {info['file'] / 1e9:.2f} GB and "
            f"its pack; {a.tokens} greedy tokens; CPU rows' threads {','.join(map(str, a.thread_list))}, "
            f"other rows {top}; medians of {a.rounds} interleaved rounds; {res['date']}\n"
            f"llama.cpp: {res['llama_cpp']}; GPU: {gpu_text}; memory cap: {cap_text}; GPU cache "
            f"{a.gpu_cache_mb} MiB; cap {cap_mb} MiB, host cache of --io-direct {a.host_cache_mb} MiB "
            f"(CPU) / {a.host_cache_mb_gpu} MiB (--gpu)")

    def emit(final: bool) -> None:
        # Rewritten after every row: a run cut off by a time limit keeps the rows it finished.
        text = head + "\n\n" + markdown(res["rows"], res["skipped"]) + "\n"
        if final:
            print(text, end="")
        if a.markdown:
            Path(a.markdown).write_text(text)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1) + "\n")

    run_rows(a, res, has_gpu, gpu_text, cap, cap_mb, emit)
    shutil.rmtree(a.work, ignore_errors=True)
    emit(final=True)


def run_rows(a, res: dict, has_gpu: bool, gpu_text: str, cap, cap_mb: int, emit) -> None:
    top = a.thread_list[-1]
    short, long_ = gl.PROMPT, long_prompt(a.prefill_tokens)
    S, rows, skipped = res["settings"], res["rows"], res["skipped"]
    cap_text = cap.stdout.strip()
    if "cpu" in a.rows:
        for t in a.thread_list:
            cells = [("moestream", m) for m in a.cpu_moestream] + [("llama.cpp", "l-cpu")]
            S[f"cpu{t}"] = interleaved(a, f"cpu {t}", cells, t, short, a.tokens)
            rows.append(compare("cpu", f"warm CPU decode, {t} threads", *split(S[f"cpu{t}"])))
            emit(False)
    for row, label in (("resident", "warm GPU decode, every expert resident"),
                       ("gpu25", f"GPU decode, {a.gpu_cache_fraction:.0%} VRAM cache ({a.gpu_cache_mb} MiB) "
                                 "over the page cache")):
        if row not in a.rows and not (row == "gpu25" and "prefill" in a.rows):
            continue  # the prefill row takes its figures from the gpu25 runs
        if not has_gpu:
            if row in a.rows:
                skipped.append((label, gpu_text))
            continue
        cells = [("moestream", "gpu"), ("llama.cpp", "l-gpu")] if row == "resident" else \
            [("moestream", m) for m in a.gpu25_moestream] + [("llama.cpp", "l-exps")]
        S[row] = interleaved(a, row, cells, top, long_, a.tokens)
        if row in a.rows:
            rows.append(compare(row, label, *split(S[row])))
            emit(False)
    if "cap" in a.rows:
        label = f"decode under a memory cap of {a.cap_fraction:.0%} of the GGUF ({cap_mb} MiB)"
        if cap.returncode != 0:
            skipped.append((label, cap_text))
        else:
            ms = a.cap_moestream or (["gpu25-direct"] if has_gpu else ["cpu", "cpu-direct"])
            ll = a.cap_llama or (["l-exps"] if has_gpu else ["l-cpu"])
            cells = [("moestream", m) for m in ms] + [("llama.cpp", m) for m in ll]
            S["cap"] = interleaved(a, "cap", cells, top, short, a.tokens, cap_mb)
            rows.append(compare("cap", label, *split(S["cap"])))
            emit(False)
    if "prefill" in a.rows:
        if not has_gpu:
            S["prefill"] = interleaved(a, "prefill", [("moestream", "cpu"), ("llama.cpp", "l-cpu")], top, long_, 2)
        cells = S["prefill" if not has_gpu else "gpu25"]
        n = sorted({c["prompt_tokens"] for c in cells if c["prompt_tokens"]})
        if len(n) > 1:
            log(f"WARNING: the engines tokenized the prompt to different lengths: {n}")
        label = f"prefill tok/s, {'/'.join(map(str, n)) or a.prefill_tokens}-token prompt"
        rows.append(compare("prefill", label, *split(cells), key="prefill_tok_s"))


def split(cells: list[dict]) -> tuple[list[dict], list[dict]]:
    return [c for c in cells if c["engine"] == "moestream"], [c for c in cells if c["engine"] == "llama.cpp"]


if __name__ == "__main__":
    main()
