"""Conformance of moestream's C++ tokenizer with Hugging Face `tokenizers` (the oracle).

For each vocabulary in ../shared/tokenizers (qwen3, llama2, gpt2) and models/demo/tokenizer.json
when it exists, >= 5 MB of seeded mixed text is encoded by `tokenize encode` and by `tokenizers`;
every id must match. Decoding must match the reference's decode (so decode(encode(s)) == s
wherever the reference round-trips), and streaming decode must equal whole-sequence decode.
"""
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import mixed_text  # noqa: E402

tokenizers = pytest.importorskip("tokenizers", reason="the oracle `tokenizers` is not installed (scripts/setup.sh installs it)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "tokenizers"
CORPUS_BYTES = 5_100_000


def _bin_dir():
    d = os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))
    return pathlib.Path(d)


def _tokenize_exe():
    exe = _bin_dir() / "tokenize"
    if not exe.exists():
        pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
    return exe


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = mixed_text.make_documents(CORPUS_BYTES, seed=20261129)
    assert all("\0" not in d for d in docs)
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_bytes("\0".join(docs).encode("utf-8"))
    return docs, path


def _gpt2_tokenizer_json(out_dir):
    """GPT-2 ships encoder.json + vocab.bpe: build the equivalent tokenizer.json with `tokenizers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    src = SHARED / "gpt2"
    bpe = models.BPE.from_file(str(src / "encoder.json"), str(src / "vocab.bpe"))
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path = out_dir / "tokenizer.json"
    tok.save(str(path))
    return path


def _vocabularies():
    out = []
    for name in ("qwen3", "llama2", "gpt2"):
        out.append(pytest.param(name, id=name))
    out.append(pytest.param("demo", id="demo"))
    return out


def _tokenizer_path(name, tmp_path):
    if name == "demo":
        path = ROOT / "models" / "demo" / "tokenizer.json"
        if not path.exists():
            pytest.skip("models/demo/tokenizer.json not trained yet")
        return path
    if not SHARED.exists():
        pytest.skip(f"{SHARED} is absent: the real tokenizer files are not available here")
    if name == "gpt2":
        return _gpt2_tokenizer_json(tmp_path)
    return SHARED / name / "tokenizer.json"


def _run(args):
    res = subprocess.run([str(a) for a in args], capture_output=True)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return res


def _read_ids(path):
    lines = path.read_text().split("\n")
    assert lines[-1] == ""
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def _first_difference(ours, ref, docs, tok):
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            return (f"doc {i}: first differing id at {k}: ours {a[max(0, k - 3):k + 5]} "
                    f"ref {b[max(0, k - 3):k + 5]} ref tokens "
                    f"{[tok.id_to_token(x) for x in b[max(0, k - 3):k + 5]]} text {docs[i][:200]!r}")
    return "document count differs"


@pytest.mark.parametrize("name", _vocabularies())
def test_encode_decode_match_reference(name, corpus, tmp_path):
    from tokenizers import Tokenizer
    exe = _tokenize_exe()
    tj = _tokenizer_path(name, tmp_path)
    docs, docs_path = corpus
    assert sum(len(d.encode()) for d in docs) >= 5_000_000
    tok = Tokenizer.from_file(str(tj))

    # Encode with special tokens: every id of every document.
    ours_path = tmp_path / "ours.ids"
    _run([exe, "encode", "-t", tj, "-i", docs_path, "--split-nul", "-o", ours_path])
    ours = _read_ids(ours_path)
    ref = [e.ids for e in tok.encode_batch(docs, add_special_tokens=True)]
    assert len(ours) == len(ref)
    mismatched = sum(sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))
                     for a, b in zip(ours, ref))
    assert mismatched == 0, _first_difference(ours, ref, docs, tok)

    # Without special tokens, on a slice (the post-processor is the only difference).
    head = docs[:300]
    head_path = tmp_path / "head.txt"
    head_path.write_bytes("\0".join(head).encode())
    plain_path = tmp_path / "plain.ids"
    _run([exe, "encode", "-t", tj, "-i", head_path, "--split-nul", "--no-special", "-o", plain_path])
    plain = _read_ids(plain_path)
    ref_plain = [e.ids for e in tok.encode_batch(head, add_special_tokens=False)]
    assert plain == ref_plain, _first_difference(plain, ref_plain, head, tok)

    # Decode the ids back: must equal the reference's decode, hence round-trip where it does.
    text_path = tmp_path / "decoded.txt"
    _run([exe, "decode", "-t", tj, "-i", ours_path, "-o", text_path])
    decoded = text_path.read_bytes().decode("utf-8").split("\0")
    ref_decoded = tok.decode_batch(ref, skip_special_tokens=False)
    assert len(decoded) == len(ref_decoded)
    bad = [i for i, (a, b) in enumerate(zip(decoded, ref_decoded)) if a != b]
    assert not bad, f"{len(bad)} documents decode differently, first {bad[0]}: ours {decoded[bad[0]][:200]!r} ref {ref_decoded[bad[0]][:200]!r}"
    round_trip = [i for i, d in enumerate(docs) if ref_decoded[i] == d]
    assert all(decoded[i] == docs[i] for i in round_trip)
    if name in ("qwen3", "gpt2"):
        # Byte-level BPE is lossless except for text the NFC normalizer changes.
        assert len(round_trip) > len(docs) // 2, f"only {len(round_trip)} of {len(docs)} round-trip"

    # skip_special_tokens and streaming decode, on the slice.
    head_ids = tmp_path / "head.ids"
    head_ids.write_text("".join(" ".join(map(str, ids)) + "\n" for ids in ours[:300]))
    skip_path = tmp_path / "skip.txt"
    _run([exe, "decode", "-t", tj, "-i", head_ids, "--skip-special", "-o", skip_path])
    skipped = skip_path.read_bytes().decode("utf-8").split("\0")
    assert skipped == tok.decode_batch(ref[:300], skip_special_tokens=True)
    stream_path = tmp_path / "stream.txt"
    _run([exe, "decode", "-t", tj, "-i", head_ids, "--stream", "-o", stream_path])
    streamed = stream_path.read_bytes().decode("utf-8").split("\0")
    assert streamed == ref_decoded[:300]


def _inputs(tmp_path, tokenizer_json, text):
    """tmp_path/tokenizer.json and tmp_path/t.txt, written with the given contents."""
    tj, t = tmp_path / "tokenizer.json", tmp_path / "t.txt"
    tj.write_text(tokenizer_json)
    t.write_text(text)
    return tj, t


def test_unknown_component_is_rejected_naming_field(tmp_path):
    exe = _tokenize_exe()
    bad, text = _inputs(tmp_path, '{"model": {"type": "Unigram", "vocab": []}, "added_tokens": []}', "hi")
    res = subprocess.run([str(exe), "encode", "-t", str(bad), "-i", str(text)], capture_output=True)
    assert res.returncode != 0
    err = res.stderr.decode()
    assert "model.type" in err and "Unigram" in err and str(bad) in err


def test_output_to_a_pipe_writes_through_it(tmp_path):
    """`-o` naming a FIFO (like /dev/null) must write into it, not rename a file over it."""
    import threading
    exe = _tokenize_exe()
    tj, text = _inputs(tmp_path, '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}',
                       "abab")
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    _run([exe, "encode", "-t", tj, "-i", text, "-o", fifo])
    reader.join(timeout=30)
    assert got == [b"2 2\n"]
    assert fifo.is_fifo()


# Components the real vocabularies do not use, checked against the oracle on variants of the
# GPT-2 and Llama-2 files: (base, field -> replacement JSON).
_BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_VARIANTS = {
    "split-merged-previous+bytelevel-prefix": ("gpt2", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\d+|\\s+"}, "behavior": "MergedWithPrevious", "invert": False},
        dict(_BL, add_prefix_space=True)]}}),
    "split-string-merged-next": ("gpt2", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        dict(_BL, use_regex=False)]}}),
    "split-invert-contiguous+digits": ("gpt2", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Contiguous", "invert": True},
        {"type": "Digits", "individual_digits": True}, _BL]}}),
    "split-removed+digits-runs": ("gpt2", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{P}"}, "behavior": "Removed", "invert": False},
        {"type": "Digits", "individual_digits": False}, _BL]}}),
    "nfkc+replace-regex+template": ("gpt2", {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": "\\s{2,}"}, "content": " "}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}}}}),
    "nfd+roberta": ("gpt2", {"normalizer": {"type": "NFD"},
                             "post_processor": {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 50256],
                                                "cls": ["<|endoftext|>", 50256], "trim_offsets": True,
                                                "add_prefix_space": False}}),
    "metaspace-always-split": ("llama2", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"},
                    {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]}}),
    "metaspace-first-nosplit": ("llama2", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}}),
    "metaspace-never": ("llama2", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}}),
}


@pytest.mark.parametrize("variant", sorted(_VARIANTS))
def test_component_variants_match_reference(variant, corpus, tmp_path):
    import json
    from tokenizers import Tokenizer
    exe = _tokenize_exe()
    base, changes = _VARIANTS[variant]
    doc = json.loads(_tokenizer_path(base, tmp_path).read_text())
    doc.update(changes)
    tj = tmp_path / "variant.json"
    tj.write_text(json.dumps(doc))
    tok = Tokenizer.from_file(str(tj))
    docs = corpus[0][:250]  # ~700 KB
    docs_path = tmp_path / "docs.txt"
    docs_path.write_bytes("\0".join(docs).encode())
    ids_path = tmp_path / "ids.txt"
    _run([exe, "encode", "-t", tj, "-i", docs_path, "--split-nul", "-o", ids_path])
    ours = _read_ids(ids_path)
    ref = [e.ids for e in tok.encode_batch(docs)]
    assert ours == ref, _first_difference(ours, ref, docs, tok)
    text_path = tmp_path / "decoded.txt"
    _run([exe, "decode", "-t", tj, "-i", ids_path, "-o", text_path])
    assert text_path.read_bytes().decode().split("\0") == tok.decode_batch(ref, skip_special_tokens=False)
