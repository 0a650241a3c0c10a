#!/usr/bin/env python3
"""Makes the GGUF fixtures of tests/fixtures/gguf/ (issue 18, item 7). Run once; the outputs are
checked in.

Tiny random-weight Hugging Face models (config.json, model.safetensors and a small tokenizer cut from
a real one in ../shared/tokenizers) are converted by llama.cpp's converter and quantized by its
quantizer; llama.cpp then runs each file and its greedy tokens and logits are written beside it.
llama.cpp comes from scripts/llama_cpp_tool.sh (outside the repository); this script re-runs itself
with that tool's Python (torch, transformers, the vendored gguf-py).

    scripts/llama_cpp_tool.sh build
    scripts/make_gguf_fixtures.py [--out tests/fixtures/gguf] [--work DIR]
    scripts/make_gguf_fixtures.py --from-hf-fixtures   # tests/fixtures/gguf_hf (see below)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_TOKENIZERS = REPO.parent / "shared" / "tokenizers"
CACHE = Path(os.environ.get("MOESTREAM_CACHE", str(Path.home() / ".cache" / "moestream")))

PROMPT = "The cat sat on the mat. It was"
N_PREDICT = 16
TOP_K = 20
N_FULL = 4
VOCAB = 384

# The models. "k" has every expert row length (hidden for gate/up, the expert width for down) and
# every other matrix row a multiple of 256, so that K-quants and IQ4_XS apply to all of them.
MODELS = {
    "qwen3moe-tiny": dict(kind="qwen3moe", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                          experts=4, top_k=2, expert_ff=32, seed=18001),
    "qwen3moe-k": dict(kind="qwen3moe", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                       experts=4, top_k=2, expert_ff=256, seed=18002),
    "olmoe-tiny": dict(kind="olmoe", hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16,
                       experts=4, top_k=2, expert_ff=32, seed=18003),
    "mixtral-tiny": dict(kind="mixtral", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                         experts=4, top_k=2, expert_ff=32, seed=18004),
}

# (fixture name, model, how, argument). how: convert (the converter's outtype), split (the fixture
# that llama-gguf-split cuts), quantize (llama-quantize's type name, --pure, --tensor-type
# overrides). The quantized files start from the model's F32 conversion.
FIXTURES = [
    ("qwen3moe-tiny-F32", "qwen3moe-tiny", "convert", "f32"),
    ("qwen3moe-tiny-F16", "qwen3moe-tiny", "convert", "f16"),
    ("qwen3moe-tiny-BF16", "qwen3moe-tiny", "convert", "bf16"),
    ("qwen3moe-tiny-Q8_0", "qwen3moe-tiny", "convert", "q8_0"),
    ("qwen3moe-tiny-Q8_0-split", "qwen3moe-tiny", "split", "qwen3moe-tiny-Q8_0"),
    ("qwen3moe-tiny-Q4_0", "qwen3moe-tiny", "quantize", ("Q4_0", True, [])),
    ("qwen3moe-tiny-Q4_1", "qwen3moe-tiny", "quantize", ("Q4_1", True, [])),
    ("qwen3moe-tiny-Q5_0", "qwen3moe-tiny", "quantize", ("Q5_0", True, [])),
    ("qwen3moe-tiny-Q5_1", "qwen3moe-tiny", "quantize", ("Q5_1", True, [])),
    ("qwen3moe-tiny-IQ4_NL", "qwen3moe-tiny", "quantize", ("IQ4_NL", True, [])),
    # Not pure: the MXFP4_MOE mix itself, experts MXFP4 and every other matrix Q8_0.
    ("qwen3moe-tiny-MXFP4_MOE", "qwen3moe-tiny", "quantize", ("MXFP4_MOE", False, [])),
    ("qwen3moe-k-Q2_K", "qwen3moe-k", "quantize", ("Q2_K", True, [])),
    ("qwen3moe-k-Q3_K", "qwen3moe-k", "quantize", ("Q3_K_M", True, [])),
    ("qwen3moe-k-Q4_K", "qwen3moe-k", "quantize", ("Q4_K_M", True, [])),
    ("qwen3moe-k-Q5_K", "qwen3moe-k", "quantize", ("Q5_K_M", True, [])),
    ("qwen3moe-k-Q6_K", "qwen3moe-k", "quantize", ("Q6_K", True, [])),
    ("qwen3moe-k-IQ4_XS", "qwen3moe-k", "quantize", ("IQ4_XS", True, [])),
    # Mixed: Q4_K_M's own mix (ffn_down of the last layer Q6_K, attn_v higher) plus overrides so
    # that gate, up and down differ within a layer and between the two layers.
    ("qwen3moe-k-mixed", "qwen3moe-k", "quantize",
     ("Q4_K_M", False, [(r"blk\.0\.ffn_up_exps", "Q5_K"), (r"blk\.1\.ffn_gate_exps", "Q3_K")])),
    ("olmoe-tiny-F32", "olmoe-tiny", "convert", "f32"),
    ("olmoe-tiny-Q8_0", "olmoe-tiny", "convert", "q8_0"),
    ("mixtral-tiny-F32", "mixtral-tiny", "convert", "f32"),
    ("mixtral-tiny-Q8_0", "mixtral-tiny", "convert", "q8_0"),
]
SPLIT_MAX_TENSORS = 10

# The pre-tokenizer each model's GGUF names (tokenizer.ggml.pre). The converter recognises a
# pre-tokenizer by hashing how the tokenizer splits a test text; a cut-down vocabulary changes that
# hash, so the name of the real model's pre-tokenizer is given explicitly.
PRE_TOKENIZER = {"qwen3moe": "qwen2", "olmoe": "olmo", "mixtral": None}


def log(msg: str) -> None:
    print(f"make_gguf_fixtures: {msg}", file=sys.stderr, flush=True)


def tool_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts" / "llama_cpp_tool.sh"), "env"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# ---------------------------------------------------------------- tokenizers (cut from real ones)

def qwen_tokenizer(dst: Path, vocab_size: int = VOCAB,
                   specials: tuple = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")) -> None:
    """Qwen3's byte-level BPE cut to its first vocab_size - len(specials) tokens (the 256 byte
    symbols come first) and the merges among them, plus the special tokens (three of Qwen3's by
    default)."""
    src = json.loads((SHARED_TOKENIZERS / "qwen3" / "tokenizer.json").read_text(encoding="utf-8"))
    keep = vocab_size - len(specials)
    vocab = {t: i for t, i in src["model"]["vocab"].items() if i < keep}
    merges = [m for m in src["model"]["merges"]
              if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tok = dict(src)
    tok["model"] = dict(src["model"], vocab=vocab, merges=merges)
    tok["added_tokens"] = [dict(id=keep + j, content=s, single_word=False, lstrip=False, rstrip=False,
                                normalized=False, special=True) for j, s in enumerate(specials)]
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    cfg = json.loads((SHARED_TOKENIZERS / "qwen3" / "tokenizer_config.json").read_text(encoding="utf-8"))
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "bos_token": None,
        "eos_token": specials[-1], "pad_token": specials[0], "unk_token": None,
        "model_max_length": 256, "chat_template": cfg["chat_template"]}, indent=1), encoding="utf-8")


def gpt2_tokenizer(dst: Path) -> None:
    """GPT-2's byte-level BPE (what OLMoE's GPT-NeoX-style vocabulary derives from) cut to its first
    VOCAB-1 tokens and the merges among them, plus <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    enc = json.loads((SHARED_TOKENIZERS / "gpt2" / "encoder.json").read_text(encoding="utf-8"))
    keep = VOCAB - 1
    vocab = {t: i for t, i in enc.items() if i < keep}
    merges = []
    for line in (SHARED_TOKENIZERS / "gpt2" / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]:
        a, b = line.split(" ")
        if a in vocab and b in vocab and a + b in vocab:
            merges.append((a, b))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<|endoftext|>"])
    assert tk.token_to_id("<|endoftext|>") == keep
    tk.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "bos_token": None,
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "model_max_length": 256}, indent=1), encoding="utf-8")


