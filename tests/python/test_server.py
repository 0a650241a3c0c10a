"""moestream-server end to end over loopback with a real HTTP client (requests): every endpoint,
streaming, every bad input (4xx JSON, never a crash), the API key, 503 from a full queue and for
connections beyond the HTTP threads + waiting FIFO, a disconnect freeing its slot, KV prefix reuse
across chat turns, graceful SIGTERM."""
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

requests = pytest.importorskip("requests", reason="requests (PyPI) is the HTTP client of these tests")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
CTX = 512


def _exe():
    exe = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / "moestream-server"
    if not exe.exists():
        pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
    if not (DEMO / "model.json").exists():
        pytest.skip(f"demo model {DEMO} absent")
    return exe


class Server:
    def __init__(self, *args, ctx=CTX, model=DEMO):
        self.proc = subprocess.Popen([str(_exe()), "-m", str(model), "--port", "0", "-t", "1",
                                      "--ctx", str(ctx), *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if "listening on http://127.0.0.1:" not in line:
            self.proc.kill()
            raise AssertionError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = line.split("http://")[1].split()[0]
        self.url = "http://" + self.url

    def post(self, path, body=None, **kw):
        if body is not None and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        return requests.post(self.url + path, data=body, timeout=30, **kw)

    def get(self, path, **kw):
        return requests.get(self.url + path, timeout=30, **kw)

    def metrics(self, headers=None):
        out = {}
        for line in self.get("/metrics", headers=headers).text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop_cleanly(self):
        """stop(); the server must have exited with status 0 (its stderr is the message)."""
        self.stop()
        assert self.proc.returncode == 0, self.proc.stderr.read()

    # `with Server(...) as s:` stops it on leaving; after a block that did not raise, cleanly.
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.stop_cleanly()
        else:
            self.stop()


def serving(*args, **kw):
    """A module fixture's body: a Server(*args, **kw) for its tests, stopped cleanly after them."""
    s = Server(*args, **kw)
    yield s
    s.stop_cleanly()


@pytest.fixture(scope="module")
def server():
    yield from serving("--queue-size", "1", "--max-body-kb", "64")


def sse_events(resp):
    """Parsed `data:` events of a server-sent-event response, [DONE] as the string."""
    out = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def assert_json_error(r, status, *needles):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/json")
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    for n in needles:
        assert n in err["message"] or n == err.get("code") or n == err.get("param"), (n, err)
    return err


def test_health_and_models(server):
    assert server.get("/health").json() == {"status": "ok"}
    m = server.get("/v1/models").json()
    assert m["object"] == "list"
    assert [d["id"] for d in m["data"]] == ["demo"]
    assert m["data"][0]["max_model_len"] == CTX


def test_completion_is_deterministic_at_temperature_0_and_counts_tokens(server):
    body = {"model": "demo", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True}
    a, b = server.post("/v1/completions", body), server.post("/v1/completions", body)
    assert a.status_code == 200, a.text
    ja, jb = a.json(), b.json()
    assert ja["object"] == "text_completion"
    assert ja["choices"][0]["text"] == jb["choices"][0]["text"]
    assert ja["choices"][0]["text"].strip()
    assert ja["choices"][0]["finish_reason"] == "length"
    assert ja["usage"]["completion_tokens"] == 12
    assert ja["usage"]["total_tokens"] == ja["usage"]["prompt_tokens"] + 12


def test_completion_prompt_tokens_match_the_reference_tokenizer(server):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    text = "The kernel schedules threads, and then"
    r = server.post("/v1/completions", {"prompt": text, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(text).ids)


def test_seeded_sampling_repeats(server):
    body = {"prompt": "In the morning", "max_tokens": 10, "temperature": 0.9, "top_p": 0.9,
            "top_k": 20, "seed": 7, "ignore_eos": True}
    assert server.post("/v1/completions", body).json()["choices"][0]["text"] == \
        server.post("/v1/completions", body).json()["choices"][0]["text"]


def test_n_choices_run_one_after_the_other_without_parallel(server):
    # Queue 1 + the running one: n = 2 fits, choice i is the request of seed 7 + i; n = 3 does not.
    body = {"prompt": "In the morning", "max_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    two = server.post("/v1/completions", {**body, "n": 2, "seed": 7}).json()
    singles = [server.post("/v1/completions", {**body, "seed": s}).json()["choices"][0]["text"] for s in (7, 8)]
    assert [c["text"] for c in two["choices"]] == singles and singles[0] != singles[1]
    assert_json_error(server.post("/v1/completions", {**body, "n": 3}), 400, "n")


def test_chat_uses_the_template_and_reference_token_count(server):
    jinja2 = pytest.importorskip("jinja2")
    tokenizers = pytest.importorskip("tokenizers")
    cfg = json.loads((DEMO / "tokenizer_config.json").read_text())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a kernel?"}]
    text = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(
        cfg["chat_template"]).render(messages=msgs, add_generation_prompt=True)
    want = len(tokenizers.Tokenizer.from_file(str(DEMO / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids)
    r = server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["object"] == "chat.completion"
    assert j["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(j["choices"][0]["message"]["content"], str)
    assert j["choices"][0]["finish_reason"] in ("stop", "length")
    assert j["usage"]["prompt_tokens"] == want


def test_chat_stream_matches_the_non_streamed_reply(server):
    body = {"messages": [{"role": "user", "content": "Tell me about memory."}], "max_tokens": 16,
            "temperature": 0, "ignore_eos": True}
    whole = server.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    r = server.post("/v1/chat/completions", {**body, "stream": True,
                                             "stream_options": {"include_usage": True}}, stream=True)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    chunks = [e for e in ev[:-1] if e["choices"]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["object"] == "chat.completion.chunk" for e in chunks)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in chunks)
    assert text == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert ev[-2]["usage"]["completion_tokens"] == 16


def test_completion_stream(server):
    r = server.post("/v1/completions", {"prompt": "The file system", "max_tokens": 6, "stream": True,
                                        "temperature": 0, "ignore_eos": True}, stream=True)
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    assert all(e["object"] == "text_completion" for e in ev[:-1])
    assert ev[-2]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in ev[:-1]).strip()


def test_stop_string_cuts_the_output(server):
    body = {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    full = server.post("/v1/completions", body).json()["choices"][0]["text"]
    words = full.split()
    assert len(words) > 4, full
    stop = words[3]
    r = server.post("/v1/completions", {**body, "stop": [stop]}).json()
    assert r["choices"][0]["text"] == full[:full.index(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"


BAD = [
    ("/v1/completions", "{not json", 400, "invalid_json"),
    ("/v1/completions", "[1, 2]", 400, "invalid_json"),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10 ** 12}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": CTX}, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hello " * (CTX + 10), "max_tokens": 4}, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "temperature": 7}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "stop": 3}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "unknown_field": 1}, 400, "unknown_field"),
    ("/v1/completions", {"prompt": [999999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model_not_found"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": "x"}, 400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": 3}, 400, "model"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_input_gets_a_json_4xx(server, path, body, status, needle):
    assert_json_error(server.post(path, body), status, needle)


def test_body_over_the_limit_gets_413_json(server):
    r = server.post("/v1/completions", {"prompt": "x" * (100 << 10)})
    assert_json_error(r, 413, "body_too_large")


def test_deeply_nested_json_in_any_field_gets_400_and_the_server_stays_up():
    # ~200 KB of balanced brackets: each of these killed the server (SIGSEGV, stack overflow).
    deep = "[" * 100000 + "]" * 100000
    user = '{"role": "user", "content": "x"}'
    bodies = [
        ("/v1/completions", '{"prompt": %s}' % deep),
        ("/v1/completions", '{"prompt": "x", "unused": {"a": %s}}' % deep),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % deep),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x", "name": %s}]}' % deep),
        ("/v1/chat/completions", '{"messages": [%s], "tools": [%s]}' % (user, deep)),
        ("/v1/chat/completions", '{"messages": [%s], "chat_template_kwargs": {"k": %s}}' % (user, deep)),
    ]
    with Server("--max-body-kb", "1024") as s:
        for path, body in bodies:
            assert_json_error(s.post(path, body), 400, "json_too_deep", "64")
            assert s.get("/health").status_code == 200
        ok = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                             "chat_template_kwargs": {"unused": [[[[1]]]]}})
        assert ok.status_code == 200, ok.text


def test_an_engine_failure_answers_500_with_an_error_id_and_no_server_path(tmp_path):
    # The expert files shrink under the running server: the read fails with an IoError naming the
    # file. The client gets an error id only; the log line with that id has the path.
    model = tmp_path / "model"
    shutil.copytree(DEMO, model, ignore=shutil.ignore_patterns("heldout*", "figures", "routing"))
    s = Server(model=model)
    try:
        for f in (model / "experts").iterdir():
            os.truncate(f, 100)
        r = s.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2})
        err = assert_json_error(r, 500, "engine_error")
        assert "/" not in r.text and str(tmp_path) not in r.text, r.text
        error_id = err["message"].split("error id ")[1].split(")")[0]
        stream = s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True})
        assert "engine_error" in stream.text and "/" not in stream.text.replace("data: ", ""), stream.text
        assert s.get("/health").status_code == 200
    finally:
        s.stop()
    log = s.proc.stderr.read()
    assert f"error {error_id} (engine_error)" in log and str(model) in log, log


