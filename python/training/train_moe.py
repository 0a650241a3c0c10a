# Trains the demo model (transformers' Qwen3MoeForCausalLM; --config picks it, wide128 or the
# Glm4MoeForCausalLM grouped128) on the Debian-package English corpus, then writes the HF
# checkpoint, loss curve, held-out perplexity and held-out/train routing traces.
"""Train the moestream demo MoE (run on the GPU device machine).

Input: data/tokens/{train,heldout}.bin (uint16, python/training/tokenize_corpus.py) and
models/demo/tokenizer.json. Output folder (--out):
  hf/                  the checkpoint (save_pretrained: config.json, bf16 *.safetensors shards
                       of < 16 MiB each in the per-expert layout of published checkpoints)
  loss.csv, loss.png   training loss (LM and router load-balancing) and held-out loss
  metrics.json         perplexity on models/demo/heldout.txt (sliding window) and run figures
  routing_heldout.npz, routing_train.npz   routing traces (see routing_stats.py for the format)
  samples.txt          greedy and sampled continuations of fixed prompts
--smoke runs a few steps of each experts implementation and prints throughput only.
"""
import argparse
import csv
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Glm4MoeConfig, Qwen3MoeConfig

PROMPTS = ["The meaning of the word", "Elizabeth looked at Mr. Darcy and", "In the beginning",
           "The kernel driver", "A dictionary is"]


def demo_config(vocab_size, eos_id):
    """8 layers x 32 experts (top-4) of width 80 over a 256-wide residual stream.

    Packed with q8 experts and bf16 dense weights this is about 29.6 MB (packed_bytes below):
    dense 11.7 MB (two 8192x256 embeddings dominate) + 8 layer files of 32 x 68 KiB experts.
    """
    return Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, moe_intermediate_size=80,
        num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], output_router_logits=True, router_aux_loss_coef=0.01,
        rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=0.02, bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id,
        use_cache=True)


def wide_config(vocab_size, eos_id):
    """The routing shape of Qwen3-30B-A3B (128 experts, top-8) in a model small enough to train in
    minutes: 8 layers of 128 experts of width 32 over the demo's 256-wide residual stream.

    Exists for what needs real routing at that shape (issues 22 and 23: cache-aware routing at a
    budget of half the experts, batched streams, cache policies). bf16: about 62 MB; q8 experts
    with bf16 dense weights about 40 MB.
    """
    cfg = demo_config(vocab_size, eos_id)
    cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size = 128, 8, 32
    return cfg


def grouped_config(vocab_size, eos_id):
    """GLM-4.5's router at wide128's size (Glm4MoeForCausalLM): 128 experts of width 32, top-8,
    chosen by grouped sigmoid routing (8 groups of 16; a group scores the sum of its two best
    biased scores; the best 4 groups are kept and the 8 best experts inside them selected), the
    weights renormalised and scaled by 2.5, one always-on shared expert of width 32, and GLM's
    attention (QK-norm, Q/K/V biases, half of each head rotated). Every layer is MoE, as in
    wide128, so the two models' cache figures compare layer for layer.

    Exists for issue 23's "the same for grouped sigmoid routing": cache-aware routing may only
    swap within the kept groups, so how much it can save is the grouped router's own question.
    Balanced as DeepSeek-V3 is (--balance bias): no auxiliary loss; after every step each
    layer's correction bias moves by a fixed step towards the experts below the mean load.
    """
    return Glm4MoeConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, moe_intermediate_size=32,
        n_routed_experts=128, num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
        first_k_dense_replace=0, routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True,
        attention_bias=True, num_nextn_predict_layers=0, rms_norm_eps=1e-6,
        max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        initializer_range=0.02, bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id,
        use_cache=True)


CONFIGS = {"demo": demo_config, "wide128": wide_config, "grouped128": grouped_config}
# The balance each config trains with when --balance is not given.
DEFAULT_BALANCE = {"demo": "pooled", "wide128": "layer", "grouped128": "bias"}


