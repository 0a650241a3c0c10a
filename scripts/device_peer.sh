#!/usr/bin/env bash
# Run THERE (the device machine: no network, no pip): bench/peer.py, moestream against llama.cpp
# on the same Qwen3-30B-A3B-shaped Q8_0 weights (issue 19), with llama.cpp built with CUDA (sm_90)
# from the trimmed source that `scripts/llama_cpp_tool.sh device-src` packed here into
# .llama/llama.cpp-src.tar.xz (carry .llama and .deps).
#
#   bash scripts/device_peer.sh build         builds llama.cpp (CUDA; llama-completion and
#                                             llama-quantize) in /tmp/llama-build-cuda and
#                                             moestream's infer and convert_model (CUDA) in
#                                             build-device-gpu; resumable: a build cut off by the
#                                             command's time limit goes on at the next call
#   bash scripts/device_peer.sh model [ARGS]  also makes the model in both formats (the bf16
#                                             checkpoint, llama.cpp's converter and quantizer, then
#                                             convert_model) in /tmp/llama-models, and stops
#   bash scripts/device_peer.sh deepen [N]    also writes the N-layer (default 48) Q8_0 GGUF
#                                             /tmp/q30-L<N>-Q8_0.gguf from the 6-layer one
#                                             (bench/gguf_deepen.py), unless it is there; run
#                                             it with: run --layers N --gguf THAT --moestream-gguf
#   bash scripts/device_peer.sh run [ARGS]    does what is missing of those, has the VM plug in
#                                             GROW_GIB of memory (below), then bench/peer.py
#                                             ARGS (default: 6 layers, threads 2,16, 32 tokens, 3
#                                             rounds); the table and JSON go to $OUT (peer.md,
#                                             peer.json, peer.log), rewritten after every row;
#                                             $OUT/machine.txt has memory and filesystems
# Each keeps its outputs in /tmp between calls on a warm machine, so the three steps fit the
# device tool's 600 s per command; pass model the same --layers/--seed as run.
set -euo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
L=$PWD/.llama
mkdir -p "$O"
# The device's Firecracker VM plugs memory in as it is used: MemTotal starts far below the kind's
# 128 GiB (the device library's KINDS.md). infer's automatic O_DIRECT choice reads MemAvailable,
# so a warm row could stream a model the machine can hold. Touching GROW_GIB (default 64) of
# anonymous memory once makes the VM plug it in; while MemAvailable is low it waits for the VM,
# and it stops once MemTotal has not grown for 10 s.
grow_memory() {
  python3 - "${GROW_GIB:-64}" <<'PY'
import sys, time
want = int(sys.argv[1]) << 30
def meminfo(key):
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith(key + ":"))
t0, before, held = time.time(), meminfo("MemTotal"), []
last_total, last_growth = before, t0
while meminfo("MemTotal") < want and sum(map(len, held)) < want:
    total = meminfo("MemTotal")
    if total > last_total:
        last_total, last_growth = total, time.time()
    if meminfo("MemAvailable") < (12 << 30):  # the VM plugs memory in behind the writes: wait for it,
        if time.time() - last_growth > 10:    # unless it has stopped growing
            break
        time.sleep(0.5)
        continue
    b = bytearray(4 << 30)
    b[::4096] = b"\1" * len(range(0, len(b), 4096))  # one write a page: the VM must back it
    held.append(b)
touched = sum(map(len, held)) >> 30
held.clear()
print(f"device_peer: MemTotal {before >> 30} GiB -> {meminfo('MemTotal') >> 30} GiB after touching {touched} GiB "
      f"in {time.time() - t0:.0f} s; MemAvailable now {meminfo('MemAvailable') >> 30} GiB", file=sys.stderr)
PY
}
# Where the models lie and how much memory is free decide what the rows measure (a file on tmpfs
# is memory; moestream streams a model larger than the memory room): kept beside the results.
{ date -u; free -g; df -hT /tmp "$PWD"; cat /sys/fs/cgroup/memory.max 2>/dev/null; } >"$O/machine.txt" 2>&1 || true
cmd=${1:-run}
[ $# -gt 0 ] && shift
[ -f "$L/llama.cpp-src.tar.xz" ] || { echo "device_peer: no $L/llama.cpp-src.tar.xz (run scripts/llama_cpp_tool.sh device-src here and carry .llama)" >&2; exit 1; }
case "$cmd" in build|model|deepen|run) ;; *) echo "device_peer: unknown command '$cmd' (build|model|deepen|run)" >&2; exit 1 ;; esac
# CMake finds nvcc on PATH or through CUDACXX.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
SRC=/tmp/llama-src/llama.cpp
BLD=/tmp/llama-build-cuda

