"""The GGUF files of tests/fixtures/gguf_hf (the transformers fixtures of gpt-oss, DeepSeek,
Qwen2-MoE and GLM-4.5 converted by llama.cpp's converter: scripts/make_gguf_fixtures.py
--from-hf-fixtures) are complete and unchanged: every file listed with its hash and size (< 2 MB),
each reference present with the prompts of its source fixture, and the tensor types and metadata
as recorded. The CLIs run them: `infer` in place and on the pack `convert_model` makes prints
transformers' greedy tokens, and `cluster_experts` repacks them (leading dense layers included).
Logits are compared in tests/gguf_arch_test.cpp."""
import hashlib
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gguf_hf"


def entries():
    return json.loads((FIXTURES / "manifest.json").read_text())["fixtures"]


def entry(name):
    return next(x for x in entries() if x["name"] == name)


def test_every_file_is_listed():
    listed = {e["file"] for e in entries()} | {e["reference"] for e in entries() if "/" not in e["reference"]}
    on_disk = {p.name for p in FIXTURES.iterdir() if p.suffix in (".gguf", ".json")} - {"manifest.json"}
    assert listed == on_disk
    assert {e["architecture"] for e in entries()} == {"gpt-oss", "deepseek2", "qwen2moe", "glm4moe"}


@pytest.mark.parametrize("name", [e["name"] for e in entries()])
def test_file_and_reference(name):
    e = entry(name)
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
    e = entry(name)
    r = gguf.GGUFReader(str(FIXTURES / e["file"]))
    assert {t.name: t.tensor_type.name for t in r.tensors} == e["tensor_types"]
    arch = e["architecture"]
    assert r.fields["general.architecture"].contents() == arch
    if arch == "gpt-oss":  # the fixture's clamp, which llama.cpp's graph does not read
        assert r.fields["gpt-oss.swiglu_clamp_exp"].contents() == [1.25] * 3
    elif arch == "deepseek2":
        assert r.fields["deepseek2.expert_gating_func"].contents() in (1, 2)
    elif arch == "glm4moe":  # a dense first layer, grouped sigmoid routing and an MTP block
        assert r.fields["glm4moe.leading_dense_block_count"].contents() == 1
        assert r.fields["glm4moe.expert_group_count"].contents() > 1
        assert r.fields["glm4moe.nextn_predict_layers"].contents() == 1
    else:
        assert r.fields["qwen2moe.expert_shared_feed_forward_length"].contents() > 0


@pytest.mark.parametrize("name", ["qwen2moe-BF16", "glm4moe-F32"])
def test_infer_in_place_and_on_the_converted_pack_gives_transformers_greedy_tokens(tool, tmp_path, name):
    e = entry(name)
    ref = json.loads((FIXTURES / e["reference"]).read_text())
    gguf = FIXTURES / e["file"]
    r = tool("convert_model", "-q", gguf, tmp_path / "pack")
    assert r.returncode == 0, r.stderr
    for model in (gguf, tmp_path / "pack"):
        for prompt, want in zip(ref["prompts"], ref["greedy"]):
            r = tool("infer", "-m", model, "--prompt-ids", ",".join(map(str, prompt)), "-n", len(want),
                     "--temp", 0, "--ignore-eos", "--print-ids", "-t", 2)
            assert r.returncode == 0, r.stderr
            assert [int(t) for t in r.stdout.strip().splitlines()[-1].split(",")] == want, model


@pytest.mark.parametrize("name", ["qwen2moe-F32", "glm4moe-F32"])
def test_cluster_experts_repacks_and_the_copy_decodes_the_same(tool, tmp_path, name):
    """qwen2moe's experts permute in the GGUF (its shared expert is not expert-indexed); glm4moe's
    dense first layer has no experts, so the routing log numbers MoE layers and grouped routing
    keeps experts within their groups. The permuted copy decodes the same tokens."""
    run = ["--prompt-ids", "5,17,200,31,44,90,120,7", "-n", 24, "--temp", 0, "--ignore-eos", "--print-ids",
           "-t", 2]
    gguf = FIXTURES / entry(name)["file"]
    log = tmp_path / f"{name}.log"
    r = tool("infer", "-m", gguf, *run, "--collect-routing", log)
    assert r.returncode == 0, r.stderr
    tokens = r.stdout.strip().splitlines()[-1]
    out = tmp_path / f"{name}-clustered.gguf"
    r = tool("cluster_experts", "--model", gguf, "--routing", log, "--out", out)
    assert r.returncode == 0, r.stderr
    r = tool("infer", "-m", out, *run)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == tokens
