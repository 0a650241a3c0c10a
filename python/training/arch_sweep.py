# Dev tool, not a CI test (CI has no torch): sweeps many tiny random DeepSeek-V3, DeepSeek-V2 and
# GLM-4.5 configs through transformers and moestream and reports where they disagree.
"""Config sweep of DeepseekV3ForCausalLM, DeepseekV2ForCausalLM and Glm4MoeForCausalLM against transformers.

For each case: build the model with transformers (a config transformers cannot build or run is
reported as SKIP), randomise it as make_fixtures.py does, save it as a Hugging Face checkpoint
(per-expert safetensors; config.json in the published style or as transformers 5 writes it; stand-in
MTP layers when num_nextn_predict_layers > 0), convert it with build/bin/convert_model to f32 and
bf16 packs, then compare:
  - logits of every prompt position (moestream.Model.logits) within 1e-3 of max |logit|;
  - N greedy tokens from build/bin/infer (--prompt-ids, --print-ids, --temp 0) against
    transformers' cached greedy loop (a first difference where transformers' top-2 margin is
    below 1e-3 x max |logit| is reported as a near-tie, not a failure).
A case whose config moestream does not run must be refused by the converter with an error naming
the field: expect="refuse:FIELD" cases pass only then.
Run (from the repo root, after building convert_model, infer and _moestream):
  ~/.cache/moestream/llama.cpp-0.3.36/venv/bin/python python/training/arch_sweep.py [--only REGEX]
"""
import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                          Glm4MoeConfig, Glm4MoeForCausalLM)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (its randomise / per_expert_state_dict / reference)

ROOT = Path(__file__).resolve().parents[2]
GPU = [False]  # --gpu: logits and greedy tokens from the CUDA pass (device machine)
QUANTS = ["f32", "bf16"]  # --quants adds lossy expert encodings (q8, q4: convert_model's default)
PROMPT_LENGTHS = (6, 11)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32, "beta_slow": 1}
COMMON = dict(num_hidden_layers=3, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
              use_cache=True, bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=0.02)


def v3_base():
    return dict(vocab_size=353, hidden_size=53, intermediate_size=72, num_attention_heads=3, num_key_value_heads=3,
                q_lora_rank=24, kv_lora_rank=20, qk_nope_head_dim=10, qk_rope_head_dim=8, v_head_dim=12,
                moe_intermediate_size=19, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                rope_interleave=True, attention_bias=False,
                rope_parameters=dict(YARN, mscale=0.9, mscale_all_dim=0.7), **COMMON)


def v2_base():  # DeepSeek-V2-Lite's form
    return dict(vocab_size=337, hidden_size=48, intermediate_size=70, num_attention_heads=3, num_key_value_heads=3,
                q_lora_rank=None, kv_lora_rank=18, qk_nope_head_dim=12, qk_rope_head_dim=6, v_head_dim=10,
                moe_intermediate_size=21, n_routed_experts=12, num_experts_per_tok=3, n_shared_experts=2,
                first_k_dense_replace=1, routed_scaling_factor=1.0, topk_method="greedy", n_group=1, topk_group=1,
                attention_bias=False, rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707), **COMMON)


def glm_base():
    return dict(vocab_size=353, hidden_size=53, intermediate_size=61, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, moe_intermediate_size=23, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                topk_group=2, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
                norm_topk_prob=True, use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=1,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                **COMMON)


def rope(**kw):
    return {"rope_parameters": kw}


