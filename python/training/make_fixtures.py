# Builds the tiny random-weight reference models (Qwen3-MoE, OLMoE, Mixtral, Qwen2-MoE, GLM-4.5,
# DeepSeek-V3, gpt-oss, MiniMax-M2) with transformers
# itself and writes them, with reference logits and greedy tokens, to tests/fixtures/<name>/.
"""Test fixtures for the converter and the forward pass, made by Hugging Face transformers.

For every fixture: config.json, model.safetensors (float32) and reference.json =
  {"prompts": [[ids]], "logits": [prompt][position][vocab], "greedy": [prompt][32 ids],
   "greedy_min_margin": [prompt] smallest top1-top2 logit gap met while generating,
   "transformers_version", "torch_version", ...}.
qwen3_moe, olmoe, mixtral and qwen2_moe are saved in the per-expert tensor layout of published checkpoints
(converted here from the fused 3-D tensors that transformers 5 holds in memory, and checked
against transformers' own reverse conversion and by reloading), with config.json keys in the
published style too (rope_theta, num_experts); qwen3_moe_fused, with the
config.json that transformers 5 writes (rope_parameters, num_local_experts), is saved by
save_pretrained(save_original_format=False), i.e. the fused layout
`mlp.experts.gate_up_proj [E, 2F, D]` (gate rows first) and `mlp.experts.down_proj [E, D, F]`.
deepseek_v3 (DeepSeek-V3 / Kimi K2's architecture) adds multi-head latent attention with a q LoRA,
interleaved RoPE pairs and YaRN mscale, a dense first layer, grouped sigmoid routing with a random
correction bias, and a shared expert; its config.json is in the published style (rope_scaling).
deepseek_v3_fp8 is the same architecture saved as DeepSeek-V3's FP8 releases are: linear weights in
float8_e4m3fn with `weight_scale_inv` block scales (16 x 16 blocks, powers of two) and a
quantization_config; the reference runs on the dequantised weights. deepseek_v2 is DeepSeek-V2-Lite's
form: MLA with a plain q_proj, complex (interleaved) RoPE, a softmax router, two shared experts;
deepseek_v2_grouped the same with DeepSeek-V2's group-limited greedy router (topk_method
group_limited_greedy, 4 groups scored by their best probability, 2 kept, routed_scaling_factor 2.5).
qwen2_moe (Qwen1.5-MoE / Qwen2-MoE) adds Q/K/V biases and the sigmoid-gated shared expert; its
config.json drops `qkv_bias` and `layer_types`, as released Qwen2-MoE configs do (transformers'
defaults: biases on, every layer full attention).
qwen2_moe_dense_swa is Qwen2-MoE with a dense first layer (mlp_only_layers [0]) and sliding windows
(use_sliding_window, window 4, layer_types left to transformers' default from max_window_layers).
glm4_moe (GLM-4.5) adds the grouped sigmoid router with a random (non-zero) e_score_correction_bias
and routed_scaling_factor, an ungated shared expert, a dense first layer, partial rotary, QK-norm
and Q/K/V biases; its config.json is in the published GLM-4.5 style (partial_rotary_factor,
rope_theta and num_nextn_predict_layers at the top level) and its checkpoint carries a stand-in
MTP layer (model.layers.3.*, as GLM-4.5's layer 46/92) that transformers and the converter skip.
gpt_oss (eager attention, f32) has attention sinks, sliding (window 6) and full layers, YaRN RoPE
with truncate false, biases everywhere, the clamped SwiGLU (limit 1.25, so the clamp matters) and
the top-k softmax router, saved as transformers writes it (`gate_up_proj [E, D, 2F]`, gate/up
columns interleaved). gpt_oss_mxfp4 is the same model with its experts quantised to MXFP4 and
saved in the released checkpoints' layout (`*_blocks` [E, rows, cols/32, 16], `*_scales`
[E, rows, cols/32], uint8, config.json with quantization_config mxfp4); its reference logits come
from the model holding transformers' own dequantisation of those blocks
(integrations.mxfp4.convert_moe_packed_tensors), saved too as mxfp4_dequantized.safetensors
(`layers.N.gate_up_proj` [E, D, 2F], `layers.N.down_proj` [E, F, D], f32) for bit-exact checks.
minimax_m2 (MiniMax-M2, transformers >= 5.23) has QK-norm over all heads before the head split,
partial rotary (8 of 16 dims), the sigmoid router with a random e_score_correction_bias (selection
only) and renormalised top-k, no shared expert; saved in the released layout (Mixtral's
block_sparse_moe.experts.N.w1/w2/w3, block_sparse_moe.gate, block_sparse_moe.e_score_correction_bias)
with a config.json in the released style (rotary_dim, rope_theta, use_qk_norm, qk_norm_type,
scoring_func, use_routing_bias, shared_intermediate_size, attn_type_list at the top level).
minimax_m2_fp8 is the same model as MiniMax-M2's FP8 release stores it: every projection and expert
matrix float8_e4m3fn with `weight_scale_inv` blocks (16 x 16 here, 128 x 128 released) and
quantization_config fmt "float8_e4m3fn"; the router and the correction bias stay float.
Run on a machine with torch + transformers >= 5 (the device machine): python3 make_fixtures.py
(--only NAME ... remakes some fixtures and leaves the others as they are).
"""
import argparse
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                          Glm4MoeConfig, Glm4MoeForCausalLM, GptOssConfig, GptOssForCausalLM, MiniMaxM2Config,
                          MiniMaxM2ForCausalLM, MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

