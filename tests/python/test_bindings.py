"""Python bindings (`import moestream`): every call against the CLI tools and outside oracles
(transformers logits, the `tokenizers` library), and bad input raising the matching exception."""
import json
import os
import pathlib
import shutil
import subprocess
import threading
import time
import warnings

import numpy as np
import pytest

moestream = pytest.importorskip(
    "moestream", reason="moestream module not built (configure with -DMOESTREAM_PYTHON=ON, "
    "PYTHONPATH=<build>/python)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
FIXTURE = ROOT / "tests" / "fixtures" / "olmoe"
PROMPT = "The river"


@pytest.fixture(scope="module")
def run(tool):
    """run(name, *args): a CLI of the build that must succeed (see conftest.tool)."""
    def checked(name, *args):
        r = tool(name, *args)
        assert r.returncode == 0, r.stderr
        return r
    return checked


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    if not (DEMO / "model.json").exists():
        pytest.skip(f"{DEMO} absent")
    # A private copy: cluster(repack=True) rewrites the files.
    dst = tmp_path_factory.mktemp("bind") / "demo"
    shutil.copytree(DEMO, dst, ignore=shutil.ignore_patterns("routing", "figures", "heldout*.txt"))
    return dst


@pytest.fixture(scope="module")
def model(demo):
    return moestream.Model(demo, threads=2)


@pytest.fixture(scope="module")
def olmoe_f32(run, tmp_path_factory):
    if not (FIXTURE / "reference.json").exists():
        pytest.skip(f"fixture {FIXTURE} absent")
    out = tmp_path_factory.mktemp("bind_olmoe") / "olmoe_f32"
    run("convert_model", "-q", FIXTURE, out, "--quant", "f32", "--dense-quant", "f32")
    return out


def test_logits_equal_transformers_and_greedy_ids_equal_infer(run, olmoe_f32):
    # infer cannot print logits: its greedy ids are compared, the logits against transformers'.
    ref = json.loads((FIXTURE / "reference.json").read_text())
    m = moestream.Model(olmoe_f32, threads=2)
    for prompt, want_logits, want_ids in zip(ref["prompts"], ref["logits"], ref["greedy"]):
        got = m.logits(prompt)
        assert got.dtype == np.float32 and got.shape == (len(prompt), m.config["vocab_size"])
        want = np.asarray(want_logits, dtype=np.float32)
        scale = np.abs(want).max(axis=1)
        assert (np.abs(got - want).max(axis=1) <= 1e-3 * scale).all()
        ids = m.generate(prompt, len(want_ids), temperature=0, ignore_eos=True)  # no tokenizer: ids
        cli = run("infer", "-m", olmoe_f32, "-t", 2, "--prompt-ids", ",".join(map(str, prompt)),
                  "-n", len(want_ids), "--temp", 0, "--print-ids", "--ignore-eos")
        assert ids == [int(x) for x in cli.stdout.strip().split(",")] == want_ids
        assert np.array_equal(m.logits(prompt), got)  # a second call starts from an empty cache


def test_generate_text_equals_infer_and_stream_pieces_join_to_it(run, model, demo):
    text = model.generate(PROMPT, 24, temperature=0)
    cli = run("infer", "-m", demo, "-t", 2, "-p", PROMPT, "-n", 24, "--temp", 0)
    assert cli.stdout == PROMPT + text + "\n"
    pieces = list(model.generate(PROMPT, 24, temperature=0, stream=True))
    assert all(isinstance(p, str) for p in pieces) and len(pieces) > 1
    assert "".join(pieces) == text


def test_seeded_sampling_is_reproducible_and_matches_infer(run, model, demo):
    a = model.generate(PROMPT, 16, temperature=1.0, top_p=0.9, seed=7)
    assert a == model.generate(PROMPT, 16, temperature=1.0, top_p=0.9, seed=7)
    cli = run("infer", "-m", demo, "-t", 2, "-p", PROMPT, "-n", 16, "--temp", 1.0, "--top-p", 0.9,
              "--seed", 7)
    assert cli.stdout == PROMPT + a + "\n"


def test_abandoned_stream_stops_and_model_stays_usable(model):
    it = model.generate(PROMPT, 200, temperature=0, stream=True, ignore_eos=True)
    next(it)
    del it  # the generating thread is cancelled and joined
    assert model.generate(PROMPT, 4, temperature=0) == model.generate(PROMPT, 4, temperature=0)


def test_generation_releases_the_gil(model):
    done = threading.Event()
    t = threading.Thread(target=lambda: (model.generate(PROMPT, 48, temperature=0, ignore_eos=True), done.set()))
    spins = 0
    t0 = time.perf_counter()
    t.start()
    while not done.is_set():
        spins += 1
    t.join()
    elapsed = time.perf_counter() - t0
    # Holding the GIL in C++ would freeze this loop for the whole generation.
    assert spins > 10000, (spins, elapsed)


def test_perplexity_equals_infer(run, model, demo, tmp_path):
    text = (DEMO / "heldout_head.txt").read_text()[:1500]
    f = tmp_path / "t.txt"
    f.write_text(text)
    r = model.perplexity(text, ctx=128, stride=64)
    cli = run("infer", "-m", demo, "-t", 2, "--perplexity", f, "--ctx", 128, "--stride", 64)
    assert cli.stdout.startswith(f"perplexity {r['perplexity']:.4f} over {r['n_scored']} tokens")
    assert 1 < r["perplexity"] < model.config["vocab_size"]


def test_stats_account_for_every_expert(model):
    model.generate(PROMPT, 8, temperature=0, ignore_eos=True)
    s = model.stats()
    # The last sampled token is never fed back: 8 tokens take 7 decode steps.
    assert s["decode"]["tokens"] == 7 and s["prefill"]["tokens"] == len(model.tokenizer.encode(PROMPT))
    e = s["expert_store"]
    assert e["experts_requested"] > 0
    assert e["experts_read"] <= e["experts_requested"]
    assert s["cache_aware"]["enabled"] is False


def test_tokenizer_matches_the_tokenizers_library(model, demo):
    tokenizers = pytest.importorskip("tokenizers")
    ref = tokenizers.Tokenizer.from_file(str(demo / "tokenizer.json"))
    for s in ["The river ran fast.", "  unicode: é ü 中文 🙂\n\ttabs", ""]:
        ids = model.tokenizer.encode(s)
        assert ids == ref.encode(s).ids
        assert model.tokenizer.decode(ids) == ref.decode(ids, skip_special_tokens=False)
    assert model.tokenizer.vocab_size == ref.get_vocab_size()


def test_tokenizer_load_standalone_and_missing_file(demo, model, tmp_path):
    tok = moestream.Tokenizer.load(demo / "tokenizer.json")
    assert tok.encode("The river ran") == model.tokenizer.encode("The river ran")
    assert tok.token_id(tok.token_text(42)) == 42
    with pytest.raises(moestream.IoError, match="absent.json"):
        moestream.Tokenizer.load(tmp_path / "absent.json")


def test_every_io_mode_and_host_cache_give_the_same_text(demo, model):
    want = model.generate(PROMPT, 12, temperature=0, ignore_eos=True)
    for io in ["simple", "pread", "mmap", "auto"]:
        m = moestream.Model(demo, io=io, threads=2)
        assert m.generate(PROMPT, 12, temperature=0, ignore_eos=True) == want, io
        assert m.stats()["expert_store"]["experts_requested"] > 0
    with pytest.warns(UserWarning, match="host_cache_mb without io_direct: experts are cached twice"):
        m = moestream.Model(demo, io="pread", host_cache_mb=64, threads=2)
    m.generate(PROMPT, 12, temperature=0, ignore_eos=True)
    read = m.stats()["expert_store"]["experts_read"]
    assert m.generate(PROMPT, 12, temperature=0, ignore_eos=True) == want
    # The second run finds its experts cached: in the host cache, or (resident and verified on
    # first use) in the page cache, computed in place.
    s = m.stats()["expert_store"]
    assert s["experts_read"] == read and s["host_cache_hits"] + s["experts_in_place"] > 0


def test_store_options_go_through_infers_builder(demo, model):
    want = model.generate(PROMPT, 12, temperature=0, ignore_eos=True)
    assert model.stats()["expert_io"].startswith("engine ")  # infer's default store, --io auto
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = moestream.Model(demo, io="pread", io_direct=True, direct_max_read_kb=8, threads=2)
    refused = [w for w in caught if "O_DIRECT" in str(w.message)]
    if refused:
        pytest.skip(f"O_DIRECT refused here: {refused[0].message}")
    assert not caught, [str(w.message) for w in caught]
    assert "(O_DIRECT 8 KiB)" in m.stats()["expert_io"]
    assert m.generate(PROMPT, 12, temperature=0, ignore_eos=True) == want
    s = m.stats()["expert_store"]
    assert s["read_ops_issued"] > s["read_ops_requested"]  # experts split into 8 KiB reads
    with pytest.warns(UserWarning, match="O_DIRECT does not apply to the mmap backend"):
        moestream.Model(demo, io="mmap", io_direct=True, threads=2)
    with pytest.raises(moestream.ConfigError, match=r"direct_max_read_kb must be in \[4, .*got 2"):
        moestream.Model(demo, direct_max_read_kb=2)
    with pytest.raises(moestream.ConfigError, match="io_qd must be in"):
        moestream.Model(demo, io_qd=0)


def test_cache_aware_at_tolerance_zero_changes_nothing(demo, model):
    want = model.generate(PROMPT, 12, temperature=0, ignore_eos=True)
    m = moestream.Model(demo, cache_aware=True, cache_tolerance=0.0, threads=2)
    assert m.generate(PROMPT, 12, temperature=0, ignore_eos=True) == want
    s = m.stats()["cache_aware"]
    assert s["enabled"] is True and s["routings"] > 0 and s["substitutions"] == 0


def test_routing_log_columns_equal_infer_collect_routing(run, demo, tmp_path):
    py_log, cli_log = tmp_path / "py.bin", tmp_path / "cli.bin"
    m = moestream.Model(demo, threads=2, collect_routing=py_log)
    m.generate(PROMPT, 6, temperature=0, ignore_eos=True)
    m.close_routing()
    run("infer", "-m", demo, "-t", 2, "-p", PROMPT, "-n", 6, "--temp", 0, "--ignore-eos",
        "--collect-routing", cli_log)
    a, b = moestream.RoutingLog(py_log), moestream.RoutingLog(cli_log)
    cfg = m.config
    n_prompt = len(m.tokenizer.encode(PROMPT))
    # Every generated token but the last is fed back: prompt + 5 positions, every layer.
    assert len(a) == cfg["n_layers"] * (n_prompt + 5)
    assert a.ids.shape == (len(a), cfg["n_experts_per_tok"]) and a.ids.dtype == np.uint16
    assert a.weights.dtype == np.float32 and a.router_input is None
    assert (a.ids < cfg["n_experts"]).all()
    np.testing.assert_allclose(a.weights.sum(axis=1), 1.0, rtol=1e-5)  # norm_topk_prob
    assert set(a.phase.tolist()) == {moestream.PHASE_PREFILL, moestream.PHASE_DECODE}
    assert (a.position[a.phase == moestream.PHASE_PREFILL] < n_prompt).all()
    for col in ["layer", "position", "ids", "weights", "request", "phase"]:
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert a.model_hash == b.model_hash and a.warning == "" and a.truncated_bytes == 0


@pytest.fixture(scope="module")
def routing_log(demo, tmp_path_factory):
    log = tmp_path_factory.mktemp("bind_log") / "r.bin"
    m = moestream.Model(demo, threads=2, collect_routing=log)
    m.generate(PROMPT, 24, temperature=0, ignore_eos=True)
    m.generate("A small model", 24, temperature=0, ignore_eos=True)
    m.close_routing()
    return log


def test_corrupt_log_raises_format_error_and_truncated_tail_warns(routing_log, tmp_path):
    data = bytearray(routing_log.read_bytes())
    cut = tmp_path / "cut.bin"
    cut.write_bytes(bytes(data[:-7]))
    log = moestream.RoutingLog(cut)
    assert "truncated tail" in log.warning and log.truncated_bytes > 0
    record = int.from_bytes(data[68:72], "little")
    data[64 + record + 26] ^= 0xFF  # second record's ids
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(moestream.FormatError, match=f"offset {64 + record}") as e:
        moestream.RoutingLog(bad)
    assert isinstance(e.value, ValueError) and str(bad) in str(e.value)
    with pytest.raises(moestream.IoError) as e:
        moestream.RoutingLog(tmp_path / "absent.bin")
    assert isinstance(e.value, OSError) and "absent.bin" in str(e.value)


def test_cluster_equals_cluster_experts_and_cost_model_agrees(run, demo, routing_log, tmp_path):
    res = moestream.cluster(demo, [routing_log], method="greedy", evaluate=routing_log)
    cli = json.loads(run("cluster_experts", "--routing", routing_log, "--model", demo, "--method", "greedy",
                         "--evaluate", routing_log, "--json").stdout)
    for split in ["train", "heldout"]:
        for m in ["identity", "greedy", "chosen"]:
            for k, v in cli[split][m].items():
                assert res[split][m][k] == pytest.approx(v, rel=1e-9), (split, m, k)
    slots = res["slots"]
    assert slots.shape == (8, 32) and slots.dtype == np.uint32
    assert all(sorted(row) == list(range(32)) for row in slots.tolist())
    assert moestream.cost(demo, routing_log, slots=slots) == pytest.approx(res["train"]["chosen"])
    assert moestream.cost(demo, routing_log) == pytest.approx(res["train"]["identity"])  # no maps yet
    with pytest.raises(moestream.FormatError):
        moestream.cost(demo, routing_log, slots=np.zeros((8, 32), dtype=np.uint32))


def test_token_read_cost_coalesces_neighbours():
    g = dict(expert_bytes=8192, expert_stride=8192, gap_bytes=0)
    assert moestream.token_read_cost([3, 4, 5], **g) == (1, 3 * 8192)
    assert moestream.token_read_cost([9, 1], **g) == (2, 2 * 8192)
    with pytest.raises(moestream.ConfigError):
        moestream.token_read_cost([1], expert_bytes=0, expert_stride=0)


def test_missing_model_raises_io_error(tmp_path):
    with pytest.raises(moestream.IoError, match="does not exist") as e:
        moestream.Model(tmp_path / "nope")
    assert isinstance(e.value, OSError) and isinstance(e.value, moestream.Error)


def test_bad_options_raise_config_error(demo, model):
    with pytest.raises(moestream.ConfigError, match="bogus"):
        moestream.Model(demo, io="bogus")
    with pytest.raises(moestream.ConfigError, match="cache_tolerance"):
        moestream.Model(demo, cache_aware=True, cache_tolerance=-1)
    with pytest.raises(TypeError):
        moestream.Model(demo, no_such_option=1)
    with pytest.raises(moestream.ConfigError):
        model.generate(PROMPT, 4, temperature=-1)
    with pytest.raises(moestream.ConfigError):
        model.generate(PROMPT, 4, temperature=0.5, top_p=0, stream=True)
    with pytest.raises(moestream.ConfigError, match="vocab|vocabulary"):
        model.logits([10 ** 6])
    with pytest.raises(moestream.ConfigError, match="method|seriation|bogus"):
        moestream.cluster(demo, [], method="bogus")


def test_bad_model_json_raises_with_file_name(demo, tmp_path):
    broken = tmp_path / "m"
    shutil.copytree(demo, broken)
    (broken / "model.json").write_text("{ not json")
    with pytest.raises(moestream.Error) as e:
        moestream.Model(broken)
    assert "model.json" in str(e.value)


def test_routing_analysis_example_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (the example's only extra)")
    if not (DEMO / "model.json").exists():
        pytest.skip(f"{DEMO} absent")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(pathlib.Path(moestream.__file__).parents[1]),
                                                                   os.environ.get("PYTHONPATH", "")] if p))
    r = subprocess.run(["python3", str(ROOT / "python" / "examples" / "routing_analysis.py"), "--out", str(tmp_path),
                        "--tokens", "8", "--threads", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    for name in ["expert_load.png", "lru_hit_rate.png"]:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "hit rate" in r.stdout


def test_type_stubs_match_the_module():
    import ast
    tree = ast.parse((ROOT / "python" / "moestream" / "__init__.pyi").read_text())
    stubbed = {n.name if not isinstance(n, ast.AnnAssign) else n.target.id
               for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AnnAssign))}
    assert stubbed == set(moestream.__all__)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cls = getattr(moestream, node.name)
            for b in node.body:
                name = b.target.id if isinstance(b, ast.AnnAssign) else getattr(b, "name", None)
                assert name is None or hasattr(cls, name), f"{node.name}.{name} stubbed but absent"