def llama_tokenizer(dst: Path) -> None:
    """Llama-2's SentencePiece BPE (Mixtral's algorithm: byte fallback, a dummy-prefix space) cut to
    VOCAB pieces: <unk>, <s>, </s>, the 256 byte pieces, then Llama-2's merges in their order with
    the single characters they start from. Written twice, as real Mixtral checkpoints ship it: a
    SentencePiece model (tokenizer.model, which the converter prefers, with score -rank for each
    merge so that score order is merge order) and the same vocabulary as tokenizer.json."""
    from sentencepiece import sentencepiece_model_pb2 as spm
    src = json.loads((SHARED_TOKENIZERS / "llama2" / "tokenizer.json").read_text(encoding="utf-8"))
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]  # types: UNKNOWN, CONTROL
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]  # BYTE
    have = {p for p, _, _ in pieces}
    chars, merges = [], []
    for rank, m in enumerate(src["model"]["merges"]):
        a, b = m.split(" ") if isinstance(m, str) else m
        need = [x for x in dict.fromkeys((a, b)) if x not in have]
        if any(len(x) != 1 for x in need) or a + b in have:
            continue
        if len(pieces) + len(chars) + len(need) + 1 > VOCAB:
            break
        for x in need:
            chars.append(x)
            have.add(x)
        pieces.append((a + b, -float(rank), 1))  # NORMAL
        have.add(a + b)
        merges.append(f"{a} {b}")
    # Single characters score below every merge (they are starting symbols, never merge results).
    pieces += [(c, -1e6 - i, 1) for i, c in enumerate(chars)]
    assert len(pieces) == VOCAB, len(pieces)

    proto = spm.ModelProto()
    for text, score, kind in pieces:
        sp = proto.pieces.add()
        sp.piece, sp.score, sp.type = text, score, kind
    proto.trainer_spec.model_type = spm.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = VOCAB
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 0, 1, 2
    proto.trainer_spec.pad_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    (dst / "tokenizer.model").write_bytes(proto.SerializeToString())

    tok = dict(src)
    tok["model"] = dict(src["model"], vocab={p: i for i, (p, _, _) in enumerate(pieces)}, merges=merges)
    tok["added_tokens"] = [t for t in src["added_tokens"] if t["id"] < 3]
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
        "model_max_length": 256, "legacy": False}, indent=1), encoding="utf-8")


