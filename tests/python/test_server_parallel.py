"""moestream-server --parallel N end to end (continuous batching, runtime/server/batch_scheduler.h):
concurrent greedy requests, streamed and not, get the text each gets alone; a streamed client that
disconnects mid-reply does not change the others' text; /metrics shows the requests running."""
import json
import threading

import pytest

from test_server import DEMO, Server, sse_events, requests  # noqa: F401  (requests: skip without it)

PROMPTS = ["The operating system keeps a table of pages.", "Once upon a time", "The river",
           "In the morning the kernel"]


def _complete(s, prompt, max_tokens=12, stream=False):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    r = s.post("/v1/completions", body, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]["text"]
    return "".join(e["choices"][0]["text"] for e in sse_events(r) if isinstance(e, dict) and e.get("choices"))


def _leave_after_three_events(s, body, left=None):
    """A long streamed reply whose client hangs up after a few events."""
    r = s.post("/v1/completions", dict(body, max_tokens=200, stream=True, temperature=0), stream=True)
    for i, _ in enumerate(r.iter_lines()):
        if i >= 3:
            break
    r.close()
    if left is not None:
        left.set()


def _together_beside_a_leaver(s, request, leaver_body):
    """request(i) for every prompt at once, beside a client that leaves mid-stream: the results."""
    got = [None] * len(PROMPTS)
    left = threading.Event()

    def one(i):
        got[i] = request(i)

    threads = [threading.Thread(target=_leave_after_three_events, args=(s, leaver_body, left))]
    threads += [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert left.is_set()
    return got


def test_concurrent_requests_get_what_each_gets_alone_and_a_leaver_changes_nothing():
    # No prefix reuse: every prompt runs from position 0 in one chunk on both servers (bitwise).
    alone = Server("--parallel", "1", "--no-prefix-reuse")
    try:
        want = [_complete(alone, p) for p in PROMPTS]
    finally:
        alone.stop()
    assert all(want)
    s = Server("--parallel", "3", "--queue-size", "4", "--no-prefix-reuse")
    try:
        got = _together_beside_a_leaver(s, lambda i: _complete(s, PROMPTS[i], stream=i % 2 == 1),
                                        {"prompt": "Far away"})
        assert got == want
        m = s.metrics()
        assert m["moestream_requests_completed_total"] >= len(PROMPTS)
        assert m["moestream_requests_running"] in (0, 1)  # the leaver may not be seen gone yet
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.proc.stderr.read()


def test_parallel_is_checked_at_startup():
    with pytest.raises(AssertionError, match="--parallel"):
        Server("--parallel", "65")


def _by_request(log):
    """A routing log -> {request id: {(position, layer): (phase, expert ids)}}."""
    out = {}
    for i in range(len(log)):
        key = (int(log.position[i]), int(log.layer[i]))
        out.setdefault(int(log.request[i]), {})[key] = (int(log.phase[i]), tuple(log.ids[i].tolist()))
    return out


def test_routing_log_keeps_concurrent_requests_apart_and_metrics_count_the_batch(tmp_path):
    # Issue 22 item 3: with --parallel the batch's routing events carry their sequence, and the
    # server's --collect-routing logs each request under its own id (timings.routing_request_id):
    # every request's records equal those of the same request run alone.
    moestream = pytest.importorskip("moestream")
    n_tok = 6
    alone_log, batch_log = tmp_path / "alone.bin", tmp_path / "batch.bin"
    alone = Server("--parallel", "1", "--no-prefix-reuse", "--collect-routing", alone_log)
    try:
        alone_ids = []
        for p in PROMPTS[:3]:
            r = alone.post("/v1/completions", {"prompt": p, "max_tokens": n_tok, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            alone_ids.append(r.json()["timings"]["routing_request_id"])
    finally:
        alone.stop()
    assert alone.proc.returncode == 0, alone.proc.stderr.read()
    s = Server("--parallel", "4", "--no-prefix-reuse", "--collect-routing", batch_log)
    try:
        # A long reply runs first, so the three requests join a running batch.
        long = s.post("/v1/completions", {"prompt": "Far away", "max_tokens": 300, "stream": True,
                                          "temperature": 0, "ignore_eos": True}, stream=True)
        lines = long.iter_lines()
        assert any(line.startswith(b"data:") for line in lines)
        got = [None] * 3

        def one(i):
            r = s.post("/v1/completions", {"prompt": PROMPTS[i], "max_tokens": n_tok, "temperature": 0,
                                           "ignore_eos": True})
            assert r.status_code == 200, r.text
            got[i] = r.json()["timings"]["routing_request_id"]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for _ in lines:  # the long reply to its end
            pass
        m = s.metrics()
        assert m["moestream_batch_steps_total"] > 0
        assert m["moestream_batch_sequences_total"] > m["moestream_batch_steps_total"]  # steps of 2+ sequences
        assert m["moestream_sequences_running"] == 0
        assert m['moestream_forward_seconds_total{phase="expert_compute"}'] > 0
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.proc.stderr.read()
    assert None not in got and len(set(got)) == 3
    alone_recs = _by_request(moestream.RoutingLog(alone_log))
    batch_recs = _by_request(moestream.RoutingLog(batch_log))
    assert len(batch_recs) == 4  # the long reply and the three
    n_layers = json.loads((DEMO / "model.json").read_text())["n_layers"]
    for a_id, b_id in zip(alone_ids, got):
        a, b = alone_recs[a_id], batch_recs[b_id]
        assert a == b
        positions = sorted({pos for pos, _ in b})
        assert len(b) == len(positions) * n_layers and positions == list(range(len(positions)))
        assert {ph for ph, _ in b.values()} == {moestream.PHASE_PREFILL, moestream.PHASE_DECODE}


def _replayed(s, prompt, replay, max_tokens=10):
    r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                   "ignore_eos": True, "replay_request": replay})
    assert r.status_code == 200, r.text
    assert r.json()["timings"]["replay_request"] == replay
    return r.json()["choices"][0]["text"]


def test_replayed_routing_per_request_together_equals_alone(tmp_path):
    # Issue 22: --replay-routing gives each request its own request of a routing log (here the
    # demo's own routing of other prompts, so the experts differ from its router's choice);
    # concurrent replayed requests, beside a client that leaves, get the text each gets alone.
    log = tmp_path / "routing.bin"
    rec = Server("--parallel", "1", "--no-prefix-reuse", "--collect-routing", log)
    try:
        plain = [_complete(rec, p, max_tokens=10) for p in ("Far away in the mountains", "The library closed at",
                                                            "Two trains left the station", "The recipe calls for")]
    finally:
        rec.stop()
    assert rec.proc.returncode == 0 and all(plain)
    alone = Server("--parallel", "1", "--replay-routing", log)
    try:
        want = [_replayed(alone, p, (i + 1) % 4) for i, p in enumerate(PROMPTS)]
        router = Server("--parallel", "1", "--no-prefix-reuse")
        try:
            assert want != [_complete(router, p, max_tokens=10) for p in PROMPTS], "the replay changed nothing"
            r = router.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "replay_request": 0})
            assert r.status_code == 400 and "--replay-routing" in r.text
        finally:
            router.stop()
        r = alone.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "replay_request": 4})
        assert r.status_code == 400 and "outside the routing log's 4 requests" in r.text
    finally:
        alone.stop()
    s = Server("--parallel", "3", "--queue-size", "4", "--replay-routing", log)
    try:
        got = _together_beside_a_leaver(s, lambda i: _replayed(s, PROMPTS[i], (i + 1) % 4),
                                        {"prompt": "Far away", "replay_request": 2})
        assert got == want
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.proc.stderr.read()
