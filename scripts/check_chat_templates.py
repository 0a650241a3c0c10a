#!/usr/bin/env python3
"""Dev check: real chat templates rendered by our engine (render_chat_template) against
transformers' own renderer (render_jinja_template: its jinja2 environment, reasoning-field aliasing
and `documents`), byte for byte, for a set of conversations.

The templates are other projects' files and stay outside the repository: by default they are read
from the llama.cpp source cache (--templates DIR to point elsewhere). Run with a Python that has
transformers, e.g.
  ~/.cache/moestream/llama.cpp-0.3.36/venv/bin/python scripts/check_chat_templates.py
Exit status 1 when any template differs."""
import argparse
import copy
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DIR = pathlib.Path.home() / (".cache/moestream/llama.cpp-0.3.36/src/llama_cpp_python-0.3.36/"
                                     "vendor/llama.cpp/models/templates")

# Template file -> the special tokens its tokenizer_config.json passes.
TEMPLATES = {
    "openai-gpt-oss-120b.jinja": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
    "GLM-4.6.jinja": {"eos_token": "<|endoftext|>"},
    "GLM-4.7-Flash.jinja": {"eos_token": "<|endoftext|>"},
    "moonshotai-Kimi-K2.jinja": {"bos_token": "[BOS]", "eos_token": "[EOS]"},
    "Kimi-K2-Instruct.jinja": {"bos_token": "[BOS]", "eos_token": "[EOS]"},
    "Kimi-K2-Thinking.jinja": {"bos_token": "[BOS]", "eos_token": "[EOS]"},
    "deepseek-ai-DeepSeek-V3.1.jinja": {"bos_token": "<｜begin▁of▁sentence｜>",
                                        "eos_token": "<｜end▁of▁sentence｜>"},
    "Qwen-Qwen3-0.6B.jinja": {"eos_token": "<|im_end|>"},
    "Qwen3-Coder.jinja": {"eos_token": "<|im_end|>"},
    "Qwen-QwQ-32B.jinja": {"eos_token": "<|im_end|>"},
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city, \"now\"",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "days": {"type": "integer", "default": 1},
            "tags": {"type": "array", "items": {"type": "string"}, "nullable": True},
            "where": {"type": "object", "properties": {"lat": {"type": "number"},
                                                       "lon": {"type": "number"}}},
            "mode": {"oneOf": [{"type": "string", "description": "by name"}, {"type": "integer"}]},
            "kind": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {"name": "now", "description": "Current time",
                                      "parameters": {"type": "object", "properties": {}}}},
]

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "tags": ["a", "b"]}}}
CALL_STR = {"id": "call_2", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}

