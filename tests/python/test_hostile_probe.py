"""Hostile-input probe, model files: systematic truncations, bit flips and byte overwrites at many
offsets of every file of a packed model (model.json, dense.safetensors, each experts/layer file
and its .map, tokenizer.json, tokenizer_config.json), each run through `infer`. Every run must
exit, never by a signal; a refused input exits 1 with an error naming the file; an accepted one
must print the clean run's tokens (hostile.verdict). The user's files must stay byte-identical.
About 850 runs of infer on two threads."""
import json
import pathlib
import struct

import pytest

import hostile
from hostile import DEMO, exe, run, run_all, verdict


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not (DEMO / "model.json").exists():
        pytest.skip(f"demo model {DEMO} absent")
    base, log = hostile.build_model(tmp_path_factory.mktemp("probe") / "model")
    clean = infer(base)
    assert clean.rc == 0 and clean.out, clean
    return base, clean.out


def infer(m):
    return run("infer", [exe("infer"), "-m", str(m), "-p", hostile.PROMPT, "-n", "6", "--temp", "0",
                         "-t", "1", "--ignore-eos"])


def probe(model, tmp_path, rel, mutations, names, legal=lambda data: False):
    """Runs infer on each mutation of rel; returns the failures [(label, why, outcome)]."""
    base, clean_out = model
    before = hostile.tree_hashes(base)
    mutations = list(mutations)
    assert mutations

    def one(job):
        i, (label, data) = job
        m = hostile.variant(base, tmp_path / f"v{i}", rel, data)
        o = infer(m)
        after = hostile.sha(m / rel)
        why = verdict(o, clean_out, "infer", names, legal=o.rc == 0 and legal(data))
        if after != hostile.hashlib.sha256(data).hexdigest():
            why = (why or "") + " the mutated input file was modified"
        hostile.shutil.rmtree(m)
        return None if why is None else (label, why, o)

    failures = [f for f in run_all(list(enumerate(mutations)), one) if f]
    for f in failures:
        print("PROBE", rel, f[0], "|", f[1], "|", f[2].err.strip()[-400:])
    assert hostile.tree_hashes(base) == before, "a run modified the model's files"
    return failures


def json_legal(clean, free):
    """legal(data) for a JSON file: data parses and differs from clean only under a free path."""
    ref = json.loads(clean)

    def legal(data):
        try:
            doc = json.loads(data)
        except ValueError:
            return False
        diff = hostile.json_diff(ref, doc)
        return bool(diff) and all(any(d.startswith(f) for f in free) for d in diff)
    return legal


def test_expert_layer_files(model, tmp_path):
    base, _ = model
    failures = []
    for layer in (0, 5):  # layer 5: its header and cuts only (the same code reads every layer)
        rel = f"experts/layer_{layer:03d}.bin"
        data = (base / rel).read_bytes()
        n = struct.unpack_from("<I", data, 20)[0]
        data_off, stride = struct.unpack_from("<Q", data, 48)[0], struct.unpack_from("<Q", data, 40)[0]
        table_end = 64 + 8 * n
        offs = list(range(0, 64)) + hostile.spread(64, table_end, 16) + hostile.spread(table_end, data_off, 4)
        # Payloads: each expert's start, and spread over the slots (checksummed), padding included.
        offs += [data_off + s * stride for s in range(0, n, 4)] + hostile.spread(data_off, len(data), 24)
        if layer != 0:
            offs = list(range(0, 64, 2))
        muts = list(hostile.flips(data, offs)) + list(hostile.byte_sets(data, range(8, 64, 4 if layer == 0 else 16)))
        muts += list(hostile.truncations(data, [0, 1, 7, 8, 56, 63, 64, table_end - 1, data_off - 1,
                                                data_off, data_off + 1, len(data) // 2, len(data) - 4096,
                                                len(data) - 1]))
        muts.append(("one byte appended", data + b"\0"))
        muts.append(("a slot appended", data + bytes(stride)))
        failures += probe(model, tmp_path / f"l{layer}", rel, muts, [f"layer_{layer:03d}"])
    assert failures == [], failures