N_GREEDY = 32
PROMPT_LENGTHS = (5, 9, 12)


def fixture_specs():
    """name -> (model class, config, seed, layout). Odd sizes wherever the architecture allows."""
    common = dict(num_hidden_layers=3, rms_norm_eps=1e-6, max_position_embeddings=256,
                  tie_word_embeddings=False, use_cache=True, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, initializer_range=0.02)
    qwen = Qwen3MoeConfig(
        vocab_size=419, hidden_size=67, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=37, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)
    # The fused variant also covers norm_topk_prob = false, a wider top-k and more experts.
    qwen_fused = Qwen3MoeConfig(
        vocab_size=389, hidden_size=45, intermediate_size=64, num_attention_heads=3,
        num_key_value_heads=1, head_dim=18, moe_intermediate_size=29, num_experts=12,
        num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    # OLMoE: head_dim = hidden/heads and q_norm is over hidden_size, so hidden = heads * even.
    olmoe = OlmoeConfig(
        vocab_size=401, hidden_size=54, intermediate_size=29, num_attention_heads=3,
        num_key_value_heads=1, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        clip_qkv=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    mixtral = MixtralConfig(
        vocab_size=433, hidden_size=61, intermediate_size=43, num_attention_heads=4,
        num_key_value_heads=2, head_dim=14, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=None, router_jitter_noise=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)
    # Qwen2-MoE: QKV biases, a shared expert (of its own width) behind a sigmoid gate, raw top-k
    # probabilities; head_dim given so the hidden size can be odd.
    qwen2 = Qwen2MoeConfig(
        vocab_size=331, hidden_size=47, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, moe_intermediate_size=27, num_experts=8,
        num_experts_per_tok=3, shared_expert_intermediate_size=41, norm_topk_prob=False,
        decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)
    # Qwen2-MoE with a leading dense MLP layer (mlp_only_layers [0]) and sliding windows of 4 on the
    # even layers below max_window_layers (transformers 5's default layer_types), renormalised top-k.
    qwen2_dense_swa = Qwen2MoeConfig(
        vocab_size=211, hidden_size=37, intermediate_size=45, num_attention_heads=4,
        num_key_value_heads=1, head_dim=10, moe_intermediate_size=19, num_experts=6,
        num_experts_per_tok=2, shared_expert_intermediate_size=23, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[0], qkv_bias=True, use_sliding_window=True,
        sliding_window=4, max_window_layers=3,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    # gpt-oss: widths multiples of 32 (MXFP4 blocks); a window shorter than every prompt + greedy run.
    gpt_oss = GptOssConfig(
        vocab_size=307, hidden_size=64, intermediate_size=32, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=6, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        swiglu_limit=1.25, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 64,
                         "rope_theta": 150000.0}, **common)
    # GLM-4.5: 16 experts in 4 groups, 2 groups kept, top-4; one dense first layer; partial rotary
    # (8 of 16 dims); QK-norm and Q/K/V biases; a scaled, renormalised sigmoid router.
    glm = Glm4MoeConfig(
        vocab_size=353, hidden_size=53, intermediate_size=61, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=23, n_routed_experts=16,
        num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
        num_nextn_predict_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        **common)
    # DeepSeek-V3: MLA (q LoRA, interleaved RoPE pairs, YaRN with mscale != mscale_all_dim so both
    # the cos/sin factor and the softmax scale move), a dense first layer, grouped sigmoid routing
    # with a correction bias (randomise) and a scaling factor, one shared expert.
    deepseek = DeepseekV3Config(
        vocab_size=353, hidden_size=53, intermediate_size=72, num_attention_heads=3,
        num_key_value_heads=3, q_lora_rank=24, kv_lora_rank=20, qk_nope_head_dim=10,
        qk_rope_head_dim=8, v_head_dim=12, moe_intermediate_size=19, n_routed_experts=16,
        num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_interleave=True, attention_bias=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 0.9, "mscale_all_dim": 0.7},
        **common)
    # DeepSeek-V2-Lite's form: MLA without q LoRA (a plain q_proj), complex (interleaved) RoPE with
    # YaRN mscale = mscale_all_dim, softmax top-k without renormalisation, two ungated shared
    # experts, a dense first layer.
    deepseek2_form = dict(
        vocab_size=337, hidden_size=48, intermediate_size=70, num_attention_heads=3,
        num_key_value_heads=3, q_lora_rank=None, kv_lora_rank=18, qk_nope_head_dim=12,
        qk_rope_head_dim=6, v_head_dim=10, moe_intermediate_size=21, n_routed_experts=12,
        num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1, norm_topk_prob=False,
        attention_bias=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 0.707, "mscale_all_dim": 0.707},
        **common)
    deepseek2 = DeepseekV2Config(routed_scaling_factor=1.0, topk_method="greedy", n_group=1, topk_group=1,
                                 **deepseek2_form)
    # DeepSeek-V2's group-limited greedy router (issue 20): softmax over all experts, each group
    # scored by its best probability, the 2 best of 4 groups kept, top-3 inside them, the
    # probabilities times routed_scaling_factor (not renormalised); otherwise deepseek_v2's form.
    deepseek2_grouped = DeepseekV2Config(routed_scaling_factor=2.5, topk_method="group_limited_greedy", n_group=4,
                                         topk_group=2, **deepseek2_form)
    # MiniMax-M2: 12 experts, top-3, sigmoid scores with a correction bias (randomise), renormalised;
    # q_norm over all 4 x 16 query dims and k_norm over 2 x 16 key dims; RoPE on 8 of 16 dims.
    minimax = MiniMaxM2Config(
        vocab_size=347, hidden_size=51, intermediate_size=29, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=12, num_experts_per_tok=3,
        router_jitter_noise=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
        **common)
    return {
        "qwen3_moe": (Qwen3MoeForCausalLM, qwen, 1001, "per_expert"),
        "olmoe": (OlmoeForCausalLM, olmoe, 1002, "per_expert"),
        "mixtral": (MixtralForCausalLM, mixtral, 1003, "per_expert"),
        "qwen3_moe_fused": (Qwen3MoeForCausalLM, qwen_fused, 1004, "fused"),
        "qwen2_moe": (Qwen2MoeForCausalLM, qwen2, 1005, "per_expert"),
        "qwen2_moe_dense_swa": (Qwen2MoeForCausalLM, qwen2_dense_swa, 1013, "per_expert"),
        "glm4_moe": (Glm4MoeForCausalLM, glm, 1006, "per_expert"),
        "deepseek_v3": (DeepseekV3ForCausalLM, deepseek, 1007, "per_expert"),
        "deepseek_v3_fp8": (DeepseekV3ForCausalLM, deepseek, 1008, "per_expert_fp8"),
        "deepseek_v2": (DeepseekV2ForCausalLM, deepseek2, 1009, "per_expert"),
        "deepseek_v2_grouped": (DeepseekV2ForCausalLM, deepseek2_grouped, 1010, "per_expert"),
        "gpt_oss": (GptOssForCausalLM, gpt_oss, 1006, "gpt_oss"),
        "gpt_oss_mxfp4": (GptOssForCausalLM, gpt_oss, 1006, "mxfp4"),
        "minimax_m2": (MiniMaxM2ForCausalLM, minimax, 1014, "per_expert"),
        "minimax_m2_fp8": (MiniMaxM2ForCausalLM, minimax, 1015, "per_expert_fp8"),
    }


