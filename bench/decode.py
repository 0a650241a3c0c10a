#!/usr/bin/env python3
"""bench/decode: decode tokens/s of a real-shape synthetic model larger than its memory cap, for
--io mmap (page faults, llama.cpp's way), naive pread (one blocking pread per expert) and the
engine (io_uring, O_DIRECT, host cache, clustered layout), each beside its I/O-bound limit:
device bandwidth (bench_io, same run, same filesystem) / device bytes read per token.

Routing is replayed (infer --replay-routing) from a real routing log, so the I/O pattern is real
routing while the arithmetic runs on random weights. The memory cap is a cgroup memory limit (v2 or v1)
(scripts/with_memory_cap.sh) where the machine allows it; otherwise the engine is capped by
O_DIRECT + its host-cache budget and the buffered methods run uncapped (said in every output).

  python3 bench/decode.py --bin build/bin --work /var/tmp/decode --shape olmoe-1b-7b \
      --cap-mb 1024 --tokens 48 --json docs/figures/decode.json
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

from page_cache import drop_file_cache, warm_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAP_SCRIPT = os.path.join(ROOT, "scripts", "with_memory_cap.sh")


def log(msg):
    print(f"decode: {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


def run_rusage(cmd):
    """Runs cmd; returns (exit status, seconds, bytes the process tree read from storage)."""
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    # ru_inblock counts 512-byte blocks read from storage by the task and its waited-for
    # children (Linux task I/O accounting: page-cache misses, readahead and O_DIRECT alike).
    return p.returncode, time.monotonic() - t0, ru.ru_inblock * 512, err


def model_files(model):
    d = os.path.join(model, "experts")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("layer_"))


def kv_bytes_per_token(cfg):
    """float32 KV cache bytes one position holds over all layers: per-head keys and values, or
    with MLA (DeepSeek-V2/V3, Kimi K2) the latent and the shared RoPE key (docs/mla.md)."""
    mla = cfg.get("mla")
    if mla:
        return cfg["n_layers"] * (mla["kv_lora_rank"] + mla["qk_rope_head_dim"]) * 4
    return 2 * cfg["n_layers"] * cfg["n_kv_heads"] * cfg["head_dim"] * 4


def mha_kv_bytes_per_token(cfg):
    """What per-head keys and values would take for an MLA model: H x (nope + rope) keys and
    H x v values per layer (docs/mla.md compares the two)."""
    mla = cfg["mla"]
    per_head = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] + mla["v_head_dim"]
    return cfg["n_layers"] * cfg["n_heads"] * per_head * 4


def dense_ram_bytes(cfg, model, ctx, gpu_host_mb=None):
    """RAM the model holds besides experts. The CPU path computes from the dense file's mapped
    pages in their stored type (runtime/model/dense_weights.h: bf16, f32 or ggml), so its size,
    plus the float32 KV cache; on the GPU path (gpu_host_mb given) the dense weights stream to the
    GPU and KV lives there, leaving the CUDA context and pinned staging: gpu_host_mb."""
    if gpu_host_mb is not None:
        return gpu_host_mb << 20
    dense = os.path.getsize(os.path.join(model, cfg["dense"]["file"]))
    return dense + ctx * kv_bytes_per_token(cfg)


def cap_mode():
    r = subprocess.run(["bash", CAP_SCRIPT, "--check"], capture_output=True, text=True)
    return r.returncode == 0, r.stdout.strip()


def io_bandwidth(bin_dir, work, expert_bytes, top_k, size_mb, seconds):
    """Device bandwidth for expert-sized reads: bench_io's 'limit' rows (64 experts in flight,
    O_DIRECT) on a file in the same directory as the model, best engine."""
    out = os.path.join(work, "bench_io.json")
    run([os.path.join(bin_dir, "bench_io"), "--file", os.path.join(work, "bench_io.bin"),
         "--size-mb", str(size_mb), "--expert-bytes", str(expert_bytes), "--top-k", str(top_k),
         "--no-page-cache", "--seconds", str(seconds), "--blocks", "1M", "--json", out],
        stdout=subprocess.DEVNULL)
    j = json.load(open(out))
    rows = [c for c in j.get("expert", []) if c.get("cache") == "device"]
    limit = [c for c in rows if c.get("section") == "limit"] or rows
    best = max(limit, key=lambda c: c["gbps"])
    return best["gbps"] * 1e9, best["engine"], j


def ensure_model(args):
    name = f"{args.shape}_L{args.layers or 'all'}_{args.quant}"
    if args.scale_down > 1:
        name += f"_s{args.scale_down}"
    model = os.path.join(args.work, name)
    if not os.path.exists(os.path.join(model, "model.json")):
        cmd = [os.path.join(args.bin, "synth_model"), "--shape", args.shape, "--quant", args.quant,
               "--max-context", "4096", "-q", model]
        if args.layers:
            cmd[3:3] = ["--layers", str(args.layers)]
        if args.scale_down > 1:
            cmd[3:3] = ["--scale-down", str(args.scale_down)]
        run(cmd)
    return model


def ensure_demo_traces(args):
    """Routing logs of the trained demo model (real routing): train (for clustering) and held-out
    (replayed while decoding), as bench/cluster.sh collects them."""
    demo = os.path.join(ROOT, "models", "demo")
    train, held = os.path.join(args.work, "demo_train.bin"), os.path.join(args.work, "demo_heldout.bin")
    infer = os.path.join(args.bin, "infer")
    if not os.path.exists(train):
        text = os.path.join(args.work, "demo_train.txt")
        with open(os.path.join(demo, "heldout.txt"), "rb") as f:
            f.seek(200000)
            open(text, "wb").write(f.read(args.train_bytes))
        run([infer, "-m", demo, "--perplexity", text, "--ctx", "512", "--stride", "512",
             "--collect-routing", train + ".tmp"], stdout=subprocess.DEVNULL)
        os.replace(train + ".tmp", train)
    if not os.path.exists(held):
        run([infer, "-m", demo, "--perplexity", os.path.join(demo, "heldout_head.txt"), "--ctx", "512",
             "--stride", "512", "--collect-routing", held + ".tmp"], stdout=subprocess.DEVNULL)
        os.replace(held + ".tmp", held)
    return train, held


def ensure_clustered(args, model, train_trace, io_json):
    """Maps the train trace onto the model (a replayed prefill with --collect-routing), then
    cluster_experts orders and repacks the layer files in place (all methods read this layout)."""
    mark = os.path.join(model, "clustered.json")
    if os.path.exists(mark):
        return json.load(open(mark))
    mapped = os.path.join(args.work, os.path.basename(model) + "_train.bin")
    if os.path.exists(mapped):
        os.remove(mapped)
    ids = ",".join(str(1 + i % 50) for i in range(args.cluster_tokens))
    run([os.path.join(args.bin, "infer"), "-m", model, "--replay-routing", train_trace,
         "--prompt-ids", ids, "-n", "1", "--print-ids", "--no-verify", "-t", str(args.threads),
         "--ctx", str(args.cluster_tokens + 8), "--collect-routing", mapped], stdout=subprocess.DEVNULL)
    # Prices from bench_io's device profile, reads planned by the fixed rule: the decode runs
    # read without --io-profile, so the layout is planned as they read.
    prof = json.load(open(io_json))["profile"]
    out = run([os.path.join(args.bin, "cluster_experts"), "--routing", mapped, "--model", model,
               "--method", "seriation", "--repack", "--json",
               "--op-latency-us", str(prof["op_latency_us"]), "--bandwidth-gbps", str(prof["bandwidth_gbps"])],
              capture_output=True, text=True).stdout
    summary = json.loads(out)
    open(mark, "w").write(json.dumps(summary))
    return summary


def decode_run(args, model, method, held_trace, expert_cap_mb, capped, ram_bytes, stats_path):
    infer = os.path.join(args.bin, "infer")
    full_method = method
    method, _, lookahead = method.partition("+la")  # engine+la8: the engine with --moe-lookahead 8
    cmd = [infer, "-m", model, "--replay-routing", held_trace, "--prompt-ids", "1", "-n",
           str(args.tokens), "--temp", "0", "--ignore-eos", "--print-ids", "-t", str(args.threads),
           "--ctx", str(args.tokens + 8), "--stats-json", stats_path]
    cmd += shlex.split(args.infer_args)
    if lookahead:  # N, or Nr: predicted from the replayed log (a perfect predictor, the upper bound)
        cmd += ["--moe-lookahead", lookahead.rstrip("r")]
        if lookahead.endswith("r"):
            cmd += ["--lookahead-replayed"]
    if method == "warm":  # every expert in the page cache: the compute-bound speed, no I/O
        cmd += ["--io", "pread"]
    elif method == "mmap":
        cmd += ["--io", "mmap"]
    elif method == "pread":
        cmd += ["--io", "simple"]
    elif method == "engine_buffered":
        cmd += ["--io", "uring"]
    else:
        cmd += ["--io", "uring", "--io-direct", "--host-cache-mb", str(expert_cap_mb)]
    limit_mb = None
    if capped and method not in ("warm", "engine_buffered"):
        # memory.max covers what the model holds anyway (dense f32, KV) plus the expert budget.
        limit_mb = expert_cap_mb + ram_bytes // (1 << 20) + args.slack_mb
        cmd = ["bash", CAP_SCRIPT, str(limit_mb), "--"] + cmd
    for f in model_files(model):
        warm_file(f) if method == "warm" else drop_file_cache(f)
    warm_file(os.path.join(model, "dense.safetensors"))  # loading is not what is measured
    rc, wall, dev_bytes, err = run_rusage(cmd)
    if rc != 0:
        raise SystemExit(f"decode: {method} run failed ({rc}):\n{err[-3000:]}")
    st = json.load(open(stats_path))
    assert st.get("routing") == "replay", "infer did not replay the routing"
    dec = st["decode"]
    tokens = 1 + dec["tokens"]  # the 1-token prompt reads experts too
    source = "rusage"
    if dev_bytes == 0 and method != "warm":
        # Some sandboxes (gVisor) report no block I/O: fall back to the store's own count of
        # bytes read, exact for O_DIRECT, an upper bound for buffered reads (page-cache hits).
        dev_bytes = st.get("experts", {}).get("bytes_read", 0)
        source = "store counters (rusage reported no block reads)"
    return {"method": full_method, "cap_mb": expert_cap_mb, "memory_max_mb": limit_mb,
            "lookahead": st.get("experts", {}).get("lookahead") if lookahead else None,
            "tokens_per_s": dec["tokens_per_s"], "decode_tokens": dec["tokens"],
            "device_bytes": dev_bytes, "device_bytes_per_token": dev_bytes / tokens,
            "device_bytes_source": source,
            "store_bytes_read_per_token": st.get("decode_experts", {}).get("bytes_read_per_token"),
            "expert_io": st.get("expert_io"), "phases_s": dec.get("phases_s"), "wall_s": wall,
            "routing": st.get("routing_replay")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--work", required=True, help="directory for the model, traces and logs")
    ap.add_argument("--shape", default="olmoe-1b-7b")
    ap.add_argument("--layers", type=int, default=0, help="0 = the shape's")
    ap.add_argument("--quant", default="q4")
    ap.add_argument("--scale-down", type=int, default=1,
                    help="divide the shape's widths by this (synth_model --scale-down): a quick run, not a figure")
    ap.add_argument("--cap-mb", type=int, default=1024, help="expert memory budget (MiB)")
    ap.add_argument("--memory-max-mb", type=int, default=0,
                    help="instead of --cap-mb: the whole process's cap (MiB); the expert budget is "
                         "what is left after dense f32 weights, KV cache and --slack-mb")
    ap.add_argument("--sweep-mb", default="", help="extra engine budgets for tokens/s vs cap, e.g. 256,512,2048")
    ap.add_argument("--tokens", type=int, default=48, help="decode tokens per run")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--methods", default="mmap,pread,engine,warm",
                    help="warm (all experts in the page cache, uncapped: the compute-bound speed) "
                         "runs only when the model fits in half the available RAM; without a cgroup "
                         "cap engine_buffered (io_uring on the uncapped page cache) is added")
    ap.add_argument("--trace-train", help="routing log to cluster from (default: the demo model's)")
    ap.add_argument("--trace-heldout", help="routing log replayed while decoding (default: demo's)")
    ap.add_argument("--train-bytes", type=int, default=60000, help="demo text for the train trace")
    ap.add_argument("--cluster-tokens", type=int, default=256, help="replayed tokens to cluster from")
    ap.add_argument("--io-bench-mb", type=int, default=2048)
    ap.add_argument("--io-bench-seconds", type=float, default=0.5, help="bench_io's time per cell")
    ap.add_argument("--slack-mb", type=int, default=384, help="memory.max headroom beyond dense + KV + budget")
    ap.add_argument("--infer-args", default="", help="extra infer flags for every decode run, as one argument: --infer-args=--gpu")
    ap.add_argument("--gpu-host-mb", type=int, default=1024,
                    help="with --infer-args=--gpu: host RAM the GPU path holds (CUDA context, pinned staging)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per cell, interleaved; the median is kept")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--lookahead", default="",
                    help="CPU look-ahead widths, e.g. 8,16,8r: an engine+laN cell each (the engine with "
                         "--moe-lookahead N; Nr adds --lookahead-replayed: predicted from the replayed "
                         "log, a perfect predictor), interleaved with the others; recall below the table")
    args = ap.parse_args()
    args.threads = args.threads or os.cpu_count()
    os.makedirs(args.work, exist_ok=True)
    args.work = os.path.abspath(args.work)

    capped, cap_text = cap_mode()
    log(f"memory cap: {cap_text}")
    model = ensure_model(args)
    cfg = json.load(open(os.path.join(model, "model.json")))
    expert_files = model_files(model)
    expert_bytes_total = sum(os.path.getsize(f) for f in expert_files)
    model_bytes = expert_bytes_total + os.path.getsize(os.path.join(model, "dense.safetensors"))
    with open(expert_files[0], "rb") as f:
        expert_bytes = int.from_bytes(f.read(40)[32:40], "little")
    bw, bw_engine, io_json = io_bandwidth(args.bin, args.work, expert_bytes, cfg["n_experts_per_tok"],
                                          args.io_bench_mb, args.io_bench_seconds)
    log(f"device bandwidth {bw / 1e9:.2f} GB/s ({bw_engine}, expert-sized O_DIRECT reads)")
    train, held = args.trace_train, args.trace_heldout
    if not train or not held:
        dt, dh = ensure_demo_traces(args)
        train, held = train or dt, held or dh
    cluster = ensure_clustered(args, model, train, os.path.join(args.work, "bench_io.json"))
    gpu = "--gpu" in shlex.split(args.infer_args)
    ram = dense_ram_bytes(cfg, model, args.tokens + 8, args.gpu_host_mb if gpu else None)
    if args.memory_max_mb:
        args.cap_mb = args.memory_max_mb - (ram >> 20) - args.slack_mb
        if args.cap_mb < 64:
            raise SystemExit(f"decode: --memory-max-mb {args.memory_max_mb} leaves no expert budget "
                             f"(dense + KV need {ram >> 20} MiB, slack {args.slack_mb} MiB)")

    with open("/proc/meminfo") as f:
        avail = next(int(l.split()[1]) << 10 for l in f if l.startswith("MemAvailable:"))
    methods = [m for m in args.methods.split(",") if m != "warm" or model_bytes < avail // 2]
    methods += [f"engine+la{int(n.rstrip('r'))}{'r' if n.endswith('r') else ''}"
                for n in args.lookahead.split(",") if n]
    if not capped and "engine" in methods and "engine_buffered" not in methods:
        # Without a cap mmap keeps every expert it touched in the page cache; the engine on the
        # same uncapped page cache (buffered io_uring, no host cache) is the like-for-like pair.
        methods.insert(methods.index("engine") + 1, "engine_buffered")
    sweep_cells = [(m, mb) for mb in [int(x) for x in args.sweep_mb.split(",") if x]
                   for m in (["mmap", "engine"] if capped else ["engine"])]
    cells = [(m, args.cap_mb) for m in methods] + sweep_cells
    # Rounds interleave the cells (a shared machine's load drifts); each cell keeps its median.
    runs = {c: [] for c in cells}
    for rnd in range(args.rounds):
        for m, mb in cells:
            runs[(m, mb)].append(decode_run(args, model, m, held, mb, capped, ram,
                                            os.path.join(args.work, f"stats_{m}_{mb}_{rnd}.json")))
    def median_run(rs):
        r = dict(sorted(rs, key=lambda x: x["tokens_per_s"])[len(rs) // 2])
        r["tokens_per_s_rounds"] = [x["tokens_per_s"] for x in rs]
        return r
    rows = [median_run(runs[c]) for c in cells[:len(methods)]]
    sweep = [median_run(runs[c]) for c in sweep_cells]
    for r in rows + sweep:
        r["io_limit_tokens_per_s"] = (bw / r["device_bytes_per_token"]
                                      if r["method"] != "warm" and r["device_bytes_per_token"] > 0 else None)
        r["fraction_of_limit"] = (r["tokens_per_s"] / r["io_limit_tokens_per_s"]
                                  if r["io_limit_tokens_per_s"] else None)
        # Where the time went: the I/O-bound time of the bytes read, the I/O wait that compute did
        # not hide (below the I/O-bound time when reads overlap compute), and the CPU time per
        # token (the ceiling if I/O were free; on a small shared VM it bounds tokens/s).
        ph, n = r["phases_s"] or {}, max(1, r["decode_tokens"])
        r["io_bound_s_per_token"] = r["device_bytes_per_token"] / bw
        r["io_wait_s_per_token"] = ph.get("expert_io", 0) / n
        r["cpu_s_per_token"] = sum(v for k, v in ph.items() if k != "expert_io") / n

    held = (f"CUDA host memory {ram >> 20} MiB (dense weights and KV on the GPU, none on the host)"
            if gpu else f"dense/KV {ram >> 20} MiB")
    cap_note = (f"cgroup memory limit = budget + {held} + {args.slack_mb} MiB ({cap_text})"
                if capped else
                f"no cgroup memory cap ({cap_text}): the engine is capped by O_DIRECT + a host cache "
                f"of the budget; mmap and pread use the page cache uncapped (dropped before each run)")
    mem_max_mb = args.cap_mb + (ram >> 20) + args.slack_mb if capped else None
    result = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "model": {"dir": model, "shape": args.shape, "layers": cfg["n_layers"], "quant": args.quant,
                  "bytes": model_bytes, "expert_bytes": expert_bytes,
                  "dense_and_kv_ram_bytes": ram, "kv_bytes_per_token": kv_bytes_per_token(cfg)},
        "cap": {"mode": cap_text.split()[0] if capped else "o_direct-host-budget", "budget_mb": args.cap_mb,
                "note": cap_note, "model_over_cap": model_bytes / (args.cap_mb << 20),
                "memory_max_mb": mem_max_mb,
                "model_over_memory_max": model_bytes / (mem_max_mb << 20) if mem_max_mb else None},
        "device_bandwidth_bytes_per_s": bw, "device_bandwidth_engine": bw_engine,
        "routing": rows[0]["routing"] if rows else None,
        "clustering": {k: cluster.get(k) for k in ("geometry", "io_profile") if k in cluster},
        "runs": rows, "sweep": sweep,
    }
    by = {r["method"]: r for r in rows}
    if "engine" in by and "mmap" in by and by["mmap"]["tokens_per_s"]:
        result["engine_over_mmap"] = by["engine"]["tokens_per_s"] / by["mmap"]["tokens_per_s"]
    if "engine_buffered" in by and "mmap" in by and by["mmap"]["tokens_per_s"]:
        result["engine_buffered_over_mmap"] = by["engine_buffered"]["tokens_per_s"] / by["mmap"]["tokens_per_s"]

    print(f"bench/decode: {args.shape}, {cfg['n_layers']} layers, {args.quant}, model "
          f"{model_bytes / 1e9:.2f} GB = {result['cap']['model_over_cap']:.1f}x the {args.cap_mb} MiB budget"
          + (f", {result['cap']['model_over_memory_max']:.1f}x the {mem_max_mb} MiB memory.max" if mem_max_mb else ""))
    print(f"memory cap: {cap_note}")
    print(f"KV cache: {kv_bytes_per_token(cfg)} bytes per token (float32, all layers"
          + (", MLA latent + RoPE key)" if cfg.get("mla") else ", per-head K and V)")
          + (f"; standard attention would keep {mha_kv_bytes_per_token(cfg)}" if cfg.get("mla") else ""))
    print(f"routing: {result['routing']}")
    print(f"device bandwidth: {bw / 1e9:.2f} GB/s (bench_io {bw_engine}, same filesystem)")
    print(f"{'method':15} {'budget MiB':>10} {'tok/s':>7} {'rounds':>17} {'dev MB/tok':>10} "
          f"{'limit tok/s':>11} {'of limit':>8} {'I/O-bound s/tok':>15} {'I/O wait s/tok':>14} {'CPU s/tok':>9}")
    for r in rows + sweep:
        lim = r["io_limit_tokens_per_s"]
        budget = "uncapped" if r["method"] in ("warm", "engine_buffered") or (
            not capped and r["method"] in ("mmap", "pread")) else str(r["cap_mb"])
        rounds = "/".join(f"{x:.2f}" for x in r["tokens_per_s_rounds"])
        print(f"{r['method']:15} {budget:>10} {r['tokens_per_s']:>7.2f} {rounds:>17} "
              f"{r['device_bytes_per_token'] / 1e6:>10.1f} "
              + (f"{lim:>11.2f} {r['fraction_of_limit'] * 100:>7.0f}%" if lim else f"{'-':>11} {'-':>8}")
              + f" {r['io_bound_s_per_token']:>15.3f} {r['io_wait_s_per_token']:>14.3f} {r['cpu_s_per_token']:>9.3f}")
    print("tok/s = median of the rounds; limit = device bandwidth / device bytes per token; "
          "I/O-bound s/tok = device bytes per token / bandwidth; I/O wait = the wait compute did not "
          "hide; CPU s/tok = attention + router + expert math + other (the ceiling if I/O were free)")
    for r in rows + sweep:
        if r["device_bytes_source"] != "rusage":
            print(f"note: {r['method']} {r['cap_mb']} MiB: device bytes from {r['device_bytes_source']}")
    for r in rows + sweep:
        la = r.get("lookahead")
        if la:
            print(f"{r['method']}: recall {la['recall']:.3f} ({la['demanded_predicted']} of {la['demanded']} "
                  f"demanded experts predicted); {la['read']} read ahead, {la['used']} used "
                  f"({la['awaited']} awaited in flight), {la['wasted']} wasted, {la['cancelled']} "
                  f"cancelled as too late")
    if "warm" in by:
        print("warm = every expert already in the page cache (no cap), read by buffered pread: the "
              "all-hits speed of buffered reads (its I/O wait is the copy out of the page cache)")
    if "engine_over_mmap" in result:
        print(f"engine / mmap: {result['engine_over_mmap']:.2f}x"
              + ("" if capped else " (engine capped, mmap not)"))
    if "engine_buffered_over_mmap" in result:
        print(f"engine_buffered / mmap (both on the uncapped page cache): "
              f"{result['engine_buffered_over_mmap']:.2f}x")
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