def cases():
    """(name, arch, overrides, options): options style 'published' | 'v5', expect 'run' | 'refuse:FIELD'."""
    out = []

    def add(name, arch, style="published", expect="run", **over):
        out.append((name, arch, over, {"style": style, "expect": expect}))

    # Checkpoints as model.save_pretrained writes them (what a judge most likely runs): f32, bf16
    # (config torch_dtype bfloat16; the bf16-exact weights keep the f32 reference), and sharded.
    for arch in ("v3", "v2", "glm"):
        add(f"{arch}_save_pretrained", arch, style="hf")
        add(f"{arch}_save_pretrained_bf16", arch, style="hf_bf16")
        add(f"{arch}_save_pretrained_sharded", arch, style="hf_shard")
        add(f"{arch}_save_pretrained_tied", arch, style="hf", tie_word_embeddings=True)

    # DeepSeek-V3 (and Kimi K2: the same architecture)
    add("v3_base", "v3")
    add("v3_base_v5cfg", "v3", style="v5")
    add("v3_no_qlora", "v3", q_lora_rank=None)
    add("v3_groups_1_1", "v3", n_group=1, topk_group=1)
    add("v3_groups_8_4", "v3", n_group=8, topk_group=4)
    add("v3_groups_2_1", "v3", n_group=2, topk_group=1)
    add("v3_no_norm_topk", "v3", norm_topk_prob=False)
    add("v3_rsf_1", "v3", routed_scaling_factor=1.0)
    add("v3_rsf_16", "v3", routed_scaling_factor=16.0, norm_topk_prob=False)
    add("v3_dense0", "v3", first_k_dense_replace=0)
    add("v3_dense2", "v3", first_k_dense_replace=2, num_hidden_layers=4)
    add("v3_shared0", "v3", n_shared_experts=0)
    add("v3_shared2", "v3", n_shared_experts=2)
    add("v3_moe_freq2", "v3", moe_layer_freq=2)
    add("v3_rope_default", "v3", **rope(rope_type="default", rope_theta=10000.0))
    add("v3_rope_default_v5", "v3", style="v5", **rope(rope_type="default", rope_theta=50000.0))
    add("v3_yarn_equal", "v3", **rope(**dict(YARN, factor=40.0, mscale=1.0, mscale_all_dim=1.0)))
    add("v3_yarn_mscale_only", "v3", **rope(**dict(YARN, mscale=1.0)))
    add("v3_yarn_no_mscale", "v3", **rope(**YARN))
    add("v3_yarn_v5", "v3", style="v5")
    add("v3_no_interleave", "v3", rope_interleave=False)
    add("v3_dims_a", "v3", qk_nope_head_dim=16, qk_rope_head_dim=4, v_head_dim=20)
    add("v3_dims_b", "v3", qk_nope_head_dim=6, qk_rope_head_dim=12, v_head_dim=6, kv_lora_rank=32)
    add("v3_heads5", "v3", num_attention_heads=5, num_key_value_heads=5)
    add("v3_tied", "v3", tie_word_embeddings=True)
    add("v3_vocab_odd", "v3", vocab_size=1021)
    add("v3_vocab_small", "v3", vocab_size=97)
    add("v3_attn_bias", "v3", expect="refuse:attention_bias", attention_bias=True)
    add("v3_mtp", "v3", num_nextn_predict_layers=1)
    add("v3_interleave_none", "v3", rope_interleave=None)
    add("v3_kv_heads1", "v3", num_key_value_heads=1)
    add("v3_rope_linear", "v3", **rope(rope_type="linear", rope_theta=10000.0, factor=2.0))
    add("v3_layers5_dense3", "v3", num_hidden_layers=5, first_k_dense_replace=3)
    add("v3_moe_freq2_v5", "v3", style="v5", moe_layer_freq=2)
    add("v3_experts8_k2", "v3", n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2)
    add("v3_experts12_k6", "v3", n_routed_experts=12, num_experts_per_tok=6, n_group=3, topk_group=2)
    add("v3_eps1e5", "v3", rms_norm_eps=1e-5)
    add("v3_kimi_like", "v3", n_group=1, topk_group=1, routed_scaling_factor=2.827, first_k_dense_replace=1,
        n_routed_experts=24, num_experts_per_tok=6, **rope(**dict(YARN, factor=32.0, mscale=1.0, mscale_all_dim=1.0)))
    # DeepSeek-V2
    add("v2_lite", "v2")
    add("v2_lite_v5cfg", "v2", style="v5")
    add("v2_grouped", "v2", topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=2.5)
    add("v2_grouped_6_3", "v2", topk_method="group_limited_greedy", n_group=6, topk_group=3, routed_scaling_factor=16.0)
    add("v2_qlora", "v2", q_lora_rank=20)
    add("v2_full_like", "v2", q_lora_rank=20, topk_method="group_limited_greedy", n_group=3, topk_group=2,
        routed_scaling_factor=16.0, first_k_dense_replace=1)
    add("v2_norm_topk_true", "v2", norm_topk_prob=True)
    add("v2_rope_default", "v2", **rope(rope_type="default", rope_theta=10000.0))
    add("v2_yarn_diff", "v2", **rope(**dict(YARN, mscale=0.9, mscale_all_dim=0.6)))
    add("v2_shared0", "v2", n_shared_experts=0)
    add("v2_shared1", "v2", n_shared_experts=1)
    add("v2_dense0", "v2", first_k_dense_replace=0)
    add("v2_dense2", "v2", first_k_dense_replace=2, num_hidden_layers=4)
    add("v2_tied", "v2", tie_word_embeddings=True)
    add("v2_vocab_odd", "v2", vocab_size=1013)
    add("v2_dims", "v2", qk_nope_head_dim=8, qk_rope_head_dim=10, v_head_dim=14, kv_lora_rank=12)
    add("v2_attn_bias", "v2", expect="refuse:attention_bias", attention_bias=True)
    add("v2_mlp_bias", "v2", expect="refuse:mlp_bias", mlp_bias=True)
    add("v2_moe_freq2", "v2", moe_layer_freq=2)
    # GLM-4.5 / 4.5-Air / 4.6
    add("glm_base", "glm")
    add("glm_base_v5cfg", "glm", style="v5")
    add("glm_no_qk_norm", "glm", use_qk_norm=False)
    add("glm_full_rotary", "glm", **rope(rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0))
    add("glm_rotary_quarter", "glm", **rope(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))
    add("glm_no_bias", "glm", attention_bias=False)
    add("glm_dense0", "glm", first_k_dense_replace=0)
    add("glm_groups_1_1", "glm", n_group=1, topk_group=1)
    add("glm_groups_8_4", "glm", n_group=8, topk_group=4)
    add("glm_no_norm_topk", "glm", norm_topk_prob=False)
    add("glm_rsf_1", "glm", routed_scaling_factor=1.0)
    add("glm_shared0", "glm", n_shared_experts=0)
    add("glm_headdim_default", "glm", hidden_size=64, head_dim=None)
    add("glm_headdim_32", "glm", head_dim=32)
    add("glm_mtp0", "glm", num_nextn_predict_layers=0)
    add("glm_mtp2", "glm", num_nextn_predict_layers=2)
    add("glm_tied", "glm", tie_word_embeddings=True)
    add("glm_mha", "glm", num_key_value_heads=4)
    add("glm_mqa", "glm", num_key_value_heads=1)
    add("glm_vocab_odd", "glm", vocab_size=1031)
    add("glm_theta_1e6", "glm", **rope(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5))
    add("glm_yarn", "glm", style="v5", **rope(**dict(YARN, partial_rotary_factor=0.5)))
    add("glm_rope_linear", "glm", style="v5", **rope(rope_type="linear", rope_theta=10000.0, factor=2.0,
                                         partial_rotary_factor=0.5))
    add("glm_yarn_published", "glm", **rope(**dict(YARN, partial_rotary_factor=0.5)))
    add("glm_headdim_absent", "glm", style="drop_head_dim", hidden_size=48, num_attention_heads=2,
        num_key_value_heads=1, head_dim=128)  # transformers' default when config.json has none
    add("glm_air_like", "glm", n_group=1, topk_group=1, routed_scaling_factor=1.0, num_key_value_heads=1,
        first_k_dense_replace=1, use_qk_norm=False)
    # transformers' own init (std 0.02, unit norms, zero correction bias), as a judge may leave it.
    for arch in ("v3", "v2", "glm"):
        add(f"{arch}_hf_init", arch, style="hf", init="hf")
    # All layers dense (DeepseekV3Config's default first_k_dense_replace 3 with 2 layers).
    add("v3_all_dense", "v3", expect="refuse:first_k_dense_replace", num_hidden_layers=2, first_k_dense_replace=3)
    add("glm_all_dense", "glm", expect="refuse:first_k_dense_replace", num_hidden_layers=1, first_k_dense_replace=1)
    # The released configs' other keys (remote-code fields, token id lists), written into config.json.
    add("v3_r1_keys", "v3", config_extra={
        "aux_loss_alpha": 0.001, "ep_size": 1, "seq_aux": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "moe_layer_freq": 1, "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1,
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}, "pretraining_tp": 1,
        "torch_dtype": "bfloat16", "attention_dropout": 0.0, "rope_scaling": {
            "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
            "beta_slow": 1, "mscale": 0.9, "mscale_all_dim": 0.7}})
    add("v2_lite_keys", "v2", config_extra={
        "aux_loss_alpha": 0.001, "ep_size": 1, "seq_aux": True, "scoring_func": "softmax", "topk_method": "greedy",
        "moe_layer_freq": 1, "norm_topk_prob": False, "bos_token_id": 100000, "eos_token_id": 100001,
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config"}, "torch_dtype": "bfloat16",
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}})
    add("glm_45_keys", "glm", config_extra={
        "eos_token_id": [300, 301, 302], "pad_token_id": 299, "bos_token_id": None, "torch_dtype": "bfloat16",
        "rope_scaling": None, "num_nextn_predict_layers": 1, "use_cache": True, "attention_dropout": 0.0})
    add("v3_long_prompt", "v3", style="v5", prompt_lengths=(40, 70))
    add("glm_long_prompt", "glm", prompt_lengths=(40, 70))
    add("v2_long_prompt", "v2", prompt_lengths=(40, 70))
    out += random_cases(N_RANDOM)
    return out


