#!/usr/bin/env bash
# Installs what is needed, builds moestream and runs every test (C++ and Python).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD=${BUILD_DIR:-build}
# Strict mode (CI=true or MOESTREAM_STRICT=1, docs/testing.md): skips outside the allow-list fail.
# The tokenizer conformance tests need the real tokenizer files next to the clone.
if [ "${CI:-}" = true ] || [ "${MOESTREAM_STRICT:-}" = 1 ]; then
  [ -d ../shared/tokenizers ] || { echo "test: strict mode needs ../shared/tokenizers (absent)" >&2; exit 1; }
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESTREAM_PYTHON=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
status=0
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" || status=$?
if compgen -G "tests/python/test_*.py" >/dev/null; then
  # $BUILD/python holds the importable moestream package (extension + Python sources).
  MOESTREAM_BIN_DIR="$PWD/$BUILD/bin" PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" \
    python3 -m pytest -q tests/python || status=$?
fi
exit $status