# Blocks of the FP8 fixture: 16 x 16 so that every matrix of the tiny model has several, partial
# ones on its edges included (DeepSeek-V3's releases use 128 x 128).
FP8_BLOCK = (16, 16)


def fp8_block_quantize(w, block):
    """(fp8 [R, C], scales [ceil(R/br), ceil(C/bc)] f32, dequantised f32): w = fp8 * scale per block.

    Scales are powers of two (2^ceil(log2(amax / 448)), 448 the largest e4m3 value), so each
    dequantised value is exactly a bf16 value too and a bf16 pack stays lossless.
    """
    rows, cols = w.shape
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    s = torch.ones(nr, nc)
    for i in range(nr):
        for j in range(nc):
            amax = float(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].abs().max())
            if amax > 0:
                s[i, j] = 2.0 ** math.ceil(math.log2(amax / 448.0))
    full = s.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    q = (w / full).to(torch.float8_e4m3fn)
    return q, s, q.to(torch.float32) * full


W_NAMES = {"1": "gate", "2": "down", "3": "up"}  # Mixtral-style expert matrices


@torch.no_grad()
def to_fp8_checkpoint(model, sd, block):
    """DeepSeek-V3's (and MiniMax-M2's) FP8 release layout of sd (per-expert names): every linear
    layer's weight but the embedding, lm_head and the router in F8_E4M3 with `<name>_scale_inv`
    block scales. The in-memory model is set to the dequantised values, so the reference is what
    the file holds."""
    params = dict(model.named_parameters())
    out = {}
    for k, v in sd.items():
        if v.dim() != 2 or not k.endswith(("_proj.weight", "_proj_with_mqa.weight", ".w1.weight", ".w2.weight",
                                           ".w3.weight")):
            out[k] = v
            continue
        q, s, deq = fp8_block_quantize(v, block)
        out[k], out[k + "_scale_inv"] = q, s
        # MiniMax-M2 / Mixtral names: block_sparse_moe.experts.N.w1 (gate), w3 (up), w2 (down).
        k_std = re.sub(r"\.block_sparse_moe\.experts\.(\d+)\.w([123])\.weight$",
                       lambda x: f".mlp.experts.{x.group(1)}.{W_NAMES[x.group(2)]}_proj.weight", k)
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", k_std)
        if m is None:
            params[k].copy_(deq)
        elif m.group(3) == "down":
            params[m.group(1) + ".down_proj"][int(m.group(2))].copy_(deq)
        else:  # gate_up_proj [E, 2F, D]: gate rows first
            gu = params[m.group(1) + ".gate_up_proj"]
            f = gu.shape[1] // 2
            (gu[int(m.group(2)), :f] if m.group(3) == "gate" else gu[int(m.group(2)), f:]).copy_(deq)
    return out


