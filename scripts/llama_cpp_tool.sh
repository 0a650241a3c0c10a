#!/usr/bin/env bash
# Builds llama.cpp as a TEST TOOL (the GGUF oracle, issue 18): its converter, llama-quantize,
# llama-gguf-split, llama-completion and our small driver that dumps greedy tokens and logits.
# Source: the llama-cpp-python source distribution on PyPI, which vendors llama.cpp. Everything
# lives outside the repository, in
#   ${MOESTREAM_CACHE:-$HOME/.cache/moestream}/llama.cpp-<version>/
#     dl/      the sdist (sha256-checked)      src/    its unpacked tree
#     venv/    Python for the converter (torch, transformers, the vendored gguf-py, safetensors)
#     build/   CMake build of only the targets llama (libllama + ggml: 63 steps), llama-quantize,
#              llama-gguf-split (llama.cpp's common library: 62 more) and llama-completion (its
#              CLI that prints decode timings, for bench/gguf_llama.py); static, CPU
#     bin/     moestream-llama-oracle (scripts/llama_oracle.cpp linked against libllama)
# Idempotent: each step is skipped when its output exists. Nothing of llama.cpp enters the repo.
#
# Usage: scripts/llama_cpp_tool.sh [build|fetch|venv|llama|env|device-src]
#   build (default)  do every missing step, then print the env lines
#   fetch | venv | llama   one step (llama: the CMake build and the oracle; needs fetch)
#   device-src       pack the trimmed source and the Qwen3 tokenizer into .llama/ for the device
#                    machine (scripts/device_gguf_bench.sh, device_peer.sh; needs fetch only)
#   env              print shell assignments (LLAMA_CPP_*) for an existing build; fails if absent
#   server           also build llama-server in the same build tree (bench/server/bench_streams.py
#                    --llama-server; needs build; its web UI off); prints its path
set -euo pipefail

VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TORCH_VERSION=2.15.0
CACHE=${MOESTREAM_CACHE:-$HOME/.cache/moestream}
ROOT=$CACHE/llama.cpp-$VERSION
SRC=$ROOT/src/llama_cpp_python-$VERSION/vendor/llama.cpp
VENV=$ROOT/venv
BUILD=$ROOT/build
BIN=$ROOT/bin
REPO=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${LLAMA_CPP_JOBS:-2}

say() { echo "llama_cpp_tool: $*" >&2; }
die() { echo "llama_cpp_tool: ERROR: $*" >&2; exit 1; }

# The sdist has no git metadata; its changelog names the llama.cpp commit it vendors.
vendored_commit() {
  local commit
  commit=$(sed -n "/^## \[$VERSION\]/,/^## \[/p" "$SRC/../../CHANGELOG.md" \
    | grep -o 'llama.cpp@[0-9a-f]*' | head -n 1 || true)
  echo "${commit:-unknown}"
}

print_env() {
  local f
  for f in "$BUILD/bin/llama-quantize" "$BUILD/bin/llama-gguf-split" "$BUILD/bin/llama-completion" \
           "$BIN/moestream-llama-oracle" \
           "$VENV/bin/python" "$SRC/convert_hf_to_gguf.py"; do
    [ -e "$f" ] || die "missing $f: run scripts/llama_cpp_tool.sh build"
  done
  echo "LLAMA_CPP_VERSION=llama-cpp-python-$VERSION"
  echo "LLAMA_CPP_COMMIT=$(vendored_commit)"
  echo "LLAMA_CPP_SDIST_SHA256=$SDIST_SHA256"
  echo "LLAMA_CPP_SRC=$SRC"
  echo "LLAMA_CPP_PYTHON=$VENV/bin/python"
  echo "LLAMA_CPP_CONVERT=$SRC/convert_hf_to_gguf.py"
  echo "LLAMA_CPP_QUANTIZE=$BUILD/bin/llama-quantize"
  echo "LLAMA_CPP_GGUF_SPLIT=$BUILD/bin/llama-gguf-split"
  echo "LLAMA_CPP_COMPLETION=$BUILD/bin/llama-completion"
  echo "LLAMA_CPP_ORACLE=$BIN/moestream-llama-oracle"
}

