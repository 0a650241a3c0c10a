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


def test_sigterm_to_the_wrapper_stops_the_command_and_removes_the_cgroup():
    """A benchmark stops a capped server by signalling the wrapper: the command gets SIGTERM, the
    wrapper waits for it, reports, and leaves no cgroup behind; stdin still reaches the command."""
    _need_cap()
    import signal
    import time
    r = subprocess.run(["bash", str(SCRIPT), "64", "--", "cat"], input="through\n", capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "through\n", r
    p = subprocess.Popen(["bash", str(SCRIPT), "64", "--", "python3", "-c",
                          "import signal, sys, time\n"
                          "signal.signal(signal.SIGTERM, lambda *_: (print('got TERM', flush=True), sys.exit(5)))\n"
                          "print('up', flush=True)\ntime.sleep(60)"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 20, "the wrapper did not pass SIGTERM on"
    assert out == "got TERM\n" and p.returncode == 5, (out, err, p.returncode)
    assert "peak" in err, err  # the wrapper's report: it outlived the command
    leftovers = [d for root in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup", "/sys/fs/cgroup/unified")
                 for d in pathlib.Path(root).glob(f"moestream-cap-{p.pid}")]
    assert not leftovers, leftovers