def test_a_chunked_body_is_held_to_the_same_limit(server):
    # httplib bounds Content-Length bodies only: a chunked one used to be read whole (200 MB here).
    def chunks(n, size):
        yield b'{"prompt": "'
        for _ in range(n):
            yield b"x" * size
        yield b'", "max_tokens": 1}'

    r = requests.post(server.url + "/v1/completions", data=chunks(200, 1 << 20), timeout=30)
    assert_json_error(r, 413, "body_too_large")
    ok = requests.post(server.url + "/v1/completions", data=chunks(3, 10), timeout=30)
    assert ok.status_code == 200, ok.text
    r = requests.put(server.url + "/v1/anything", data=chunks(200, 1 << 20), timeout=30)
    assert_json_error(r, 413, "body_too_large")
    assert_json_error(server.post("/v1/nothing", {"a": 1}), 404, "not_found")
    assert_json_error(requests.delete(server.url + "/v1/models", data="{}", timeout=30), 404, "not_found")
    r = requests.post(server.url + "/v1/completions", files={"prompt": ("p", b"hi")}, timeout=30)
    assert_json_error(r, 415, "unsupported_media_type")
    assert server.get("/health").status_code == 200


def test_unknown_endpoint_gets_404_json_and_server_survives_bad_input(server):
    assert_json_error(server.get("/v1/nothing"), 404, "not_found")
    assert server.get("/health").status_code == 200
    assert server.metrics()["moestream_requests_invalid_total"] >= len(BAD)


