# Trains the demo model's byte-level BPE tokenizer (Qwen2 style) on data/corpus/train.txt and
# writes models/demo/tokenizer.json + tokenizer_config.json.
"""Byte-level BPE in the layout of Qwen2's tokenizer.json.

Same normalizer (NFC), pre-tokenizer (Split on Qwen2's regex, isolated; then ByteLevel without
prefix space or its own regex), ByteLevel decoder and post-processor, BPE without unk or byte
fallback. The special tokens come first, so <|endoftext|> is id 0, <|im_start|> 1, <|im_end|> 2.
"""
import argparse
import json
import os
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# transformers/models/qwen2/tokenization_qwen2.py: PRETOKENIZE_REGEX
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                 r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def build_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def docs_of(path, chunk_docs=256):
    """Batches of documents (the corpus separates documents with a blank line pair)."""
    docs = Path(path).read_text(encoding="utf-8").split("\n\n\n")
    for i in range(0, len(docs), chunk_docs):
        yield docs[i:i + chunk_docs]


def write_atomic(path, text):
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default="data/corpus/train.txt")
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--vocab-size", type=int, default=8192)
    args = ap.parse_args()

    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs_of(args.train), trainer=trainer)
    for t in SPECIAL_TOKENS:
        assert tok.token_to_id(t) == SPECIAL_TOKENS.index(t), t

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)}
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 2048,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    write_atomic(out / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    sample = "The quick brown fox doesn't jump over 12 lazy dogs.\n"
    enc = tok.encode(sample)
    assert tok.decode(enc.ids) == sample, "byte-level round trip failed"
    print(f"vocab {tok.get_vocab_size()}; '{sample.strip()}' -> {len(enc.ids)} tokens: {enc.tokens}")


if __name__ == "__main__":
    main()
