"""`infer`'s terminal chat (-cnv: turns from stdin, the model's chat template, the KV cache kept
between turns, Ctrl-C), its prompt sources (-f FILE, -p - from stdin), and llama-cli's flags:
supported ones renamed, the others refused by name with exit status 1, never read as bundles of
short flags (-hf is not -h -f)."""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
TURN = re.compile(r"chat: turn (\d+): prompt (\d+) tokens, (\d+) reused from the KV cache, (\d+) run; reply (\d+) tokens")


def _exe(name):
    exe = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / name
    if not exe.exists():
        pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
    return exe


def infer(*args, stdin=""):
    return subprocess.run([str(_exe("infer")), *map(str, args)], input=stdin, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def demo():
    if not (DEMO / "model.json").exists():
        pytest.skip(f"{DEMO} absent")
    return DEMO


def turns(stderr):
    return [tuple(int(g) for g in m.groups()) for m in TURN.finditer(stderr)]


def test_second_turn_reuses_the_first_from_the_kv_cache(demo):
    r = infer("-m", demo, "-cnv", "-sys", "Answer briefly.", "-n", "8", "--temp", "0", "--timing",
              stdin="Hello there\nWhat is two plus two?\n")
    assert r.returncode == 0, r.stderr
    t = turns(r.stderr)
    assert [x[0] for x in t] == [1, 2], r.stderr
    (_, p1, reused1, run1, reply1), (_, p2, reused2, run2, _) = t
    assert reused1 == 0 and run1 == p1
    # Turn 2's prompt starts with turn 1's prompt and reply: all of turn 1's prompt and at least
    # the part of the reply fed back come from the cache; only the rest is run.
    assert reused2 >= p1 + reply1 - 1 and run2 == p2 - reused2 and run2 < p2
    assert len(r.stdout.splitlines()) >= 2


def test_reused_prefix_gives_the_reply_a_fresh_run_gives(demo):
    # Turn 2, run after turn 1's tokens kept in the KV cache, says what the same conversation
    # rendered by hand (the demo's ChatML template) says from an empty cache.
    args = ["-m", demo, "-n", "6", "--temp", "0"]
    first = infer(*args, "-cnv", stdin="Hi\n")
    assert first.returncode == 0, first.stderr
    two = infer(*args, "-cnv", "--timing", stdin="Hi\nTell me more\n")
    assert two.returncode == 0, two.stderr
    assert two.stdout.startswith(first.stdout)
    assert turns(two.stderr)[1][2] > 0  # the cache was used
    reply1, reply2 = first.stdout[:-1], two.stdout[len(first.stdout):-1]
    text = (f"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n{reply1}<|im_end|>\n"
            "<|im_start|>user\nTell me more<|im_end|>\n<|im_start|>assistant\n")
    fresh = infer(*args, "--ignore-eos", "-p", text)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout[len(text):-1].startswith(reply2)


def test_dash_p_is_the_first_turn(demo):
    args = ["-m", demo, "-cnv", "-n", "6", "--temp", "0"]
    two = infer(*args, stdin="Hi\nTell me more\n")
    via_p = infer(*args, "-p", "Hi", stdin="Tell me more\n")
    assert via_p.returncode == 0, via_p.stderr
    assert via_p.stdout == two.stdout


def test_end_of_input_ends_the_chat_cleanly(demo):
    r = infer("-m", demo, "-cnv", "-n", "4", stdin="")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "error" not in r.stderr


def test_ctrl_c_stops_a_reply_then_ends_the_chat_at_the_prompt(demo):
    p = subprocess.Popen([str(_exe("infer")), "-m", str(demo), "-cnv", "--ignore-eos", "-n", "4000", "--temp", "0",
                          "-t", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdin.write(b"Tell me a long story\n")
        p.stdin.flush()
        assert p.stdout.read(1)  # the reply has begun
        p.send_signal(signal.SIGINT)
        line = b""
        deadline = time.time() + 60
        while b"stopped by Ctrl-C" not in line and time.time() < deadline:
            line = p.stderr.readline()
            assert line, "infer ended instead of returning to the prompt"
        assert TURN.search(line.decode()) and b"stopped by Ctrl-C" in line
        assert int(TURN.search(line.decode()).group(5)) < 4000
        assert p.poll() is None  # still at the prompt
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)  # at the prompt: ends the chat
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_no_chat_template_is_a_clear_error(demo, tmp_path):
    copy = tmp_path / "demo"
    shutil.copytree(demo, copy, ignore=shutil.ignore_patterns("figures", "routing", "heldout*"))
    (copy / "tokenizer_config.json").write_text('{"eos_token": "<|endoftext|>"}')
    r = infer("-m", copy, "-cnv", stdin="Hi\n")
    assert r.returncode == 1 and "no chat template" in r.stderr, r.stderr


def test_prompt_from_file_and_from_stdin_match_dash_p(demo, tmp_path):
    ref = infer("-m", demo, "-p", "Once upon a time", "-n", "5", "--temp", "0")
    assert ref.returncode == 0, ref.stderr
    f = tmp_path / "prompt.txt"
    f.write_text("Once upon a time")
    assert infer("-m", demo, "-f", f, "-n", "5", "--temp", "0").stdout == ref.stdout
    assert infer("-m", demo, "-p", "-", "-n", "5", "--temp", "0", stdin="Once upon a time").stdout == ref.stdout
    r = infer("-m", demo, "-p", "-", "-n", "5", stdin="")
    assert r.returncode == 1 and "stdin is empty" in r.stderr
    r = infer("-m", demo, "-p", "x", "-f", f)
    assert r.returncode == 1 and "not both" in r.stderr


def test_a_prompt_that_starts_with_a_dash_is_a_prompt(demo):
    r = infer("-m", demo, "-p", "-i think", "-n", "2", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("-i think")


@pytest.mark.parametrize("args,named", [
    (["-hf", "org/repo"], "-hf"),
    (["-hf", "org/repo:Q4_K_M"], "-hf"),
    (["--hf-repo", "org/repo"], "--hf-repo"),
    (["-ngl", "99"], "-ngl"),
    (["-fa"], "-fa"),
    (["--color"], "--color"),
    (["-i"], "-i"),
    (["-r", "User:"], "-r"),
    (["--jinja"], "--jinja"),
    (["-no-cnv"], "-no-cnv"),
    (["-hx"], "-hx"),
])
def test_llama_cli_flags_we_lack_are_refused_by_name(args, named):
    r = infer("-m", "nowhere", "-p", "x", *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout == ""  # not --help
    assert named in r.stderr and "error" in r.stderr


def test_llama_cli_context_flag_is_ctx(demo):
    r = infer("-m", demo, "-p", "Hi", "-n", "2", "-c", "256", "--timing")
    assert r.returncode == 0, r.stderr
    assert "context 256" in r.stderr
    r = infer("-m", demo, "-p", "Hi", "-n", "2", "--ctx-size", "128", "--timing")
    assert r.returncode == 0, r.stderr
    assert "context 128" in r.stderr


def test_system_prompt_needs_conversation(demo):
    r = infer("-m", demo, "-p", "Hi", "-sys", "Be brief")
    assert r.returncode == 1 and "-cnv" in r.stderr