# ---------------------------------------------------------------- random Hugging Face models

def hf_config(name: str, m: dict) -> dict:
    common = {
        "hidden_size": m["hidden"], "num_hidden_layers": m["layers"],
        "num_attention_heads": m["heads"], "num_key_value_heads": m["kv_heads"],
        "head_dim": m["head_dim"], "vocab_size": VOCAB, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "float32", "num_experts_per_tok": m["top_k"], "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True, "rope_scaling": None,
    }
    if m["kind"] == "qwen3moe":
        return dict(common, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                    num_experts=m["experts"], moe_intermediate_size=m["expert_ff"],
                    intermediate_size=2 * m["expert_ff"], decoder_sparse_step=1, mlp_only_layers=[],
                    norm_topk_prob=True, rope_theta=1000000.0, attention_bias=False,
                    use_sliding_window=False, sliding_window=None, bos_token_id=None,
                    eos_token_id=VOCAB - 1, router_aux_loss_coef=0.001, output_router_logits=False)
    if m["kind"] == "olmoe":
        return dict(common, architectures=["OlmoeForCausalLM"], model_type="olmoe",
                    num_experts=m["experts"], intermediate_size=m["expert_ff"], norm_topk_prob=False,
                    rope_theta=10000.0, attention_bias=False, clip_qkv=None, bos_token_id=None,
                    rms_norm_eps=1e-5,  # what OLMoE uses and what the converter writes for it
                    eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1, router_aux_loss_coef=0.01,
                    output_router_logits=False)
    if m["kind"] == "mixtral":
        return dict(common, architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_local_experts=m["experts"], intermediate_size=m["expert_ff"],
                    rope_theta=1000000.0, sliding_window=None, bos_token_id=1, eos_token_id=2,
                    router_jitter_noise=0.0, router_aux_loss_coef=0.001, output_router_logits=False)
    raise ValueError(name)


