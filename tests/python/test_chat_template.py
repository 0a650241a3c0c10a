"""Chat templates rendered by our C++ Jinja subset (render_chat_template) against Python's jinja2
set up the way transformers' apply_chat_template sets it up, live, for several conversations."""
import json
import os
import pathlib
import subprocess

import pytest

jinja2 = pytest.importorskip("jinja2", reason="jinja2 (PyPI) is the oracle for chat templates")
import jinja2.ext  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "tokenizers"

# The classic Llama-2 chat template (meta-llama/Llama-2-7b-chat-hf, tokenizer_config.json): our
# llama2 tokenizer copy ships none, so it is written here; it exercises raise_exception, slicing,
# loop.index0 arithmetic and the bos/eos variables.
LLAMA2_CHAT = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

# A Mistral/Mixtral-style template with whitespace control, namespace, filters and tests.
MIXTRAL_LIKE = """{%- set ns = namespace(n_user=0, sys='') %}
{%- for m in messages %}
    {%- if m.role == 'system' %}{% set ns.sys = m.content | trim %}{% endif %}
    {%- if m.role == 'user' %}{% set ns.n_user = ns.n_user + 1 %}{% endif %}
{%- endfor %}
{{- bos_token }}
{%- for m in messages if m.role != 'system' %}
    {%- if m.role == 'user' %}
        {%- if loop.last and ns.sys %}[INST] {{ ns.sys }}\n\n{{ m.content }}[/INST]
        {%- else %}[INST] {{ m.content }}[/INST]{% endif %}
    {%- elif m.role == 'assistant' %}
        {{- ' ' ~ m.content | trim ~ eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, got ' ~ m.role) }}
    {%- endif %}
{%- endfor %}
{# users: {{ ns.n_user }} #}
{%- if tools is not none and tools | length > 0 %}[TOOLS]{{ tools | tojson }}[/TOOLS]{% endif %}
{{- '' if add_generation_prompt is false else '' }}
  {% for k, v in {'a': 1, 'b': [1, 2]}.items() %}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}
{{ messages | length }} {{ (messages | first).role | upper }} {{ messages[-1].content[:5] }}"""

# Macros as gpt-oss, GLM and Kimi templates use them: recursion over a JSON schema, defaults,
# keyword arguments, varargs/kwargs, macro output in expressions, top-level variables and
# namespaces seen from inside, and whitespace control around macro tags.
MACROS = """{%- macro ts_type(spec, required=[], depth=0) -%}
    {%- if spec.type == 'object' and spec.properties -%}
        {{- '{' }}
        {%- for name, sub in spec.properties.items() -%}
            {{- name }}{{ '?' if name not in required }}: {{ ts_type(sub, sub.required or [], depth + 1) }}
            {{- ', ' if not loop.last }}
        {%- endfor -%}
        {{- '}' }}
    {%- elif spec.type == 'array' -%}
        {%- set inner = ts_type(spec['items'] or {}) -%}
        {{- (inner if inner|length < 20 else 'any') ~ '[]' }}
    {%- elif spec.enum -%}
        {{- '"' + spec.enum|join('" | "') + '"' }}
    {%- else -%}
        {{- spec.type or 'any' }}
    {%- endif -%}
{%- endmacro -%}
{% macro text(content) -%}
    {%- if content is string -%}{{ content }}
    {%- else -%}{% for p in content %}{{ p.text }}{% endfor %}{%- endif -%}
{%- endmacro %}
{%- macro line(role, body, sep=': ', end='\\n') -%}
{{ role|upper }}{{ sep }}{{ body }}{{ end }}{{ varargs|join('+') }}{{ kwargs.tag }}
{%- endmacro -%}
{%- set ns = namespace(n=0) -%}
{%- macro count() %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{% endmacro -%}
{{ bos_token }}
{%- if tools %}
{%- for t in tools %}
type {{ t.function.name }} = (_: {{ ts_type(t.function.parameters, t.function.parameters.required or []) }}) => any;
{% endfor %}
{%- endif %}
{%- for m in messages %}
{{ line(m.role, text(m.content), end=';') }}[{{ count() }}]
{%- if text(m.content).endswith('?') %} (question){% endif %}
{%- endfor %}
{{ line('x', 1, '=', '', 2, 3, tag='!') }} {{ text is callable }} {{ ns.n }}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  And 3+3?  "}],
    [{"role": "user", "content": "Think first."},
     {"role": "assistant", "content": "<think>\nhmm, easy\n</think>\n\nSure, ünïcödé \"quotes\" ok"},
     {"role": "user", "content": "<tool_response>x</tool_response>"}],
    [{"role": "user", "content": "multi\nline\n\ttext"},
     {"role": "assistant", "content": "reply", "reasoning_content": "because"},
     {"role": "user", "content": "next"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather, \"now\"",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "plan", "description": "nested", "parameters": {
             "type": "object", "required": ["steps"], "properties": {
                 "steps": {"type": "array", "items": {"type": "object", "properties": {
                     "unit": {"type": "string", "enum": ["c", "f"]}, "n": {"type": "integer"}}}},
                 "tags": {"type": "array", "items": {"type": "string"}}}}}}]


def _exe():
    exe = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / "render_chat_template"
    if not exe.exists():
        pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
    return exe


def reference(source, ctx):
    """transformers' _compile_jinja_template environment, without importing transformers."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source).render(**ctx)


def ours(args, ctx):
    r = subprocess.run([str(_exe()), *args], input=json.dumps(ctx), capture_output=True, text=True,
                       timeout=30)
    return r