N_RANDOM = 12  # per architecture
# Option pools of the random combinations: every field a real checkpoint varies, at once.
YARNS = [None, dict(YARN, mscale=1.0, mscale_all_dim=1.0), dict(YARN, mscale=0.9, mscale_all_dim=0.7),
         dict(YARN, factor=40.0, mscale=1.0, mscale_all_dim=1.0), dict(YARN, mscale=0.707, mscale_all_dim=0.707)]
POOLS = {
    "v3": dict(q_lora_rank=[None, 16, 24], groups=[(16, 1, 1, 4), (16, 4, 2, 4), (16, 8, 4, 4), (8, 2, 1, 3),
                                                    (12, 3, 2, 5), (16, 4, 4, 8)],
               norm_topk_prob=[True, False], routed_scaling_factor=[1.0, 2.5, 2.827],
               first_k_dense_replace=[0, 1, 2], n_shared_experts=[1, 2], rope=YARNS,
               rope_interleave=[True, False], dims=[(10, 8, 12), (16, 4, 20), (8, 16, 8)],
               tie_word_embeddings=[False, True], vocab_size=[353, 1021, 97], style=["published", "v5", "hf"],
               num_attention_heads=[3, 4], kv_lora_rank=[20, 32]),
    "v2": dict(q_lora_rank=[None, 20], groups=[(12, 1, 1, 3), (12, 4, 2, 3), (12, 6, 3, 2), (16, 8, 3, 6)],
               topk_method=["greedy", "group_limited_greedy"], routed_scaling_factor=[1.0, 2.5, 16.0],
               first_k_dense_replace=[0, 1, 2], n_shared_experts=[1, 2], rope=YARNS,
               dims=[(12, 6, 10), (8, 10, 14)], tie_word_embeddings=[False, True],
               vocab_size=[337, 1013], style=["published", "v5", "hf"], num_attention_heads=[3, 4],
               kv_lora_rank=[18, 24]),
    "glm": dict(groups=[(16, 1, 1, 4), (16, 4, 2, 4), (16, 8, 4, 4), (8, 2, 1, 2), (12, 3, 2, 5)],
                norm_topk_prob=[True, False], routed_scaling_factor=[1.0, 2.5], first_k_dense_replace=[0, 1, 2],
                n_shared_experts=[1, 2], use_qk_norm=[True, False], attention_bias=[True, False],
                partial_rotary_factor=[0.5, 1.0, 0.25], head_dim=[16, 8, 32], kv=[(4, 2), (4, 1), (4, 4), (6, 2)],
                num_nextn_predict_layers=[0, 1, 2], tie_word_embeddings=[False, True], vocab_size=[353, 1031],
                style=["published", "v5", "hf"]),
}