# The source (also the converter and gguf-py the model step needs); scripts/device_gguf_bench.sh
# unpacks the same file to the same place.
if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
  rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src
  tar -xJf "$L/llama.cpp-src.tar.xz" -C /tmp/llama-src
fi

build_llama() {
  [ -x "$BLD/bin/llama-completion" ] && [ -x "$BLD/bin/llama-quantize" ] && return 0
  local t0=$SECONDS
  if [ ! -f "$BLD/build.ninja" ]; then
    # One GPU: no NCCL. Flash attention kernels stay in (llama.cpp's default build).
    cmake -S "$SRC" -B "$BLD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
      >/tmp/llama-cuda-configure.log 2>&1 || { tail -30 /tmp/llama-cuda-configure.log >&2; exit 1; }
  fi
  cmake --build "$BLD" -j "$(nproc)" --target llama-completion llama-quantize >/tmp/llama-cuda-build.log 2>&1 ||
    { tail -30 /tmp/llama-cuda-build.log >&2; exit 1; }
  echo "device_peer: llama.cpp (CUDA) built in $((SECONDS - t0)) s" >&2
}

build_moestream() {
  [ -x build-device-gpu/bin/infer ] && [ -x build-device-gpu/bin/convert_model ] && return 0
  local t0=$SECONDS
  # The same configuration as scripts/device_gpu_resident.sh, so a warm machine shares the build.
  DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON -DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest" \
    BUILD_DIR=build-device-gpu bash scripts/device_build.sh infer convert_model >/tmp/moestream-peer-build.log 2>&1 ||
    { tail -30 /tmp/moestream-peer-build.log >&2; exit 1; }
  echo "device_peer: moestream (CUDA) built in $((SECONDS - t0)) s" >&2
}

build_moestream
build_llama
[ "$cmd" = build ] && { echo "device_peer: built" >&2; exit 0; }
if [ "$cmd" = run ]; then
  grow_memory 2>&1 | tee -a "$O/machine.txt" >&2
  free -g >>"$O/machine.txt" 2>&1
fi

# The tokenizer travels compressed (the carry limit); the model's checkpoint takes it from here.
TOK=/tmp/llama-tokenizers
if [ ! -f "$TOK/qwen3/tokenizer.json" ]; then
  mkdir -p "$TOK/qwen3" && cp "$L"/tokenizers/qwen3/* "$TOK/qwen3/" && xz -d -f "$TOK/qwen3/tokenizer.json.xz"
fi
# bench/peer.py takes llama.cpp's paths from these instead of scripts/llama_cpp_tool.sh env.
export LLAMA_CPP_VERSION=$(cat "$L/VERSION" 2>/dev/null || echo unknown) LLAMA_CPP_COMMIT=$(cat "$L/COMMIT" 2>/dev/null || echo unknown)
export LLAMA_CPP_SRC=$SRC LLAMA_CPP_PYTHON=$(command -v python3) LLAMA_CPP_CONVERT=$SRC/convert_hf_to_gguf.py
export LLAMA_CPP_QUANTIZE=$BLD/bin/llama-quantize LLAMA_CPP_COMPLETION=$BLD/bin/llama-completion
export PYTHONPATH=$SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}
extra=(--json "$O/peer.json" --markdown "$O/peer.md")
case "$cmd" in model|deepen) extra=(--models-only) ;; esac
deep_layers=48
if [ "$cmd" = deepen ]; then
  deep_layers=${1:-48}
  [[ "$deep_layers" =~ ^[0-9]+$ ]] && [ "$deep_layers" -ge 1 ] ||
    { echo "device_peer: deepen takes a layer count, not '$deep_layers'" >&2; exit 1; }
  set --
fi
python3 bench/peer.py --bin build-device-gpu/bin --cache /tmp/llama-models --tokenizers "$TOK" "${extra[@]}" "$@" \
  2>"$O/peer.log" || { tail -40 "$O/peer.log" >&2; exit 1; }
if [ "$cmd" = deepen ]; then
  D=/tmp/q30-L$deep_layers-Q8_0.gguf
  [ -f "$D" ] || python3 bench/gguf_deepen.py /tmp/llama-models/qwen3-30b-a3b-shape-L6-seed1/qwen3moe-L6-Q8_0.gguf \
    "$D" --layers "$deep_layers" 2>"$O/deepen.log" || { tail -20 "$O/deepen.log" >&2; exit 1; }
  echo "device_peer: $D ($(du -h --apparent-size "$D" | cut -f1))" >&2
fi
