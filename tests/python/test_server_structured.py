"""Structured output (response_format json_object / json_schema, the grammar extension) against a
live moestream-server on the demo model: the `openai` client's parse helper returns a valid pydantic
object, 100 random schemas from a fixed generator all give outputs that parse and validate (with
`jsonschema`), streamed and batched (--parallel) outputs too, and bad schemas or grammars are 400s
naming the field."""
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import List, Literal

import pytest

from schema_gen import schemas
from test_server import serving, sse_events, requests  # noqa: F401  (requests: skip without it)

jsonschema = pytest.importorskip("jsonschema", reason="outputs are validated with jsonschema (PyPI)")
openai = pytest.importorskip("openai", reason="the openai client's parse helper is under test")
pydantic = pytest.importorskip("pydantic")

MESSAGES = [{"role": "user", "content": "Describe the weather as JSON."}]
PARALLEL = 4


@pytest.fixture(scope="module")
def server():
    yield from serving()


@pytest.fixture(scope="module")
def batched():
    yield from serving("--parallel", PARALLEL)


def _chat(s, body):
    r = s.post("/v1/chat/completions", dict({"messages": MESSAGES, "max_tokens": 300}, **body))
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _streamed_chat(s, body):
    r = s.post("/v1/chat/completions", dict({"messages": MESSAGES, "max_tokens": 300, "stream": True}, **body),
               stream=True)
    assert r.status_code == 200, r.text
    text, finish = "", None
    for e in sse_events(r):
        if isinstance(e, dict) and e.get("choices"):
            text += e["choices"][0]["delta"].get("content") or ""
            finish = e["choices"][0].get("finish_reason") or finish
    return text, finish


def _schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


class Weather(pydantic.BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    sunny: bool
    celsius: int = pydantic.Field(ge=-40, le=45)
    wind: List[Literal["N", "E", "S", "W"]] = pydantic.Field(max_length=3)
    note: str = pydantic.Field(max_length=12)


def test_openai_parse_helper_returns_a_valid_pydantic_object(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    for seed in range(3):
        out = parse(model="demo", messages=MESSAGES, response_format=Weather, max_tokens=300, seed=seed,
                    temperature=1.0)
        msg = out.choices[0].message
        assert out.choices[0].finish_reason == "stop"
        assert isinstance(msg.parsed, Weather), msg.content
        assert Weather.model_validate_json(msg.content) == msg.parsed


def _check(schema, text, finish, where):
    assert finish == "stop", f"{where}: cut at max_tokens: {text!r}"
    try:
        value = json.loads(text)
    except ValueError as e:
        raise AssertionError(f"{where}: not JSON ({e}): {text!r}\nschema {json.dumps(schema)}")
    jsonschema.validate(value, schema)


def test_one_hundred_random_schemas_all_validate(batched):
    """Through --parallel: PARALLEL requests at a time share the batch, each with its own schema;
    every fifth one streamed."""
    cases = list(enumerate(schemas(100)))

    def one(case):
        i, schema = case
        body = {"response_format": _schema_format(schema), "seed": i, "temperature": 1.0}
        if i % 5 == 0:
            text, finish = _streamed_chat(batched, body)
        else:
            c = _chat(batched, body)
            text, finish = c["message"]["content"], c["finish_reason"]
        _check(schema, text, finish, f"schema {i}")

    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(one, cases))


def test_schemas_validate_without_batching_and_streamed_equals_whole(server):
    for i, schema in enumerate(schemas(8, seed=7)):
        body = {"response_format": _schema_format(schema), "seed": i, "temperature": 0.8}
        c = _chat(server, body)
        _check(schema, c["message"]["content"], c["finish_reason"], f"schema {i}")
        text, finish = _streamed_chat(server, body)
        assert (text, finish) == (c["message"]["content"], c["finish_reason"])


def test_json_object_gives_an_object(server):
    for seed in range(3):
        c = _chat(server, {"response_format": {"type": "json_object"}, "seed": seed, "max_tokens": 400,
                           "temperature": 0.7})
        if c["finish_reason"] == "stop":
            assert isinstance(json.loads(c["message"]["content"]), dict)
        else:  # an open object may run to max_tokens; what came is still a prefix of one
            assert c["message"]["content"].startswith("{")


def test_grammar_on_completions(server):
    grammar = r'root ::= ("yes" | "no") ", " [0-9] [0-9]?'
    for seed in range(5):
        r = server.post("/v1/completions", {"prompt": "Answer:", "grammar": grammar, "max_tokens": 20,
                                            "seed": seed, "temperature": 1.0})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        assert c["finish_reason"] == "stop"
        assert re.fullmatch(r"(yes|no), [0-9][0-9]?", c["text"]), c["text"]


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "bogus"}}, "response_format.type"),
    ({"response_format": _schema_format({"type": "no-such-type"})}, "response_format.json_schema.schema"),
    ({"response_format": _schema_format({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})},
     "response_format.json_schema.schema"),
    ({"grammar": "root ::= undefined_rule"}, "grammar"),
    ({"grammar": "root ::= (\"a\""}, "grammar"),
])
def test_bad_schema_or_grammar_is_a_400_naming_the_field(server, body, param):
    r = server.post("/v1/chat/completions", dict({"messages": MESSAGES}, **body))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


