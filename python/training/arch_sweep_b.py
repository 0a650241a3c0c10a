# Config sweep for gpt-oss and Qwen2-MoE against transformers (a dev tool, not a CI test: CI has no
# torch). Builds many tiny random models, converts each with build/bin/convert_model and checks
# build/bin/infer's greedy tokens and the pack's logits against transformers.
"""Sweeps GptOssForCausalLM and Qwen2MoeForCausalLM configs through convert_model and infer.

For each config: transformers builds the model (weights from make_fixtures.randomise, bf16 values),
save_pretrained writes the checkpoint as a user would (f32, or bf16 for the `ckpt_bf16` cases;
gpt-oss `mxfp4` cases in the released MXFP4 layout through make_fixtures.mxfp4_experts), and the
reference is transformers' greedy run (32 tokens after prompts of 5, 13 and 21 tokens, so every
sliding window below 53 masks something). Then convert_model makes f32 and bf16 packs (MXFP4: one
pack, experts kept as MXFP4) and
  * the pack's logits over each prompt (python module, Model.logits) must be within 1e-3 of the
    row's max |logit| (the MXFP4 pack: 0.6, as q4 in tests/reference_test.cpp, since its product
    rounds activations to 8 bits and a tiny random model's routing then flips; so MXFP4 cases also
    convert the dequantised model saved as a plain checkpoint, held to 1e-3);
  * infer --temp 0 --print-ids must give transformers' 32 greedy tokens, up to the first step
    whose reference top-1/top-2 margin is below 1e-3 x max |logit| (a near-tie);
  * or convert_model must refuse the config with an error naming the field (`refuse` cases).
A config transformers itself cannot build is reported as `skip`.

Run (after building convert_model, infer and _moestream):
  ~/.cache/moestream/llama.cpp-0.3.36/venv/bin/python python/training/arch_sweep_b.py [--only SUBSTR]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import traceback
import zlib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import mxfp4_experts, randomise, save_mxfp4_checkpoint  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N_GREEDY = 32
PROMPT_LENGTHS = (5, 13, 21)
S, F = "sliding_attention", "full_attention"
DROP = object()  # a config kwarg left out entirely (the config class's default applies)
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 64, "rope_theta": 150000.0}
COMMON = dict(rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False, use_cache=True,
              bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=0.02)


def gpt_oss(**kw):
    c = dict(vocab_size=307, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=6,
             layer_types=[S, F, S], swiglu_limit=1.25, attention_bias=True, rope_parameters=dict(YARN), **COMMON)
    c.update(kw)
    return ("gpt_oss", {k: v for k, v in c.items() if v is not DROP})


def qwen2(**kw):
    c = dict(vocab_size=331, hidden_size=47, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=12, moe_intermediate_size=27, num_experts=8, num_experts_per_tok=3,
             shared_expert_intermediate_size=41, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
             qkv_bias=True, use_sliding_window=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **COMMON)
    c.update(kw)
    return ("qwen2_moe", {k: v for k, v in c.items() if v is not DROP})


def yarn(**kw):
    r = dict(YARN)
    r.update(kw)
    return r


def cases():
    """name -> (arch, config kwargs, options); options: mxfp4, ckpt_bf16, expect ('ok' | 'refuse')."""
    g = {
        "base": gpt_oss(),
        "win1": gpt_oss(sliding_window=1),
        "win4": gpt_oss(sliding_window=4),
        "win13": gpt_oss(sliding_window=13),
        "win64_gt_seq": gpt_oss(sliding_window=64),
        "all_full": gpt_oss(layer_types=[F, F, F]),
        "win4_all_sliding": gpt_oss(sliding_window=4, layer_types=[S, S, S]),
        "all_sliding": gpt_oss(layer_types=[S, S, S]),
        "full_first": gpt_oss(layer_types=[F, S, F]),
        "default_layer_types_4l": gpt_oss(num_hidden_layers=4, layer_types=None),
        "rope_default": gpt_oss(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "yarn_f32_default_release": gpt_oss(rope_parameters=yarn(factor=32.0, original_max_position_embeddings=4096)),
        "yarn_f2_trunc": gpt_oss(rope_parameters=yarn(factor=2.0, truncate=True)),
        "yarn_f8_beta": gpt_oss(rope_parameters=yarn(factor=8.0, beta_fast=16.0, beta_slow=2.0)),
        "yarn_small_orig": gpt_oss(rope_parameters=yarn(factor=16.0, original_max_position_embeddings=8)),
        "yarn_theta1e4": gpt_oss(rope_parameters=yarn(rope_theta=10000.0)),
        "rope_linear": gpt_oss(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
        "swiglu_0p3": gpt_oss(swiglu_limit=0.3),
        "swiglu_7": gpt_oss(swiglu_limit=7.0),
        "swiglu_alpha1": gpt_oss(swiglu_alpha=1.0),
        "e4_k1": gpt_oss(num_local_experts=4, num_experts_per_tok=1),
        "e16_k4": gpt_oss(num_local_experts=16, num_experts_per_tok=4),
        "e4_k4": gpt_oss(num_local_experts=4, num_experts_per_tok=4),
        "head_dim8": gpt_oss(head_dim=8),
        "head_dim32": gpt_oss(head_dim=32),
        "heads6_hd24": gpt_oss(num_attention_heads=6, num_key_value_heads=3, head_dim=24),
        "head_dim_none": gpt_oss(head_dim=None),
        "head_dim_absent": gpt_oss(head_dim=DROP),
        "head_dim10": gpt_oss(head_dim=10),
        "odd_widths_h40_i24": gpt_oss(hidden_size=40, intermediate_size=24, vocab_size=263),
        "odd_widths_h33_i17": gpt_oss(hidden_size=33, intermediate_size=17, num_attention_heads=3,
                                      num_key_value_heads=1, head_dim=14),
        "kv1": gpt_oss(num_key_value_heads=1),
        "kv_eq_heads": gpt_oss(num_key_value_heads=4),
        "no_attention_bias": gpt_oss(attention_bias=False),
        "tied": gpt_oss(tie_word_embeddings=True),
        "aux_fields": gpt_oss(router_aux_loss_coef=0.5, output_router_logits=True, initial_context_length=64),
        "vocab_1001": gpt_oss(vocab_size=1001),
        "eps_1e-5": gpt_oss(rms_norm_eps=1e-5),
        "one_layer_sliding": gpt_oss(num_hidden_layers=1, layer_types=[S]),
        "ckpt_bf16": gpt_oss(),
        "published_style_config": gpt_oss(rope_parameters=yarn(factor=32.0, original_max_position_embeddings=16)),
        "mix_5l_w8_kv1_tied_nobias": gpt_oss(num_hidden_layers=5, layer_types=None, sliding_window=8,
                                             num_key_value_heads=1, tie_word_embeddings=True, attention_bias=False,
                                             num_local_experts=6, num_experts_per_tok=3),
        "mxfp4_base": gpt_oss(),
        "mxfp4_tied_nobias_kv1": gpt_oss(tie_word_embeddings=True, attention_bias=False, num_key_value_heads=1),
        "mxfp4_win4_allslide": gpt_oss(sliding_window=4, layer_types=[S, S, S]),
        "mxfp4_e16_k4_hd32": gpt_oss(num_local_experts=16, num_experts_per_tok=4, head_dim=32),
        "mxfp4_inter64": gpt_oss(intermediate_size=64, hidden_size=96, num_attention_heads=6, num_key_value_heads=2),
    }
    q = {
        "base": qwen2(),
        "norm_topk": qwen2(norm_topk_prob=True),
        "shared0": qwen2(shared_expert_intermediate_size=0),
        "no_qkv_bias": qwen2(qkv_bias=False),
        "step2": qwen2(decoder_sparse_step=2),
        "step2_2layers": qwen2(decoder_sparse_step=2, num_hidden_layers=2),
        "step3": qwen2(decoder_sparse_step=3),
        "mlp_only_0": qwen2(mlp_only_layers=[0]),
        "mlp_only_01": qwen2(mlp_only_layers=[0, 1]),
        "mlp_only_1": qwen2(mlp_only_layers=[1]),
        "mlp_only_02": qwen2(mlp_only_layers=[0, 2]),
        "sliding_w4": qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=3),
        "sliding_w4_mwl1": qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=1),
        "sliding_w64": qwen2(use_sliding_window=True, sliding_window=64, max_window_layers=3),
        "sliding_off_w4": qwen2(use_sliding_window=False, sliding_window=4),
        "rope_linear": qwen2(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
        "rope_dynamic": qwen2(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
        "rope_yarn": qwen2(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                            "original_max_position_embeddings": 64}),
        "tied": qwen2(tie_word_embeddings=True),
        "vocab_1003": qwen2(vocab_size=1003),
        "vocab_97": qwen2(vocab_size=97),
        "e4_k1": qwen2(num_experts=4, num_experts_per_tok=1),
        "e16_k8_norm": qwen2(num_experts=16, num_experts_per_tok=8, norm_topk_prob=True),
        "kv1": qwen2(num_key_value_heads=1),
        "head_dim14": qwen2(head_dim=14),
        "head_dim_absent_h48": qwen2(head_dim=DROP, hidden_size=48),
        "kv_eq_heads": qwen2(num_key_value_heads=4),
        "head_dim_none": qwen2(head_dim=None, hidden_size=48),
        "aux_fields": qwen2(router_aux_loss_coef=0.5, output_router_logits=True),
        "ckpt_bf16": qwen2(),
        "published_style_config": qwen2(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
                                                         "original_max_position_embeddings": 32}),
        "explicit_layer_types": qwen2(use_sliding_window=True, sliding_window=5, layer_types=[F, S, S]),
        "mix_dense2_swa_tied_norm": qwen2(num_hidden_layers=4, mlp_only_layers=[0, 1], use_sliding_window=True,
                                          sliding_window=3, max_window_layers=4, tie_word_embeddings=True,
                                          norm_topk_prob=True, qkv_bias=False, num_key_value_heads=1),
        "step2_2l_swa_shared_odd": qwen2(num_hidden_layers=2, decoder_sparse_step=2, use_sliding_window=True,
                                         sliding_window=6, max_window_layers=1, shared_expert_intermediate_size=7,
                                         vocab_size=509),
        "gelu_refused": qwen2(hidden_act="gelu"),
    }
    out = {}
    for name, (arch, kw) in g.items():
        out[f"gpt_oss/{name}"] = (arch, kw, {"mxfp4": name.startswith("mxfp4"), "ckpt_bf16": name == "ckpt_bf16",
                                             "published": name.startswith("published")})
    for name, (arch, kw) in q.items():
        out[f"qwen2_moe/{name}"] = (arch, kw, {"mxfp4": False, "ckpt_bf16": name == "ckpt_bf16",
                                               "published": name.startswith("published")})
    return out


@torch.no_grad()
def reference(model, prompts):
    """Per prompt: logits [T, V], 32 greedy ids and each step's top1-top2 margin relative to max |logit|."""
    res = []
    for ids in prompts:
        out = model(torch.tensor([ids]), use_cache=True)
        logits = out.logits[0].float().numpy()
        past, nxt = out.past_key_values, out.logits[0, -1].float()
        gen, margins = [], []
        for _ in range(N_GREEDY):
            top2 = torch.topk(nxt, 2).values
            margins.append(float(top2[0] - top2[1]) / max(float(nxt.abs().max()), 1e-30))
            tok = int(torch.argmax(nxt))
            gen.append(tok)
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[0, -1].float()
        full = model(torch.tensor([ids + gen[:-1]]), use_cache=False).logits[0]
        if full[len(ids) - 1:].argmax(-1).tolist() != gen:
            raise RuntimeError("transformers: cached greedy differs from the uncached argmax")
        res.append((logits, gen, margins))
    return res


