"""The GGUF files of tests/fixtures/gguf_hf (the transformers fixtures of gpt-oss and DeepSeek
converted by llama.cpp's converter: scripts/make_gguf_fixtures.py --from-hf-fixtures) are complete
and unchanged: every file listed with its hash and size (< 2 MB), each reference present with the
prompts of its source fixture, and the tensor types and metadata as recorded. No engine needed;
tests/gguf_arch_test.cpp runs them."""
import hashlib
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gguf_hf"


def entries():
    return json.loads((FIXTURES / "manifest.json").read_text())["fixtures"]


def test_every_file_is_listed():
    listed = {e["file"] for e in entries()} | {e["reference"] for e in entries() if "/" not in e["reference"]}
    on_disk = {p.name for p in FIXTURES.iterdir() if p.suffix in (".gguf", ".json")} - {"manifest.json"}
    assert listed == on_disk
    assert {e["architecture"] for e in entries()} == {"gpt-oss", "deepseek2"}


@pytest.mark.parametrize("name", [e["name"] for e in entries()])
def test_file_and_reference(name):
    e = next(x for x in entries() if x["name"] == name)
    data = (FIXTURES / e["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == e["sha256"]
    assert len(data) == e["bytes"] < 2 * 1024 * 1024
    ref = json.loads((FIXTURES / e["reference"]).read_text())
    source = json.loads((ROOT / e["source"] / "reference.json").read_text())
    assert ref["prompts"] == source["prompts"]
    assert len(ref["logits"]) == len(ref["greedy"]) == len(ref["prompts"])


@pytest.mark.parametrize("name", [e["name"] for e in entries()])
def test_tensor_types_and_metadata(name):
    gguf = pytest.importorskip("gguf", reason="the gguf package (scripts/setup.sh installs it)")
    e = next(x for x in entries() if x["name"] == name)
    r = gguf.GGUFReader(str(FIXTURES / e["file"]))
    assert {t.name: t.tensor_type.name for t in r.tensors} == e["tensor_types"]
    assert r.fields["general.architecture"].contents() == e["architecture"]
    if e["architecture"] == "gpt-oss":  # the fixture's clamp, which llama.cpp's graph does not read
        assert r.fields["gpt-oss.swiglu_clamp_exp"].contents() == [1.25] * 3
    else:
        assert r.fields["deepseek2.expert_gating_func"].contents() in (1, 2)