step_fetch() {
  local tgz=$ROOT/dl/llama_cpp_python-$VERSION.tar.gz
  if [ ! -f "$tgz" ]; then
    say "downloading the llama-cpp-python $VERSION sdist from PyPI into $ROOT/dl"
    mkdir -p "$ROOT/dl"
    # pip prepares an sdist's metadata with its build backend; without the backend at hand it
    # builds the backend's own build tools from source first (tens of minutes).
    python3 -c "import scikit_build_core" 2>/dev/null || python3 -m pip install -q scikit-build-core >&2
    python3 -m pip download --no-binary :all: --no-deps --no-build-isolation \
      "llama-cpp-python==$VERSION" -d "$ROOT/dl" >&2 \
      || python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$ROOT/dl" >&2 \
      || die "pip download of llama-cpp-python==$VERSION failed"
  fi
  echo "$SDIST_SHA256  $tgz" | sha256sum -c --quiet - >&2 || die "sha256 mismatch for $tgz"
  if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
    say "unpacking into $ROOT/src"
    rm -rf "$ROOT/src"; mkdir -p "$ROOT/src"
    tar xzf "$tgz" -C "$ROOT/src" || die "cannot unpack $tgz"
    [ -f "$SRC/convert_hf_to_gguf.py" ] || die "the sdist has no vendor/llama.cpp/convert_hf_to_gguf.py"
  fi
}

step_venv() {
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch, gguf, safetensors, tokenizers" 2>/dev/null; then
    return
  fi
  say "creating the converter's venv in $VENV (torch $TORCH_VERSION, transformers; several GB)"
  python3 -m venv "$VENV" || die "python3 -m venv failed"
  # The converter imports torch. PyPI has only the CUDA build of torch for Linux, whose libtorch
  # links the CUDA runtime libraries (libcudart, libcublas, libcudnn, ...): installed with
  # --no-deps it fails to import (checked with 2.15.0), so it comes with its nvidia-* dependencies,
  # used on the CPU only. transformers: the converter reads the tokenizer through AutoTokenizer.
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" >&2 || die "pip install torch==$TORCH_VERSION failed"
  "$VENV/bin/pip" install -q numpy safetensors tokenizers transformers sentencepiece protobuf >&2 \
    || die "pip install of the converter's dependencies failed"
  # The converter must use the gguf-py it was released with, not the newest one on PyPI.
  "$VENV/bin/pip" install -q --no-deps "$SRC/gguf-py" >&2 || die "pip install of vendored gguf-py failed"
  "$VENV/bin/python" -c "import torch; torch.zeros(2) + 1" \
    || die "torch installed in $VENV does not import"
}

step_build() {
  local want=("$BUILD/src/libllama.a" "$BUILD/bin/llama-quantize" "$BUILD/bin/llama-gguf-split"
              "$BUILD/bin/llama-completion")
  local f missing=0
  for f in "${want[@]}"; do [ -e "$f" ] || missing=1; done
  [ $missing -eq 0 ] && return
  command -v cmake >/dev/null || die "cmake not found (scripts/setup.sh installs it)"
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  say "configuring llama.cpp in $BUILD (static, CPU only, AVX2/FMA/F16C fixed rather than -march=native)"
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_OPENMP=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    "${launcher[@]}" >&2 || die "cmake configure failed"
  say "building the targets llama llama-quantize llama-gguf-split llama-completion with -j $JOBS"
  local t0=$SECONDS
  cmake --build "$BUILD" -j "$JOBS" --target llama llama-quantize llama-gguf-split llama-completion >&2 \
    || die "llama.cpp build failed"
  say "built in $((SECONDS - t0)) s"
  for f in "${want[@]}"; do [ -e "$f" ] || die "build finished but $f is missing"; done
}

