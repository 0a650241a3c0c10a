# Routing statistics of a routing trace beside what uniform routing gives: per-layer expert load,
# experts shared by consecutive tokens, and per-layer LRU expert-cache hit rate over cache sizes.
"""Routing statistics for moestream's demo model.

Trace format (written by train_moe.py, numpy .npz):
  experts  uint8 [T, L, k]  the router's top-k expert ids of token t in layer l (top-k order)
  tokens   uint16 [T]       the token ids, in order; windows of `window` tokens were run
                            independently (the KV cache restarts every `window` tokens)
  window   int64            that window length
  source   str              where the tokens came from
Uniform routing is simulated as independent uniformly random k-subsets per token and layer
(seeded), with the same T, L, k and E; its exact expectations are also given: load 1/E per
expert, consecutive overlap k/E, LRU hit rate c/E for a cache of c experts per layer.
"""
import argparse
import json
import os
from pathlib import Path

import numpy as np


def load_trace(path):
    z = np.load(path)
    return z["experts"], int(z["window"])


def uniform_trace(T, L, k, E, seed=0):
    rng = np.random.default_rng(seed)
    # argpartition of random keys = a uniformly random k-subset per (token, layer)
    return np.argpartition(rng.random((T, L, E)), k, axis=-1)[..., :k].astype(np.uint8)