def test_metrics_count_tokens_tiers_bytes_and_queue(server):
    before = server.metrics()
    server.post("/v1/completions", {"prompt": "Count me", "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    m = server.metrics()
    assert m["moestream_completion_tokens_total"] == before["moestream_completion_tokens_total"] + 5
    assert m["moestream_requests_completed_total"] == before["moestream_requests_completed_total"] + 1
    assert m["moestream_decode_tokens_per_second"] > 0
    assert m["moestream_expert_requests_total"] > before["moestream_expert_requests_total"]
    tiers = sum(m[f'moestream_expert_hits_total{{tier="{t}"}}'] for t in ("host_cache", "page_cache", "storage"))
    assert tiers == m["moestream_expert_requests_total"]
    assert "moestream_expert_bytes_read_total" in m
    assert m["moestream_queue_length"] == 0


def test_chat_turns_reuse_the_previous_kv_prefix(server):
    msgs = [{"role": "user", "content": "Explain virtual memory."}]
    processed = []
    for turn in range(3):
        r = server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0}).json()
        u = r["usage"]
        processed.append((u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
        assert r["timings"]["prompt_tokens_processed"] == u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]
        msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                 {"role": "user", "content": f"And point {turn}?"}]
    # Turns 2 and 3 extend the previous turn's conversation: the old prompt comes from the cache
    # (up to a token or two where the reply's text re-tokenizes differently at its edges).
    for (p_prev, _), (p, cached) in zip(processed, processed[1:]):
        assert cached >= 0.9 * p_prev, processed
        assert p - cached < p / 2, processed


