"""Docs smoke test (issue 24): every command README.md and docs/*.md tell a user to run, run once
with its smallest settings (the demo model, a few tokens, seconds not minutes). A case fails on a
non-zero exit or an empty result.

CASES below is the one list of documented commands. Each entry is either a smoke run or a skip
with its reason (the device machine, llama.cpp, a CI job of its own, ...); a skip is reported as
such by pytest. Commands that need a GPU, root or a cgroup memory controller run where the machine
has them and skip (naming what is missing) where it does not.

test_every_documented_command_has_a_smoke_case scans README.md and docs/*.md (fenced blocks, inline
code and prose) for commands: `build*/bin/X`, a bare CLI name (an executable of tools/ or bench/)
leading a command, `bench/...`, `scripts/...` and `python/...` `.sh`/`.py` files, `.ci/run`,
`pip install ./python`, `curl`, and each fenced Python block. A command with no entry in CASES
fails, naming the file and line.
"""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from doc_commands import all_documented_commands, documented_commands

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
GGUF = ROOT / "tests" / "fixtures" / "gguf" / "qwen3moe-tiny-Q8_0.gguf"
PROMPT = "Elizabeth looked at Mr. Darcy and"

# ---------------------------------------------------------------------------------------------
# Running commands.

def _bin_dir():
    return pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))).resolve()


def _gpu_present():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    r = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