# A Hermes-style template (the markup of Qwen2.5/Qwen3's), on the demo model's weights.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>\nAnswer with "
    "<tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}},
]


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    from test_server import DEMO
    d = tmp_path_factory.mktemp("hermes_demo")
    import shutil
    for name in ("model.json", "dense.safetensors", "tokenizer.json"):  # the server refuses links out of the dir
        shutil.copy2(DEMO / name, d / name)
    shutil.copytree(DEMO / "experts", d / "experts")
    cfg = json.loads((DEMO / "tokenizer_config.json").read_text())
    cfg["chat_template"] = HERMES_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    yield from serving("--parallel", 2, model=d, ctx=1024)


def _calls(text):
    calls = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)
    assert calls and re.fullmatch(r"(<tool_call>\n.*?\n</tool_call>\n?)+", text, re.S), text
    return [json.loads(c) for c in calls]


def test_tool_choice_required_and_named_are_enforced(hermes):
    schemas_by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for seed in range(4):
        for choice, names in [("required", set(schemas_by_name)),
                              ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})]:
            r = hermes.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "tool_choice": choice,
                                                     "max_tokens": 300, "seed": seed})
            assert r.status_code == 200, r.text
            c = r.json()["choices"][0]
            text = c["message"]["content"] or ""
            if c["message"].get("tool_calls"):  # a server that parses calls out of the reply
                calls = [{"name": t["function"]["name"], "arguments": json.loads(t["function"]["arguments"])}
                         for t in c["message"]["tool_calls"]]
            else:
                calls = _calls(text)
            assert c["finish_reason"] in ("stop", "tool_calls"), c
            for call in calls:
                assert call["name"] in names, call
                jsonschema.validate(call["arguments"], schemas_by_name[call["name"]])
            if not isinstance(choice, str):
                assert len(calls) == 1


def test_tool_choice_errors_name_the_field(hermes, server):
    msgs = [{"role": "user", "content": "x"}]
    for s, body in [(hermes, {"tool_choice": "required"}),  # no tools
                    (hermes, {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                    (hermes, {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}),
                    (server, {"tools": TOOLS, "tool_choice": "required"})]:  # the demo template has no tool markup
        r = s.post("/v1/chat/completions", dict({"messages": msgs}, **body))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "tool_choice", r.text


def test_n_choices_each_follow_the_schema(batched):
    schema = schemas(1, seed=3)[0]
    r = batched.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 300, "n": 3, "seed": 5,
                                              "response_format": _schema_format(schema)})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 3
    for c in choices:
        _check(schema, c["message"]["content"], c["finish_reason"], f"choice {c['index']}")