def test_without_prefix_reuse_every_prompt_is_processed():
    s = Server("--no-prefix-reuse")
    try:
        body = {"messages": [{"role": "user", "content": "Explain virtual memory."}], "max_tokens": 4}
        s.post("/v1/chat/completions", body)
        u = s.post("/v1/chat/completions", body).json()["usage"]
        assert u["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        s.stop()


def test_a_model_without_a_tokenizer_takes_and_answers_token_ids(server, tmp_path):
    # The demo model with its tokenizer fields removed (as synth_model writes models): token-id
    # prompts give the same tokens as the demo with its tokenizer; text and chat get 400.
    tokenizers = pytest.importorskip("tokenizers")
    cfg = json.loads((DEMO / "model.json").read_text())
    cfg["tokenizer"] = {"file": None, "config": None}
    (tmp_path / "model.json").write_text(json.dumps(cfg))
    # Hard links: a symbolic link leading out of the model directory is refused.
    os.link(DEMO / cfg["dense"]["file"], tmp_path / cfg["dense"]["file"])
    shutil.copytree(DEMO / cfg["experts"]["dir"], tmp_path / cfg["experts"]["dir"], copy_function=os.link)
    tok = tokenizers.Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    ids = tok.encode("Once upon a time").ids
    want = server.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                           "ignore_eos": True}).json()["choices"][0]["text"]
    s = Server(model=tmp_path)
    try:
        r = s.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        assert c["text"] == "" and len(c["token_ids"]) == 8
        assert tok.decode(c["token_ids"]) == want
        ev = sse_events(s.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                                   "ignore_eos": True, "stream": True}, stream=True))
        assert ev[-1] == "[DONE]"
        assert [i for e in ev[:-1] for i in e["choices"][0]["token_ids"]] == c["token_ids"]
        lp = s.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                        "logprobs": 1}).json()["choices"][0]["logprobs"]
        assert lp["tokens"] == [f"token_id:{i}" for i in c["token_ids"]]
        assert [list(t) for t in lp["top_logprobs"]] == [[t] for t in lp["tokens"]]  # greedy: the top one
        assert_json_error(s.post("/v1/completions", {"prompt": "text", "max_tokens": 2}), 400, "no_tokenizer")
        assert_json_error(s.post("/v1/completions", {"prompt": ids, "stop": ["x"]}), 400, "no_tokenizer")
        assert_json_error(s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                          400, "no_tokenizer")
    finally:
        s.stop()
    assert s.proc.returncode == 0
    assert "has no tokenizer" in s.proc.stderr.read()