@torch.no_grad()
def randomise(model, seed):
    """Weights with O(1) activations: matrices ~ N(0, 1/fan_in), norm weights ~ U(0.5, 1.5),
    all rounded to bf16 values.

    transformers' own init (std 0.02, norms = 1) gives near-flat logits and routing, which
    would hide a missing norm weight or a wrong expert; these weights make every part matter.
    """
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith(".bias") or name.endswith("_bias"):  # biases: centred at 0, as large as the projections
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        elif name.endswith(".sinks"):  # gpt-oss's per-head sink logits, of the scores' size
            p.copy_(torch.randn(p.shape, generator=g))
        elif p.dim() == 1:  # RMSNorm weights
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        else:
            # gpt-oss's experts are stored as x @ W ([E, in, out]): the fan-in is the middle dim.
            fan_in = p.shape[-2] if name.endswith(("experts.gate_up_proj", "experts.down_proj")) else p.shape[-1]
            scale = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(fan_in)
            if name.endswith(("mlp.gate.weight", "mlp.router.weight")):
                scale *= 3.0  # a router with clear preferences: no near-ties in top-k
            p.copy_(torch.randn(p.shape, generator=g) * scale)
        # Exactly representable in bf16 (stored as f32): a bf16 pack is then lossless and must
        # reproduce the f32 reference logits and greedy tokens as closely as an f32 pack.
        p.copy_(p.to(torch.bfloat16).to(torch.float32))
    # The sigmoid router's correction bias is a buffer, zero after init: random values, of the
    # size of the score differences, so that it moves selections (GLM-4.5, DeepSeek-V3).
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_((torch.randn(b.shape, generator=g) * 0.3).to(torch.bfloat16).to(torch.float32))