def templates():
    out = [("demo", (ROOT / "models" / "demo" / "tokenizer_config.json"))]
    if (SHARED / "qwen3" / "tokenizer_config.json").exists():
        out.append(("qwen3", SHARED / "qwen3" / "tokenizer_config.json"))
    return out


def config_source(path):
    cfg = json.loads(path.read_text())
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
               if cfg.get(k) is not None}
    return cfg["chat_template"], special


@pytest.mark.parametrize("name,path", templates(), ids=[t[0] for t in templates()])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("with_tools", [False, True])
def test_model_template_matches_jinja2(name, path, conv, gen, with_tools):
    source, special = config_source(path)
    ctx = {"messages": CONVERSATIONS[conv], "add_generation_prompt": gen,
           "tools": TOOLS if with_tools else None}
    want = reference(source, {**special, **ctx})
    r = ours(["--config", str(path)], ctx)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want


def test_qwen3_enable_thinking_false_matches_jinja2():
    path = SHARED / "qwen3" / "tokenizer_config.json"
    if not path.exists():
        pytest.skip(f"{path} absent")
    source, special = config_source(path)
    ctx = {"messages": CONVERSATIONS[1], "add_generation_prompt": True, "enable_thinking": False}
    r = ours(["--config", str(path)], ctx)
    assert r.returncode == 0, r.stderr
    assert r.stdout == reference(source, {**special, **ctx, "tools": None})


@pytest.mark.parametrize("source_name", ["llama2", "mixtral_like", "macros"])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_inline_template_matches_jinja2_or_both_raise(tmp_path, source_name, conv):
    source = {"llama2": LLAMA2_CHAT, "mixtral_like": MIXTRAL_LIKE, "macros": MACROS}[source_name]
    f = tmp_path / "t.jinja"
    f.write_text(source)
    ctx = {"messages": CONVERSATIONS[conv], "add_generation_prompt": True, "tools": TOOLS,
           "bos_token": "<s>", "eos_token": "</s>"}
    try:
        want = reference(source, ctx)
    except jinja2.exceptions.TemplateError as e:
        r = ours(["--template", str(f)], ctx)
        assert r.returncode == 1
        assert str(e) in r.stderr
        return
    r = ours(["--template", str(f)], ctx)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want


def test_raise_exception_is_reported_with_its_message(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text(LLAMA2_CHAT)
    bad = {"messages": [{"role": "assistant", "content": "x"}], "bos_token": "<s>", "eos_token": "</s>"}
    r = ours(["--template", str(f)], bad)
    assert r.returncode == 1
    assert "Conversation roles must alternate" in r.stderr


@pytest.mark.parametrize("source,needle", [
    ("{% for x in y %}", "missing"),
    ("{{ 1 + }}", "line 1"),
    ("a\n{% include 'other.jinja' %}", "line 2"),
    ("{% macro m(a=1, b) %}{% endmacro %}", "non-default argument follows default argument"),
    ("{{ x | nosuchfilter }}", "nosuchfilter"),
])
def test_bad_template_fails_with_line(tmp_path, source, needle):
    f = tmp_path / "t.jinja"
    f.write_text(source)
    r = ours(["--template", str(f)], {"messages": []})
    assert r.returncode == 1
    assert needle in r.stderr


# Hostile nesting and sizes: render_chat_template exits 1 with the limit named, never a crash.
@pytest.mark.parametrize("source,needle", [
    ("{% if true %}" * 100_000 + "x" + "{% endif %}" * 100_000, "over the limit of 1048576 bytes"),
    ("{%if 1%}" * 40_000 + "x" + "{%endif%}" * 40_000, "nest deeper than the limit of 64 levels"),
    ("{{ " + "(" * 100_000 + "1" + ")" * 100_000 + " }}", "nest deeper than the limit of 128 levels"),
    ("{{ 1" + " ~ 1" * 100_000 + " }}", "nest deeper than the limit of 128 levels"),
    ("{{ 'ab' * 100000000 }}", "string repetition of 2 bytes * 100000000"),
    ("{{ 9223372036854775807 + 1 }}", "integer overflow: 9223372036854775807 + 1"),
    ("{{ 2 ** 64 }}", "integer overflow: 2 ** 64"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "limit of 1000000 loop iterations"),
    ("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", "macro calls nest deeper than the limit of 50"),
    ("{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(40) }}",
     "limit of 1000000 macro calls"),
], ids=["100k-if", "40k-if", "100k-parens", "100k-concat", "repetition", "add-overflow", "pow-overflow",
        "nested-loops", "macro-recursion", "macro-calls"])
def test_hostile_template_exits_1_naming_the_limit(tmp_path, source, needle):
    f = tmp_path / "t.jinja"
    f.write_text(source)
    r = ours(["--template", str(f)], {"messages": []})
    assert r.returncode == 1, (r.returncode, r.stderr[-300:])
    assert "render_chat_template: error: chat template" in r.stderr
    assert needle in r.stderr


@pytest.mark.parametrize("field", ["messages", "tools", "enable_thinking"])
def test_deeply_nested_input_exits_1_naming_it(tmp_path, field):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages }}")
    deep = "[" * 100_000 + "]" * 100_000
    body = '{"messages": %s}' % (deep if field == "messages" else '[], "%s": %s' % (field, deep))
    r = subprocess.run([str(_exe()), "--template", str(f)], input=body, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1, (r.returncode, r.stderr[-300:])
    assert f"input '{field}' nests deeper than the limit of 128 levels" in r.stderr