def build_checkpoint(arch, kw, opts, seed, dest):
    cls, cfg_cls = (GptOssForCausalLM, GptOssConfig) if arch == "gpt_oss" else (Qwen2MoeForCausalLM, Qwen2MoeConfig)
    torch.manual_seed(seed)
    config = cfg_cls(**kw)
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"
    model = cls(config).eval().to(torch.float32)
    randomise(model, seed)
    if config.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("tie_word_embeddings did not tie lm_head")
    if opts["mxfp4"]:
        packed, _ = mxfp4_experts(model)
        save_mxfp4_checkpoint(model, packed, dest)
        # The same model with the dequantised experts as a plain checkpoint: its f32 pack must
        # match strictly (the MXFP4 pack's own product rounds activations to 8 bits).
        model.save_pretrained(dest.parent / "hf_dequantized", safe_serialization=True)
    elif opts["ckpt_bf16"]:
        import copy
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(dest, safe_serialization=True)
    else:
        model.save_pretrained(dest, safe_serialization=True)
    if opts.get("published"):
        cfg = json.loads((dest / "config.json").read_text())
        rope = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rope.pop("rope_theta")
        cfg["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
        cfg["torch_dtype"] = cfg.pop("dtype", "float32")
        if arch == "qwen2_moe":
            cfg.pop("layer_types", None)
            cfg.pop("qkv_bias", None)
        (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        reloaded = cls.from_pretrained(dest, dtype=torch.float32, experts_implementation="eager",
                                       attn_implementation="eager").eval()
        with torch.no_grad():
            ids = torch.arange(3, 20).view(1, -1)
            if not torch.equal(reloaded(ids).logits, model(ids).logits):
                raise RuntimeError("the published-style config.json reloads to a different model")
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, config.vocab_size, size=n).tolist() for n in PROMPT_LENGTHS]
    return prompts, reference(model, prompts)


