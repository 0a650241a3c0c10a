#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps (scripts/device_deps.sh): builds the CUDA tier
# with tests and checks GGUF on the GPU: the CUDA kernel and forward-pass tests, then every GGUF
# fixture's 16 greedy tokens from `infer` on the CPU path, with --gpu, and with --gpu from a pack
# converted by convert_model, each against llama.cpp's tokens stored beside the fixture.
# Summary in $OUT/summary.txt (also printed), logs in $OUT/logs.tgz.
source "$(dirname "$0")/device_gpu_env.sh" device_gguf
keep_logs
say "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); $(nproc) cores"
t0=$(date +%s)
gpu_build 80 gpu_round_activations_test gpu_ggml_test gpu_kernels_test gpu_gguf_test gpu_mla_test gpu_gguf_arch_test \
  gpu_gguf_iquants_test gpu_expert_cache_test infer convert_model
say "build: $(( $(date +%s) - t0 )) s"
rc=0
for t in gpu_round_activations_test gpu_ggml_test gpu_kernels_test gpu_mla_test gpu_expert_cache_test gpu_gguf_test gpu_gguf_arch_test \
    gpu_gguf_iquants_test; do
  timeout 600 "$B/$t" >"$W/$t.log" 2>&1; r=$?
  [ $r -eq 0 ] || rc=1
  say "$t: exit $r, $(grep -E '^\[  PASSED  \]' "$W/$t.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$W/$t.log") failed"
  grep -E '^\[  FAILED  \] [A-Za-z]|Failure$' -A3 "$W/$t.log" | head -40 | tee -a "$S"
done
grep -E '^\[ gpu_vs_cpu gguf' "$W/gpu_gguf_test.log" "$W/gpu_gguf_iquants_test.log" | tee -a "$S"

say "== greedy tokens vs llama.cpp (16 each): CPU path | --gpu | --gpu on a converted pack"
python3 - "$B" "$W" <<'PY' | tee -a "$S"
import json, pathlib, subprocess, sys
B, W = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
fx = pathlib.Path("tests/fixtures/gguf")
def tokens(model, *extra):
    r = subprocess.run([str(B / "infer"), "-m", str(model), "--prompt-ids", PROMPT, "-n", "16", "--temp", "0",
                        "--ignore-eos", "--print-ids", *extra], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    return [int(t) for t in r.stdout.strip().splitlines()[-1].split(",")[-16:]], ""
def agree(got, want):
    if got is None: return "error"
    n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    return f"{n}/16"
bad = 0
for meta in sorted(fx.glob("*.json")):
    if meta.name == "manifest.json": continue
    d = json.loads(meta.read_text())
    model = fx / d["files"][0]
    PROMPT = ",".join(map(str, d["prompt_ids"]))
    want = d["generated_ids"]
    cpu, e1 = tokens(model)
    gpu, e2 = tokens(model, "--gpu")
    pack = W / ("pack-" + meta.stem)
    c = subprocess.run([str(B / "convert_model"), "-q", str(model), str(pack)],
                       capture_output=True, text=True, timeout=300)
    packed, e3 = tokens(pack, "--gpu") if c.returncode == 0 else (None, c.stderr.strip().splitlines()[-1])
    row = f"{meta.stem:32s} cpu {agree(cpu, want):6s} gpu {agree(gpu, want):6s} gpu-pack {agree(packed, want):6s}"
    if gpu is not None and cpu is not None and gpu != cpu: row += "  (gpu != cpu)"
    for e in (e1, e2, e3):
        if e: row += "  " + e[:160]
    print(row, flush=True)
    bad += gpu is None or packed is None
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || rc=1
M=models/demo
PROMPT=$(head -c 600 "$M/heldout_head.txt")
timeout 60 "$B/infer" -m $M -p "$PROMPT" -n 64 --temp 0 --ignore-eos --print-ids -t 16 >"$W/demo_cpu.txt" 2>"$W/demo_cpu.err"
timeout 60 "$B/infer" -m $M -p "$PROMPT" -n 64 --temp 0 --ignore-eos --print-ids --gpu >"$W/demo_gpu.txt" 2>"$W/demo_gpu.err"
if cmp -s "$W/demo_cpu.txt" "$W/demo_gpu.txt" && [ -s "$W/demo_cpu.txt" ]; then say "demo: GPU and CPU greedy tokens identical (64)"
else rc=1; say "demo: GPU and CPU tokens DIFFER"; tail -3 "$W/demo_gpu.err" | tee -a "$S"; fi
say "device_gguf: exit $rc"
exit $rc