step_oracle() {
  local src=$REPO/scripts/llama_oracle.cpp out=$BIN/moestream-llama-oracle
  if [ -x "$out" ] && [ "$out" -nt "$src" ]; then return; fi
  say "compiling $out from scripts/llama_oracle.cpp against libllama"
  mkdir -p "$BIN"
  local libs=("$BUILD/src/libllama.a")
  local l
  for l in libggml.a libggml-cpu.a libggml-base.a; do
    f=$(find "$BUILD/ggml" -name "$l" -print -quit)
    [ -n "$f" ] || die "cannot find $l under $BUILD/ggml"
    libs+=("$f")
  done
  g++ -std=c++17 -O2 -I"$SRC/include" -I"$SRC/ggml/include" "$src" "${libs[@]}" -lpthread -ldl -lm \
    -o "$out" || die "compiling the oracle failed"
}

cmd=${1:-build}
# The vendored tree without docs, models, tests, examples, the web UI and every ggml backend but
# CPU and CUDA (about 4.5 MB of xz) in $REPO/.llama/, with its version, commit and the Qwen3
# tokenizer bench/gguf_llama.py needs (1.4 MB of xz): what scripts/device_gguf_bench.sh builds from on the device
# machine, which has no network and takes at most 64 MiB of carried files (carry .llama).
# llama-server for the concurrent-streams comparison (issue 22): the same tree with the server
# targets switched on (the UI assets off: nothing is downloaded); the other targets stay as built.
step_server() {
  local out=$BUILD/bin/llama-server
  if [ ! -e "$out" ]; then
    [ -e "$BUILD/CMakeCache.txt" ] || die "no llama.cpp build in $BUILD: run scripts/llama_cpp_tool.sh build first"
    cmake -S "$SRC" -B "$BUILD" -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2 \
      || die "cmake configure (server) failed"
    say "building llama-server with -j $JOBS"
    cmake --build "$BUILD" -j "$JOBS" --target llama-server >&2 || die "llama-server build failed"
  fi
  echo "LLAMA_CPP_SERVER=$out"
}

step_device_src() {
  local out=$REPO/.llama tok=${MOESTREAM_TOKENIZERS:-$REPO/../shared/tokenizers}
  mkdir -p "$out"
  if [ ! -f "$out/llama.cpp-src.tar.xz" ]; then
    say "packing the trimmed llama.cpp source into $out/llama.cpp-src.tar.xz"
    local ex=() b
    for b in docs models media benches tests examples tools/ui 'tools/server/public*'; do ex+=(--exclude="llama.cpp/$b"); done
    for b in et metal hexagon sycl vulkan opencl cann hip musa openvino rpc virtgpu webgpu zdnn zendnn; do
      ex+=(--exclude="llama.cpp/ggml/src/ggml-$b")
    done
    tar -C "$SRC/.." -cJf "$out/llama.cpp-src.tar.xz.tmp" "${ex[@]}" --exclude='.git*' llama.cpp \
      || die "cannot pack $SRC"
    mv "$out/llama.cpp-src.tar.xz.tmp" "$out/llama.cpp-src.tar.xz"
  fi
  # Only the source is needed here: the device machine builds its own binaries.
  echo "llama-cpp-python-$VERSION" >"$out/VERSION"
  vendored_commit >"$out/COMMIT"
  [ -f "$tok/qwen3/tokenizer.json" ] || die "no $tok/qwen3/tokenizer.json (MOESTREAM_TOKENIZERS=DIR)"
  # xz: the tokenizer is 11 MB as JSON and the carried files' limit is tight.
  rm -rf "$out/tokenizers" && mkdir -p "$out/tokenizers/qwen3"
  cp "$tok"/qwen3/* "$out/tokenizers/qwen3/" && xz -9 "$out/tokenizers/qwen3/tokenizer.json"
  say "$out: $(du -sh "$out" | cut -f1) (carry .llama; then scripts/device_gguf_bench.sh there)"
}

case "$cmd" in
  build)
    step_fetch; step_venv; step_build; step_oracle; print_env ;;
  fetch) step_fetch ;;
  venv) step_fetch; step_venv ;;
  llama) step_fetch; step_build; step_oracle ;;
  env) print_env ;;
  device-src) step_fetch; step_device_src ;;
  server) step_fetch; step_server ;;
  *) die "unknown command '$cmd' (build|fetch|venv|llama|env|device-src|server)" ;;
esac