class Smoke:
    """Runs one case's commands; every run must exit 0 and (by default) print something."""

    def __init__(self, tmp):
        self.tmp = pathlib.Path(tmp)
        self.bin = _bin_dir()
        self.build = self.bin.parent  # scripts that take BUILD_DIR append /bin
        self.env = dict(os.environ, MOESTREAM_BIN_DIR=str(self.bin))

    def exe(self, name):
        path = self.bin / name
        if not path.exists():
            pytest.skip(f"{path} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
        return str(path)

    def run(self, argv, *, env=None, timeout=120, stdin=None, quiet_ok=False, cwd=ROOT, free_text=False):
        """Runs argv to completion; stdout and stderr are pipes, decoded without newline
        translation so that a progress bar's carriage returns are seen (item 4 of issue 24: into a
        pipe, progress is plain lines). free_text: stdout is a random model's text (any bytes)."""
        argv = [str(a) for a in argv]
        r = subprocess.run(argv, capture_output=True, timeout=timeout, cwd=cwd,
                           env=dict(self.env, **(env or {})), input=stdin.encode() if stdin else None)
        r.stdout = r.stdout.decode("utf-8", "replace")
        r.stderr = r.stderr.decode("utf-8", "replace")
        shown = " ".join(argv) if len(" ".join(argv)) < 400 else " ".join(argv)[:400] + " ..."
        assert r.returncode == 0, (f"`{shown}` exited {r.returncode}\n--- stdout (tail)\n"
                                   f"{r.stdout[-2000:]}\n--- stderr (tail)\n{r.stderr[-3000:]}")
        if not quiet_ok:
            assert r.stdout.strip(), f"`{shown}` printed nothing on stdout\n--- stderr\n{r.stderr[-2000:]}"
        for name, text in ((("stdout", r.stdout),) if not free_text else ()) + (("stderr", r.stderr),):
            assert "\r" not in text.replace("\r\n", "\n"), (
                f"`{shown}` redrew a line with carriage returns on its {name}, a pipe (progress into a "
                f"pipe or file must be plain lines: common/progress.h)\n{text[-1000:]!r}")
        return r

    def infer(self, *args, **kw):
        return self.run([self.exe("infer"), *args], **kw)

    def routing_log(self):
        """A routing log of the demo model: one short generation (infer --collect-routing)."""
        log = self.tmp / "demo_routing.bin"
        if not log.exists():
            self.infer("-m", DEMO, "-p", PROMPT, "-n", 8, "--temp", 0, "-t", 2, "--collect-routing", log)
        return log

    def copy_demo(self, name):
        dst = self.tmp / name
        shutil.copytree(DEMO, dst)
        return dst


# ---------------------------------------------------------------------------------------------
# The table. Each case is a function of a Smoke; a skip is a reason string.

# Reasons a documented command is not run by this test; conftest.py's strict mode allows exactly
# these (pattern "docs smoke, not run here").
DEVICE = "docs smoke, not run here (device machine)"
LLAMA = "docs smoke, not run here (needs llama.cpp)"
CI_JOB = "docs smoke, not run here (a CI job of its own)"
DOWNLOAD = "docs smoke, not run here (downloads)"
ONE_OFF = "docs smoke, not run here (one-off generator)"
SLOW = "docs smoke, not run here (slow; MOESTREAM_SMOKE_SLOW=1 runs it)"
COVERED = "docs smoke, not run here (another test runs it)"


@dataclass
class Case:
    run: Optional[Callable] = None  # the smoke run, a function of a Smoke
    skip: Optional[str] = None      # or why it is not run here
    why: str = ""                   # what the run covers, or the skip's reason


CASES = {}


def case(key):
    def deco(fn):
        assert key not in CASES, key
        CASES[key] = Case(run=fn, why=(fn.__doc__ or "").strip())
        return fn
    return deco


def skipped(key, category, why):
    assert key not in CASES, key
    CASES[key] = Case(skip=f"{category}: {why}", why=why)


# --- CLIs (README "Tools") ---

@case("bin/infer")
def _infer(s):
    """README's demo runs (greedy, sampled), a GGUF file in place, --perplexity, --timing, --stats-json,
    the terminal chat (-cnv, turns piped in)."""
    r = s.infer("-m", DEMO, "-p", PROMPT, "-n", 4, "--temp", 0)
    assert r.stdout.startswith(PROMPT)
    s.infer("-m", DEMO, "-p", "The kernel driver", "-n", 4, "--seed", 1, "--temp", 0.8)
    s.infer("-m", GGUF, "-p", "Hello", "-n", 4, "--temp", 0, free_text=True)
    text = s.tmp / "ppl.txt"
    text.write_text(DEMO.joinpath("heldout_head.txt").read_text(encoding="utf-8")[:600], encoding="utf-8")
    r = s.infer("-m", DEMO, "--perplexity", text, "--ctx", 64, "--stride", 64, "-t", 2, quiet_ok=True)
    assert "perplexity" in (r.stdout + r.stderr).lower()
    s.infer("-m", DEMO, "-p", PROMPT, "-n", 2, "--timing", "--stats-json", s.tmp / "stats.json")
    assert json.loads((s.tmp / "stats.json").read_text())
    # README's chat in the terminal: turns piped in, -sys, --timing's per-turn line.
    r = s.infer("-m", DEMO, "-cnv", "-sys", "You are terse.", "-n", 4, "--timing", stdin="Hello\nTell me more\n",
                free_text=True)
    assert "chat: turn 2:" in r.stderr


@case("bin/infer --gpu")
def _infer_gpu(s):
    """docs/gpu.md's GPU pass on the demo model, with look-ahead; needs a GPU."""
    if not _gpu_present():
        pytest.skip("needs a CUDA GPU (none here; scripts/device_gpu.sh runs the GPU suite on the device machine)")
    s.infer("-m", DEMO, "-p", PROMPT, "-n", 4, "--temp", 0, "--gpu")
    s.infer("-m", DEMO, "-p", PROMPT, "-n", 4, "--temp", 0, "--gpu", "--gpu-cache-mb", 8, "--moe-lookahead", 2)
    s.infer("-m", DEMO, "-p", PROMPT, "-n", 4, "--temp", 0, "--gpu", "--gpu-sync-layers")


@case("bin/convert_model")
def _convert(s):
    """A Hugging Face checkpoint (the qwen3_moe fixture) to a packed model, then infer on it."""
    out = s.tmp / "converted"
    r = s.run([s.exe("convert_model"), ROOT / "tests/fixtures/qwen3_moe", out, "--quant", "q8"], quiet_ok=True)
    assert "convert_model: wrote" in r.stderr and "convert: 100%" in r.stderr
    s.infer("-m", out, "--prompt-ids", "1,2,3", "-n", 2, "--print-ids")


@case("bin/cluster_experts")
def _cluster_experts(s):
    """--repack of a packed copy from a routing log (with --prior-out, docs/format.md), and --out of
    a GGUF (README's two forms); cache_sim --prior reads the prior back."""
    log = s.routing_log()
    model = s.copy_demo("demo_repacked")
    prior = s.tmp / "demo.prior"
    r = s.run([s.exe("cluster_experts"), "--routing", log, "--model", model, "--repack", "--prior-out", prior],
              quiet_ok=True)
    assert "maps installed" in r.stderr
    assert prior.stat().st_size == 48 + 4 * 8 * 32
    s.run([s.exe("cache_sim"), "--routing", log, "--experts", 16, "--all-phases", "--foresight-only", "--prior", prior])
    s.infer("-m", model, "-p", PROMPT, "-n", 2, "--temp", 0)
    glog = s.tmp / "gguf_routing.bin"
    s.infer("-m", GGUF, "-p", "Hello there", "-n", 4, "--temp", 0, "--collect-routing", glog, free_text=True)
    s.run([s.exe("cluster_experts"), "--model", GGUF, "--routing", glog, "--out", s.tmp / "out.gguf"],
          quiet_ok=True)
    s.infer("-m", s.tmp / "out.gguf", "-p", "Hello", "-n", 2, "--temp", 0, free_text=True)


@case("bin/moestream-server")
def _server(s):
    """Started on a free port; the official openai client's completion, chat and streamed chat."""
    openai = pytest.importorskip("openai", reason="the openai package (scripts/setup.sh installs it)")
    proc = subprocess.Popen([s.exe("moestream-server"), "-m", DEMO, "--port", "0", "-t", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://\S+)", line)
        assert m, f"moestream-server did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        client = openai.OpenAI(base_url=m.group(1) + "/v1", api_key="none", timeout=60)
        c = client.completions.create(model="demo", prompt="The river", max_tokens=4, temperature=0)
        assert c.choices[0].text
        chat = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4, temperature=0)
        assert chat.choices[0].message.content is not None
        pieces = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True)
            if ch.choices]
        assert "".join(pieces)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"moestream-server exited {proc.returncode} on SIGTERM"


