"""bench/peer.py's pure parts: thread lists, argument checks, round order, medians, ratios, the
best mode, the cache budgets and the table. Nothing here runs an engine or times anything."""
import argparse
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("peer", ROOT / "bench" / "peer.py")
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)


def args(**kw):
    a = dict(layers=2, tokens=8, rounds=3, cap_fraction=0.5, gpu_cache_fraction=0.25, prefill_tokens=64,
             rows=list(peer.ROWS), cap_moestream=[], cap_llama=[], cpu_moestream=["cpu"],
             gpu25_moestream=["gpu25", "gpu25-pin"], moestream_gguf=False)
    a.update(kw)
    return argparse.Namespace(**a)


def test_threads_are_clamped_to_the_cores_deduplicated_and_sorted():
    assert peer.parse_threads("2,16", 2) == [2]
    assert peer.parse_threads("16,2", 16) == [2, 16]
    assert peer.parse_threads("1, 4,4", 8) == [1, 4]


@pytest.mark.parametrize("text", ["0", "-2", "two", "2,,16", ""])
def test_bad_thread_counts_are_refused(text):
    with pytest.raises(ValueError, match="--threads"):
        peer.parse_threads(text, 16)


def test_good_arguments_pass():
    peer.check_args(args())
    peer.check_args(args(layers=48, cap_fraction=0.99, gpu_cache_fraction=1.0, cap_llama=["l-cpu", "l-exps"]))
    peer.check_args(args(cpu_moestream=["cpu", "cpu-noverify"]))


@pytest.mark.parametrize("kw,flag", [
    (dict(layers=0), "--layers"), (dict(layers=49), "--layers"), (dict(tokens=1), "--tokens"),
    (dict(rounds=0), "--rounds"), (dict(cap_fraction=1.0), "--cap-fraction"),
    (dict(cap_fraction=0.0), "--cap-fraction"), (dict(gpu_cache_fraction=0.0), "--gpu-cache-fraction"),
    (dict(gpu_cache_fraction=1.5), "--gpu-cache-fraction"), (dict(prefill_tokens=1), "--prefill-tokens"),
    (dict(rows=["cpu", "gpu"]), "--rows"), (dict(cap_moestream=["fast"]), "--cap-moestream"),
    (dict(gpu25_moestream=["gpu25", "pinned"]), "--gpu25-moestream"),
    # Full offload holds the whole model in VRAM: not a mode for a model that fits nowhere.
    (dict(cap_llama=["l-gpu"]), "--cap-llama"),
    (dict(cpu_moestream=["gpu25"]), "--cpu-moestream"),
    # A GGUF has no expert checksums: the unverified cell would be the verified one again.
    (dict(cpu_moestream=["cpu", "cpu-noverify"], moestream_gguf=True), "cpu-noverify with --moestream-gguf"),
])
def test_bad_arguments_are_refused_by_name(kw, flag):
    with pytest.raises(ValueError, match=flag):
        peer.check_args(args(**kw))


def test_rounds_alternate_the_order():
    cells = ["m", "l", "x"]
    assert peer.round_order(cells, 0) == cells
    assert peer.round_order(cells, 1) == ["x", "l", "m"]
    assert peer.round_order(cells, 2) == cells


def test_median_needs_every_round():
    assert peer.aggregate([3.0, 1.0, 2.0]) == {"median": 2.0, "rounds": [3.0, 1.0, 2.0], "failed": 0}
    assert peer.aggregate([4.0, 1.0]) == {"median": 2.5, "rounds": [4.0, 1.0], "failed": 0}
    # A mode that fails in any round is not a mode that runs.
    assert peer.aggregate([3.0, None, 2.0]) == {"median": None, "rounds": [3.0, None, 2.0], "failed": 1}
    assert peer.aggregate([None]) == {"median": None, "rounds": [None], "failed": 1}


def cell(engine, mode, tok_s, rounds=None, failed=0, prefill=None):
    rounds = rounds if rounds is not None else [tok_s]
    return {"engine": engine, "mode": mode, "tok_s": tok_s, "rounds": rounds, "failed": failed,
            "prefill_tok_s": prefill, "prefill_rounds": [prefill]}


def test_compare_takes_each_engines_best_mode_and_the_goal():
    ms = [cell("moestream", "cpu", 3.0), cell("moestream", "cpu-direct", 12.0)]
    ll = [cell("llama.cpp", "l-cpu", 1.0), cell("llama.cpp", "l-exps", 1.5)]
    r = peer.compare("cap", "cap", ms, ll)
    assert (r["moestream"], r["llama"], r["ratio"], r["goal"]) == ("cpu-direct", "l-exps", 8.0, 10.0)
    assert r["met"] is False
    r = peer.compare("cpu", "cpu 2", ms[:1], ll[:1])
    assert r["ratio"] == 3.0 and r["met"] is True


