#!/usr/bin/env bash
# Installs what is needed, builds moestream and runs `infer` on the model the repository ships.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target infer
"$BUILD/bin/infer" -m models/demo -p "${PROMPT:-The meaning of the word}" -n "${N_TOKENS:-64}" --timing "$@"