@case("bin/synth_model")
def _synth(s):
    """A one-layer OLMoE-shaped model (widths scaled down) run with --prompt-ids and --replay-routing."""
    out = s.tmp / "synth"
    r = s.run([s.exe("synth_model"), "--shape", "olmoe-1b-7b", "--layers", 1, "--scale-down", 16,
               "--max-context", 256, "-t", 1, out])
    assert "synth_model: 100%" in r.stderr
    s.infer("-m", out, "--prompt-ids", "1,2,3", "-n", 2, "--print-ids", "-t", 1)
    log = s.tmp / "synth_routing.bin"
    s.infer("-m", out, "--prompt-ids", "1,2,3", "-n", 2, "--print-ids", "-t", 1, "--collect-routing", log)
    s.infer("-m", out, "--prompt-ids", "1,2,3", "-n", 2, "--print-ids", "-t", 1, "--replay-routing", log)


@case("bin/tokenize")
def _tokenize(s):
    """encode, decode (round trip of a sentence) and info on the demo tokenizer."""
    tok = s.exe("tokenize")
    (s.tmp / "in.txt").write_text("The river ran past the mill.\n", encoding="utf-8")
    s.run([tok, "encode", "-t", DEMO / "tokenizer.json", "-i", s.tmp / "in.txt", "-o", s.tmp / "ids.txt",
           "--no-special"], quiet_ok=True)
    assert (s.tmp / "ids.txt").read_text().strip()
    r = s.run([tok, "decode", "-t", DEMO / "tokenizer.json", "-i", s.tmp / "ids.txt"])
    assert "The river ran past the mill." in r.stdout
    s.run([tok, "info", "-t", DEMO / "tokenizer.json"])


@case("bin/render_chat_template")
def _render(s):
    """docs/server.md: the demo's chat template for a one-message context on stdin."""
    ctx = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True})
    r = s.run([s.exe("render_chat_template"), "--config", DEMO / "tokenizer_config.json"], stdin=ctx)
    assert "Hi" in r.stdout


# --- bench programs ---

@case("bin/bench_io")
def _bench_io(s):
    """An 8 MiB file, page cache and O_DIRECT, no block sweeps, a fraction of a second a cell."""
    s.run([s.exe("bench_io"), "--file", s.tmp / "io.bin", "--size-mb", 8, "--seconds", 0.05, "--no-sweep",
           "--json", s.tmp / "io.json"])


@case("bin/cpu_decode")
def _cpu_decode(s):
    """A 1-layer, 8-expert, 256-wide model: one run of 2 tokens."""
    s.run([s.exe("cpu_decode"), "--layers", 1, "--experts", 8, "--top-k", 2, "--hidden", 256, "--ffn", 128,
           "--heads", 4, "--kv-heads", 2, "--head-dim", 64, "--vocab", 512, "--tokens", 2, "--reps", 1, "-t", 1])


@case("bin/cache_sim")
def _cache_sim(s):
    """The policies on a short demo routing log, a few capacities."""
    s.run([s.exe("cache_sim"), "--routing", s.routing_log(), "--experts", 16, 64, "--all-phases"])


@case("bin/cluster_replay")
def _cluster_replay(s):
    """Cold replay of a routing log on the demo model (bench/cluster.sh runs it too)."""
    s.run([s.exe("cluster_replay"), "--model", DEMO, "--routing", s.routing_log(), "--max-tokens", 8,
           "--buffered", "--io", "pread"])


@case("bin/bench_quant_accuracy")
def _quant_accuracy(s):
    """One small matrix."""
    s.run([s.exe("bench_quant_accuracy"), "--rows", 64, "--cols", 256])