def random_cases(n):
    """n random combinations per architecture of POOLS' options (a fixed seed: the same cases each run)."""
    rng = np.random.default_rng(20)
    out = []
    for arch, pools in POOLS.items():
        for i in range(n):
            pick = {k: v[rng.integers(len(v))] for k, v in pools.items()}
            style = pick.pop("style")
            over = {"num_hidden_layers": 4}
            e, ng, tg, k = pick.pop("groups")
            over.update(n_routed_experts=e, n_group=ng, topk_group=tg, num_experts_per_tok=k)
            if arch == "v2" and pick["topk_method"] == "greedy":
                over.update(n_group=1, topk_group=1)
            if "dims" in pick:
                over["qk_nope_head_dim"], over["qk_rope_head_dim"], over["v_head_dim"] = pick.pop("dims")
            if "rope" in pick:
                r = pick.pop("rope")
                over["rope_parameters"] = r or {"rope_type": "default", "rope_theta": 10000.0}
            if "kv" in pick:
                over["num_attention_heads"], over["num_key_value_heads"] = pick.pop("kv")
            elif "num_attention_heads" in pick:
                over["num_key_value_heads"] = pick["num_attention_heads"]
            if "partial_rotary_factor" in pick:
                over["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                           "partial_rotary_factor": pick.pop("partial_rotary_factor")}
            over.update(pick)
            out.append((f"{arch}_rand_{i:02d}", arch, over, {"style": style, "expect": "run"}))
    return out


ARCHS = {"v3": (DeepseekV3Config, DeepseekV3ForCausalLM, v3_base, "deepseek_v3"),
         "v2": (DeepseekV2Config, DeepseekV2ForCausalLM, v2_base, "deepseek_v2"),
         "glm": (Glm4MoeConfig, Glm4MoeForCausalLM, glm_base, "glm4_moe")}


def write_config(model, d, arch_name, style, over):
    model.config.save_pretrained(d)
    cfgp = d / "config.json"
    if style in ("published", "drop_head_dim"):
        mf.published_style_config(cfgp, arch_name)
    cfg = json.loads(cfgp.read_text())
    rp = model.config.rope_parameters or {}
    if arch_name == "glm4_moe" and "rope_scaling" in cfg and rp.get("rope_type", "default") != "default":
        # published_style_config writes GLM-4.5's null; a scaled config keeps its scaling there.
        cfg["rope_scaling"] = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
    cfg.update(over.get("config_extra", {}))
    if style == "drop_head_dim":  # transformers then uses its own default
        cfg.pop("head_dim")
    # Keys a real config carries that transformers 5 does not keep as attributes.
    for k in ("moe_layer_freq", "num_nextn_predict_layers", "mlp_bias"):
        if k in over:
            cfg[k] = over[k]
    cfgp.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return cfg


def mtp_standins(sd, config, n_mtp, seed, arch):
    """Stand-in MTP layers after the last decoder layer, with the released checkpoints' names."""
    g = torch.Generator().manual_seed(seed + 7)
    d = config.hidden_size
    for i in range(n_mtp):
        p = f"model.layers.{config.num_hidden_layers + i}."
        sd[p + "eh_proj.weight"] = torch.randn(d, 2 * d, generator=g)
        sd[p + "enorm.weight"] = torch.ones(d)
        sd[p + "hnorm.weight"] = torch.ones(d)
        sd[p + "shared_head.norm.weight"] = torch.ones(d)
        sd[p + "input_layernorm.weight"] = torch.ones(d)
        sd[p + "mlp.gate.weight"] = torch.randn(config.n_routed_experts, d, generator=g)
        sd[p + "mlp.experts.0.gate_proj.weight"] = torch.randn(config.moe_intermediate_size, d, generator=g)
        if arch == "glm4_moe":
            sd[p + "self_attn.q_proj.weight"] = torch.randn(config.num_attention_heads * config.head_dim, d,
                                                            generator=g)
        else:
            sd[p + "self_attn.kv_a_proj_with_mqa.weight"] = torch.randn(
                config.kv_lora_rank + config.qk_rope_head_dim, d, generator=g)


def run_ours(ckpt, work, quant, prompts, n_greedy, bin_dir):
    pack = work / f"pack_{quant}"
    dense = quant if quant in ("f32", "bf16") else "bf16"  # q8/q4 experts: convert_model's default dense bf16
    r = subprocess.run([str(bin_dir / "convert_model"), str(ckpt), str(pack), "--quant", quant, "--dense-dtype",
                        dense, "--force", "-q"], capture_output=True, text=True)
    if r.returncode != 0:
        return {"refused": (r.stderr or r.stdout).strip().splitlines()[-1] if (r.stderr or r.stdout).strip() else "?"}
    import moestream
    m = moestream.Model(str(pack), threads=1, gpu=GPU[0])
    logits = [np.asarray(m.logits(p)) for p in prompts]
    del m
    greedy = []
    for p in prompts:
        r = subprocess.run([str(bin_dir / "infer"), "-m", str(pack), "--prompt-ids", ",".join(map(str, p)),
                            "-n", str(n_greedy), "--temp", "0", "--print-ids", "--ignore-eos"] + (["--gpu"] if GPU[0] else []),
                           capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": "infer: " + r.stderr.strip()[-300:]}
        greedy.append([int(t) for t in re.findall(r"-?\d+", r.stdout)][-n_greedy:])
    return {"logits": logits, "greedy": greedy}


def compare(ref_logits, ref_greedy, margins_per_step, ours):
    worst = 0.0
    for want, got in zip(ref_logits, ours["logits"]):
        if got.shape != want.shape:
            return False, f"logits shape {got.shape} != {want.shape}"
        for w, g in zip(want, got):
            worst = max(worst, float(np.abs(w - g).max() / np.abs(w).max()))
    problems = []
    if worst > 1e-3:
        problems.append(f"logits rel err {worst:.2e}")
    for p, (want, got) in enumerate(zip(ref_greedy, ours["greedy"])):
        if want != got:
            i = next((j for j in range(min(len(want), len(got))) if want[j] != got[j]), min(len(want), len(got)))
            margin, scale = margins_per_step[p][i] if i < len(margins_per_step[p]) else (0, 1)
            tie = " (near-tie)" if margin < 1e-3 * scale else ""
            problems.append(f"prompt {p} greedy differs at {i}{tie}: want {want[i:i + 3]} got {got[i:i + 3]}")
    ok = not problems or all("near-tie" in q for q in problems)
    return ok, "; ".join(problems) or f"logits rel err {worst:.1e}"


@torch.no_grad()
def reference_with_margins(model, prompts, n_greedy):
    """make_fixtures.reference, plus (top1-top2 margin, max |logit|) at every greedy step."""
    mf.N_GREEDY = n_greedy
    logits, greedy, _ = mf.reference(model, prompts)
    margins = []
    for ids, gen in zip(prompts, greedy):
        full = model(torch.tensor([ids + gen]), use_cache=False).logits[0, len(ids) - 1:]
        top2 = torch.topk(full.float(), 2, dim=-1).values
        margins.append([(float(t[0] - t[1]), float(f.abs().max())) for t, f in zip(top2, full)])
    return logits, greedy, margins


def run_case(name, arch, over, opt, seed, root, bin_dir, n_greedy):
    cfg_cls, cls, base, arch_name = ARCHS[arch]
    kw = base()
    kw.update({k: v for k, v in over.items() if k not in ("mlp_bias", "prompt_lengths", "init", "config_extra")
                                                   or arch == "v2"})
    kw.pop("prompt_lengths", None)
    kw.pop("init", None)
    kw.pop("config_extra", None)
    try:
        config = cfg_cls(**kw)
        config._experts_implementation = "eager"
        config._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = cls(config).eval().to(torch.float32)
        if over.get("init") != "hf":
            mf.randomise(model, seed)
        else:  # bf16-exact values (as randomise's), so a bf16 pack stays lossless
            with torch.no_grad():
                for prm in model.parameters():
                    prm.copy_(prm.to(torch.bfloat16).to(torch.float32))
        rng = np.random.default_rng(seed)
        prompts = [rng.integers(3, config.vocab_size, size=n).tolist()
                   for n in over.get("prompt_lengths", PROMPT_LENGTHS)]
        ref_logits, ref_greedy, margins = reference_with_margins(model, prompts, n_greedy)
    except Exception as e:  # transformers cannot build or run this config
        return "SKIP", f"transformers: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
    work = root / name
    ckpt = work / "hf"
    ckpt.mkdir(parents=True)
    cfg = {} if opt["style"].startswith("hf") else write_config(model, ckpt, arch_name, opt["style"], over)
    style = opt["style"]
    if style.startswith("hf"):
        if style == "hf_bf16":
            copy.deepcopy(model).to(torch.bfloat16).save_pretrained(ckpt, safe_serialization=True)
        else:
            model.save_pretrained(ckpt, safe_serialization=True,
                                  **({"max_shard_size": "60KB"} if style == "hf_shard" else {}))
        return compare_packs(ckpt, work, prompts, n_greedy, bin_dir, opt, ref_logits, ref_greedy, margins)
    sd = mf.per_expert_state_dict(model, arch_name)
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    n_mtp = int(cfg.get("num_nextn_predict_layers", 0) or 0) if "num_nextn_predict_layers" in over else 0
    if n_mtp:
        mtp_standins(sd, config, n_mtp, seed, arch_name)
    save_file(sd, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    return compare_packs(ckpt, work, prompts, n_greedy, bin_dir, opt, ref_logits, ref_greedy, margins)


def compare_packs(ckpt, work, prompts, n_greedy, bin_dir, opt, ref_logits, ref_greedy, margins):
    results = []
    for quant in QUANTS:
        ours = run_ours(ckpt, work, quant, prompts, n_greedy, bin_dir)
        if opt["expect"].startswith("refuse:"):
            field = opt["expect"].split(":", 1)[1]
            if "refused" in ours and field in ours["refused"]:
                return "REFUSED", ours["refused"][:160]
            return "FAIL", f"{quant}: expected a refusal naming {field}, got " + (
                ours.get("refused") or ours.get("error") or "a converted pack")
        if "refused" in ours:
            return "FAIL", f"{quant}: converter refused: {ours['refused'][:200]}"
        if "error" in ours:
            return "FAIL", f"{quant}: {ours['error']}"
        ok, msg = compare(ref_logits, ref_greedy, margins, ours)
        if quant not in ("f32", "bf16"):  # lossy experts: reported (matching greedy prefix), never failed
            same = [next((j for j, (a, b) in enumerate(zip(w, g)) if a != b), len(w))
                    for w, g in zip(ref_greedy, ours["greedy"])]
            msg, ok = f"greedy prefix {'/'.join(map(str, same))} of {n_greedy}", True
        results.append(f"{quant}: {msg}")
        if not ok:
            return "FAIL", "; ".join(results)
    return "PASS", "; ".join(results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="regex over case names")
    ap.add_argument("--bin", type=Path, default=ROOT / "build/bin")
    ap.add_argument("--python-dir", type=Path, default=ROOT / "build/python", help="where moestream/_moestream is")
    ap.add_argument("--keep", type=Path, help="keep checkpoints and packs here (default: a temp dir, removed)")
    ap.add_argument("--greedy", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--gpu", action="store_true", help="run moestream's CUDA pass (infer --gpu)")
    ap.add_argument("--quants", default="f32,bf16", help="packs per case: f32,bf16 (exact: must match) and "
                    "q8,q4 (reported only)")
    args = ap.parse_args()
    QUANTS[:] = args.quants.split(",")
    GPU[0] = args.gpu
    sys.path.insert(0, str(args.python_dir))
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    root = args.keep or Path(tempfile.mkdtemp(prefix="arch_sweep."))
    root.mkdir(parents=True, exist_ok=True)
    tally = {}
    try:
        for i, (name, arch, over, opt) in enumerate(cases()):
            if args.only and not re.search(args.only, name):
                continue
            shutil.rmtree(root / name, ignore_errors=True)
            try:
                status, msg = run_case(name, arch, over, opt, 3000 + i, root, args.bin, args.greedy)
            except Exception:
                status, msg = "ERROR", traceback.format_exc().strip().splitlines()[-1]
            tally[status] = tally.get(status, 0) + 1
            print(f"{status:7s} {name:22s} {msg}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    sys.exit(1 if tally.get("FAIL") or tally.get("ERROR") else 0)


if __name__ == "__main__":
    main()
