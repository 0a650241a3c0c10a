"""scripts/with_memory_cap.sh: usage errors, the --check verdict, and (where the machine has a
cgroup v2 or v1 memory controller and root) a command over its cap is killed while one under it runs."""
import pathlib
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "with_memory_cap.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_bad_usage_exits_2_with_the_usage_line():
    for args in ([], ["12"], ["abc", "--", "true"], ["0", "--", "true"], ["12", "true"]):
        r = run(*args)
        assert r.returncode == 2, (args, r)
        assert "usage:" in r.stderr


def test_check_gives_a_verdict_matching_its_exit_status():
    r = run("--check")
    assert r.returncode in (0, 3), r
    if r.returncode == 0:
        assert r.stdout.startswith(("cgroup-v2 (", "cgroup-v1 ("))
    else:
        assert r.stdout.startswith("unavailable: ")
        # Run mode refuses the same way instead of running uncapped.
        r2 = run("64", "--", "true")
        assert r2.returncode == 3 and "unavailable" in r2.stderr


def _need_cap():
    r = run("--check")
    if r.returncode != 0:
        pytest.skip("no memory cap on this machine: " + r.stdout.strip())


def test_command_over_the_cap_is_killed_and_under_it_runs():
    _need_cap()
    hog = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
    r = run("64", "--", "python3", "-c", hog)
    assert r.returncode != 0 and "survived" not in r.stdout, r
    assert "oom_kill" in r.stderr
    r = run("64", "--", "python3", "-c", "b = bytearray(8 << 20); print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r
    assert "memory.max 64 MiB" in r.stderr or "memory.limit_in_bytes 64 MiB" in r.stderr


def test_exit_status_of_the_command_is_passed_through():
    _need_cap()
    assert run("64", "--", "bash", "-c", "exit 7").returncode == 7