@case("bin/bench_residency")
def _residency(s):
    """A few residency queries of the demo model."""
    s.run([s.exe("bench_residency"), "-m", DEMO, "--reps", 2, "--host-cache-mb", 8])


@case("bin/bench_ggml_matvec")
def _ggml_matvec(s):
    """One small shape, one round."""
    s.run([s.exe("bench_ggml_matvec"), "--shape", "64x256", "--rounds", 1, "--stream-mib", 1, "--batch", 2])


@case("bin/bench_ggml_kquants_matvec")
def _ggml_kquants(s):
    """One repetition of short samples."""
    s.run([s.exe("bench_ggml_kquants_matvec"), "--reps", 1, "--sample-ms", 1, "--inputs", 2])


@case("bin/bench_sampler")
def _sampler(s):
    """A small vocabulary, one round of two draws."""
    s.run([s.exe("bench_sampler"), "--vocab", 4096, "--rounds", 1, "--draws", 2])


@case("bin/bench_constrained_decode")
def _constrained_decode(s):
    """One round of 8 tokens on the demo, unconstrained and under the schema."""
    r = s.run([s.exe("bench_constrained_decode"), "-m", DEMO, "--tokens", 8, "--rounds", 1])
    assert "median per-round ratio" in r.stdout


@case("scripts/xgrammar_source.sh")
def _xgrammar_source(s):
    """Idempotent: the sources scripts/setup.sh unpacked are found (nothing fetched again)."""
    s.run(["bash", "scripts/xgrammar_source.sh"])
    assert (ROOT / ".deps" / "xgrammar-0.2.8" / "include" / "xgrammar" / "xgrammar.h").is_file()


@case("bin/bench_gpu_kernels")
def _gpu_kernels(s):
    """The CUDA kernel benchmark; needs a GPU."""
    if not _gpu_present():
        pytest.skip("needs a CUDA GPU (none here; scripts/device_kernels.sh runs it on the device machine)")
    s.run([s.exe("bench_gpu_kernels")], timeout=300)


skipped("bin/fuzz_chat_template", CI_JOB, "libFuzzer targets are built and run by scripts/fuzz.sh (the fuzz job)")
skipped("bin/reference_test", CI_JOB, "a unit test: ctest runs it in this job")
skipped("bin/gpu_mla_test", DEVICE, "a GPU unit test: ctest builds it here, the device machine runs it")
skipped("bin/gpu_forward_test", DEVICE, "a GPU unit test: ctest builds it here, the device machine runs it")
skipped("bin/gpu_batch_test", DEVICE, "a GPU unit test: ctest builds it here, the device machine runs it")


# --- bench scripts ---

@case("bench/cluster.sh")
def _cluster_sh(s):
    """Without data/corpus/train.txt (the held-out branch), small slices, one replay round, the raw
    device only (EMULATE=0: the throttled volume needs root and a cgroup io/blkio controller;
    scripts/with_io_throttle.sh's case checks that)."""
    r = s.run(["bash", "bench/cluster.sh", s.build, s.tmp / "cluster"], timeout=300,
              env=dict(TRAIN_BYTES="20000", HELDOUT_BYTES="8000", REPLAY_TOKENS="50", ROUNDS="1", EMULATE="0",
                       SEARCH_MOVES="2000"), quiet_ok=True)
    assert "cold decode reads, raw device" in r.stdout and "clustered+profile" in r.stdout, r.stdout


@case("bench/gpu_cache_trace.sh")
def _gpu_cache_trace(s):
    """Two generations of 4 tokens into a routing log (the log cache_sim replays; CPU only)."""
    out = s.tmp / "trace.bin"
    s.run(["bash", "bench/gpu_cache_trace.sh", s.build, out, 2, 4], quiet_ok=True)
    assert out.stat().st_size > 0


@case("bench/io_e2e.sh")
def _io_e2e(s):
    """A 1-layer, 8-expert synthetic model, 2 tokens per --io mode, no memory cap."""
    r = s.run(["bash", "bench/io_e2e.sh"], timeout=300, env=dict(
        BIN=str(s.bin), MODEL_ROOT=str(s.tmp / "e2e"), OUT_DIR=str(s.tmp / "e2e_out"), LAYERS="1",
        EXPERTS="8", HIDDEN="256", FFN="128", TOPK="2", HOST_CACHE_MB="1", N_TOKENS="2", THREADS="1",
        MEM_CAP_MB="off"))
    assert "same tokens from every run: yes" in r.stdout