def test_expert_map_files(model, tmp_path):
    base, _ = model
    rel = "experts/layer_002.map"
    data = (base / rel).read_bytes()
    muts = list(hostile.flips(data, range(0, len(data), 2), bit_of=lambda i: (i * 3) % 8))
    muts += list(hostile.byte_sets(data, range(0, len(data), 8)))
    muts += list(hostile.truncations(data, [0, 1, 8, 12, 16, len(data) - 16, len(data) - 8, len(data) - 1]))
    muts.append(("one byte appended", data + b"\0"))
    # Another layer's valid map in this place: bound to another file.
    muts.append(("layer 3's map", (base / "experts/layer_003.map").read_bytes()))
    failures = probe(model, tmp_path, rel, muts, ["layer_002"])
    assert failures == [], failures


def test_dense_safetensors(model, tmp_path):
    base, _ = model
    rel = "dense.safetensors"
    data = (base / rel).read_bytes()
    hlen = struct.unpack_from("<Q", data, 0)[0]
    end = 8 + hlen
    # The header: its length and every part of the JSON. The tensor data carries no checksum in
    # the format, so a flipped weight is a different model, not a detectable fault: not probed.
    offs = list(range(0, 8)) + hostile.spread(8, end, 110)
    muts = list(hostile.flips(data, offs))
    muts += list(hostile.byte_sets(data, hostile.spread(8, end, 10), values=(0x00, ord('"'), ord("9"))))
    muts += list(hostile.truncations(data, [0, 4, 8, 9, end // 2, end - 1, end, end + 1, len(data) // 2,
                                            len(data) - 1]))
    muts.append(("header length + 1", struct.pack("<Q", hlen + 1) + data[8:]))
    muts.append(("header length huge", struct.pack("<Q", 2 ** 63) + data[8:]))
    header = json.loads(data[8:end])
    free = ["__metadata__"]

    def legal(d):
        try:
            h = json.loads(d[8:8 + struct.unpack_from("<Q", d, 0)[0]])
        except (ValueError, struct.error):
            return False
        diff = hostile.json_diff(header, h)
        return bool(diff) and all(any(x.startswith(f) for f in free) for x in diff)
    failures = probe(model, tmp_path, rel, muts, ["dense.safetensors"], legal)
    assert failures == [], failures


def test_model_json(model, tmp_path):
    base, _ = model
    rel = "model.json"
    data = (base / rel).read_bytes()
    muts = list(hostile.flips(data, range(0, len(data), 6), bit_of=lambda i: (i * 5) % 8))
    muts += list(hostile.truncations(data, hostile.spread(0, len(data), 12) + [len(data) - 1]))
    muts.append(("NUL appended", data + b"\0"))
    muts.append(("second document appended", data + data))
    # Free: fields whose other values describe another valid model (provenance, numerics no file
    # can cross-check, token ids checked against the vocabulary only).
    free = ["source", "rms_norm_eps", "rope.theta", "max_position_embeddings", "eos_token_id",
            "bos_token_id"]
    # A flipped file name is refused by the open naming the file that is not there.
    failures = probe(model, tmp_path, rel, muts, ["model.json", "No such file"], json_legal(data, free))
    assert failures == [], failures


def test_tokenizer_files(model, tmp_path):
    base, _ = model
    failures = []
    rel = "tokenizer.json"
    data = (base / rel).read_bytes()
    # The structure at the start (added tokens, normalizer, pre-tokenizer, model type), then
    # spread over the vocabulary and merges; a changed token string is another valid vocabulary.
    offs = hostile.spread(0, 6000, 60) + hostile.spread(6000, len(data), 30)
    muts = list(hostile.flips(data, offs))
    muts += list(hostile.truncations(data, hostile.spread(0, len(data), 10) + [len(data) - 1]))
    free = ["model.vocab", "model.merges", "added_tokens"]
    failures += probe(model, tmp_path / "t", rel, muts, ["tokenizer"], json_legal(data, free))
    rel = "tokenizer_config.json"
    data = (base / rel).read_bytes()
    muts = list(hostile.flips(data, range(0, len(data), 16), bit_of=lambda i: (i * 3) % 8))
    muts += list(hostile.truncations(data, hostile.spread(0, len(data), 8)))
    free = ["chat_template", "clean_up_tokenization_spaces", "model_max_length", "errors",
            "tokenizer_class", "pad_token", "unk_token", "additional_special_tokens"]
    failures += probe(model, tmp_path / "c", rel, muts, ["tokenizer"], json_legal(data, free))
    assert failures == [], failures