CONVERSATIONS = {
    "system+user": ([{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Hello ünïcödé \"quotes\""}], {}),
    "multi-turn": ([{"role": "system", "content": "Be kind."},
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "  And 3+3?\n"}], {}),
    "reasoning": ([{"role": "user", "content": "Think first."},
                   {"role": "assistant", "content": "Sure.", "reasoning_content": "easy one"},
                   {"role": "user", "content": "next"},
                   {"role": "assistant", "content": "Done.", "reasoning_content": "second thought"}], {}),
    "think-tags": ([{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
                    {"role": "user", "content": "again"}], {}),
    "tools": ([{"role": "system", "content": "Use tools."},
               {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [CALL]},
               {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
               {"role": "assistant", "content": "It is 21 C."},
               {"role": "user", "content": "And Oslo?"}], {"tools": TOOLS}),
    "tool-call-last": ([{"role": "user", "content": "Oslo?"},
                        {"role": "assistant", "content": "", "reasoning_content": "call it",
                         "tool_calls": [CALL_STR]},
                        {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "cold"}],
                       {"tools": TOOLS}),
    "two-calls-null-content": ([{"role": "developer", "content": "Dev notes."},
                                {"role": "user", "content": "Both cities?"},
                                {"role": "assistant", "content": None, "tool_calls": [
                                    CALL, {**CALL, "id": "call_3", "function": {
                                        "name": "now", "arguments": {}}}]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "warm"},
                                {"role": "tool", "tool_call_id": "call_3", "content": "noon"},
                                {"role": "assistant", "content": "Warm, at noon.", "thinking": "both done"}],
                               {"tools": TOOLS}),
    "content-parts": ([{"role": "system", "content": [{"type": "text", "text": "sys part"}]},
                       {"role": "user", "content": [{"type": "text", "text": "part one "},
                                                    {"type": "text", "text": "part two"}]}], {}),
    "no-thinking": ([{"role": "user", "content": "quick"}],
                    {"enable_thinking": False, "thinking": False, "reasoning_effort": "low"}),
    "thinking-on": ([{"role": "system", "content": "s"}, {"role": "user", "content": "deep"}],
                    {"enable_thinking": True, "thinking": True, "reasoning_effort": "high",
                     "builtin_tools": ["browser", "python"], "model_identity": "You are a test."}),
}


def reference(source, messages, gen, tools, extra):
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template
    try:
        # As the tokenizer's apply_chat_template calls it.
        chat = _normalize_chat_messages(copy.deepcopy(messages))
        out, _ = render_jinja_template(conversations=[chat], tools=tools,
                                       chat_template=source, add_generation_prompt=gen, **extra)
        return True, out[0]
    except Exception as e:  # noqa: BLE001 - any failure is compared against ours failing too
        return False, f"{type(e).__name__}: {e}"


def ours(exe, path, messages, gen, tools, extra):
    ctx = {**extra, "messages": messages, "add_generation_prompt": gen}
    if tools is not None:
        ctx["tools"] = tools
    r = subprocess.run([str(exe), "--template", str(path)], input=json.dumps(ctx).encode(),
                       capture_output=True, timeout=60)
    if r.returncode == 0:
        return True, r.stdout.decode()
    return False, r.stderr.decode().strip()


def first_difference(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"at byte {i}: transformers {a[max(0, i - 60):i + 60]!r}\n    ours         {b[max(0, i - 60):i + 60]!r}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--templates", type=pathlib.Path, default=DEFAULT_DIR)
    ap.add_argument("--bin", type=pathlib.Path,
                    default=pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", ROOT / "build" / "bin")))
    ap.add_argument("--verbose", action="store_true", help="print every differing case")
    args = ap.parse_args()
    exe = args.bin / "render_chat_template"
    if not exe.exists():
        sys.exit(f"{exe} not built")
    failed = False
    for name, special in TEMPLATES.items():
        path = args.templates / name
        if not path.exists():
            print(f"{name:36} absent")
            continue
        source = path.read_text()
        n = same = both_raise = 0
        diffs = []
        raised = set()
        for conv, (messages, opts) in CONVERSATIONS.items():
            tools = opts.get("tools")
            extra = {**special, **{k: v for k, v in opts.items() if k != "tools"}}
            for gen in (True, False):
                n += 1
                ok_r, want = reference(source, messages, gen, tools, extra)
                ok_o, got = ours(exe, path, messages, gen, tools, extra)
                if ok_r and ok_o and want == got:
                    same += 1
                elif not ok_r and not ok_o:
                    # raise_exception's message must come through; other errors (a sandbox
                    # refusal, a type error) only need to be errors in both.
                    kind, _, msg = want.partition(": ")
                    if kind == "TemplateError" and msg not in got:
                        diffs.append(f"{conv} gen={gen}: both raise, transformers {want!r}, ours {got!r}")
                    else:
                        both_raise += 1
                        raised.add(kind)
                elif ok_r and ok_o:
                    diffs.append(f"{conv} gen={gen}: {first_difference(want, got)}")
                else:
                    diffs.append(f"{conv} gen={gen}: transformers {'ok' if ok_r else want!r}; "
                                 f"ours {'ok' if ok_o else got!r}")
        status = "MATCH" if not diffs else "DIFFER"
        failed |= bool(diffs)
        print(f"{name:36} {status}: {same}/{n} identical, {both_raise} raise in both"
              f"{' (' + ', '.join(sorted(raised)) + ')' if raised else ''}, {len(diffs)} differ")
        for d in diffs[:None if args.verbose else 2]:
            print("  " + d)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
