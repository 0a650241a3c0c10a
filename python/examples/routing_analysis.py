"""Routing analysis, notebook style: load the demo model, record its routing while it generates,
then plot each layer's expert load and the hit rate of an LRU expert cache against its size.

    PYTHONPATH=build/python python3 python/examples/routing_analysis.py --out /tmp/routing
(needs matplotlib: `pip install matplotlib`). Writes expert_load.png and lru_hit_rate.png.
"""
import argparse
import collections
import pathlib
import tempfile

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import moestream  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

# %% 1. Generate with routing recorded (infer --collect-routing)
def record(model_dir, log_path, prompts, n_tokens, threads):
    model = moestream.Model(model_dir, threads=threads, collect_routing=log_path)
    for p in prompts:
        text = model.generate(p, n_tokens, temperature=0.8, seed=1, ignore_eos=True)
        print(f"{p!r} -> {text[:60]!r}...")
    model.close_routing()
    return model.config


# %% 2. Expert load: how often each expert of each layer is chosen
def expert_load(log):
    load = np.zeros((log.n_layers, log.n_experts), dtype=np.int64)
    layer = np.repeat(log.layer.astype(np.int64), log.top_k)
    np.add.at(load, (layer, log.ids.reshape(-1).astype(np.int64)), 1)
    return load


# %% 3. LRU hit rate: per-layer caches of `capacity` experts, replayed over the tokens in order
def lru_hit_rate(log, capacity):
    order = np.lexsort((log.layer, log.position, log.request))  # token by token, layer by layer
    caches = [collections.OrderedDict() for _ in range(log.n_layers)]
    hits = total = 0
    for i in order:
        cache = caches[log.layer[i]]
        for e in log.ids[i].tolist():
            total += 1
            if e in cache:
                hits += 1
                cache.move_to_end(e)
            else:
                cache[e] = True
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hits / total if total else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--out", default="routing_figures")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = ["The river", "Once upon a time", "A small model", "In the morning the"]
    with tempfile.TemporaryDirectory() as tmp:
        log_path = pathlib.Path(tmp) / "routing.bin"
        record(args.model, log_path, prompts, args.tokens, args.threads)
        log = moestream.RoutingLog(log_path)
    print(f"{len(log)} routing records: {log.n_layers} layers, {log.n_experts} experts, top-{log.top_k}")

    load = expert_load(log)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    im = ax.imshow(load / load.sum(axis=1, keepdims=True), aspect="auto", cmap="viridis")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title("Expert load (share of a layer's selections)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(out / "expert_load.png", dpi=120)

    capacities = list(range(log.top_k, log.n_experts + 1))
    rates = [lru_hit_rate(log, c) for c in capacities]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([c / log.n_experts for c in capacities], rates, marker=".")
    ax.set_xlabel("LRU cache size (fraction of a layer's experts)")
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("LRU expert cache hit rate")
    fig.tight_layout()
    fig.savefig(out / "lru_hit_rate.png", dpi=120)
    for c, r in zip(capacities, rates):
        if c in (log.top_k, log.n_experts // 4, log.n_experts // 2, log.n_experts):
            print(f"LRU {c:3d}/{log.n_experts} experts per layer: hit rate {r:.3f}")
    print(f"wrote {out / 'expert_load.png'} and {out / 'lru_hit_rate.png'}")


if __name__ == "__main__":
    main()
