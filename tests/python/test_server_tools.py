"""Tool calls, reasoning and the other endpoints of moestream-server through real clients from PyPI:
the `openai` client's tool-calling round trip (call, tool result, final answer; plain and
streamed), the same through LangChain's ChatOpenAI, the `anthropic` client's messages.create
(plain, streamed, with a tool), /tokenize and /detokenize against the `tokenizers` library,
models.retrieve and CORS.

The demo model never writes a tool call by itself, so the replies that carry one are forced with
the test hook `forced_output` (the server runs with --test-forced-output): the text is tokenized
and decoded token by token through the normal decode path, then parsed as any reply is."""
import json

import pytest

from test_server import DEMO, requests, serving, Server

openai = pytest.importorskip("openai", reason="the openai client (PyPI) is what these tests exercise")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL_TEXT = ("<think>\nThe user asks for the weather.\n</think>\n\nLet me check.\n<tool_call>\n"
             '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
ANSWER = "It is 21 C in Paris."


@pytest.fixture(scope="module")
def server():
    yield from serving("--reply-format", "hermes", "--test-forced-output", "--cors-origin", "http://app.test")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def forced(text):
    return {"forced_output": text}


def test_openai_tool_call_round_trip(client, server):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="demo", messages=messages, tools=[WEATHER], max_tokens=200,
                                           extra_body=forced(CALL_TEXT))
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert choice.message.model_extra["reasoning_content"] == "The user asks for the weather."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The call and the tool's result go back; the template renders both.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"}]
    prompt = server.post("/tokenize", {"messages": messages}).json()["tokens"]
    rendered = server.post("/detokenize", {"tokens": prompt}).json()["prompt"]
    assert "21 C, sunny" in rendered and "Let me check." in rendered
    final = client.chat.completions.create(model="demo", messages=messages, tools=[WEATHER], max_tokens=50,
                                           extra_body=forced(ANSWER))
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == ANSWER
    assert final.choices[0].message.tool_calls is None


def test_openai_streamed_tool_call_shows_no_markup(client):
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Weather?"}],
                                            tools=[WEATHER], max_tokens=200, stream=True,
                                            extra_body=forced(CALL_TEXT))
    content, reasoning, calls, finish = "", "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me check." and reasoning == "The user asks for the weather."
    assert "<" not in content
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(0, "get_weather", {"city": "Paris"})]
    assert finish == "tool_calls"


def test_tool_choice_none_leaves_the_text_unparsed_and_required_is_enforced(client):
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Weather?"}],
                                       tools=[WEATHER], tool_choice="none", max_tokens=200,
                                       extra_body=forced("<tool_call>\n{}\n</tool_call>"))
    assert r.choices[0].message.content == "<tool_call>\n{}\n</tool_call>"
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    # required: the reply is calls (constrained decoding, runtime/grammar), parsed into tool_calls.
    bounded = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}],
                                       tools=[bounded], tool_choice="required", max_tokens=200, seed=1)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls, r
    for c in calls:
        assert c.function.name == "get_weather"
        city = json.loads(c.function.arguments)["city"]
        assert isinstance(city, str) and len(city) <= 12


def test_forced_output_needs_the_server_flag():
    with Server() as plain:
        r = plain.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                "forced_output": "y"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "forced_output"


