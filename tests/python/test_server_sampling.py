"""The sampling fields of moestream-server against references computed here: greedy runs with
logit_bias, repeat/presence/frequency penalties replayed in numpy over the Python binding's logits,
logprobs against the log-softmax of those logits (completions and chat, streamed and not, through
the `openai` client too), `n` choices against single seeded requests, unknown fields refused with
their name; and one seeded draw with every parameter through the server, `infer` and Python."""
import collections
import json

import numpy as np
import pytest

from test_server import DEMO, serving, sse_events

PROMPT = "Once upon a time there was a little"


@pytest.fixture(scope="module")
def server():
    yield from serving("--parallel", "2", "--queue-size", "4")


@pytest.fixture(scope="module")
def model():
    moestream = pytest.importorskip(
        "moestream", reason="moestream module not built (configure with -DMOESTREAM_PYTHON=ON, "
        "PYTHONPATH=<build>/python)")
    if not (DEMO / "model.json").exists():
        pytest.skip(f"{DEMO} absent")
    return moestream.Model(DEMO, threads=2)


@pytest.fixture(scope="module")
def prompt_ids(model):
    return model.tokenizer.encode(PROMPT)


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def reference_greedy(model, prompt, n, repeat_penalty=1.0, repeat_last_n=64, presence_penalty=0.0,
                     frequency_penalty=0.0, logit_bias=None):
    """The documented order (runtime/model/sampler.h) at temperature 0, in float32 as the sampler:
    returns the ids and each step's log-softmax of the raw logits."""
    ids, rows = [], []
    for _ in range(n):
        raw = model.logits(prompt + ids)[-1]
        rows.append(log_softmax(raw))
        logits = raw.astype(np.float32).copy()
        for t, b in (logit_bias or {}).items():
            logits[t] = -np.inf if b == -100 else logits[t] + np.float32(b)
        history = prompt + ids
        window = history if repeat_last_n < 0 else history[len(history) - repeat_last_n:] if repeat_last_n else []
        rp = np.float32(repeat_penalty)
        for t in set(window):
            logits[t] = logits[t] / rp if logits[t] > 0 else logits[t] * rp
        for t, c in collections.Counter(ids).items():
            logits[t] -= np.float32(frequency_penalty) * np.float32(c) + np.float32(presence_penalty)
        ids.append(int(np.argmax(logits)))
    return ids, rows


def completion(server, **body):
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_penalties_and_bias_follow_the_reference_and_logprobs_are_the_raw_log_softmax(server, model, prompt_ids):
    n = 20  # the plain run repeats itself by then ("the rest of the house was gone. The rest of ...")
    plain, _ = reference_greedy(model, prompt_ids, n)
    cases = [{}, {"repeat_penalty": 1.6, "repeat_last_n": 16}, {"repeat_penalty": 1.6, "repeat_last_n": -1},
             {"presence_penalty": 1.5}, {"frequency_penalty": 0.9}, {"logit_bias": {plain[0]: -100, plain[1]: 4.0}}]
    tok = model.tokenizer
    runs = []
    for extra in cases:
        ids, rows = reference_greedy(model, prompt_ids, n, **extra)
        runs.append(ids)
        if extra:
            assert ids != plain, f"{extra} should change this greedy run"
        body = dict(extra)
        if "logit_bias" in body:
            body["logit_bias"] = {str(k): v for k, v in body["logit_bias"].items()}
        r = completion(server, prompt=prompt_ids, max_tokens=n, temperature=0, ignore_eos=True, logprobs=3, **body)
        lp = r["choices"][0]["logprobs"]
        assert lp["tokens"] == [tok.decode([t]) for t in ids], extra
        assert "".join(lp["tokens"]) == r["choices"][0]["text"]
        offsets = [sum(len(t) for t in lp["tokens"][:i]) for i in range(n)]
        assert lp["text_offset"] == offsets
        # The server decodes token by token, the binding runs the whole sequence as one prefill:
        # their logits drift apart by up to ~0.01 over 20 tokens of the demo model. A bias or
        # penalty applied to what is reported would move it by 1 or more.
        for i, t in enumerate(ids):
            assert lp["token_logprobs"][i] == pytest.approx(rows[i][t], abs=0.03), (extra, i)
            # The top 3 by value; near ties may swap under that drift, so a token may come from the top 6.
            best = np.argsort(-rows[i], kind="stable")
            near = {tok.decode([int(b)]): rows[i][b] for b in best[:6]}
            got = lp["top_logprobs"][i]
            assert len(got) == 3 and all(k in near and v == pytest.approx(near[k], abs=0.03) for k, v in got.items()), (extra, i)
            assert sorted(got.values(), reverse=True) == pytest.approx(list(rows[i][best[:3]]), abs=0.03)
    assert runs[1] != runs[2], "the repeat window should matter here"


