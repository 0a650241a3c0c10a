#!/usr/bin/env bash
# Run THERE (the device machine: no network, no pip): bench/gguf_llama.py with llama.cpp built
# from the trimmed source that `scripts/llama_cpp_tool.sh device-src` packed here into
# .llama/llama.cpp-src.tar.xz, and the Qwen3 tokenizer in .llama/tokenizers/qwen3 (carry .llama
# and .deps). Builds moestream's CPU targets (scripts/device_build.sh) and llama.cpp's
# llama-completion and llama-quantize (CPU, native), then runs the benchmark with the arguments
# given (e.g. --threads 16). Models are cached in /tmp/llama-models (kept between calls on a warm
# machine). The converter runs on the machine's own Python (torch, transformers) with the vendored
# gguf-py.
set -euo pipefail
cd "$(dirname "$0")/.."
L=$PWD/.llama
[ -f "$L/llama.cpp-src.tar.xz" ] || { echo "device_gguf_bench: no $L/llama.cpp-src.tar.xz (run scripts/llama_cpp_tool.sh device-src here and carry .llama)" >&2; exit 1; }
SRC=/tmp/llama-src/llama.cpp
BLD=/tmp/llama-build
if [ ! -x "$BLD/bin/llama-completion" ] || [ ! -x "$BLD/bin/llama-quantize" ]; then
  rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src
  tar -xJf "$L/llama.cpp-src.tar.xz" -C /tmp/llama-src
  t0=$SECONDS
  cmake -S "$SRC" -B "$BLD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >/tmp/llama-configure.log 2>&1 ||
    { tail -30 /tmp/llama-configure.log >&2; exit 1; }
  cmake --build "$BLD" -j "$(nproc)" --target llama-completion llama-quantize >/tmp/llama-build.log 2>&1 ||
    { tail -30 /tmp/llama-build.log >&2; exit 1; }
  echo "device_gguf_bench: llama.cpp built in $((SECONDS - t0)) s" >&2
fi
# The tokenizer travels compressed (the carry limit); bench/gguf_llama.py reads it from here.
TOK=/tmp/llama-tokenizers
if [ ! -f "$TOK/qwen3/tokenizer.json" ]; then
  mkdir -p "$TOK/qwen3" && cp "$L"/tokenizers/qwen3/* "$TOK/qwen3/" && xz -d -f "$TOK/qwen3/tokenizer.json.xz"
fi
[ -x build-device/bin/infer ] || bash scripts/device_build.sh infer >/tmp/moestream-build.log 2>&1 ||
  { tail -30 /tmp/moestream-build.log >&2; exit 1; }
# bench/gguf_llama.py takes llama.cpp's paths from these instead of scripts/llama_cpp_tool.sh env.
export LLAMA_CPP_VERSION=$(cat "$L/VERSION" 2>/dev/null || echo unknown) LLAMA_CPP_COMMIT=$(cat "$L/COMMIT" 2>/dev/null || echo unknown)
export LLAMA_CPP_SRC=$SRC LLAMA_CPP_PYTHON=$(command -v python3) LLAMA_CPP_CONVERT=$SRC/convert_hf_to_gguf.py
export LLAMA_CPP_QUANTIZE=$BLD/bin/llama-quantize LLAMA_CPP_COMPLETION=$BLD/bin/llama-completion
export PYTHONPATH=$SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}
exec python3 bench/gguf_llama.py --bin build-device/bin --cache /tmp/llama-models --tokenizers "$TOK" "$@"
