"""Fault load on moestream-server over loopback: concurrent clients mix good requests (JSON and
streamed), malformed ones (bad JSON, bad fields, deep nesting, garbage instead of HTTP, cut-off
requests) and clients that leave mid-stream, against a server small enough to overflow (2 queue
places, 3 HTTP threads, 2 waiting connections). The server must stay up, every good request must
complete or get a 503, and /metrics must agree with what the clients saw. Bounded: a fixed,
seeded plan of requests, each with a timeout, the whole load inside 45 s."""
import json
import random
import socket
import threading
import time

import pytest

from test_server import Server, _wait_for, requests, sse_events

CLIENTS = 8
OPS_PER_CLIENT = 12
LOAD_SECONDS = 45
TIMEOUT = 30


def _raw(url, data, read=True):
    """Sends bytes on a bare socket; returns the status line's code (None: no answer)."""
    host, port = url[len("http://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        if not read:
            return None
        sock.shutdown(socket.SHUT_WR)
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else None


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.tokens = 0
        self.failures = []

    def add(self, key, tokens=0):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            self.tokens += tokens

    def fail(self, what):
        with self.lock:
            self.failures.append(what)

    def __getitem__(self, key):
        return self.counts.get(key, 0)


def _good(s, rng, t):
    """A valid request: 200 with the whole reply, or 503 (queue full / overloaded)."""
    n = rng.randint(1, 4)
    chat = rng.random() < 0.5
    stream = rng.random() < 0.4
    body = {"max_tokens": n, "ignore_eos": True, "temperature": 0, "stream": stream}
    if chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": f"Hi {rng.random()}"}]
    else:
        path, body["prompt"] = "/v1/completions", f"Once {rng.randint(0, 999)}"
    if stream:
        body["stream_options"] = {"include_usage": True}
    try:
        r = requests.post(s.url + path, data=json.dumps(body), timeout=TIMEOUT, stream=stream)
    except requests.RequestException as e:
        return t.fail(("good request failed", repr(e)))
    if r.status_code == 503:
        code = r.json()["error"]["code"]
        if code not in ("queue_full", "server_overloaded") or r.headers.get("Retry-After") != "1":
            return t.fail(("bad 503", r.text))
        return t.add("503")
    if r.status_code != 200:
        return t.fail(("good request", r.status_code, r.text))
    if stream:
        events = sse_events(r)
        if events[-1] != "[DONE]" or "usage" not in events[-2]:
            return t.fail(("stream did not complete", events[-3:]))
        usage = events[-2]["usage"]
    else:
        usage = r.json()["usage"]
    if usage["completion_tokens"] != n:
        return t.fail(("short reply", n, usage))
    t.add("200", usage["completion_tokens"])


MALFORMED = [
    ("/v1/completions", "{not json"),
    ("/v1/completions", '{"prompt": 5}'),
    ("/v1/completions", '{"prompt": "x", "temperature": "hot"}'),
    ("/v1/completions", '{"prompt": "x", "junk": %s}' % ("[" * 5000 + "]" * 5000)),
    ("/v1/chat/completions", '{"messages": []}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % ("{\"a\":" * 3000 + "1" + "}" * 3000)),
    ("/v1/chat/completions", '{"messages": [{"role": "wizard", "content": "x"}]}'),
    ("/v1/nothing", '{}'),
]


def _malformed(s, rng, t):
    """A complete but bad request: a 4xx JSON error, or 503 when it came while overloaded."""
    kind = rng.random()
    if kind < 0.15:  # not HTTP at all
        status = _raw(s.url, bytes(rng.randrange(1, 256) for _ in range(200)) + b"\r\n\r\n")
        if status is not None and not (400 <= status < 500 or status == 503):
            return t.fail(("garbage answered", status))
        return t.add("4xx" if status and status < 500 else "503" if status else "unanswered")
    path, body = rng.choice(MALFORMED)
    try:
        r = requests.post(s.url + path, data=body, timeout=TIMEOUT)
    except requests.RequestException as e:
        return t.fail(("malformed request got no answer", repr(e)))
    if r.status_code == 503 or 400 <= r.status_code < 500:
        try:
            r.json()["error"]["code"]
        except (ValueError, KeyError) as e:
            return t.fail(("error body", r.status_code, r.text, e))
        return t.add("503" if r.status_code == 503 else "4xx")
    t.fail(("malformed request", path, r.status_code, r.text))


def _disconnect(s, rng, t):
    kind = rng.random()
    if kind < 0.5:
        # A long stream, left after its first event: admitted, so it ends as cancelled (or 503).
        chat = rng.random() < 0.5
        body = {"max_tokens": 480, "ignore_eos": True, "stream": True}
        if chat:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "Tell"}]
        else:
            path, body["prompt"] = "/v1/completions", "Long"
        try:
            r = requests.post(s.url + path, data=json.dumps(body), timeout=TIMEOUT, stream=True)
        except requests.RequestException as e:
            return t.fail(("stream request failed", repr(e)))
        if r.status_code == 503:
            r.close()
            return t.add("503")
        if r.status_code != 200:
            return t.fail(("stream", r.status_code, r.text))
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                break
        r.close()
        return t.add("left_stream")
    body = json.dumps({"prompt": "Cut", "max_tokens": 50}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    if kind < 0.75:
        _raw(s.url, head + body, read=False)  # whole request, then gone without reading
        return t.add("left_complete")
    cut = rng.randrange(1, len(head) + len(body))
    _raw(s.url, (head + body)[:cut], read=False)  # cut off mid-request
    t.add("left_partial")


def _client(s, seed, t):
    rng = random.Random(seed)
    for _ in range(OPS_PER_CLIENT):
        op = rng.random()
        (_good if op < 0.5 else _malformed if op < 0.8 else _disconnect)(s, rng, t)


def test_fault_load_keeps_the_server_up_and_the_metrics_consistent():
    s = Server("--queue-size", "2", "--http-threads", "3", "--max-waiting-connections", "2",
               "--max-body-kb", "256")
    try:
        m0 = s.metrics()
        t = Tally()
        threads = [threading.Thread(target=_client, args=(s, 1000 + i, t)) for i in range(CLIENTS)]
        start = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=max(1.0, start + LOAD_SECONDS - time.monotonic()))
        assert not any(th.is_alive() for th in threads), "clients still running after the time bound"
        assert t.failures == [], t.failures
        assert s.proc.poll() is None, s.proc.stderr.read()
        assert sum(t.counts.values()) == CLIENTS * OPS_PER_CLIENT, t.counts
        assert t["200"] > 0 and t["4xx"] > 0 and t["left_stream"] > 0, t.counts

        # Left connections settle: their jobs are cancelled or finish, the queue drains.
        assert _wait_for(lambda: (lambda m: m["moestream_requests_running"] == 0
                                  and m["moestream_queue_length"] == 0)(s.metrics()), 10.0)
        time.sleep(0.5)
        assert s.get("/health").status_code == 200
        d = {k: v - m0.get(k, 0) for k, v in s.metrics().items()}
        unknown = t["left_complete"]  # may have been refused, run, or never been read
        assert d["moestream_requests_failed_total"] == 0, d
        assert t["503"] <= d["moestream_requests_rejected_total"] <= t["503"] + unknown, (d, t.counts)
        # Every left stream was admitted and is cancelled (running or waiting); nothing else cancels.
        assert t["left_stream"] <= d["moestream_requests_cancelled_total"] <= t["left_stream"] + unknown, (d, t.counts)
        # Finished generations: the 200s, the left streams that ran, the complete requests left behind.
        assert t["200"] <= d["moestream_requests_completed_total"] <= t["200"] + t["left_stream"] + unknown
        assert d["moestream_requests_invalid_total"] >= t["4xx"]
        assert d["moestream_requests_invalid_total"] <= t["4xx"] + t["left_partial"] + t["unanswered"]
        assert d["moestream_completion_tokens_total"] >= t.tokens
        # Still serving normally after the storm.
        r = s.post("/v1/completions", {"prompt": "After", "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.proc.stderr.read()