def test_langchain_tool_call_round_trip(server):
    lc = pytest.importorskip("langchain_openai", reason="LangChain's OpenAI chat model (PyPI)")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Weather now in a city."""
        return "21 C, sunny"

    def model(text):
        return lc.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="demo", max_retries=0,
                             max_tokens=200, extra_body=forced(text))

    question = HumanMessage("What is the weather in Paris?")
    ai = model(CALL_TEXT).bind_tools([get_weather]).invoke([question])
    [call] = ai.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    result = get_weather.invoke(call["args"])
    final = model(ANSWER).bind_tools([get_weather]).invoke(
        [question, ai, ToolMessage(content=result, tool_call_id=call["id"])])
    assert final.content == ANSWER and not final.tool_calls


@pytest.fixture(scope="module")
def claude(server):
    anthropic = pytest.importorskip("anthropic", reason="the anthropic client (PyPI)")
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


def test_anthropic_messages_plain_and_streamed_match_openai_chat(claude, client):
    # This client no longer sends temperature itself (the Messages API dropped it); the server takes it.
    kw = dict(max_tokens=8, extra_body={"temperature": 0})
    msgs = [{"role": "user", "content": "Tell me a story."}]
    m = claude.messages.create(model="demo", system="Be brief.", messages=msgs, **kw)
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8
    oa = client.chat.completions.create(model="demo", messages=[{"role": "system", "content": "Be brief."}] + msgs,
                                        max_tokens=8, temperature=0)
    assert m.content[0].text == oa.choices[0].message.content
    assert m.usage.input_tokens == oa.usage.prompt_tokens
    with claude.messages.stream(model="demo", system="Be brief.", messages=msgs, **kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text and final.content[0].text == text
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_anthropic_tool_use_round_trip_plain_and_streamed(claude):
    tool = {"name": "get_weather", "description": "Weather now in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = claude.messages.create(model="demo", max_tokens=200, messages=msgs, tools=[tool],
                               extra_body=forced(CALL_TEXT))
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    use = m.content[2]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    with claude.messages.stream(model="demo", max_tokens=200, messages=msgs, tools=[tool],
                                extra_body=forced(CALL_TEXT)) as s:
        streamed = s.get_final_message()
    assert [b.type for b in streamed.content] == ["thinking", "text", "tool_use"]
    assert streamed.content[2].input == {"city": "Paris"} and streamed.stop_reason == "tool_use"
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content[1:]]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}]}]
    final = claude.messages.create(model="demo", max_tokens=50, messages=msgs, tools=[tool],
                                   extra_body=forced(ANSWER))
    assert final.stop_reason == "end_turn" and final.content[0].text == ANSWER


def test_anthropic_errors_name_the_field(claude):
    import anthropic
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert "messages[0].content[0].type" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": "x"}],
                               tools=[{"name": "f", "input_schema": {"type": "object"}}],
                               tool_choice={"type": "any"})
    assert "tool_choice" in str(e.value)
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="other", max_tokens=8, messages=[{"role": "user", "content": "x"}])


def test_tokenize_and_detokenize_agree_with_the_tokenizers_library(server):
    tokenizers = pytest.importorskip("tokenizers")
    ref = tokenizers.Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    text = "Once upon a time, ünïcödé <|im_end|>"
    r = server.post("/tokenize", {"model": "demo", "prompt": text}).json()
    assert r["tokens"] == ref.encode(text).ids and r["count"] == len(r["tokens"]) and r["max_model_len"] > 0
    assert server.post("/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"] == \
        ref.encode(text, add_special_tokens=False).ids
    assert server.post("/detokenize", {"tokens": r["tokens"]}).json()["prompt"] == \
        ref.decode(r["tokens"], skip_special_tokens=False)
    bad = server.post("/detokenize", {"tokens": [1, -1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[1]"
    assert server.post("/tokenize", {"text": "x"}).json()["error"]["param"] == "text"


def test_models_retrieve(client):
    assert client.models.retrieve("demo").id == "demo"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_cors_preflight_and_headers(server):
    pre = requests.options(server.url + "/v1/chat/completions", timeout=10, headers={
        "Origin": "http://app.test", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == "http://app.test"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert server.get("/v1/models", headers={"Origin": "http://app.test"}).headers[
        "Access-Control-Allow-Origin"] == "http://app.test"
    assert "Access-Control-Allow-Origin" not in server.get("/v1/models", headers={"Origin": "http://evil.test"}).headers


def test_cors_is_off_by_default_and_preflight_needs_no_key():
    with Server("--api-key", "k") as s:
        pre = requests.options(s.url + "/v1/models", timeout=10, headers={"Origin": "http://app.test"})
        assert pre.status_code == 204 and "Access-Control-Allow-Origin" not in pre.headers
        assert s.get("/v1/models").status_code == 401


def test_anthropic_stop_sequence_names_the_one_that_matched(claude):
    m = claude.messages.create(model="demo", max_tokens=50, messages=[{"role": "user", "content": "x"}],
                               stop_sequences=["NEVER", "STOP"], extra_body=forced("Hello STOP world"))
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert m.content[0].text == "Hello"  # the whitespace before the cut is trimmed with the format's markup


def test_a_batched_server_parses_tool_calls_too():
    with Server("--parallel", "2", "--reply-format", "hermes", "--test-forced-output") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Weather?"}],
                                           tools=[WEATHER], max_tokens=200, n=2, extra_body=forced(CALL_TEXT))
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
            assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
        assert r.choices[0].message.tool_calls[0].id != r.choices[1].message.tool_calls[0].id