def test_api_key_is_required_except_for_health():
    s = Server("--api-key", "sekrit")
    try:
        body = {"prompt": "hi", "max_tokens": 2}
        assert_json_error(s.post("/v1/completions", body), 401, "invalid_api_key")
        assert_json_error(s.post("/v1/completions", body, headers={"Authorization": "Bearer wrong"}), 401,
                          "invalid_api_key")
        assert_json_error(s.get("/v1/models"), 401, "invalid_api_key")
        assert_json_error(s.get("/metrics"), 401, "invalid_api_key")
        # A body defers the check until it is read (no reset): it must still happen.
        assert_json_error(s.get("/metrics", data="x" * 1000), 401, "invalid_api_key")
        assert_json_error(s.get("/v1/models", data="x"), 401, "invalid_api_key")
        assert s.get("/health").status_code == 200
        ok = s.post("/v1/completions", body, headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200, ok.text
    finally:
        s.stop()


def test_full_queue_gets_503_and_a_disconnect_frees_the_slot(server):
    # A: a long stream occupies the engine; B waits in the one queue place; C finds it full.
    sess_a = requests.Session()
    a = sess_a.post(server.url + "/v1/completions", data=json.dumps(
        {"prompt": "Once", "max_tokens": CTX - 8, "stream": True, "ignore_eos": True, "temperature": 0}),
        stream=True, timeout=30)
    lines = a.iter_lines(decode_unicode=True)
    assert next(l for l in lines if l.startswith("data: "))  # A is generating
    b_result = {}

    def run_b():
        t0 = time.monotonic()
        r = requests.post(server.url + "/v1/completions", data=json.dumps(
            {"prompt": "B", "max_tokens": 2, "temperature": 0}), timeout=60)
        b_result["status"], b_result["s"] = r.status_code, time.monotonic() - t0

    tb = threading.Thread(target=run_b)
    tb.start()
    for _ in range(100):
        if server.metrics()["moestream_queue_length"] == 1:
            break
        time.sleep(0.02)
    assert server.metrics()["moestream_queue_length"] == 1
    c = server.post("/v1/completions", {"prompt": "C", "max_tokens": 2})
    assert_json_error(c, 503, "queue_full")
    assert c.headers["Retry-After"] == "1"
    # The client of A goes away: its generation stops and B runs.
    a.close()
    sess_a.close()
    tb.join(timeout=30)
    assert b_result.get("status") == 200, b_result
    m = server.metrics()
    assert m["moestream_requests_rejected_total"] >= 1
    assert m["moestream_requests_cancelled_total"] >= 1
    assert m["moestream_queue_length"] == 0


def test_sigterm_finishes_the_running_stream_then_exits_0():
    s = Server()
    r = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 64, "stream": True, "ignore_eos": True},
               stream=True)
    lines = r.iter_lines(decode_unicode=True)
    assert next(l for l in lines if l.startswith("data: "))
    s.proc.send_signal(signal.SIGTERM)
    rest = [l for l in lines if l.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert s.proc.wait(timeout=15) == 0
    assert "signal 15" in s.proc.stderr.read()


def test_a_queued_stream_that_disconnects_frees_its_place(server):
    def stream(prompt, max_tokens):
        sess = requests.Session()
        r = sess.post(server.url + "/v1/completions", data=json.dumps(
            {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}),
            stream=True, timeout=30)
        return sess, r, r.iter_lines(decode_unicode=True)

    sa, a, la = stream("Once", CTX - 8)
    assert next(l for l in la if l.startswith("data: "))  # A runs
    sb, b, lb = stream("Queued", 4)
    assert next(lb) == ": waiting"                        # B waits in the one place
    b.close()
    sb.close()
    for _ in range(100):                                  # noticed at B's next keep-alive write
        if server.metrics()["moestream_queue_length"] == 0:
            break
        time.sleep(0.05)
    assert server.metrics()["moestream_queue_length"] == 0
    result = {}
    tc = threading.Thread(target=lambda: result.update(r=requests.post(
        server.url + "/v1/completions", data=json.dumps({"prompt": "C", "max_tokens": 2}), timeout=60)))
    tc.start()
    for _ in range(100):
        if server.metrics()["moestream_queue_length"] == 1:
            break
        time.sleep(0.02)
    a.close()
    sa.close()
    tc.join(timeout=30)
    assert result["r"].status_code == 200, result["r"].text


def _raw_post(url, path, body):
    """Sends a whole non-streaming request on a bare socket (closed by the caller to leave)."""
    host, port = url[len("http://"):].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
    return sock


def _wait_for(pred, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_a_non_streaming_client_that_disconnects_frees_the_engine_and_its_place():
    # A long non-streaming request runs (A), another waits in the one queue place (B). B's
    # client leaves: its place is free at once. A's client leaves: generation stops within a
    # token and the next queued request (C) runs at once. Both count as cancelled.
    big = 4096
    with Server("--queue-size", "1", ctx=big) as s:
        m0 = s.metrics()
        a = _raw_post(s.url, "/v1/completions", {"prompt": "Once", "max_tokens": big - 16,
                                                 "ignore_eos": True, "temperature": 0})
        assert _wait_for(lambda: s.metrics()["moestream_requests_running"] == 1)
        b = _raw_post(s.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "B"}],
                                                      "max_tokens": 2})
        assert _wait_for(lambda: s.metrics()["moestream_queue_length"] == 1)
        b.close()
        assert _wait_for(lambda: s.metrics()["moestream_queue_length"] == 0, 2.0)
        assert s.metrics()["moestream_requests_cancelled_total"] == m0["moestream_requests_cancelled_total"] + 1
        result = {}

        def run_c():
            r = requests.post(s.url + "/v1/completions", data=json.dumps(
                {"prompt": "C", "max_tokens": 2, "temperature": 0, "ignore_eos": True}), timeout=60)
            result["r"], result["t"] = r, time.monotonic()

        tc = threading.Thread(target=run_c)
        tc.start()
        assert _wait_for(lambda: s.metrics()["moestream_queue_length"] == 1)
        assert s.metrics()["moestream_requests_running"] == 1  # A still generating
        t_close = time.monotonic()
        a.close()
        tc.join(timeout=60)
        assert result["r"].status_code == 200, result["r"].text
        assert result["t"] > t_close  # C finished after A's client left (A's stop is counted below)
        m = s.metrics()
        assert m["moestream_requests_cancelled_total"] == m0["moestream_requests_cancelled_total"] + 2
        a_tokens = m["moestream_completion_tokens_total"] - m0["moestream_completion_tokens_total"] - 2
        assert 0 < a_tokens < big - 16, a_tokens  # A stopped early
        # The worker marks itself idle just after C's answer is handed out: the gauge follows.
        assert _wait_for(lambda: s.metrics()["moestream_requests_running"] == 0, 2.0)
        assert s.metrics()["moestream_queue_length"] == 0