def run_case(name, arch, kw, opts, seed, work, bindir, moestream):
    ckpt = work / "hf"
    ckpt.mkdir()
    try:
        prompts, ref = build_checkpoint(arch, kw, opts, seed, ckpt)
    except Exception as e:  # noqa: BLE001 - transformers refusing a config is a result
        return "skip", f"transformers: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    f32 = ["--quant", "f32", "--dense-quant", "f32"]
    packs = [("mxfp4", ckpt, f32), ("dequantized_f32", work / "hf_dequantized", f32)] if opts["mxfp4"] else [
        ("f32", ckpt, f32), ("bf16", ckpt, ["--quant", "bf16", "--dense-quant", "bf16"])]
    notes = []
    for tag, src, flags in packs:
        pack = work / f"pack_{tag}"
        p = subprocess.run([str(bindir / "convert_model"), "-q", "-t", "2", str(src), str(pack), *flags],
                           capture_output=True, text=True)
        if p.returncode != 0:
            return "refused", p.stderr.strip().splitlines()[-1][:220] if p.stderr.strip() else f"rc {p.returncode}"
        tol = 0.6 if tag == "mxfp4" else 1e-3  # MXFP4: q4's budget (tests/reference_test.cpp)
        m = moestream.Model(str(pack), threads=2)
        worst = 0.0
        for ids, (want, gen, margins) in zip(prompts, ref):
            got = m.logits(ids)
            scale = np.abs(want).max(axis=1)
            worst = max(worst, float((np.abs(got - want).max(axis=1) / scale).max()))
            cli = subprocess.run([str(bindir / "infer"), "-m", str(pack), "-t", "2", "--prompt-ids",
                                  ",".join(map(str, ids)), "-n", str(N_GREEDY), "--temp", "0", "--print-ids",
                                  "--ignore-eos"], capture_output=True, text=True)
            if cli.returncode != 0:
                return "FAIL", f"{tag}: infer rc {cli.returncode}: {cli.stderr.strip()[-200:]}"
            toks = [int(x) for x in cli.stdout.strip().split(",")]
            if toks != gen:
                i = next(i for i in range(len(gen)) if i >= len(toks) or toks[i] != gen[i])
                near_tie = min(margins[:i + 1]) < (1e-2 if tag == "mxfp4" else 1e-3)
                if not near_tie:
                    return "FAIL", (f"{tag}: prompt len {len(ids)}: greedy differs at step {i} "
                                    f"(got {toks[i] if i < len(toks) else None}, want {gen[i]}, "
                                    f"margin {min(margins[:i + 1]):.2g}); logits rel err {worst:.2g}")
                notes.append(f"{tag} near-tie at step {i}")
        if worst > tol:
            return "FAIL", f"{tag}: logits rel err {worst:.3g} > {tol}"
        notes.append(f"{tag} rel {worst:.1e}")
    return "ok", ", ".join(notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=Path, default=ROOT / "build/bin")
    ap.add_argument("--pymod", type=Path, default=ROOT / "build/python")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--keep", type=Path, help="keep each case's checkpoint and packs under this directory")
    args = ap.parse_args()
    sys.path.insert(0, str(args.pymod))
    import moestream  # noqa: E402 - the build's python module
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    results = {}
    for name, (arch, kw, opts) in cases().items():
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory(prefix="arch_sweep_b.") as tmp:
            work = Path(tmp)
            if args.keep:
                work = args.keep / name.replace("/", "_")
                work.mkdir(parents=True, exist_ok=True)
            try:
                status, detail = run_case(name, arch, kw, opts, zlib.crc32(name.encode()) % 100000, work,
                                          args.bin, moestream)
            except Exception:  # noqa: BLE001
                status, detail = "ERROR", traceback.format_exc().strip().splitlines()[-1]
        results[name] = (status, detail)
        print(f"{status:8s} {name:34s} {detail}", flush=True)
    counts = {}
    for s, _ in results.values():
        counts[s] = counts.get(s, 0) + 1
    print("summary:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), f"of {len(results)}")
    return 1 if any(s in ("FAIL", "ERROR") for s, _ in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
