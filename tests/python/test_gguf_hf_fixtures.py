"""The GGUFs of the transformers fixtures (tests/fixtures/gguf_hf, issues 20 and 21: qwen2moe and
glm4moe made by llama.cpp's converter from tests/fixtures/{qwen2_moe,glm4_moe}) are complete and
unchanged, and the CLIs run them: `infer -m X.gguf` and `infer` on the pack `convert_model` makes
print transformers' greedy tokens. Logits are compared in tests/gguf_qwen2_glm4_test.cpp."""
import hashlib
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gguf_hf"
MANIFEST = FIXTURES / "manifest.json"
MAX_BYTES = 2 << 20  # each fixture stays small


def entries():
    return json.loads(MANIFEST.read_text())["fixtures"]


def test_every_file_is_listed_present_and_small():
    listed = {f for e in entries() for f in e["files"]}
    on_disk = {p.name for p in FIXTURES.glob("*.gguf")}
    assert listed == on_disk
    assert {e["architecture"] for e in entries()} == {"qwen2moe", "glm4moe"}
    for e in entries():
        assert e["bytes"] < MAX_BYTES, e["name"]


@pytest.mark.parametrize("name", [e["name"] for e in entries()])
def test_files_are_unchanged_with_the_recorded_types(name):
    e = next(x for x in entries() if x["name"] == name)
    for f in e["files"]:
        data = (FIXTURES / f).read_bytes()
        assert hashlib.sha256(data).hexdigest() == e["sha256"][f], f
        assert len(data) == e["bytes"]
    gguf = pytest.importorskip("gguf", reason="the gguf package (scripts/setup.sh installs it)")
    r = gguf.GGUFReader(str(FIXTURES / e["files"][0]))
    assert {t.name: t.tensor_type.name for t in r.tensors} == e["tensor_types"]
    assert r.fields["general.architecture"].contents() == e["architecture"]
    assert (ROOT / e["source"] / "reference.json").is_file()


@pytest.mark.parametrize("name", ["qwen2moe-BF16", "glm4moe-F32"])
def test_infer_in_place_and_on_the_converted_pack_gives_transformers_greedy_tokens(tool, tmp_path, name):
    e = next(x for x in entries() if x["name"] == name)
    ref = json.loads((ROOT / e["source"] / "reference.json").read_text())
    gguf = FIXTURES / e["files"][0]
    r = tool("convert_model", "-q", gguf, tmp_path / "pack")
    assert r.returncode == 0, r.stderr
    for model in (gguf, tmp_path / "pack"):
        for prompt, want in zip(ref["prompts"], ref["greedy"]):
            r = tool("infer", "-m", model, "--prompt-ids", ",".join(map(str, prompt)), "-n", len(want),
                     "--temp", 0, "--ignore-eos", "--print-ids", "-t", 2)
            assert r.returncode == 0, r.stderr
            assert [int(t) for t in r.stdout.strip().splitlines()[-1].split(",")] == want, model


def test_cluster_experts_repacks_qwen2moe_and_refuses_glm4moe_by_name(tool, tmp_path):
    """qwen2moe's experts permute in the GGUF (its shared expert is not expert-indexed) and the
    permuted copy decodes the same tokens; glm4moe's dense first layer is refused, naming the way
    (a pack)."""
    ids = "5,17,200,31,44,90,120,7"
    run = ["--prompt-ids", ids, "-n", 24, "--temp", 0, "--ignore-eos", "--print-ids", "-t", 2]
    for name in ("qwen2moe-F32", "glm4moe-F32"):
        gguf = FIXTURES / f"{name}.gguf"
        log = tmp_path / f"{name}.log"
        r = tool("infer", "-m", gguf, *run, "--collect-routing", log)
        assert r.returncode == 0, r.stderr
        tokens = r.stdout.strip().splitlines()[-1]
        out = tmp_path / f"{name}-clustered.gguf"
        r = tool("cluster_experts", "--model", gguf, "--routing", log, "--out", out)
        if name.startswith("glm4moe"):
            assert r.returncode != 0 and "dense is not supported" in r.stderr and "convert_model" in r.stderr
            continue
        assert r.returncode == 0, r.stderr
        r = tool("infer", "-m", out, *run)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == tokens