def grouped(cfg):
    """Whether the config routes by grouped sigmoid scores with a correction bias."""
    return hasattr(cfg, "n_group")


def n_experts(cfg):
    return cfg.num_local_experts if grouped(cfg) else cfg.num_experts


def packed_bytes(cfg, quant):
    """Bytes of the packed model (docs/format.md): dense bf16 + per-layer 4 KiB-aligned experts."""
    D, F_, E, L, V = (cfg.hidden_size, cfg.moe_intermediate_size, n_experts(cfg),
                      cfg.num_hidden_layers, cfg.vocab_size)
    hd, H, KV = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

    def mat(r, c):
        if quant == "bf16":
            return r * c * 2
        nb = -(-c // 32)
        return r * nb * 2 + r * nb * (32 if quant == "q8" else 16)

    def up64(x):
        return -(-x // 64) * 64

    def up4k(x):
        return -(-x // 4096) * 4096

    expert = up64(mat(F_, D)) + up64(mat(F_, D)) + mat(D, F_)
    layer_file = up4k(64 + 8 * E) + E * up4k(expert)
    dense = 2 * V * D + D + L * (2 * D + D * H * hd * 2 + D * KV * hd * 2 + 2 * hd + E * D)
    if grouped(cfg):  # per layer: the shared expert, Q/K/V biases, the correction bias
        dense += L * (3 * D * F_ * cfg.n_shared_experts + (H + 2 * KV) * hd + E)
    return {"dense": dense * 2, "experts": L * layer_file, "total": dense * 2 + L * layer_file,
            "expert_bytes": expert}


class Batches:
    """Random windows of seq+1 tokens from a uint16 token file, from a seeded generator."""

    def __init__(self, path, seq, batch, seed, device):
        self.data = np.memmap(path, dtype="<u2", mode="r")
        self.seq, self.batch, self.device = seq, batch, device
        self.rng = np.random.default_rng(seed)

    def next(self):
        starts = self.rng.integers(0, len(self.data) - self.seq - 1, size=self.batch)
        x = np.stack([self.data[s:s + self.seq + 1] for s in starts]).astype(np.int64)
        return torch.from_numpy(x).to(self.device, non_blocking=True)


def lr_at(step, total, peak, warmup, floor=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def make_model(cfg, experts_impl, device):
    cfg._experts_implementation = experts_impl
    cfg._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(cfg).to(device)


class RouterTap:
    """The experts each grouped router chose in the last forward pass: forward hooks on the layers'
    routers (the modules holding `e_score_correction_bias`), which return (logits, weights,
    indices). `ordered` (the routing traces) sorts them best first by biased score, as moestream's
    router lists them (transformers' top-k is unsorted); the bias updates only count them."""

    def __init__(self, model, ordered=False):
        self.routers = [m for m in model.modules() if hasattr(m, "e_score_correction_bias")]
        self.chosen = [None] * len(self.routers)
        self.ordered = ordered
        self.handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def _hook(self, i):
        def hook(module, inputs, output):
            logits, _, idx = output
            if not self.ordered:
                self.chosen[i] = idx.detach()
                return
            with torch.no_grad():
                choice = torch.sigmoid(logits.float()) + module.e_score_correction_bias
                order = torch.argsort(choice.gather(1, idx), dim=-1, descending=True, stable=True)
                self.chosen[i] = idx.gather(1, order)
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def update_bias(tap, step_size):
    """DeepSeek-V3's balancing without a loss: each layer's correction bias rises by step_size for
    every expert chosen less often than the mean in the last batch and falls for every expert
    chosen more often (sign of the gap, not its size). Returns the mean over layers of the busiest
    expert's load / the mean load (1 at perfect balance)."""
    worst = []
    for r, idx in zip(tap.routers, tap.chosen):
        load = torch.bincount(idx.reshape(-1), minlength=r.e_score_correction_bias.numel()).float()
        r.e_score_correction_bias += step_size * torch.sign(load.mean() - load)
        worst.append(load.max() / load.mean())
    return torch.stack(worst).mean()


def layer_balance_loss(router_logits, k):
    """The load-balancing loss taken per layer, then averaged over layers.

    transformers' loss (the "pooled" balance) concatenates every layer's router logits before
    counting, so it balances expert *indices* across layers and leaves the experts of one layer
    free to go unused (models/demo has layers where a few experts take most of the traffic).
    Here each layer's experts are balanced among themselves: E * sum_i f_i * P_i per layer, with
    f_i the share of the layer's top-k slots given to expert i (summing to k) and P_i its mean
    router probability; k at perfect balance, like transformers' value.
    """
    losses = []
    for r in router_logits:  # [tokens, E], one per layer
        p = F.softmax(r.float(), dim=-1)
        p = p.reshape(-1, p.shape[-1])
        n_tok, n_exp = p.shape
        top = torch.topk(p, k, dim=-1).indices.reshape(-1)
        f = torch.zeros(n_exp, device=p.device).scatter_add_(0, top, torch.ones_like(top, dtype=p.dtype))
        losses.append(n_exp * (f / n_tok * p.mean(0)).sum())
    return torch.stack(losses).mean()


def train_step(model, opt, x, balance="pooled", tap=None, bias_step=1e-2):
    """One optimizer step. Returns (LM loss, balance figure): the auxiliary loss for pooled and
    layer, the busiest expert's load over the mean (update_bias) for bias."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        out = model(input_ids=x[:, :-1], output_router_logits=balance != "bias")
        logits = out.logits.float()
    lm = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
    if balance == "bias":
        loss = lm
    else:
        aux = out.aux_loss if balance == "pooled" else layer_balance_loss(
            out.router_logits, model.config.num_experts_per_tok)
        loss = lm + model.config.router_aux_loss_coef * aux
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if balance == "bias":
        aux = update_bias(tap, bias_step)
    return lm.detach(), aux.detach()


@torch.no_grad()
def eval_loss(model, tokens, seq, n_windows):
    model.eval()
    total, count = 0.0, 0
    for i in range(n_windows):
        x = tokens[i * seq:(i + 1) * seq + 1].unsqueeze(0)
        if x.size(1) < seq + 1:
            break
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits.float()
        total += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
        count += seq
    model.train()
    return total / count


@torch.no_grad()
def perplexity(model, ids, window, stride, device, dtype, batch=32):
    """Sliding-window perplexity. Window w starts at w*stride and holds up to `window` tokens;
    the first window scores every token after its first, each later one only the tokens past the
    previous window's end (its last `stride`), with the rest as context. Tokens scored:
    len(ids) - 1, each exactly once."""
    model.eval()
    ids = torch.tensor(ids, device=device)
    starts = [0]
    while starts[-1] + window < len(ids):
        starts.append(starts[-1] + stride)
    nll = 0.0
    # Full-length windows run in batches; the last (shorter) one runs alone.
    groups, cur = [], []
    for s in starts:
        if s + window <= len(ids):
            cur.append(s)
            if len(cur) == batch:
                groups.append(cur)
                cur = []
        else:
            if cur:
                groups.append(cur)
                cur = []
            groups.append([s])
    if cur:
        groups.append(cur)
    for g in groups:
        x = torch.stack([ids[s:s + window] for s in g])
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logits = model(input_ids=x).logits.float()
        for b, s in enumerate(g):
            first = 0 if s == 0 else window - stride - 1  # logits[first] predicts the first new token
            nll += F.cross_entropy(logits[b, first:-1], x[b, first + 1:], reduction="sum").item()
    return math.exp(nll / (len(ids) - 1)), len(ids) - 1


@torch.no_grad()
def routing_trace(model, tokens, window, n_tokens):
    """Top-k expert ids of every token and layer, windows of `window` tokens from the start."""
    model.eval()
    k = model.config.num_experts_per_tok
    tap = RouterTap(model, ordered=True) if grouped(model.config) else None
    experts = []
    for s in range(0, n_tokens, window):
        x = tokens[s:min(s + window, n_tokens)].unsqueeze(0)
        out = model(input_ids=x, output_router_logits=tap is None)  # f32: no bf16 near-ties in top-k
        if tap is not None:  # the grouped routers' own choices, best first
            ids = torch.stack(tap.chosen, dim=1)
        else:  # router_logits: one [tokens, E] tensor per layer; same top-k rule as the router.
            ids = torch.stack([torch.topk(F.softmax(r.float(), -1), k, -1).indices
                               for r in out.router_logits], dim=1)  # [tokens, L, k]
        experts.append(ids.to(torch.uint8).cpu().numpy())
    if tap is not None:
        tap.close()
    return np.concatenate(experts), tokens[:n_tokens].cpu().numpy().astype(np.uint16)


def save_trace(path, experts, tokens, window, source):
    np.savez_compressed(path, experts=experts, tokens=tokens, window=np.int64(window),
                        source=np.array(source))


@torch.no_grad()
def samples(model, tok, device, eos_id):
    model.eval()
    lines = []
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([tok.encode(p).ids], device=device)
        g = model.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=eos_id,
                           pad_token_id=eos_id)
        torch.manual_seed(1234 + i)
        s = model.generate(ids, max_new_tokens=48, do_sample=True, temperature=0.8, top_p=0.95,
                           top_k=50, eos_token_id=eos_id, pad_token_id=eos_id)
        lines.append(f"[greedy] {tok.decode(g[0].tolist())!r}")
        lines.append(f"[t=0.8 ] {tok.decode(s[0].tolist())!r}")
    return "\n".join(lines) + "\n"


def plot_loss(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [r["tokens"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(t, [r["loss"] for r in rows], lw=0.8, label="train LM loss")
    ev = [r for r in rows if r["val_loss"] != ""]
    ax.plot([r["tokens"] / 1e6 for r in ev], [r["val_loss"] for r in ev], "o-", label="held-out loss")
    ax2 = ax.twinx()
    ax2.plot(t, [r["aux_loss"] for r in rows], color="gray", lw=0.6, alpha=0.6)
    ax2.set_ylabel("load balance: aux loss, or busiest/mean (bias) (gray)")
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(bottom=max(0.0, min(r["loss"] for r in rows) - 0.5), top=min(10, max(r["loss"] for r in rows)))
    ax.legend(loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def smoke(args, cfg, device):
    """A few steps per experts implementation: that it trains and how fast."""
    batches = Batches(args.data / "train.bin", args.seq, args.batch, 0, device)
    for impl in args.impls.split(","):
        torch.manual_seed(0)
        model = make_model(CONFIGS[args.config](cfg.vocab_size, cfg.eos_token_id), impl, device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=device.type == "cuda")
        tap = RouterTap(model) if args.balance == "bias" else None
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        try:
            for _ in range(3):
                train_step(model, opt, batches.next(), args.balance, tap, args.bias_step)
            sync()
            t0 = time.time()
            for _ in range(args.smoke_steps):
                lm, aux = train_step(model, opt, batches.next(), args.balance, tap, args.bias_step)
            sync()
            dt = time.time() - t0
            print(f"smoke {impl:10s} {args.smoke_steps * args.batch * args.seq / dt / 1e3:8.1f} "
                  f"k tok/s  lm {lm.item():.3f} aux {aux.item():.3f}  "
                  + (f"mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else ""),
                  flush=True)
        except Exception as e:  # report and try the next implementation
            print(f"smoke {impl:10s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        del model, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="demo",
                    help="demo: 32 experts top-4 (models/demo); wide128: 128 experts top-8; grouped128: "
                         "128 experts top-8 by GLM-4.5's grouped sigmoid router")
    ap.add_argument("--balance", choices=("pooled", "layer", "bias"), default=None,
                    help="load balancing: transformers' loss (pooled over layers), the same per layer, or "
                         "DeepSeek-V3's correction-bias updates (grouped128 only); default: the config's "
                         + ", ".join(f"{c} {b}" for c, b in DEFAULT_BALANCE.items()))
    ap.add_argument("--bias-step", type=float, default=1e-2,
                    help="--balance bias: how far a correction bias moves per step (DeepSeek-V3 moved "
                         "it 1e-3 at a tenth of this script's learning rate)")
    ap.add_argument("--device", default="cuda", help="cuda (training runs), or cpu for a short check")
    ap.add_argument("--data", type=Path, default=Path("data/tokens"))
    ap.add_argument("--tokenizer", default="models/demo/tokenizer.json")
    ap.add_argument("--heldout-text", default="models/demo/heldout.txt")
    ap.add_argument("--out", type=Path, default=Path("data/demo_run"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--experts-impl", default="grouped_mm")
    ap.add_argument("--max-minutes", type=float, default=8.0, help="stop training early past this")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop after this many steps, the schedule still spanning --steps (repeats "
                         "a run that --max-minutes cut short)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--trace-tokens", type=int, default=65536)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--impls", default="grouped_mm,batched_mm,eager")
    ap.add_argument("--smoke-steps", type=int, default=10)
    args = ap.parse_args()
    args.balance = args.balance or DEFAULT_BALANCE[args.config]
    if (args.balance == "bias") != (args.config == "grouped128"):
        ap.error(f"--balance {args.balance} with --config {args.config}: the correction-bias updates are for "
                 "the grouped sigmoid router (grouped128) and the losses for the softmax routers")

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (--device cpu runs a short check)")
    tok = Tokenizer.from_file(args.tokenizer)
    eos_id = tok.token_to_id("<|endoftext|>")
    cfg = CONFIGS[args.config](tok.get_vocab_size(), eos_id)
    sizes = {q: packed_bytes(cfg, q) for q in ("bf16", "q8", "q4")}
    print("packed MB: " + ", ".join(f"{q} {s['total'] / 1e6:.1f}" for q, s in sizes.items()), flush=True)
    if args.smoke:
        smoke(args, cfg, device)
        return

    args.out.mkdir(parents=True, exist_ok=True)
    model = make_model(cfg, args.experts_impl, device)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = n_params - n_expert + n_expert * cfg.num_experts_per_tok // n_experts(cfg)
    print(f"params {n_params / 1e6:.2f} M (experts {n_expert / 1e6:.2f} M, active/token "
          f"{active / 1e6:.2f} M)", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    tap = RouterTap(model) if args.balance == "bias" else None
    batches = Batches(args.data / "train.bin", args.seq, args.batch, args.seed, device)
    held = torch.from_numpy(np.fromfile(args.data / "heldout.bin", dtype="<u2").astype(np.int64)).to(device)

    rows, t0, step = [], time.time(), 0
    tokens_per_step = args.batch * args.seq
    model.train()
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        lm, aux = train_step(model, opt, batches.next(), args.balance, tap, args.bias_step)
        last = (step == args.steps - 1 or (time.time() - t0) / 60 > args.max_minutes
                or step + 1 == args.stop_after)
        if step % 10 == 0 or last:
            row = {"step": step, "tokens": (step + 1) * tokens_per_step, "lr": lr,
                   "loss": lm.item(), "aux_loss": aux.item(), "val_loss": "",
                   "elapsed_s": round(time.time() - t0, 1)}
            if step % args.eval_every == 0 or last:
                row["val_loss"] = eval_loss(model, held, args.seq, 32)
            rows.append(row)
            if step % 50 == 0 or last:
                print(f"step {step} tok {row['tokens'] / 1e6:.1f}M loss {row['loss']:.3f} aux "
                      f"{row['aux_loss']:.3f} val {row['val_loss']} "
                      f"{row['tokens'] / (time.time() - t0) / 1e3:.0f}k tok/s", flush=True)
        if last:
            break
    train_s = time.time() - t0
    if tap is not None:
        tap.close()
    trained_tokens = (step + 1) * tokens_per_step

    with open(args.out / "loss.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot_loss(rows, args.out / "loss.png",
              f"moestream {args.config} MoE ({cfg.architectures[0] if cfg.architectures else type(model).__name__}, "
              f"{cfg.num_hidden_layers} layers, {n_experts(cfg)} experts, top-{cfg.num_experts_per_tok})")

    # Checkpoint: bf16 weights, per-expert layout (transformers' default save), small shards.
    model.eval()
    model.config.output_router_logits = False
    model.to(torch.bfloat16)
    for m in model.modules():  # correction biases stay f32, as published checkpoints keep them
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias.data = m.e_score_correction_bias.data.float()
    model.save_pretrained(args.out / "hf", max_shard_size="12MB",
                                             safe_serialization=True)
    del model, opt
    # The tokenizer travels with the checkpoint, so convert_model packs a runnable model.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = Path(args.tokenizer).parent / name
        if src.exists():
            shutil.copyfile(src, args.out / "hf" / name)

    # Held-out perplexity from transformers, on the committed held-out text encoded as one string.
    text = Path(args.heldout_text).read_text(encoding="utf-8")
    ids = tok.encode(text).ids
    reloaded = AutoModelForCausalLM.from_pretrained(
        args.out / "hf", dtype=torch.float32, experts_implementation=args.experts_impl).to(device)
    ppl = {}
    for name, n in (("heldout_full", len(ids)), ("heldout_head16k", 16384)):
        p32, scored = perplexity(reloaded, ids[:n], 512, 256, device, torch.float32)
        pbf, _ = perplexity(reloaded, ids[:n], 512, 256, device, torch.bfloat16)
        ppl[name] = {"tokens": n, "scored": scored, "ppl_f32": p32, "ppl_bf16_autocast": pbf}
        print(f"perplexity {name}: f32 {p32:.3f}  bf16 {pbf:.3f}  ({scored} tokens)", flush=True)

    ex, tk = routing_trace(reloaded, held, 512, min(args.trace_tokens, held.numel()))
    save_trace(args.out / "routing_heldout.npz", ex, tk, 512, "data/tokens/heldout.bin")
    train_tokens = torch.from_numpy(np.fromfile(args.data / "train.bin", dtype="<u2",
                                                count=args.trace_tokens).astype(np.int64)).to(device)
    ex, tk = routing_trace(reloaded, train_tokens, 512, args.trace_tokens)
    save_trace(args.out / "routing_train.npz", ex, tk, 512, "data/tokens/train.bin")
    (args.out / "samples.txt").write_text(samples(reloaded, tok, device, eos_id))
    print((args.out / "samples.txt").read_text(), flush=True)

    metrics = {
        "model": {"params": n_params, "expert_params": n_expert, "active_params_per_token": active,
                  "config": {k: getattr(cfg, k) for k in (
                      "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "moe_intermediate_size", "num_experts_per_tok",
                      "norm_topk_prob", "router_aux_loss_coef", "n_group", "topk_group",
                      "routed_scaling_factor", "n_shared_experts") if hasattr(cfg, k)},
                  "architecture": type(reloaded).__name__, "experts": n_experts(cfg)},
        "packed_bytes_estimate": sizes,
        "training": {"steps": step + 1, "batch": args.batch, "seq": args.seq, "tokens": trained_tokens,
                     "corpus_train_tokens": int(batches.data.size), "lr": args.lr,
                     "warmup": args.warmup, "seed": args.seed, "balance": args.balance,
                     "bias_step": args.bias_step if args.balance == "bias" else None,
                     "experts_impl": args.experts_impl,
                     "seconds": round(train_s, 1), "tokens_per_s": round(trained_tokens / train_s),
                     "final_train_loss": rows[-1]["loss"], "final_heldout_loss": rows[-1]["val_loss"],
                     "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"},
        "perplexity": {"method": "sliding window 512, stride 256, text encoded whole, no BOS",
                       "text": args.heldout_text, **ppl},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(json.dumps(metrics["training"]), flush=True)


if __name__ == "__main__":
    main()