# Architectures whose released checkpoints keep Mixtral's names (block_sparse_moe, w1/w2/w3).
MIXTRAL_NAMES = ("mixtral", "minimax_m2")


def per_expert_state_dict(model, arch):
    """The published-checkpoint layout, converted from the fused in-memory tensors."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().to(torch.float32).contiguous()
        if ".mlp.experts.gate_up_proj" in name:
            prefix = name.replace(".mlp.experts.gate_up_proj", "")
            n_e, two_f, _ = t.shape
            f = two_f // 2
            for e in range(n_e):
                gate, up = t[e, :f].contiguous(), t[e, f:].contiguous()
                if arch in MIXTRAL_NAMES:
                    out[f"{prefix}.block_sparse_moe.experts.{e}.w1.weight"] = gate
                    out[f"{prefix}.block_sparse_moe.experts.{e}.w3.weight"] = up
                else:
                    out[f"{prefix}.mlp.experts.{e}.gate_proj.weight"] = gate
                    out[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = up
        elif ".mlp.experts.down_proj" in name:
            prefix = name.replace(".mlp.experts.down_proj", "")
            for e in range(t.shape[0]):
                key = (f"{prefix}.block_sparse_moe.experts.{e}.w2.weight" if arch in MIXTRAL_NAMES
                       else f"{prefix}.mlp.experts.{e}.down_proj.weight")
                out[key] = t[e].contiguous()
        elif arch in MIXTRAL_NAMES and ".mlp.gate.weight" in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = t
        elif arch == "minimax_m2" and name.endswith(".mlp.e_score_correction_bias"):  # beside the gate
            out[name.replace(".mlp.", ".block_sparse_moe.")] = t
        else:
            out[name] = t
    return out


def published_style_config(path, arch):
    """Rewrites a transformers-5 config.json in the key style of published checkpoints.

    transformers 5 writes `rope_parameters` and, for Qwen3-MoE/OLMoE, `num_local_experts`;
    the published Qwen3-MoE/OLMoE/Mixtral configs carry `rope_theta` + `rope_scaling`,
    `num_experts` (Mixtral: `num_local_experts`) and `torch_dtype`. The per-expert fixtures use
    the published style, the fused one keeps transformers 5's, so a converter meets both.
    transformers still loads this file (checked by the reload in write_fixture).
    """
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    if arch not in ("mixtral", "deepseek_v3", "deepseek_v2", "minimax_m2") and "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    if arch == "qwen2_moe":  # released Qwen1.5-MoE / Qwen2-MoE configs predate both keys
        cfg.pop("qkv_bias")
        cfg.pop("layer_types")
    if arch == "glm4_moe":  # GLM-4.5's config.json: these at the top level, under these names
        cfg["partial_rotary_factor"] = rope["partial_rotary_factor"]
        cfg["rope_scaling"] = None
        if "num_mtp_layers" in cfg:
            cfg["num_nextn_predict_layers"] = cfg.pop("num_mtp_layers")
        if "num_local_experts" in cfg:
            cfg["n_routed_experts"] = cfg.pop("num_local_experts")
    if arch == "minimax_m2":  # MiniMax-M2's config.json: the remote code's keys, partial rotary as rotary_dim
        cfg["rotary_dim"] = int(cfg["head_dim"] * rope["partial_rotary_factor"])
        cfg["rope_scaling"] = None
        cfg.update(use_qk_norm=True, qk_norm_type="per_layer", scoring_func="sigmoid", use_routing_bias=True,
                   shared_intermediate_size=0, attn_type_list=[1] * cfg["num_hidden_layers"])
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


FP4_LEVELS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def mxfp4_quantize(w):
    """w [..., rows, cols] -> (blocks uint8 [..., rows, cols/32, 16], scales uint8 [..., rows, cols/32]) in
    the released gpt-oss layout: byte j of a block holds element 2j (low nibble) and 2j+1 (high);
    scale = 2^(byte - 127), the smallest power of two that brings the block's amax within 6."""
    *prefix, rows, cols = w.shape
    x = w.reshape(*prefix, rows, cols // 32, 32).to(torch.float64)
    amax = x.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -120)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    y = x / torch.pow(2.0, e)
    mag = (y.abs().unsqueeze(-1) - FP4_LEVELS.to(torch.float64)).abs().argmin(-1)  # nearest level
    code = (mag | ((y < 0) & (mag > 0)).to(torch.int64) << 3).to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (e.squeeze(-1) + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


@torch.no_grad()
def mxfp4_experts(model):
    """Quantises every layer's experts to MXFP4 in place (transformers' dequantisation of the blocks
    becomes the weights); returns the checkpoint's expert tensors and the dequantised ones."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    packed, dequantized = {}, {}
    for l, layer in enumerate(model.model.layers):
        ex = layer.mlp.experts
        p = f"model.layers.{l}.mlp.experts"
        for proj in ("gate_up_proj", "down_proj"):
            w = getattr(ex, proj)  # [E, in, out]: the blocks hold rows = outputs
            blocks, scales = mxfp4_quantize(w.transpose(1, 2).contiguous())
            deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            if deq.shape != w.shape:
                raise RuntimeError(f"{p}.{proj}: dequantised shape {tuple(deq.shape)} != {tuple(w.shape)}")
            w.copy_(deq)
            packed[f"{p}.{proj}_blocks"], packed[f"{p}.{proj}_scales"] = blocks, scales
            dequantized[f"layers.{l}.{proj}"] = deq.contiguous()
    return packed, dequantized


def save_mxfp4_checkpoint(model, packed, dest):
    """Writes gpt-oss's MXFP4 checkpoint of `model` into dest: config.json with its
    quantization_config, model.safetensors with the `packed` experts (mxfp4_experts) and every other
    tensor in f32 (a tied lm_head left to the embeddings)."""
    sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()
          if not k.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    sd.update(packed)
    model.config.save_pretrained(dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(sd, str(dest / "model.safetensors"), metadata={"format": "pt"})


@torch.no_grad()
def reference(model, prompts):
    logits_all, greedy_all, margins = [], [], []
    for ids in prompts:
        x = torch.tensor([ids])
        out = model(x, use_cache=True)
        logits_all.append(out.logits[0].float().numpy())
        past, nxt = out.past_key_values, out.logits[0, -1]
        gen, min_margin = [], float("inf")
        for _ in range(N_GREEDY):
            top2 = torch.topk(nxt.float(), 2).values
            min_margin = min(min_margin, float(top2[0] - top2[1]))
            tok = int(torch.argmax(nxt))
            gen.append(tok)
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[0, -1]
        # The cached loop must agree with a plain forward over the whole sequence.
        full = model(torch.tensor([ids + gen[:-1]]), use_cache=False).logits[0]
        check = full[len(ids) - 1:].argmax(-1).tolist()
        if check != gen:
            raise RuntimeError(f"cached greedy {gen} != uncached argmax {check}")
        greedy_all.append(gen)
        margins.append(min_margin)
    return logits_all, greedy_all, margins


def f32_list(a):
    """Nested lists of floats printed with 9 significant digits: exact for float32, compact."""
    if a.ndim == 1:
        return [float(f"{v:.9g}") for v in a.tolist()]
    return [f32_list(r) for r in a]


def write_fixture(name, cls, config, seed, layout, out_root):
    torch.manual_seed(seed)
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"
    model = cls(config).eval().to(torch.float32)
    randomise(model, seed)
    arch = config.model_type
    attn = model.model.layers[0].self_attn
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if arch in ("deepseek_v3", "deepseek_v2"):  # MLA: query heads are qk_nope + qk_rope wide
        hd = config.qk_nope_head_dim + config.qk_rope_head_dim
        attn = attn.q_b_proj if config.q_lora_rank else attn.q_proj
    else:
        attn = attn.q_proj
    if attn.weight.shape[0] != config.num_attention_heads * hd:
        raise RuntimeError(f"{name}: the query projection has {attn.weight.shape[0]} rows, expected "
                           f"{config.num_attention_heads} heads x {hd}")
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, config.vocab_size, size=n).tolist() for n in PROMPT_LENGTHS]

    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_root))
    try:
        mxfp4_reload = None
        if layout == "gpt_oss":
            model.save_pretrained(tmp, safe_serialization=True)
            keys = load_file(str(tmp / "model.safetensors")).keys()
            if not any(k.endswith("mlp.experts.gate_up_proj") for k in keys):
                raise RuntimeError(f"{name}: save_pretrained did not write gate_up_proj")
        elif layout == "mxfp4":
            packed, dequantized = mxfp4_experts(model)
            save_mxfp4_checkpoint(model, packed, tmp)  # the fixture's embeddings are not tied
            save_file(dequantized, str(tmp / "mxfp4_dequantized.safetensors"), metadata={"format": "pt"})
            from transformers import Mxfp4Config
            mxfp4_reload = Mxfp4Config(dequantize=True)
        elif layout == "fused":
            model.save_pretrained(tmp, save_original_format=False, safe_serialization=True)
            keys = load_file(str(tmp / "model.safetensors")).keys()
            if not any(k.endswith("mlp.experts.gate_up_proj") for k in keys):
                raise RuntimeError(f"{name}: save_pretrained did not write the fused layout")
        else:
            sd = per_expert_state_dict(model, arch)
            # transformers' own reverse conversion (what save_pretrained writes by default) must
            # give the same names and values.
            with tempfile.TemporaryDirectory() as d:
                model.save_pretrained(d, safe_serialization=True)
                theirs = load_file(str(Path(d) / "model.safetensors"))
            if set(theirs) != set(sd):
                raise RuntimeError(f"{name}: layout differs from save_pretrained: "
                                   f"{sorted(set(theirs) ^ set(sd))[:6]}")
            for k, v in sd.items():
                if not torch.equal(theirs[k].float(), v):
                    raise RuntimeError(f"{name}: tensor {k} differs from save_pretrained")
            model.config.save_pretrained(tmp)
            published_style_config(tmp / "config.json", arch)
            if arch == "glm4_moe":  # a stand-in MTP layer after the last decoder layer
                g = torch.Generator().manual_seed(seed + 1)
                mtp = f"model.layers.{config.num_hidden_layers}."
                d = config.hidden_size
                sd[mtp + "eh_proj.weight"] = torch.randn(d, 2 * d, generator=g)
                sd[mtp + "enorm.weight"] = torch.ones(d)
                sd[mtp + "self_attn.q_proj.bias"] = torch.randn(config.num_attention_heads * config.head_dim,
                                                                generator=g)
            if layout == "per_expert_fp8":
                sd = to_fp8_checkpoint(model, sd, FP8_BLOCK)
                cfg = json.loads((tmp / "config.json").read_text())
                # MiniMax-M2's release spells the format by its torch dtype.
                fmt = "float8_e4m3fn" if arch == "minimax_m2" else "e4m3"
                cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": fmt,
                                              "quant_method": "fp8", "weight_block_size": list(FP8_BLOCK)}
                (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for extra in ("generation_config.json",):
            (tmp / extra).unlink(missing_ok=True)

        logits, greedy, margins = reference(model, prompts)
        if layout == "per_expert_fp8":
            # transformers loads FP8 checkpoints on GPUs only: check instead that the file's FP8
            # weights times their scales are the weights the reference ran with.
            written, want = load_file(str(tmp / "model.safetensors")), per_expert_state_dict(model, arch)
            for k, v in want.items():
                got = written[k].to(torch.float32)
                if written[k].dtype == torch.float8_e4m3fn:
                    sc = written[k + "_scale_inv"]
                    got = got * sc.repeat_interleave(FP8_BLOCK[0], 0)[:v.shape[0]].repeat_interleave(
                        FP8_BLOCK[1], 1)[:, :v.shape[1]]
                if not torch.equal(got, v):
                    raise RuntimeError(f"{name}: FP8 tensor {k} does not dequantise to the model's")
            reloaded = None
        else:
            # Reloading the written files must reproduce the logits: the layout is loadable.
            extra_args = {"quantization_config": mxfp4_reload} if mxfp4_reload else {}
            # Eager attention, as the reference ran (sdpa sums in another order: ~1e-6 apart).
            reloaded = cls.from_pretrained(tmp, dtype=torch.float32, experts_implementation="eager",
                                           attn_implementation="eager", **extra_args).eval()
        with torch.no_grad():
            for ids, ref in zip(prompts, logits if reloaded is not None else []):
                got = reloaded(torch.tensor([ids])).logits[0].numpy()
                if not np.array_equal(got, ref):
                    raise RuntimeError(f"{name}: reloaded model differs by "
                                       f"{np.abs(got - ref).max()}")
        ref = {
            "architecture": cls.__name__, "layout": layout, "seed": seed,
            "prompts": prompts, "logits": [f32_list(l) for l in logits], "greedy": greedy,
            "greedy_min_margin": [float(f"{m:.6g}") for m in margins],
            "max_abs_logit": float(max(np.abs(l).max() for l in logits)),
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        }
        with open(tmp / "reference.json", "w") as f:
            json.dump(ref, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        dest = out_root / name
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in dest.iterdir())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name:16s} {n_params:7d} params  {size / 1e6:.2f} MB  greedy margin "
          f"{min(margins):.3g}  max|logit| {ref['max_abs_logit']:.2f}")
    if size > 1_800_000:
        raise RuntimeError(f"{dest}: {size} bytes, over the 1.8 MB fixture budget")


def write_fp8_fixture(out_root):
    """tests/fixtures/fp8/model.safetensors: FP8 (float8_e4m3fn) matrices with 128x128 block scales
    in the layout of DeepSeek-V3's FP8 releases (`X.weight` F8_E4M3, `X.weight_scale_inv` F32),
    and torch's own dequantisation of each as `X.reference` (F32), for the converter's FP8 path.
    `odd.weight` [130, 260] has partial blocks on both edges and random bytes (NaN codes
    replaced by 0); `codes.weight` [1, 256] holds every code once, NaNs included, scales 1.
    """
    g = torch.Generator().manual_seed(2001)
    raw = torch.randint(0, 256, (130, 260), generator=g, dtype=torch.uint8)
    raw[(raw == 0x7F) | (raw == 0xFF)] = 0
    odd = raw.view(torch.float8_e4m3fn)
    scale = torch.rand((2, 3), generator=g) * 0.01 + 1e-4
    full = scale.repeat_interleave(128, 0)[:130].repeat_interleave(128, 1)[:, :260]
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(1, 256).view(torch.float8_e4m3fn)
    tensors = {
        "odd.weight": odd, "odd.weight_scale_inv": scale, "odd.reference": odd.to(torch.float32) * full,
        "codes.weight": codes, "codes.weight_scale_inv": torch.ones((1, 2)),
        "codes.reference": codes.to(torch.float32),
    }
    dest = out_root / "fp8"
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt", "torch_version": torch.__version__})
    print(f"fp8              {(dest / 'model.safetensors').stat().st_size / 1e6:.2f} MB")


EXTRA_FIXTURES = {"fp8": write_fp8_fixture}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests/fixtures")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="make only these fixtures")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: reductions in a fixed order
    specs = fixture_specs()
    unknown = set(args.only or ()) - set(specs) - set(EXTRA_FIXTURES)
    if unknown:
        ap.error(f"unknown fixture(s) {sorted(unknown)}; known: {sorted(specs) + sorted(EXTRA_FIXTURES)}")
    for name, (cls, config, seed, layout) in specs.items():
        if args.only and name not in args.only:
            continue
        write_fixture(name, cls, config, seed, layout, args.out)
    for name, write in EXTRA_FIXTURES.items():
        if not args.only or name in args.only:
            write(args.out)


if __name__ == "__main__":
    main()
