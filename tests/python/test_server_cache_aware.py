"""moestream-server --cache-aware on the demo model with O_DIRECT and a small host cache: tolerance 0
answers exactly as a plain server, a wide tolerance substitutes once residency has built up over
earlier requests (reported in /metrics and each response's timings), bad tolerances are refused."""
import subprocess

import pytest

from test_server import DEMO, Server, _exe

BASE = ["--io-direct", "--host-cache-mb", "4"]
PROMPTS = ["Tell me about the history of the city.", "What is a river?",
           "Write one sentence about the sea.", "Tell me about the history of the city."]


def chats(server):
    out = []
    for p in PROMPTS:
        r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": p}],
                                                 "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def run_server(*args):
    s = Server(*BASE, *args)
    try:
        return chats(s), s.metrics()
    finally:
        s.stop_cleanly()


def test_tolerance_zero_answers_exactly_as_the_plain_server():
    plain, plain_m = run_server()
    zero, zero_m = run_server("--cache-aware", "--cache-tolerance", 0)
    assert [r["choices"][0]["message"]["content"] for r in zero] == \
           [r["choices"][0]["message"]["content"] for r in plain]
    assert "cache_aware" not in plain[0]["timings"]
    assert plain_m["moestream_cache_aware_enabled"] == 0
    assert "moestream_cache_aware_substitutions_total" not in plain_m
    assert zero_m["moestream_cache_aware_enabled"] == 1
    assert zero_m["moestream_cache_aware_substitutions_total"] == 0
    assert zero_m["moestream_cache_aware_agreement"] == 1.0
    assert zero_m["moestream_cache_aware_misses_before_total"] == \
           zero_m["moestream_cache_aware_misses_after_total"] > 0
    for r in zero:
        ca = r["timings"]["cache_aware"]
        assert ca["substitutions"] == 0 and ca["agreement"] == 1.0 and ca["slots"] > 0


def test_wide_tolerance_substitutes_across_requests_and_metrics_sum_the_timings():
    res, m = run_server("--cache-aware", "--cache-tolerance", 0.5)
    per = [r["timings"]["cache_aware"] for r in res]
    subs = m["moestream_cache_aware_substitutions_total"]
    assert subs > 0
    assert subs == sum(c["substitutions"] for c in per)
    assert m["moestream_cache_aware_slots_total"] == sum(c["slots"] for c in per)
    assert m["moestream_cache_aware_slots_total"] - m["moestream_cache_aware_slots_unchanged_total"] == subs
    assert m["moestream_cache_aware_misses_after_total"] < m["moestream_cache_aware_misses_before_total"]
    assert 0.5 < m["moestream_cache_aware_agreement"] < 1.0
    assert m["moestream_cache_aware_tolerance"] == pytest.approx(0.5)
    # Residency persists: requests after the first still substitute (the cache is not cold).
    assert sum(c["substitutions"] for c in per[1:]) > 0


@pytest.mark.parametrize("bad", ["-1", "abc", "2000"])
def test_bad_tolerance_exits_nonzero_with_a_message(bad):
    r = subprocess.run([str(_exe()), "-m", str(DEMO), "--cache-aware", "--cache-tolerance", bad],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--cache-tolerance" in r.stderr
    h = subprocess.run([str(_exe()), "--help"], capture_output=True, text=True, timeout=30)
    assert "--cache-aware" in h.stdout and "--cache-tolerance" in h.stdout


# --cache-aware-union (issue 22 item 3): with --parallel, an expert an earlier sequence of the step
# chose counts as resident for the later ones.
UNION_PROMPTS = ["The operating system keeps a table of pages.", "Once upon a time", "The river",
                 "In the morning the kernel"]


def together(*args):
    """UNION_PROMPTS sent at once to a --parallel 4 server: (texts, metrics)."""
    import threading
    s = Server("--parallel", "4", "--queue-size", "4", "--no-prefix-reuse", *args)
    got = [None] * len(UNION_PROMPTS)

    def one(i):
        r = s.post("/v1/completions", {"prompt": UNION_PROMPTS[i], "max_tokens": 16, "temperature": 0,
                                       "ignore_eos": True})
        assert r.status_code == 200, r.text
        got[i] = r.json()["choices"][0]["text"]

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(UNION_PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        return got, s.metrics()
    finally:
        s.stop_cleanly()


def test_union_at_tolerance_zero_answers_concurrent_requests_as_the_plain_server():
    plain, _ = together(*BASE)
    zero, m = together(*BASE, "--cache-aware", "--cache-tolerance", 0, "--cache-aware-union")
    assert all(plain) and zero == plain
    assert m["moestream_cache_aware_union"] == 1
    assert m["moestream_cache_aware_substitutions_total"] == 0


def test_union_substitutes_where_nothing_is_resident_and_plain_cache_aware_cannot():
    # O_DIRECT without a host cache: no tier holds an expert, so only the batch's own choices can.
    _, plain = together("--io-direct", "--cache-aware", "--cache-tolerance", 0.5)
    _, uni = together("--io-direct", "--cache-aware", "--cache-tolerance", 0.5, "--cache-aware-union")
    assert plain["moestream_cache_aware_union"] == 0
    assert plain["moestream_cache_aware_substitutions_total"] == 0
    assert uni["moestream_cache_aware_substitutions_total"] > 0
    assert uni["moestream_cache_aware_misses_after_total"] < uni["moestream_cache_aware_misses_before_total"]


def test_union_needs_cache_aware_and_is_in_help():
    r = subprocess.run([str(_exe()), "-m", str(DEMO), "--cache-aware-union"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0 and "--cache-aware-union" in r.stderr and "--cache-aware" in r.stderr
    h = subprocess.run([str(_exe()), "--help"], capture_output=True, text=True, timeout=30)
    assert "--cache-aware-union" in h.stdout