def test_failed_modes_do_not_count():
    ms = [cell("moestream", "cpu", None, [None, 5.0], failed=1), cell("moestream", "cpu-direct", 4.0)]
    ll = [cell("llama.cpp", "l-cpu", 2.0)]
    r = peer.compare("cap", "cap", ms, ll)
    assert r["moestream"] == "cpu-direct" and r["ratio"] == 2.0


def test_llama_failing_everywhere_meets_the_goal_without_a_ratio():
    ms = [cell("moestream", "cpu-direct", 4.0)]
    ll = [cell("llama.cpp", "l-cpu", None, [None, None], failed=2)]
    r = peer.compare("cap", "cap", ms, ll)
    assert r["ratio"] is None and r["met"] is True and "failed" in r["note"]
    # ... but not when moestream failed too.
    r = peer.compare("cap", "cap", [cell("moestream", "cpu", None, [None], failed=1)], ll)
    assert r["met"] is False


def test_prefill_row_compares_prefill_and_has_no_goal():
    ms = [cell("moestream", "gpu25", 100.0, prefill=900.0)]
    ll = [cell("llama.cpp", "l-exps", 50.0, prefill=300.0)]
    r = peer.compare("prefill", "prefill", ms, ll, key="prefill_tok_s")
    assert r["ratio"] == 3.0 and r["goal"] is None and r["met"] is None
    assert r["moestream_rounds"] == [900.0]


def test_cache_budgets():
    assert peer.gpu_cache_mb(4 << 30, 0.25) == 1024
    assert peer.gpu_cache_mb(1000, 0.25) == 1  # never 0: that is infer's "automatic"
    assert peer.host_cache_mb(2214, 790 << 20, 20 << 20, 320) == 1084
    assert peer.host_cache_mb(950, 790 << 20, 20 << 20, 1024) == 64


def test_long_prompt_has_the_asked_word_count():
    p = peer.long_prompt(64)
    assert p.startswith("The ") and len(p.split()) == 64


def test_table_marks_ratios_goals_failures_and_skips():
    rows = [peer.compare("cpu", "warm CPU decode, 2 threads", [cell("moestream", "cpu", 6.0, [6.0, 5.5])],
                         [cell("llama.cpp", "l-cpu", 20.0, [20.0, 21.0])]),
            peer.compare("cap", "cap", [cell("moestream", "cpu-direct", 4.0)],
                         [cell("llama.cpp", "l-cpu", None, [None], failed=1)])]
    text = peer.markdown(rows, [("warm GPU decode", "no GPU (nvidia-smi not found)")])
    lines = text.splitlines()
    assert len(lines) == 5
    assert "**0.30x**" in lines[2] and ">= 1x: NOT met" in lines[2] and "6.00 (6.00/5.50)" in lines[2]
    assert "llama.cpp failed in every mode and round" in lines[3] and ">= 10x: met" in lines[3]
    assert "every mode failed" in lines[3]
    assert lines[4].startswith("| warm GPU decode | skipped: no GPU")


def test_expert_counts_keep_where_the_experts_came_from():
    st = {"experts": {"experts_requested": 953, "experts_in_place": 925, "experts_read": 28, "host_cache_hits": 0,
                      "fetches_read_ahead": 10, "verified_in_place": 0, "io_seconds": 0.07},
          "expert_io": "engine uring, O_DIRECT, host cache 14000.0 MiB"}
    assert peer.expert_counts(st) == {"experts_requested": 953, "experts_in_place": 925, "experts_read": 28,
                                      "host_cache_hits": 0, "fetches_read_ahead": 10, "verified_in_place": 0,
                                      "expert_io": "engine uring, O_DIRECT, host cache 14000.0 MiB"}
    assert peer.expert_counts({})["experts_read"] is None  # an older infer: absent, not zero


def test_notices_keep_infers_and_the_engines_lines_only():
    err = ("loading\ninfer: the model's files (32.5 GiB) exceed the memory this process may fill\n"
           "with_memory_cap: peak 10 MiB\nmoestream: an engine notice\n")
    assert peer.notices(err) == ["infer: the model's files (32.5 GiB) exceed the memory this process may fill",
                                 "moestream: an engine notice"]
    assert peer.notices("") == []


def test_a_cell_that_streamed_by_its_own_choice_is_named_in_its_row():
    # A warm row measures the weights at hand: a round in which infer chose O_DIRECT (the memory
    # room it saw was below the model, as on a VM whose memory grows only when used) is flagged.
    ms = cell("moestream", "cpu", 13.0, [13.0, 18.0])
    ms["notices"] = [["infer: the model's files (30.25 GiB: ...) exceed the memory this process may fill (27 GiB)"],
                     []]
    r = peer.compare("cpu", "warm CPU decode, 16 threads", [ms], [cell("llama.cpp", "l-cpu", 18.0)])
    assert "streamed by its own choice in 1 of 2 rounds" in r["note"]
    line = peer.markdown([r], []).splitlines()[2]
    assert "**0.72x** (moestream streamed by its own choice in 1 of 2 rounds" in line
    ms["notices"] = [[], []]
    assert peer.compare("cpu", "x", [ms], [cell("llama.cpp", "l-cpu", 18.0)])["note"] == ""