def test_connections_beyond_threads_and_backlog_get_503_at_once_and_none_hang():
    # 2 HTTP threads, 2 waiting connections. Two clients that send half a request hold both
    # threads (httplib waits up to its 5 s read timeout); of 10 more concurrent clients, 2 wait
    # for a thread and 8 are answered 503 at once by the overflow threads. Once the half-open
    # clients go away, both waiting clients get their 200.
    with Server("--queue-size", "8", "--http-threads", "2", "--max-waiting-connections", "2") as s:
        host, port = s.url[len("http://"):].rsplit(":", 1)
        holders = []
        for _ in range(2):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers never end
            holders.append(sock)
        time.sleep(0.3)  # both taken by the two HTTP threads
        results, lock = [], threading.Lock()

        def client(i):
            try:
                r = requests.post(s.url + "/v1/completions", data=json.dumps(
                    {"prompt": f"Client {i}", "max_tokens": 2, "temperature": 0}), timeout=30)
                out = (r.status_code, r.headers.get("Retry-After"), r.text, time.monotonic())
            except requests.RequestException as e:  # a hang or a reset is a failure
                out = ("error", None, repr(e), time.monotonic())
            with lock:
                results.append(out)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 4  # well inside the holders' 5 s read timeout
        while time.monotonic() < deadline:
            with lock:
                if len(results) >= 8:
                    break
            time.sleep(0.02)
        with lock:
            early = list(results)
        assert len(early) == 8, early
        for status, retry_after, text, _ in early:
            assert status == 503, (status, text)
            assert retry_after == "1"
            assert json.loads(text)["error"]["code"] == "server_overloaded"
        for sock in holders:
            sock.close()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert sorted(r[0] for r in results) == [200] * 2 + [503] * 8, results
        m = s.metrics()
        assert m["moestream_requests_rejected_total"] == 8


def test_overload_answers_503_to_every_complete_request_even_with_a_large_body():
    # One HTTP thread held by a half-sent request, one waiting place: nearly all of 60 concurrent
    # clients with 1 MB bodies are overflow connections. The 503 used to be written before the
    # body was read; closing a socket with unread data resets the connection, and some clients saw
    # the reset instead of the answer. Every one must get its 503 (or, for the waiting one, a 400:
    # the prompt is longer than the context).
    with Server("--queue-size", "1", "--http-threads", "1", "--max-waiting-connections", "1",
               "--max-body-kb", "2048") as s:
        host, port = s.url[len("http://"):].rsplit(":", 1)
        holder = socket.create_connection((host, int(port)), timeout=10)
        holder.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers never end
        time.sleep(0.3)
        body = json.dumps({"prompt": "x" * (1 << 20), "max_tokens": 1})
        results, lock = [], threading.Lock()

        def client():
            try:
                r = requests.post(s.url + "/v1/completions", data=body, timeout=30)
                out = (r.status_code, r.json()["error"]["code"])
            except requests.RequestException as e:
                out = ("error", repr(e))
            with lock:
                results.append(out)

        threads = [threading.Thread(target=client) for _ in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        holder.close()
        assert set(results) <= {(503, "server_overloaded"), (400, "context_length_exceeded")}, results
        n503 = sum(r[0] == 503 for r in results)
        assert len(results) == 60 and n503 >= 58, results
        assert s.metrics()["moestream_requests_rejected_total"] == n503


def test_slow_overflow_clients_do_not_stall_the_answers_to_others():
    # 1 HTTP thread, 1 waiting place. Three half-sent requests take the thread, the place and an
    # overflow thread (each is held up to httplib's 5 s read timeout); a complete request that
    # comes next still gets its 503 at once, not after the holders time out.
    with Server("--http-threads", "1", "--max-waiting-connections", "1") as s:
        host, port = s.url[len("http://"):].rsplit(":", 1)
        holders = []
        try:
            for _ in range(3):
                h = socket.create_connection((host, int(port)), timeout=10)
                h.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                holders.append(h)
                time.sleep(0.2)  # taken from its FIFO before the next one comes
            r = requests.post(s.url + "/v1/completions", data=json.dumps({"prompt": "x", "max_tokens": 1}),
                              timeout=3)  # well inside the holders' 5 s
            assert_json_error(r, 503, "server_overloaded")
        finally:
            for h in holders:
                h.close()