def test_chat_logprobs_streamed_and_not(server):
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 6
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    for c in content:
        assert c["bytes"] == list(c["token"].encode())
        assert len(c["top_logprobs"]) == 2
        assert c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"]
        assert c["top_logprobs"][0]["token"] == c["token"] and c["top_logprobs"][0]["logprob"] == c["logprob"]
        assert c["logprob"] <= 0
    streamed = []
    with server.post("/v1/chat/completions", {**body, "stream": True}, stream=True) as s:
        for ev in sse_events(s):
            if ev != "[DONE]" and ev["choices"] and ev["choices"][0].get("logprobs"):
                streamed += ev["choices"][0]["logprobs"]["content"]
    # The second request reuses the first one's KV prefix: the same tokens, logprobs within rounding.
    assert [c["token"] for c in streamed] == [c["token"] for c in content]
    assert [c["logprob"] for c in streamed] == pytest.approx([c["logprob"] for c in content], abs=1e-4)
    assert [[t["token"] for t in c["top_logprobs"]] for c in streamed] == [[t["token"] for t in c["top_logprobs"]] for c in content]
    # Without logprobs the field is null, as OpenAI's.
    plain = server.post("/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_a_streamed_token_comes_with_its_logprobs(server):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    whole = completion(server, **body)["choices"][0]
    with server.post("/v1/completions", {**body, "stream": True}, stream=True) as s:
        chunks = [ev["choices"][0] for ev in sse_events(s) if ev != "[DONE]" and ev["choices"][0]["text"]]
    # Plain ASCII text, no stop string: nothing is held back, so each chunk carries its tokens'
    # entries with their text (a chunk may hold several tokens when the reader falls behind).
    assert all(c["text"] == "".join(c["logprobs"]["tokens"]) for c in chunks), chunks
    lp = [c["logprobs"] for c in chunks]
    assert sum((x["tokens"] for x in lp), []) == whole["logprobs"]["tokens"]
    assert sum((x["text_offset"] for x in lp), []) == whole["logprobs"]["text_offset"]


def test_n_choices_are_the_single_requests_of_seeds_seed_plus_i(server):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    many = completion(server, n=3, seed=11, **body)
    texts = [c["text"] for c in sorted(many["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    singles = [completion(server, seed=11 + i, **body)["choices"][0]["text"] for i in range(3)]
    assert texts == singles
    assert len(set(texts)) > 1
    assert many["usage"]["completion_tokens"] == 24
    assert many["usage"]["total_tokens"] == many["usage"]["prompt_tokens"] + 24
    with server.post("/v1/completions", {**body, "n": 3, "seed": 11, "stream": True,
                                         "stream_options": {"include_usage": True}}, stream=True) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]"
    got, finished = collections.defaultdict(str), set()
    for ev in events[:-1]:
        for c in ev["choices"]:
            got[c["index"]] += c["text"]
            if c["finish_reason"]:
                finished.add(c["index"])
    assert [got[i] for i in range(3)] == singles
    assert finished == {0, 1, 2}
    assert events[-2]["usage"]["completion_tokens"] == 24
    # More choices than the server holds at once (queue 4 + 2 slots): 400 naming n.
    r = server.post("/v1/completions", {**body, "n": 7})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


@pytest.mark.parametrize("path,body,field", [
    ("/v1/completions", {"prompt": "x", "foo": 1}, "foo"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
    ("/v1/completions", {"prompt": "x", "messages": []}, "messages"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias.99999999"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "functions": []}, "functions"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "min_p": 2}, "min_p"),
])
def test_unknown_unsupported_and_bad_fields_get_400_naming_them(server, path, body, field):
    r = server.post(path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_the_openai_client_gets_logprobs_choices_and_named_400s(server):
    openai = pytest.importorskip("openai", reason="the openai client (PyPI) is what this test exercises")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    msgs = [{"role": "user", "content": "Hello"}]
    r = client.chat.completions.create(model="demo", messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=3, n=2, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy: the same twice
    for c in r.choices:
        assert len(c.logprobs.content) == 4
        assert all(len(t.top_logprobs) == 3 for t in c.logprobs.content)
    c = client.completions.create(model="demo", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2,
                                  presence_penalty=0.5, frequency_penalty=0.5, extra_body={"ignore_eos": True})
    assert len(c.choices[0].logprobs.tokens) == 3 and len(c.choices[0].logprobs.top_logprobs[0]) == 2
    for kw, field in [({"extra_body": {"foo": 1}}, "foo"), ({"echo": True}, "echo"), ({"best_of": 3}, "best_of")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="demo", prompt="x", max_tokens=2, **kw)
        assert e.value.response.json()["error"]["param"] == field


def test_server_infer_and_python_draw_the_same_tokens(server, model, prompt_ids, tool):
    eos = model.tokenizer.eos_id
    bias = {prompt_ids[-1]: 1.5, **({eos: -100} if eos is not None else {})}
    kw = dict(temperature=0.9, top_k=0, top_p=1.0, seed=5, min_p=0.05, typical_p=0.95, repeat_penalty=1.2,
              repeat_last_n=32, presence_penalty=0.3, frequency_penalty=0.2)
    n = 16
    py = model.generate(prompt_ids, n, ignore_eos=True, logit_bias=bias, **kw)
    http = completion(server, prompt=prompt_ids, max_tokens=n, ignore_eos=True,
                      logit_bias={str(k): v for k, v in bias.items()}, **kw)["choices"][0]["text"]
    flags = ["--temp", 0.9, "--top-k", 0, "--top-p", 1.0, "--seed", 5, "--min-p", 0.05, "--typical-p", 0.95,
             "--repeat-penalty", 1.2, "--repeat-last-n", 32, "--presence-penalty", 0.3, "--frequency-penalty", 0.2]
    for k, v in bias.items():
        flags += ["--logit-bias", f"{k}:{v}"]
    cli = tool("infer", "-m", DEMO, "-t", 2, "--prompt-ids", ",".join(map(str, prompt_ids)), "-n", n,
               "--ignore-eos", *flags)
    assert cli.returncode == 0, cli.stderr
    assert py == http
    assert cli.stdout == py + "\n"
    # The same seed without the new parameters draws another text: they were not ignored.
    assert model.generate(prompt_ids, n, ignore_eos=True, temperature=0.9, top_k=0, top_p=1.0, seed=5) != py
    bad = tool("infer", "-m", DEMO, "--prompt-ids", "1", "-n", 1, "--logit-bias", "12")
    assert bad.returncode != 0 and "--logit-bias" in bad.stderr
    # Each caller reads the option in its own spelling: a keyword in Python, a flag on the CLI.
    import moestream  # the model fixture skips the test where it is not built
    with pytest.raises(moestream.ConfigError, match=r"^min_p must be in \[0, 1\], got 2"):
        model.generate(prompt_ids, 2, min_p=2.0)
    bad = tool("infer", "-m", DEMO, "--prompt-ids", "1", "-n", 1, "--min-p", 2)
    assert bad.returncode == 1 and "infer: error: --min-p must be in [0, 1], got 2" in bad.stderr, bad.stderr