def load_stats(experts, E):
    T, L, k = experts.shape
    out = []
    for l in range(L):
        frac = np.bincount(experts[:, l].ravel(), minlength=E) / (T * k)
        p = frac[frac > 0]
        srt = np.sort(frac)[::-1]
        out.append({
            "load": [round(float(f), 6) for f in frac],
            "max_over_mean": float(frac.max() * E), "min_over_mean": float(frac.min() * E),
            "cv": float(frac.std() / frac.mean()),
            "entropy_norm": float(-(p * np.log(p)).sum() / np.log(E)),
            "top_quarter_share": float(srt[:E // 4].sum()),
        })
    return out


def consecutive_overlap(experts):
    """Mean |S_t ∩ S_t+1| / k per layer."""
    T, L, k = experts.shape
    a, b = experts[:-1], experts[1:]
    shared = (a[..., :, None] == b[..., None, :]).any(-1).sum(-1)  # [T-1, L]
    return (shared.mean(0) / k).tolist()


def lru_hit_rates(experts, E):
    """Hit rate of a per-layer LRU cache holding c experts, for every c in 1..E.

    A token's k experts are looked up, then become most recent in reverse top-k order (the
    top-1 expert ends up most recent). An expert e is resident at capacity c when at most c
    experts (e included) have a recency key >= e's, so one pass gives every capacity at once.
    First uses are misses at every capacity.
    """
    T, L, k = experts.shape
    hits = np.zeros((L, E + 1))
    order = np.arange(k - 1, -1, -1)  # recency key t*k + (k-1-j): top-1 is most recent
    for l in range(L):
        last = np.full(E, -1, dtype=np.int64)
        ranks = np.empty((T, k), dtype=np.int64)
        seq = experts[:, l].astype(np.int64)
        for t in range(T):
            s = seq[t]
            lu = last[s]
            r = (last[None, :] >= lu[:, None]).sum(1)
            r[lu < 0] = E + 1  # never used: a miss for every capacity
            ranks[t] = r
            last[s] = t * k + order
        counts = np.bincount(np.minimum(ranks.ravel(), E + 1), minlength=E + 2)
        hits[l] = np.cumsum(counts)[:E + 1] / (T * k)  # hits[l][c] = P(rank <= c)
    return hits  # [L, E+1], column c = capacity c


def batch_union(experts, window, streams=(1, 2, 4, 8, 16), draws=20, seed=0):
    """Experts a decode step of N concurrent sequences reads, over N * k (no cache).

    N windows of the trace (independent runs) are drawn at random and stepped side by side; each
    step's per-layer union of the N top-k sets is what a batched step fetches once. Every 8th
    step of each draw is counted. Uniform routing gives E (1 - (1 - k/E)^N) / (N k).
    """
    T, L, k = experts.shape
    n_win = T // window
    rng = np.random.default_rng(seed)
    out = {}
    for n in streams:
        if n > n_win:
            break
        fr = []
        for _ in range(draws):
            wins = rng.choice(n_win, n, replace=False)
            steps = np.stack([experts[w * window:(w + 1) * window] for w in wins], 1)  # [W, N, L, k]
            for l in range(L):
                sets = steps[::8, :, l, :].reshape(-1, n * k)
                fr.append(np.mean([len(np.unique(r)) for r in sets]) / (n * k))
        out[str(n)] = float(np.mean(fr))
    return out


def summarise(experts, E):
    T, L, k = experts.shape
    lru = lru_hit_rates(experts, E)
    return {
        "tokens": T, "layers": L, "top_k": k, "n_experts": E,
        "load_per_layer": load_stats(experts, E),
        "consecutive_overlap_per_layer": consecutive_overlap(experts),
        "lru_hit_rate_mean_over_layers": {str(c): float(lru[:, c].mean()) for c in range(1, E + 1)},
        "lru_hit_rate_per_layer": [[float(v) for v in lru[l, 1:]] for l in range(L)],
    }


def plot(stats, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
    ref = stats["traces"]["heldout"]
    uni = stats["uniform_simulated"]
    E, k = ref["n_experts"], ref["top_k"]
    ax = axs[0]
    for l, ls in enumerate(ref["load_per_layer"]):
        ax.plot(range(1, E + 1), np.sort(ls["load"])[::-1] * E, lw=1, label=f"layer {l}")
    ax.plot(range(1, E + 1), np.sort(uni["load_per_layer"][0]["load"])[::-1] * E, "k--", lw=1,
            label="uniform (simulated)")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xlabel("expert rank (by load)")
    ax.set_ylabel("load / mean load")
    ax.set_title("held-out expert load per layer")
    ax.legend(fontsize=7, ncol=2)
    ax = axs[1]
    L = ref["layers"]
    x = np.arange(L)
    ax.bar(x - 0.2, ref["consecutive_overlap_per_layer"], 0.4, label="held-out")
    ax.bar(x + 0.2, stats["traces"]["train"]["consecutive_overlap_per_layer"], 0.4, label="train")
    ax.axhline(k / E, color="k", ls="--", lw=1, label=f"uniform k/E = {k / E:.3f}")
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction of top-k shared with previous token")
    ax.set_title("consecutive-token expert overlap")
    ax.legend(fontsize=8)
    ax = axs[2]
    cs = np.arange(1, E + 1)
    for name, st in (("held-out", ref), ("train", stats["traces"]["train"]), ("uniform (simulated)", uni)):
        ax.plot(cs, [st["lru_hit_rate_mean_over_layers"][str(c)] for c in cs],
                "--" if name.startswith("uniform") else "-", label=name)
    ax.plot(cs, cs / E, ":", color="gray", label="c/E")
    ax.set_xlabel("LRU cache size per layer (experts)")
    ax.set_ylabel("hit rate (mean over layers)")
    ax.set_title("per-layer LRU expert cache")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--n-experts", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True, help="folder for routing_stats.json/.png")
    args = ap.parse_args()
    held, window = load_trace(args.heldout)
    train, _ = load_trace(args.train)
    E = args.n_experts
    if held.max() >= E or train.max() >= E:
        raise SystemExit(f"trace holds expert id {max(held.max(), train.max())} >= n_experts {E}")
    T, L, k = held.shape
    stats = {
        "traces": {"heldout": summarise(held, E), "train": summarise(train, E)},
        "batch_union_heldout": batch_union(held, window),
        "uniform_simulated": summarise(uniform_trace(T, L, k, E), E),
        "uniform_expected": {"load": 1.0 / E, "consecutive_overlap": k / E,
                             "lru_hit_rate": "c / E for a cache of c experts per layer"},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "routing_stats.json.tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.out / "routing_stats.json")
    plot(stats, args.out / "routing.png")
    for name, st in (("heldout", stats["traces"]["heldout"]), ("train", stats["traces"]["train"]),
                     ("uniform", stats["uniform_simulated"])):
        lru = st["lru_hit_rate_mean_over_layers"]
        print(f"{name:8s} max/mean load {np.mean([x['max_over_mean'] for x in st['load_per_layer']]):.2f} "
              f"entropy {np.mean([x['entropy_norm'] for x in st['load_per_layer']]):.3f} "
              f"overlap {np.mean(st['consecutive_overlap_per_layer']):.3f} "
              f"LRU@{E // 4} {lru[str(E // 4)]:.3f} LRU@{E // 2} {lru[str(E // 2)]:.3f}")
    bu = stats["batch_union_heldout"]
    print("batch of N sequences, experts read / (N k), held-out: " + ", ".join(
        f"N={n} {v:.3f} (uniform {E * (1 - (1 - k / E) ** int(n)) / (int(n) * k):.3f})" for n, v in bu.items()))
    # Ranges over layers (the tables of docs/demo_model.md).
    for name in ("heldout", "train"):
        st = stats["traces"][name]

        def rng(key, fmt):
            v = [x[key] for x in st["load_per_layer"]]
            return f"{min(v):{fmt}}-{max(v):{fmt}}"

        rare = [sum(f < 0.1 / E for f in x["load"]) for x in st["load_per_layer"]]
        ov = st["consecutive_overlap_per_layer"]
        print(f"{name:8s} per layer: busiest/mean {rng('max_over_mean', '.1f')}, least/mean "
              f"{rng('min_over_mean', '.3f')}, busiest quarter's share {rng('top_quarter_share', '.2f')}, "
              f"entropy {rng('entropy_norm', '.2f')}, experts under 10% of the mean load "
              f"{min(rare)}-{max(rare)}, overlap with the previous token {min(ov):.2f}-{max(ov):.2f}")


if __name__ == "__main__":
    main()