@case("bench/decode.py")
def _decode_py(s):
    """A one-layer OLMoE shape scaled down, 2 tokens, the engine and mmap, a short I/O probe, a short
    demo routing log as both traces (capped by a cgroup where the machine can)."""
    log = s.routing_log()
    r = s.run([sys.executable, "bench/decode.py", "--bin", s.bin, "--work", s.tmp / "decode", "--layers", 1,
               "--scale-down", 16, "--cap-mb", 1, "--tokens", 2, "--methods", "mmap,engine",
               "--io-bench-mb", 8, "--io-bench-seconds", 0.05, "--trace-train", log, "--trace-heldout", log,
               "--cluster-tokens", 8, "--threads", 1, "--json", s.tmp / "decode.json"], timeout=300)
    assert "tok/s" in r.stdout and json.loads((s.tmp / "decode.json").read_text())["runs"]


@case("bench/ab.py")
def _ab(s):
    """The same build as A and B on the demo model: one round, two prompt lengths, 2 tokens."""
    r = s.run([sys.executable, "bench/ab.py", "--a", s.exe("infer"), "--b", s.exe("infer"), "-m", DEMO,
               "--prompt-tokens", "3,6", "--tokens", 2, "--threads", 1, "--rounds", 1])
    assert r.stdout.count("| prefill |") == 2 and r.stdout.count("| decode |") == 2, r.stdout
    # One build on two models (here the same one twice) with token-id prompts, as for synth_model's.
    r = s.run([sys.executable, "bench/ab.py", "--a", s.exe("infer"), "--b", s.exe("infer"), "-m", DEMO,
               "--model-b", DEMO, "--ids", "--prompt-tokens", "5", "--tokens", 2, "--threads", 1, "--rounds", 1])
    assert "| 5 | prefill |" in r.stdout and "| 5 | decode |" in r.stdout, r.stdout


@case("bench/report.py")
def _report(s):
    """The I/O, device-decode and hit-rate sections, tiny, into a copy of docs/results.md."""
    results = s.tmp / "results.md"
    shutil.copy(ROOT / "docs" / "results.md", results)
    s.run([sys.executable, "bench/report.py", "--bin", s.bin, "--work", s.tmp / "report", "--results", results,
           "--figures", s.tmp / "figures", "--sections", "io,decode_device,hit_rates", "--io-mb", 24,
           "--trace-prompts", 1, "--trace-tokens", 4], timeout=300, quiet_ok=True)
    assert results.read_text() != (ROOT / "docs" / "results.md").read_text()
    assert list((s.tmp / "figures").glob("*.png"))


@case("bench/cache_aware.py")
def _cache_aware(s):
    """One host-cache budget, two tolerances, short perplexity and decode."""
    r = s.run([sys.executable, "bench/cache_aware.py", "--bin", s.bin, "--budgets-mb", 4, "--tolerances", "0,0.1",
               "--ppl-chars", 400, "--ctx", 64, "--prompt-chars", 80, "--n-decode", 4, "--threads", 2,
               "--out", s.tmp / "cache_aware"], timeout=300)
    assert "|" in r.stdout


@case("bench/tokenizer.py")
def _tokenizer_py(s):
    """A 50 kB mixed corpus, ours and Hugging Face tokenizers."""
    pytest.importorskip("tokenizers", reason="the tokenizers package (scripts/setup.sh installs it)")
    s.run([sys.executable, "bench/tokenizer.py", "--bin", s.bin, "--mb", 0.05], timeout=300)


@case("bench/server/bench_server.py")
def _bench_server(s):
    """One client, one request, the warm rounds and a 2-turn chat, 2 tokens each."""
    r = s.run([sys.executable, "bench/server/bench_server.py", "--exe", s.exe("moestream-server"),
               "--clients", 1, "--requests", 1, "--max-tokens", 2, "--turns", 2, "--server-args", "-t 1"],
              timeout=300)
    assert "|" in r.stdout


@case("bench/server/bench_constrained.py")
def _bench_constrained(s):
    """One interleaved round of 8 tokens against its own server."""
    r = s.run([sys.executable, "bench/server/bench_constrained.py", "--exe", s.exe("moestream-server"),
               "--tokens", 8, "--rounds", 1], timeout=300)
    assert "constrained/unconstrained" in r.stdout


@case("bench/server/bench_streams.py")
def _bench_streams(s):
    """1 and 2 concurrent streams (--parallel 1 and 2), one round of 2 tokens, the JSON written."""
    out = s.tmp / "streams.json"
    r = s.run([sys.executable, "bench/server/bench_streams.py", "--exe", s.exe("moestream-server"),
               "--streams", "1,2", "--rounds", 1, "--max-tokens", 2, "--warmup-tokens", 1,
               "--server-args", "-t 1", "--json", out], timeout=300)
    rows = json.loads(out.read_text())["medians"]["moestream"]
    assert [r["streams"] for r in rows] == [1, 2] and "| streams |" in r.stdout


