"""GPU options of the bindings and of `infer` (issue 8): gpu/gpu_cache_mb/gpu_preload/moe_lookahead refused
with a clear error when they cannot work (moe_lookahead also runs on the CPU), and gpu=True either runs on a GPU or says why not."""
import os
import pathlib
import subprocess

import pytest

moestream = pytest.importorskip(
    "moestream", reason="moestream module not built (configure with -DMOESTREAM_PYTHON=ON, "
    "PYTHONPATH=<build>/python)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"


@pytest.fixture(scope="module")
def demo():
    if not (DEMO / "model.json").exists():
        pytest.skip(f"{DEMO} absent")
    return DEMO


def test_lookahead_without_gpu_runs_on_the_cpu(demo):
    # Issue 19: the CPU pass reads the predicted experts ahead; the tokens do not change.
    want = moestream.Model(demo, threads=2).generate("The river", max_tokens=8, temperature=0, ignore_eos=True)
    m = moestream.Model(demo, moe_lookahead=4, threads=2)
    assert m.generate("The river", max_tokens=8, temperature=0, ignore_eos=True) == want


def test_gpu_cache_budget_without_gpu_is_refused(demo):
    with pytest.raises(moestream.ConfigError, match="gpu_cache_mb needs gpu=True"):
        moestream.Model(demo, gpu_cache_mb=64)
    with pytest.raises(moestream.ConfigError, match="gpu_preload=True needs gpu=True"):
        moestream.Model(demo, gpu_preload=True)
    with pytest.raises(moestream.ConfigError, match="gpu_pin_page_cache=True needs gpu=True"):
        moestream.Model(demo, gpu_pin_page_cache=True)


def test_negative_lookahead_is_refused(demo):
    with pytest.raises(moestream.ConfigError, match="moe_lookahead"):
        moestream.Model(demo, gpu=True, moe_lookahead=-1)


def test_gpu_runs_or_names_the_reason(demo):
    try:
        m = moestream.Model(demo, gpu=True, moe_lookahead=2, threads=2)
    except moestream.ConfigError as e:  # no CUDA in this build, or no usable device: never a CPU fallback
        assert "CUDA" in str(e), str(e)
        return
    text = m.generate("The river", max_tokens=8, temperature=0, ignore_eos=True)
    assert isinstance(text, str)
    s = m.stats()
    assert "gpu" in s and "gpu_cache" in s["decode"], s


def test_infer_refuses_gpu_flags_it_cannot_honour(demo):
    exe = pathlib.Path(os.environ.get("MOESTREAM_BIN_DIR", str(ROOT / "build" / "bin"))) / "infer"
    if not exe.exists():
        pytest.skip(f"{exe} not built (set MOESTREAM_BIN_DIR to the build's bin directory)")
    # --moe-lookahead runs on the CPU too (issue 19); beyond the model's 32 experts it is refused.
    r = subprocess.run([str(exe), "-m", str(demo), "-p", "The", "-n", "2", "--moe-lookahead", "33"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--moe-lookahead 33 is outside [0, n_experts=32]" in r.stderr, r.stderr
    r = subprocess.run([str(exe), "-m", str(demo), "-p", "The", "-n", "2", "--gpu-cache-mb", "8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--gpu-cache-mb needs --gpu" in r.stderr, r.stderr
    r = subprocess.run([str(exe), "-m", str(demo), "-p", "The", "-n", "2", "--gpu-preload"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--gpu-preload needs --gpu" in r.stderr, r.stderr
    for flag in ("--gpu-no-graphs", "--gpu-pin-page-cache"):
        r = subprocess.run([str(exe), "-m", str(demo), "-p", "The", "-n", "2", flag],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and f"{flag} needs --gpu" in r.stderr, r.stderr


def test_gguf_with_gpu_runs_or_names_the_reason():
    # A GGUF on the GPU (issue 18): the same logits as the CPU pass on the same file, within the
    # float types' tolerance of tests/gpu_forward_test.cpp (BF16: summation order only).
    gguf = ROOT / "tests" / "fixtures" / "gguf" / "qwen3moe-tiny-BF16.gguf"
    if not gguf.exists():
        pytest.skip(f"{gguf} absent")
    try:
        g = moestream.Model(gguf, gpu=True, threads=2)
    except moestream.ConfigError as e:  # no CUDA in this build, or no usable device
        assert "CUDA" in str(e), str(e)
        return
    c = moestream.Model(gguf, threads=2)
    ids = list(c.tokenizer.encode("The cat sat on the mat. It was", True))
    lg, lc = g.logits(ids), c.logits(ids)
    rel = float(abs(lg - lc).max() / abs(lc).max())
    assert rel <= 1e-3, f"GPU vs CPU logits on {gguf.name}: relative difference {rel:.3g}"
    assert "gpu" in g.stats()
