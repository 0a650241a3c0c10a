"""moestream-server through Python's official `openai` client (PyPI): models, completions (text and
token-id prompts), chat, streaming chat with usage, and errors raised as the client's typed
exceptions (unknown model, wrong key, context exceeded, full queue) against a live server."""
import json
import threading

import pytest

from test_server import CTX, DEMO, requests, serving

openai = pytest.importorskip("openai", reason="the openai client (PyPI) is what these tests exercise")

KEY = "test-key"


@pytest.fixture(scope="module")
def server():
    yield from serving("--api-key", KEY, "--queue-size", "1")


@pytest.fixture(scope="module")
def client(server):
    # max_retries=0: a retried 503 would hide the error the test expects.
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30)


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["demo"]
    assert models.data[0].object == "model"


def test_completion_is_greedy_deterministic_and_counts_tokens(client, server):
    kw = dict(model="demo", prompt="Once upon a time", max_tokens=8, temperature=0,
              extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.object == "text_completion"
    assert a.choices[0].text == b.choices[0].text and a.choices[0].text.strip()
    assert a.choices[0].finish_reason == "length"
    assert a.usage.completion_tokens == 8
    assert a.usage.total_tokens == a.usage.prompt_tokens + 8
    # The same request sent by hand gives the same text: the client adds nothing that matters.
    raw = server.post("/v1/completions", {"model": "demo", "prompt": "Once upon a time", "max_tokens": 8,
                                          "temperature": 0, "ignore_eos": True},
                      headers={"Authorization": f"Bearer {KEY}"}).json()
    assert raw["choices"][0]["text"] == a.choices[0].text


def test_completion_accepts_a_token_id_prompt(client):
    tokenizers = pytest.importorskip("tokenizers")
    ids = tokenizers.Tokenizer.from_file(str(DEMO / "tokenizer.json")).encode("Once upon a time").ids
    by_ids = client.completions.create(model="demo", prompt=ids, max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})
    by_text = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=6,
                                        temperature=0, extra_body={"ignore_eos": True})
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_chat_and_streaming_chat_give_the_same_reply(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a page cache?"}]
    whole = client.chat.completions.create(model="demo", messages=msgs, max_tokens=12, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    stream = client.chat.completions.create(model="demo", messages=msgs, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    text, finish, usage, roles = "", None, None, []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert roles == ["assistant"]
    assert text == whole.choices[0].message.content
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 12
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_errors_arrive_as_the_clients_typed_exceptions(client, server):
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=msgs, max_tokens=2)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="demo", prompt="hi", max_tokens=CTX)
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="demo", messages=[{"role": "wizard", "content": "hi"}], max_tokens=2)
    assert e.value.param == "messages[0].role"
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"


def test_a_full_queue_raises_a_503_with_retry_after(client, server):
    # A long stream runs; one request waits in the single queue place; the client's next is 503.
    headers = {"Authorization": f"Bearer {KEY}"}
    long = requests.post(server.url + "/v1/completions", data=json.dumps(
        {"prompt": "Once", "max_tokens": CTX - 8, "stream": True, "ignore_eos": True}),
        headers=headers, stream=True, timeout=30)
    lines = long.iter_lines(decode_unicode=True)
    assert next(l for l in lines if l.startswith("data: "))
    waiter = threading.Thread(target=lambda: requests.post(
        server.url + "/v1/completions", data=json.dumps({"prompt": "W", "max_tokens": 2}),
        headers=headers, timeout=60))
    waiter.start()
    try:
        for _ in range(100):
            if server.metrics(headers)["moestream_queue_length"] == 1:
                break
            threading.Event().wait(0.02)
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model="demo", prompt="hi", max_tokens=2)
        assert e.value.status_code == 503 and e.value.code == "queue_full"
        assert e.value.response.headers["Retry-After"] == "1"
    finally:
        long.close()
        waiter.join(timeout=30)
    assert not waiter.is_alive()