@case("bench/server/bench_union.py")
def _bench_union(s):
    """Two streams of held-out prompts, one tolerance plain and with the union, 2 tokens, JSON written."""
    out = s.tmp / "union.json"
    r = s.run([sys.executable, "bench/server/bench_union.py", "--exe", s.exe("moestream-server"),
               "--model", DEMO, "--parallel", 2, "--tolerances", 0.5, "--rounds", 1, "--max-tokens", 2,
               "--warmup-tokens", 1, "--server-args", "-t 1 --io-direct", "--json", out], timeout=300)
    rounds = json.loads(out.read_text())["rounds"]
    assert len(rounds["union, tol 0.5"]) == 1 and "| union, tol 0.5 |" in r.stdout


@case("bench/gguf_oracle.py")
def _gguf_oracle(s):
    """Against the committed llama.cpp outputs of two fixtures (Q8_0, mixed k-quants): no llama.cpp."""
    pytest.importorskip("moestream", reason="the moestream module (PYTHONPATH=build/python)")
    fixtures = s.tmp / "gguf"
    fixtures.mkdir()
    for name in ("qwen3moe-tiny-Q8_0", "qwen3moe-k-mixed"):
        for ext in (".gguf", ".json"):
            (fixtures / (name + ext)).symlink_to(GGUF.parent / (name + ext))
    r = s.run([sys.executable, "bench/gguf_oracle.py", fixtures], timeout=300)
    assert r.stdout.count("| qwen3moe") == 2, r.stdout


@case("bench/gguf_deepen.py")
def _gguf_deepen(s):
    """The Q8_0 fixture grown to 5 layers; infer runs it in place."""
    pytest.importorskip("gguf", reason="the gguf package (scripts/setup.sh installs it)")
    out = s.tmp / "deep5.gguf"
    s.run([sys.executable, "bench/gguf_deepen.py", GGUF, out, "--layers", 5], timeout=120, quiet_ok=True)
    s.run([s.bin / "infer", "-m", out, "-p", "hello", "-n", 4, "--temp", 0], timeout=120, free_text=True)


skipped("bench/gguf_llama.py", LLAMA, "moestream against llama.cpp on a Qwen3-30B-A3B-shaped GGUF")
skipped("bench/peer.py", LLAMA, "moestream against llama.cpp on the same Qwen3-30B-A3B-shaped weights (issue 19)")
skipped("scripts/check_chat_templates.py", LLAMA,
        "real chat templates from llama.cpp's source cache against transformers (a dev check)")


# --- scripts ---