def hf_weights(m: dict) -> dict:
    """Random weights scaled so that activations stay near unit size, routing is decisive (router
    logits of a few units) and the output logits spread over several units (no ties)."""
    import numpy as np
    rng = np.random.default_rng(m["seed"])
    h, f, e, hd = m["hidden"], m["expert_ff"], m["experts"], m["head_dim"]
    q, kv = m["heads"] * hd, m["kv_heads"] * hd

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, h)).astype(np.float32)}
    for i in range(m["layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = mat(q, h)
        w[p + "self_attn.k_proj.weight"] = mat(kv, h)
        w[p + "self_attn.v_proj.weight"] = mat(kv, h)
        w[p + "self_attn.o_proj.weight"] = mat(h, q)
        if m["kind"] == "qwen3moe":  # per-head q/k norms
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        elif m["kind"] == "olmoe":  # q/k norms over the whole projection
            w[p + "self_attn.q_norm.weight"] = norm(q)
            w[p + "self_attn.k_norm.weight"] = norm(kv)
        if m["kind"] == "mixtral":
            w[p + "block_sparse_moe.gate.weight"] = mat(e, h, 3.0)
            for j in range(e):
                x = f"{p}block_sparse_moe.experts.{j}."
                w[x + "w1.weight"] = mat(f, h)  # gate
                w[x + "w3.weight"] = mat(f, h)  # up
                w[x + "w2.weight"] = mat(h, f)  # down
        else:
            w[p + "mlp.gate.weight"] = mat(e, h, 3.0)
            for j in range(e):
                x = f"{p}mlp.experts.{j}."
                w[x + "gate_proj.weight"] = mat(f, h)
                w[x + "up_proj.weight"] = mat(f, h)
                w[x + "down_proj.weight"] = mat(h, f)
    w["model.norm.weight"] = norm(h)
    w["lm_head.weight"] = mat(VOCAB, h, 3.0)
    return w


def write_hf_model(name: str, dst: Path) -> None:
    from safetensors.numpy import save_file
    m = MODELS[name]
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(hf_config(name, m), indent=1), encoding="utf-8")
    save_file(hf_weights(m), str(dst / "model.safetensors"), metadata={"format": "pt"})
    {"qwen3moe": qwen_tokenizer, "olmoe": gpt2_tokenizer, "mixtral": llama_tokenizer}[m["kind"]](dst)


# ---------------------------------------------------------------- llama.cpp steps

def convert_driver(argv: list[str]) -> None:
    """Runs llama.cpp's converter in this process with tokenizer.ggml.pre forced to argv[0]
    ('-' keeps the converter's own choice); argv[1:] are the converter's arguments."""
    pre, args = argv[0], argv[1:]
    src = os.environ["LLAMA_CPP_SRC"]
    sys.path.insert(0, src)
    import conversion.base as base  # the converter's own package, from the sdist
    import convert_hf_to_gguf
    if pre != "-":
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    sys.argv = ["convert_hf_to_gguf.py", *args]
    convert_hf_to_gguf.main()


def run(cmd: list[str], env: dict | None = None) -> str:
    log(" ".join(cmd))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit(f"make_gguf_fixtures: command failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def describe(cmd: list[str], subst: dict[str, str]) -> str:
    s = " ".join(cmd)
    for k, v in subst.items():
        s = s.replace(v, k)
    return s


def gguf_types(files: list[Path]) -> tuple[dict, dict]:
    """Tensor name -> ggml type name, and a few metadata values, read with the gguf package."""
    import gguf
    types, meta = {}, {}
    for f in files:
        r = gguf.GGUFReader(str(f))
        for t in r.tensors:
            types[t.name] = t.tensor_type.name
        for key in ("general.architecture", "general.file_type", "split.count",
                    "tokenizer.ggml.model", "tokenizer.ggml.pre"):
            fld = r.fields.get(key)
            if fld is not None and key not in meta:
                v = fld.contents()
                meta[key] = v
    return types, meta


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main() -> None:
    global SHARED_TOKENIZERS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "gguf")
    ap.add_argument("--work", type=Path, default=CACHE / "gguf-fixtures-work")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    ap.add_argument("--tokenizers", type=Path, default=SHARED_TOKENIZERS,
                    help="the real tokenizers (default: ../shared/tokenizers beside the clone)")
    args = ap.parse_args()
    SHARED_TOKENIZERS = args.tokenizers

    env = tool_env()
    py = env["LLAMA_CPP_PYTHON"]
    # The tool's venv (its python is a symlink to the system one: compare the prefixes).
    if Path(sys.prefix).resolve() != Path(py).parent.parent.resolve() and os.environ.get("MGF_REEXEC") != "1":
        os.environ["MGF_REEXEC"] = "1"
        os.execv(py, [py, __file__, *sys.argv[1:]])
    if not SHARED_TOKENIZERS.is_dir():
        raise SystemExit(f"make_gguf_fixtures: {SHARED_TOKENIZERS} is missing (the real tokenizers)")
    oracle = env["LLAMA_CPP_ORACLE"]
    subst = {"$LLAMA_CPP_ORACLE": oracle, "$LLAMA_CPP_QUANTIZE": env["LLAMA_CPP_QUANTIZE"],
             "$LLAMA_CPP_GGUF_SPLIT": env["LLAMA_CPP_GGUF_SPLIT"],
             "$LLAMA_CPP_PYTHON": py, "$WORK": str(args.work), "$OUT": str(args.out),
             "scripts/make_gguf_fixtures.py": str(Path(__file__).resolve())}
    cenv = dict(os.environ, LLAMA_CPP_SRC=env["LLAMA_CPP_SRC"])
    only = set(filter(None, args.only.split(",")))

    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    prompt_file = args.work / "prompt.txt"
    prompt_file.write_text(PROMPT, encoding="utf-8")

    hf_dirs, f32 = {}, {}
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if (only and manifest_path.exists()) else {}
    entries = {e["name"]: e for e in manifest.get("fixtures", [])}

    def convert(model: str, outtype: str, outfile: Path, extra: list[str]) -> list[str]:
        pre = PRE_TOKENIZER[MODELS[model]["kind"]] or "-"
        cmd = [py, str(Path(__file__).resolve()), "--convert-driver", pre, str(hf_dirs[model]),
               "--outtype", outtype, "--outfile", str(outfile), "--model-name", model, *extra]
        run(cmd, cenv)
        return cmd

    def model_f32(model: str) -> tuple[Path, list[str]]:
        if model not in hf_dirs:
            hf_dirs[model] = args.work / "hf" / model
            shutil.rmtree(hf_dirs[model], ignore_errors=True)
            write_hf_model(model, hf_dirs[model])
        if model not in f32:
            path = args.work / f"{model}-F32.gguf"
            f32[model] = (path, convert(model, "f32", path, []))
        return f32[model]

    for name, model, how, arg in FIXTURES:
        if only and name not in only:
            continue
        model_f32(model)
        commands = [f"$LLAMA_CPP_PYTHON scripts/make_gguf_fixtures.py (writes $WORK/hf/{model})"]
        if how == "convert":
            out = args.out / f"{name}.gguf"
            commands.append(describe(convert(model, arg, out, []), subst))
            files = [out]
        elif how == "split":
            whole = args.out / f"{arg}.gguf"
            if not whole.is_file():
                raise SystemExit(f"make_gguf_fixtures: {name} is cut from {whole}: make it first")
            for old in args.out.glob(f"{name}-0*-of-0*.gguf"):
                old.unlink()
            cmd = [env["LLAMA_CPP_GGUF_SPLIT"], "--split", "--split-max-tensors",
                   str(SPLIT_MAX_TENSORS), str(whole), str(args.out / name)]
            run(cmd)
            commands.append(f"(the {arg} fixture, as above)")
            commands.append(describe(cmd, subst))
            files = sorted(args.out.glob(f"{name}-0*-of-0*.gguf"))
            if len(files) < 2:
                raise SystemExit(f"make_gguf_fixtures: split of {name} gave {len(files)} file(s)")
        else:
            ftype, pure, overrides = arg
            src, cmd0 = f32[model]
            commands.append(describe(cmd0, subst))
            out = args.out / f"{name}.gguf"
            cmd = [env["LLAMA_CPP_QUANTIZE"]] + (["--pure"] if pure else [])
            for rx, t in overrides:
                cmd += ["--tensor-type", f"{rx}={t.lower()}"]
            cmd += [str(src), str(out), ftype, "1"]
            run(cmd)
            commands.append(describe(cmd, subst))
            files = [out]
        # llama.cpp's outputs for the file (the first split names the set).
        rcmd = [oracle, "run", str(files[0]), str(prompt_file), str(N_PREDICT), str(TOP_K), str(N_FULL)]
        res = json.loads(run(rcmd))
        # llama.cpp's tokenization of the prompt must be the Hugging Face tokenizer's, or the
        # fixture would test a tokenizer disagreement instead of the model.
        from tokenizers import Tokenizer
        hf_ids = Tokenizer.from_file(str(hf_dirs[model] / "tokenizer.json")).encode(PROMPT).ids
        if hf_ids != res["prompt_ids"]:
            raise SystemExit(f"make_gguf_fixtures: {name}: llama.cpp tokenized the prompt as "
                             f"{res['prompt_ids']}, the tokenizers library as {hf_ids}")
        commands.append(describe(rcmd, subst))  # $WORK/prompt.txt holds the prompt
        types, meta = gguf_types(files)
        expected = {
            "fixture": name, "files": [f.name for f in files], "model": model,
            "llama_cpp": f"{env['LLAMA_CPP_VERSION']} ({env['LLAMA_CPP_COMMIT']})",
            "prompt": PROMPT, "settings": {
                "threads": 1, "kv_cache": "f32", "flash_attn": False, "batch": "prompt as one batch, "
                "then one token per batch", "greedy": "first index of the largest logit"},
            **res, "commands": commands}
        (args.out / f"{name}.json").write_text(json.dumps(expected, separators=(",", ":")) + "\n")
        experts = {k: v for k, v in types.items() if "_exps" in k}
        entries[name] = {
            "name": name, "model": model, "architecture": meta.get("general.architecture"),
            "files": [f.name for f in files], "sha256": {f.name: sha256(f) for f in files},
            "bytes": sum(f.stat().st_size for f in files), "expected": f"{name}.json",
            "file_type": meta.get("general.file_type"),
            "tokenizer": [meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")],
            "expert_types": sorted(set(experts.values())), "tensor_types": types,
            "commands": commands}
        log(f"{name}: {entries[name]['bytes']} bytes, expert types {entries[name]['expert_types']}, "
            f"greedy {res['generated_ids']}")

    manifest = {
        "llama_cpp": {"version": env["LLAMA_CPP_VERSION"], "vendors": env["LLAMA_CPP_COMMIT"],
                      "sdist_sha256": env["LLAMA_CPP_SDIST_SHA256"],
                      "build": "scripts/llama_cpp_tool.sh: static libllama, CPU, GGML_NATIVE=OFF "
                               "with AVX/AVX2/FMA/F16C, no OpenMP"},
        "prompt": PROMPT, "n_predict": N_PREDICT, "top_k": TOP_K, "n_full": N_FULL,
        "models": MODELS,
        "fixtures": [entries[n] for n, *_ in FIXTURES if n in entries]}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(e["bytes"] for e in manifest["fixtures"])
    log(f"{len(manifest['fixtures'])} fixtures, {total} bytes of GGUF")


# ---------------------------------------------------------------- GGUFs of the transformers fixtures
# (issues 20 and 21: gpt-oss, deepseek2, qwen2moe and glm4moe from GGUF). The Hugging Face fixtures of
# tests/fixtures/<name>/ (python/training/make_fixtures.py) converted by llama.cpp's converter into
# tests/fixtures/gguf_hf/, checked against transformers' reference logits (not llama.cpp's): the
# engine must compute from the GGUF what transformers computes from the checkpoint.
#
#   scripts/make_gguf_fixtures.py --from-hf-fixtures [--out tests/fixtures/gguf_hf] [--only NAME,...]

# What the GGUF cannot say about a fixture, and how the source is adapted so that it can:
#   gpt-oss: llama.cpp fixes the clamped SwiGLU's limit at 7.0 (gpt-oss's value); the fixture's is
#     1.25 (so that the clamp matters) and is written as gpt-oss.swiglu_clamp_exp, which moestream
#     reads (llama.cpp's key for other architectures' expert clamp).
#   deepseek2: a GGUF holds YaRN's mscale_all_dim only (rope.scaling.yarn_log_multiplier) and means
#     mscale = mscale_all_dim, as in every released DeepSeek; deepseek_v3's fixture has 0.9 / 0.7,
#     so its GGUF is made from the config with mscale 0.7 and compared with logits transformers
#     computes for that config (written beside it). The published configs' scoring_func is added
#     (transformers 5 does not save it), which the converter turns into expert_gating_func.
#   qwen2moe, glm4moe: as converted. Their tiny shapes (hidden 47 and 53) fit no ggml block, so no
#     quantised file (llama.cpp falls back to F16 for such rows); llama.cpp cannot run the qwen2moe
#     file itself (it assumes heads x head_dim = hidden), which is why the oracle is transformers.
# The tokenizer each source gets (the converter needs one; the tests feed token ids): None is
# GPT-2's BPE cut to HF_TOKENIZER_TOKENS; a tuple is Qwen3's byte-level BPE cut to the model's
# vocabulary with those special tokens (GLM's converter looks four of its own up by name).
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
GLM_SPECIALS = ("<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>")
HF_GGUF_FIXTURES = [
    # (fixture, HF fixture dir, outtype, pre-tokenizer, config overrides, converter extras, tokenizer)
    ("gpt_oss-F32", "gpt_oss", "f32", "gpt-4o", {}, {"add_swiglu_clamp_exp": 1.25}),
    ("gpt_oss-BF16", "gpt_oss", "bf16", "gpt-4o", {}, {"add_swiglu_clamp_exp": 1.25}),
    ("gpt_oss-Q8_0", "gpt_oss", "q8_0", "gpt-4o", {}, {"add_swiglu_clamp_exp": 1.25}),
    # The released layout: MXFP4 expert blocks, which the converter repacks as ggml MXFP4.
    ("gpt_oss_mxfp4-MXFP4", "gpt_oss_mxfp4", "f32", "gpt-4o", {}, {"add_swiglu_clamp_exp": 1.25}),
    ("deepseek_v3-F32", "deepseek_v3", "f32", "deepseek-v3",
     {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "rope_scaling.mscale": 0.7}, {}),
    ("deepseek_v3-BF16", "deepseek_v3", "bf16", "deepseek-v3",
     {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "rope_scaling.mscale": 0.7}, {}),
    ("deepseek_v2-F32", "deepseek_v2", "f32", "deepseek-v3", {"scoring_func": "softmax"}, {}),
    ("qwen2moe-F32", "qwen2_moe", "f32", "qwen2", {}, {}, QWEN_SPECIALS),
    ("qwen2moe-BF16", "qwen2_moe", "bf16", "qwen2", {}, {}, QWEN_SPECIALS),
    ("glm4moe-F32", "glm4_moe", "f32", "glm4", {}, {}, GLM_SPECIALS),
    ("glm4moe-BF16", "glm4_moe", "bf16", "glm4", {}, {}, GLM_SPECIALS),
]
HF_TOKENIZER_TOKENS = 300  # GPT-2's BPE cut below every fixture's vocabulary; the converter pads


def convert_driver_hf(argv: list[str]) -> None:
    """llama.cpp's converter in this process with tokenizer.ggml.pre forced to argv[0] and the
    GGUF writer calls of argv[1] (JSON {method: per-layer value}) added to the metadata."""
    pre, extras, args = argv[0], json.loads(argv[1]), argv[2:]
    sys.path.insert(0, os.environ["LLAMA_CPP_SRC"])
    import conversion.base as base
    import convert_hf_to_gguf
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    plain = base.TextModel.set_gguf_parameters

    def with_extras(self):
        plain(self)
        for method, value in extras.items():
            getattr(self.gguf_writer, method)([value] * self.block_count)
    base.TextModel.set_gguf_parameters = with_extras
    sys.argv = ["convert_hf_to_gguf.py", *args]
    convert_hf_to_gguf.main()


def hf_source(src: Path, dst: Path, overrides: dict, specials: tuple | None = None) -> None:
    """The HF fixture with its config adapted (dotted keys reach into objects) and a tokenizer
    (HF_GGUF_FIXTURES' last column)."""
    global VOCAB
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    for key, value in overrides.items():
        obj, *path = key.split(".")
        if path:
            cfg[obj][path[0]] = value
        else:
            cfg[obj] = value
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    if specials is not None:
        qwen_tokenizer(dst, cfg["vocab_size"], specials)
        return
    saved, VOCAB = VOCAB, HF_TOKENIZER_TOKENS + 1
    try:
        gpt2_tokenizer(dst)
    finally:
        VOCAB = saved


def hf_reference(model_dir: Path, prompts: list) -> dict:
    """transformers' logits and greedy tokens for the prompts (make_fixtures.reference)."""
    sys.path.insert(0, str(REPO / "python" / "training"))
    import torch
    import transformers
    from make_fixtures import f32_list, reference
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager").eval()
    logits, greedy, margins = reference(model, prompts)
    return {"prompts": prompts, "logits": [f32_list(l) for l in logits], "greedy": greedy,
            "greedy_min_margin": margins, "transformers_version": transformers.__version__,
            "torch_version": torch.__version__}


def main_from_hf(argv: list[str]) -> None:
    global SHARED_TOKENIZERS
    ap = argparse.ArgumentParser(prog="make_gguf_fixtures.py --from-hf-fixtures")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "gguf_hf")
    ap.add_argument("--work", type=Path, default=CACHE / "gguf-hf-fixtures-work")
    ap.add_argument("--only", default="")
    ap.add_argument("--tokenizers", type=Path, default=SHARED_TOKENIZERS,
                    help="the real tokenizers (default: ../shared/tokenizers beside the clone)")
    args = ap.parse_args(argv)
    SHARED_TOKENIZERS = args.tokenizers
    env = tool_env()
    py = env["LLAMA_CPP_PYTHON"]
    if Path(sys.prefix).resolve() != Path(py).parent.parent.resolve() and os.environ.get("MGF_REEXEC") != "1":
        os.environ["MGF_REEXEC"] = "1"
        os.execv(py, [py, __file__, "--from-hf-fixtures", *argv])
    cenv = dict(os.environ, LLAMA_CPP_SRC=env["LLAMA_CPP_SRC"])
    only = set(filter(None, args.only.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    entries = {e["name"]: e for e in manifest.get("fixtures", [])}
    fixtures_root = REPO / "tests" / "fixtures"
    for name, hf_name, outtype, pre, overrides, extras, *tokenizer in HF_GGUF_FIXTURES:
        if only and name not in only:
            continue
        src = args.work / "hf" / name
        hf_source(fixtures_root / hf_name, src, overrides, *tokenizer)
        out = args.out / f"{name}.gguf"
        cmd = [py, str(Path(__file__).resolve()), "--convert-driver-hf", pre, json.dumps(extras), str(src),
               "--outtype", outtype, "--outfile", str(out), "--model-name", hf_name]
        run(cmd, cenv)
        ref = f"../{hf_name}/reference.json"
        if overrides.get("rope_scaling.mscale") is not None:  # a config transformers must run again
            ref = f"{name.split('-')[0]}.reference.json"
            prompts = json.loads((fixtures_root / hf_name / "reference.json").read_text())["prompts"]
            data = dict(hf_reference(src, prompts), architecture=json.loads((src / "config.json").read_text())[
                "architectures"][0], config_overrides=overrides)
            (args.out / ref).write_text(json.dumps(data, separators=(",", ":")) + "\n")
        types, meta = gguf_types([out])
        entries[name] = {
            "name": name, "source": f"tests/fixtures/{hf_name}", "outtype": outtype, "reference": ref,
            "architecture": meta.get("general.architecture"), "file": out.name, "sha256": sha256(out),
            "bytes": out.stat().st_size, "config_overrides": overrides, "metadata_added": extras,
            "tensor_types": types,
            "command": f"$LLAMA_CPP_PYTHON scripts/make_gguf_fixtures.py --from-hf-fixtures --only {name}"}
        log(f"{name}: {out.stat().st_size} bytes, reference {ref}")
    manifest = {"llama_cpp": f"{env['LLAMA_CPP_VERSION']} ({env['LLAMA_CPP_COMMIT']})",
                "fixtures": [entries[n] for n, *_ in HF_GGUF_FIXTURES if n in entries]}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--convert-driver":
        convert_driver(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--convert-driver-hf":
        convert_driver_hf(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--from-hf-fixtures":
        main_from_hf(sys.argv[2:])
    else:
        main()
