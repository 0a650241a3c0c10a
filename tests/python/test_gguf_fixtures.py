"""The GGUF fixture set of tests/fixtures/gguf (llama.cpp's files and outputs, the oracle of issue
18) is complete and self-consistent: every file listed, unchanged, readable by the gguf package with
the tensor types recorded, and each expected-output JSON coherent with itself. No engine needed."""
import hashlib
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
MANIFEST = FIXTURES / "manifest.json"

# Every ggml type moestream computes natively (issue 18) must be the expert type of some fixture.
REQUIRED_EXPERT_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                         "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"}
ARCHITECTURES = {"qwen3moe", "olmoe", "llama"}


def manifest():
    return json.loads(MANIFEST.read_text())


def entries():
    return manifest()["fixtures"]


def ids():
    return [e["name"] for e in entries()]


@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf", reason="the gguf package (scripts/setup.sh installs it)")


def test_every_file_is_listed_and_present():
    listed = {f for e in entries() for f in e["files"] + [e["expected"]]}
    on_disk = {p.name for p in FIXTURES.iterdir() if p.suffix in (".gguf", ".json")}
    on_disk.discard("manifest.json")
    assert listed == on_disk


def test_the_set_covers_every_type_architecture_a_mix_and_a_split():
    es = entries()
    single = [e for e in es if len(e["expert_types"]) == 1]
    assert REQUIRED_EXPERT_TYPES <= {e["expert_types"][0] for e in single}
    for arch in ARCHITECTURES:
        types = {e["expert_types"][0] for e in single if e["architecture"] == arch}
        assert {"F32", "Q8_0"} <= types, arch
    mixed = [e for e in es if len(e["expert_types"]) >= 3]
    assert mixed, "no fixture whose expert tensors have three or more types"
    for e in mixed:
        # Types differ between gate, up and down of one layer and between layers.
        t = e["tensor_types"]
        layer0 = {t[f"blk.0.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")}
        layer1 = {t[f"blk.1.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")}
        assert len(layer0) >= 2 and len(layer1) >= 2 and layer0 != layer1
    splits = [e for e in es if len(e["files"]) >= 2]
    assert splits
    for e in splits:
        n = len(e["files"])
        assert e["files"] == [f"{e['name']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


@pytest.mark.parametrize("name", ids())
def test_files_are_unchanged(name):
    e = next(x for x in entries() if x["name"] == name)
    total = 0
    for f in e["files"]:
        data = (FIXTURES / f).read_bytes()
        assert hashlib.sha256(data).hexdigest() == e["sha256"][f], f
        total += len(data)
    assert total == e["bytes"]


@pytest.mark.parametrize("name", ids())
def test_tensor_types_are_as_recorded(gguf, name):
    e = next(x for x in entries() if x["name"] == name)
    seen = {}
    arch = None
    for f in e["files"]:
        r = gguf.GGUFReader(str(FIXTURES / f))
        for t in r.tensors:
            assert t.name not in seen, f"{t.name} twice in the set"
            seen[t.name] = t.tensor_type.name
        fld = r.fields.get("general.architecture")
        if fld is not None:
            arch = fld.contents()
    assert seen == e["tensor_types"]
    assert arch == e["architecture"]
    experts = {n: t for n, t in seen.items() if "_exps" in n}
    layers = manifest()["models"][e["model"]]["layers"]
    assert len(experts) == 3 * layers
    assert sorted(set(experts.values())) == e["expert_types"]


@pytest.mark.parametrize("name", ids())
def test_expected_outputs_are_coherent(name):
    m = manifest()
    e = next(x for x in entries() if x["name"] == name)
    x = json.loads((FIXTURES / e["expected"]).read_text())
    assert x["fixture"] == name and x["files"] == e["files"]
    assert x["prompt"] == m["prompt"]
    n_vocab, k = x["n_vocab"], x["top_k"]
    prompt, gen = x["prompt_ids"], x["generated_ids"]
    assert prompt and len(gen) == m["n_predict"]
    assert all(0 <= t < n_vocab for t in prompt + gen)
    rows = x["top"]
    assert len(rows) == len(prompt) + len(gen)
    for row in rows:
        assert len(row) == k
        values = [v for _, v in row]
        assert values == sorted(values, reverse=True)
        assert len({i for i, _ in row}) == k
    # Greedy: each generated token is the top-1 of the position before it.
    for i, t in enumerate(gen):
        assert rows[len(prompt) - 1 + i][0][0] == t
    # The full rows agree with the top-k of the same positions.
    assert len(x["full_logits"]) == m["n_full"]
    for full, row in zip(x["full_logits"], rows):
        assert len(full) == n_vocab
        for i, v in row:
            assert full[i] == v
        assert max(full) == row[0][1]
    # Not degenerate: top-1 is clear of top-2 at most positions and the continuation varies.
    gaps = [r[0][1] - r[1][1] for r in rows]
    assert sum(g > 1e-3 for g in gaps) >= 0.9 * len(gaps)
    assert len(set(gen)) >= 3