def check_or_skip(script, *args, missing):
    """Runs `script --check ARGS`; skips the test (naming `missing` and the reason) on exit 3."""
    r = subprocess.run(["bash", script, "--check", *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.stdout.strip(), f"{script} --check printed nothing"
    if r.returncode == 3:
        assert r.stdout.startswith("unavailable: ")
        pytest.skip(f"no {missing} on this machine: {r.stdout.strip()}")
    assert r.returncode == 0, f"{script} --check exited {r.returncode}: {r.stdout}{r.stderr}"


@case("scripts/options_doc.py")
def _options_doc(s):
    """--check: docs/options.md is what the option table makes (through infer's and the server's
    --help-markdown)."""
    s.run([sys.executable, "scripts/options_doc.py", "--check"], quiet_ok=True)


@case("scripts/with_memory_cap.sh")
def _memory_cap(s):
    """--check; where a cgroup memory controller is writable, a capped `true` too."""
    check_or_skip("scripts/with_memory_cap.sh", missing="memory cap")
    s.run(["bash", "scripts/with_memory_cap.sh", 256, "--", "echo", "capped"])


@case("scripts/with_io_throttle.sh")
def _io_throttle(s):
    """--check on the repository's disk; where a cgroup can throttle it, a throttled `echo` too."""
    check_or_skip("scripts/with_io_throttle.sh", ROOT, missing="I/O throttle")
    r = s.run(["bash", "scripts/with_io_throttle.sh", 3000, 250000000, ROOT, "--", "echo", "throttled"], quiet_ok=True)
    assert "throttled" in r.stdout


skipped("scripts/device_cluster_iops.sh", DEVICE, "runs on the device machine (docs/results.md, issue 23)")


@case("scripts/demo.sh")
def _demo_sh(s):
    """In the build this test runs from (setup finds everything installed; infer is up to date)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (scripts/setup.sh may apt-get install)")
    cache = s.build / "CMakeCache.txt"
    home = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(), re.M) if cache.exists() else None
    if not home or pathlib.Path(home.group(1)).resolve() != ROOT:
        pytest.skip(f"{s.build} is not a CMake build directory of this checkout (demo.sh reconfigures it)")
    r = s.run(["bash", "scripts/demo.sh", "--temp", "0"], env=dict(BUILD_DIR=str(s.build), N_TOKENS="4"),
              timeout=300)
    assert "all dependencies present" in r.stdout


skipped("scripts/setup.sh", COVERED, "scripts/demo.sh's case runs it (and scripts/test.sh before this test)")


@case("scripts/same_tokens.sh")
def _same_tokens(s):
    """This build against itself, 2 tokens a case (docs/architecture.md's refactor check)."""
    s.run(["bash", "scripts/same_tokens.sh", s.bin, s.bin], env=dict(N="2", OUT_DIR=str(s.tmp / "same")),
          timeout=300)


@case("scripts/same_tokens_families.sh")
def _same_tokens_families(s):
    """This build against itself on every family's fixture, 2 tokens a case."""
    s.run(["bash", "scripts/same_tokens_families.sh", s.bin, s.bin], env=dict(N="2"), timeout=600)


skipped("scripts/test.sh", CI_JOB, "the test job itself (this test runs inside it)")
skipped(".ci/run", CI_JOB, "CI's entry point: runs scripts/test.sh (this job) and the others")
skipped("scripts/sanitize.sh", CI_JOB, "the asan and tsan jobs of .ci/run")
skipped("scripts/fuzz.sh", CI_JOB, "the fuzz job of .ci/run")
for _name in ("build", "decode", "deps", "env", "gguf", "gguf_bench", "gpu", "gpu_graphs", "gpu_resident", "gpu_tests", "tree", "io_bench", "io_hot", "kernels",
              "same_tokens", "verify_overlap", "kernel_profile", "kernel_detail", "gpu_cpu_misses", "ab"):
    skipped(f"scripts/device_{_name}.sh", DEVICE, "runs on the device machine (docs/gpu.md, docs/results.md)")
skipped("scripts/device_peer.sh", DEVICE, "runs on the GPU device machine (docs/testing.md)")
skipped("scripts/device_fixtures.sh", DEVICE,
        "makes transformers fixtures on the device machine (torch; transformers 5.23 from carried wheels)")
skipped("scripts/llama_cpp_tool.sh", LLAMA, "downloads and builds llama.cpp (~23 min, outside the repository)")
skipped("scripts/make_gguf_fixtures.py", LLAMA, "rebuilds tests/fixtures/gguf with llama.cpp and torch")
skipped("scripts/gen_tokenizer_unicode.py", ONE_OFF,
        "regenerates runtime/tokenizer/unicode_ranges.h from unicodedata2 16.0 and Unicode 9.0 tables")
skipped("scripts/gen_ggml_iquant_grids.py", COVERED,
        "test_ggml_kquants.py::test_grid_headers_match_the_gguf_package runs its --check")

# --- Python: package, examples, training ---

@case("python example in README.md")
def _readme_python(s):
    """README's ```python block, verbatim, in a scratch directory holding a link to models/."""
    pytest.importorskip("moestream", reason="the moestream module (PYTHONPATH=build/python)")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert block, "README.md has no ```python block"
    work = s.tmp / "readme_example"
    work.mkdir()
    (work / "models").symlink_to(ROOT / "models")
    (work / "example.py").write_text(block.group(1), encoding="utf-8")
    s.run([sys.executable, "example.py"], cwd=work, timeout=300)
    # README's check of the CMake build's package (PYTHONPATH as scripts/test.sh sets it)
    s.run([sys.executable, "-c", "import moestream; print(moestream.__file__)"], cwd=work)


skipped("python/examples/routing_analysis.py", COVERED,
        "test_bindings.py::test_routing_analysis_example_writes_pngs runs it")


@case("bench/cache_policy.sh")
def _cache_policy(s):
    """The whole issue-23 policy comparison on the demo (traces of 32 x 256 tokens, two perplexity
    runs at --batch 1, four cache_sim tables: most of an hour on two cores)."""
    if os.environ.get("MOESTREAM_SMOKE_SLOW") != "1":
        pytest.skip(f"{SLOW}: decode and perplexity traces of the demo, then four cache_sim tables")
    out = s.tmp / "policy"
    s.run(["bash", "bench/cache_policy.sh", DEMO, out, s.build], timeout=7200, quiet_ok=True)
    for t in ("decode", "ppl", "decode_prior", "ppl_prior"):
        assert "Belady" in (out / f"{t}.md").read_text()


skipped("scripts/device_train.sh", DEVICE, "trains a model on the GPU device machine (docs/demo_model.md)")


@case("pip install ./python")
def _pip_install(s):
    """In a fresh venv (a whole build of the project: minutes)."""
    if os.environ.get("MOESTREAM_SMOKE_SLOW") != "1":
        pytest.skip(f"{SLOW}: builds the whole project again in a fresh venv")
    venv = s.tmp / "venv"
    s.run([sys.executable, "-m", "venv", "--system-site-packages", venv], quiet_ok=True)
    s.run([venv / "bin" / "pip", "install", "-q", "./python"], timeout=3600, quiet_ok=True)
    s.run([venv / "bin" / "python", "-c", "import moestream; print(moestream.Model)"], cwd=s.tmp)


@case("python/training/routing_stats.py")
def _routing_stats(s):
    """On small random traces in train_moe.py's format (docs/demo_model.md's last training step)."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    for name in ("heldout", "train"):
        experts = np.stack([np.stack([rng.choice(32, 4, replace=False) for _ in range(8)]) for _ in range(64)])
        np.savez(s.tmp / f"routing_{name}.npz", experts=experts.astype(np.uint8),
                 tokens=np.arange(64, dtype=np.uint16), window=np.int64(32), source="smoke")
    s.run([sys.executable, "python/training/routing_stats.py", "--heldout", s.tmp / "routing_heldout.npz",
           "--train", s.tmp / "routing_train.npz", "--n-experts", 32, "--out", s.tmp], timeout=300)


skipped("python/training/build_corpus.sh", DOWNLOAD, "downloads the Debian packages of the demo corpus")
skipped("python/training/clean_corpus.py", DOWNLOAD,
        "needs the unpacked corpus packages (build_corpus.sh); test_demo_training.py tests its cleaners")
skipped("python/training/train_tokenizer.py", DOWNLOAD, "trains on data/corpus/train.txt (build_corpus.sh)")
skipped("python/training/tokenize_corpus.py", DOWNLOAD, "tokenises data/corpus (build_corpus.sh)")
skipped("python/training/train_moe.py", DEVICE, "trains the demo model with torch on a GPU")
skipped("python/training/eval_perplexity.py", DEVICE, "transformers on a CUDA GPU")
skipped("python/training/make_fixtures.py", DEVICE, "torch and transformers >= 5")
skipped("python/training/arch_sweep_b.py", DEVICE, "torch and transformers >= 5 (a config sweep, dev tool)")
skipped("python/training/arch_sweep.py", DEVICE, "torch and transformers >= 5 (a dev tool: docs/testing.md)")


# ---------------------------------------------------------------------------------------------
# The tests.

def test_every_documented_command_has_a_smoke_case():
    missing = [f"{rel}:{n}: `{key}` ({line[:120]})" for rel, n, line, key in all_documented_commands()
               if key not in CASES]
    assert not missing, (
        "documented commands without a smoke case; add each to CASES in tests/python/test_docs_smoke.py "
        "(a run with the smallest settings, or skipped() with the reason):\n  " + "\n  ".join(missing))


def test_the_scanner_finds_each_kind_of_command():
    exes = {"infer", "new_tool"}
    doc = "\n".join([
        "Run `build/bin/new_tool --x` or `new_tool -y`; prose mentions bench/new_bench.py too.",
        "```sh", "$ FOO=1 bash scripts/new_script.sh arg", "(cd python/x && python3 ../../python/x/run.py)",
        "new_tool --help", "pip install ./python", "curl -s http://localhost:8080/health", "```",
        "```python", "import moestream", "```",
        "`infer` alone, `scripts/helper.cpp` is a source file, `tokenizer.json` no command."])
    found = [(n, key) for n, _, key in documented_commands("x.md", doc, exes)]
    assert found == [(1, "bin/new_tool"), (1, "bench/new_bench.py"), (3, "scripts/new_script.sh"),
                     (4, "python/x/run.py"), (5, "bin/new_tool"), (6, "pip install ./python"), (7, "curl"),
                     (9, "python example in x.md"), (12, "bin/infer")]


@pytest.mark.parametrize("key", sorted(CASES))
def test_documented_command_runs(key, tmp_path):
    c = CASES[key]
    if c.skip:
        pytest.skip(c.skip)
    t0 = time.monotonic()
    c.run(Smoke(tmp_path))
    # Not an assertion (no wall-clock checks in tests): printed with -rA or on failure.
    print(f"{key}: {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":  # prints the table: each command, what its case does, where the docs name it
    where = {}
    for rel, n, _, key in all_documented_commands():
        where.setdefault(key, []).append(f"{rel}:{n}")
    for key in sorted(set(CASES) | set(where)):
        c = CASES.get(key)
        what = "NO CASE" if c is None else (c.skip if c.skip else "run: " + " ".join(c.why.split()))
        places = where.get(key, ["(not in the docs)"])
        print(f"{key}\n    {what}\n    {', '.join(places[:6])}{' ...' if len(places) > 6 else ''}")
