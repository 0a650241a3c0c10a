"""bench/server/bench_streams.py's pure parts: SSE and Prometheus parsing, a stream's token
count and inter-token gaps, a round's aggregate and the medians/ratios table. No server, no timing."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_streams", ROOT / "bench" / "server" / "bench_streams.py")
bs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)


def _data(obj):
    return b"data: " + json.dumps(obj).encode()


def test_prometheus_lines_with_labels_and_comments():
    text = ('# HELP x y\n# TYPE x counter\nmoestream_expert_bytes_read_total 1.5e+06\n\n'
            'moestream_forward_seconds_total{phase="expert_io"} 2.25\n')
    m = bs.parse_prometheus(text)
    assert m == {"moestream_expert_bytes_read_total": 1.5e6, 'moestream_forward_seconds_total{phase="expert_io"}': 2.25}
    with pytest.raises(ValueError):
        bs.parse_prometheus("lonely\n")


def test_sse_payloads_skip_comments_and_done():
    lines = [(0.0, b": waiting"), (0.1, _data({"a": 1})), (0.2, b""), (0.3, "data: [DONE]")]
    assert bs.sse_payloads(lines) == [(0.1, {"a": 1})]


def test_stream_stats_counts_token_ids_and_gaps_of_coalesced_events():
    ev = lambda ids: {"choices": [{"text": "", "token_ids": ids}]}  # noqa: E731
    events = [(1.0, ev([5])), (1.5, ev([6, 7])), (1.5, {"choices": [{"text": "", "token_ids": [], "finish_reason": "length"}]}),
              (2.5, ev([8]))]
    s = bs.stream_stats(0.5, events)
    assert s["tokens"] == 4 and s["first"] == 1.0 and s["last"] == 2.5
    assert s["gaps"] == [0.5, 0.0, 1.0]  # the second event carried 2 tokens: one gap and a zero


def test_stream_stats_prefers_usage_and_counts_text_events():
    events = [(1.0, {"choices": [{"text": "He"}]}), (1.2, {"choices": [{"text": ""}]}), (1.4, {"choices": [{"text": "llo"}]}),
              (1.4, {"choices": [], "usage": {"completion_tokens": 3}, "timings": {"decode_s": 0.4}})]
    s = bs.stream_stats(0.0, events)
    assert s["tokens"] == 3 and s["gaps"] == [pytest.approx(0.4)] and s["timings"] == {"decode_s": 0.4}
    with pytest.raises(RuntimeError, match="stream failed"):
        bs.stream_stats(0.0, [(1.0, {"error": {"message": "boom"}})])


def test_aggregate_rates_percentiles_and_counter_deltas():
    a = {"tokens": 5, "sent": 0.0, "first": 1.0, "last": 3.0, "gaps": [0.5] * 4, "timings": {}}
    b = {"tokens": 3, "sent": 0.0, "first": 1.0, "last": 2.0, "gaps": [0.5, 0.5], "timings": {}}
    m0 = {"moestream_expert_bytes_read_total": 100.0, "moestream_batch_steps_total": 10,
          "moestream_batch_sequences_total": 10}
    m1 = {"moestream_expert_bytes_read_total": 900.0, "moestream_batch_steps_total": 14,
          "moestream_batch_sequences_total": 18, 'moestream_forward_seconds_total{phase="expert_io"}': 1.5}
    r = bs.aggregate([a, b], m0, m1, max_running=2)
    assert r["agg_tok_s"] == pytest.approx((4 + 2) / 2.0)
    assert r["bytes_per_token"] == pytest.approx(800 / 8)
    assert r["mean_batch"] == pytest.approx(2.0) and r["itl_p50_ms"] == pytest.approx(500)
    assert r["expert_io_s"] == 1.5 and r["max_running"] == 2 and r["wall_s"] == 3.0
    with pytest.raises(RuntimeError, match="no token"):
        bs.aggregate([a, dict(b, first=None)], m0, m1, 0)


def test_percentile_medians_ratios_and_interleaving():
    assert bs.pct([], 50) == 0.0 and bs.pct([3, 1, 2], 50) == 2 and bs.pct(list(range(101)), 99) == 99
    cells = {1: bs.medians([{"agg_tok_s": 2.0, "bytes_per_token": 10.0}, {"agg_tok_s": 4.0, "bytes_per_token": 30.0},
                            {"agg_tok_s": 3.0, "bytes_per_token": 20.0}]),
             8: {"agg_tok_s": 12.0, "bytes_per_token": 8.0}}
    rows = bs.with_ratios(cells)
    assert [r["agg_x"] for r in rows] == [1.0, 4.0] and [r["bytes_x"] for r in rows] == [1.0, 0.4]
    assert bs.round_order([1, 2, 4], 1) == [1, 2, 4] and bs.round_order([1, 2, 4], 2) == [4, 2, 1]


def test_cap_peak_is_read_from_the_wrapper_and_an_oom_kill_stops_the_run():
    err = ("moestream-server: listening\n"
           "with_memory_cap: cgroup-v1 memory.limit_in_bytes 1300 MiB, peak 1297 MiB, oom_kill 0\n")
    assert bs.cap_peak_mb(err) == 1297.0
    assert bs.cap_peak_mb("no wrapper line\n") is None
    with pytest.raises(SystemExit, match="OOM-killed"):
        bs.cap_peak_mb("with_memory_cap: cgroup-v2 memory.max 64 MiB, peak 64 MiB, oom_kill 1\n")


def test_variants_parse_in_order_and_refuse_a_reused_or_missing_name():
    assert bs.parse_variants("direct=-t 2 --io-direct; page=-t 2 --no-auto-direct") == {
        "direct": "-t 2 --io-direct", "page": "-t 2 --no-auto-direct"}
    assert list(bs.parse_variants("b=x;a=y")) == ["b", "a"]
    for bad in ("a=x;a=y", "llama-server=x", "noequals", "=x", ";"):
        with pytest.raises(SystemExit, match="--variants"):
            bs.parse_variants(bad)


def test_per_round_ratio_pairs_rounds_and_skips_a_zero_base():
    rows = [{"agg_tok_s": 4.0}, {"agg_tok_s": 9.0}, {"agg_tok_s": 1.0}]
    base = [{"agg_tok_s": 2.0}, {"agg_tok_s": 3.0}, {"agg_tok_s": 0.0}]
    assert bs.per_round_ratio(rows, base) == 2.5
    assert bs.per_round_ratio(rows[2:], base[2:]) is None
