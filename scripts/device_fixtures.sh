#!/usr/bin/env bash
# Run ON the device machine (torch there; carry .whl): makes transformers fixtures with the
# transformers version of the carried wheels (5.23.0 for MiniMax-M2, which the image's 5.17 lacks)
# and writes them to $OUT/fixtures/<name>/, to copy into tests/fixtures/ here.
#   HERE:   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#             --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#             --platform manylinux2014_x86_64 -d .whl transformers==5.23.0 regex==2026.1.15
#           (.whl/ in .git/info/exclude; regex: transformers 5.23 checks regex >= 2025.10.22 at import)
#   DEVICE: bash scripts/device_fixtures.sh            (carry .whl; FIXTURES="a b" picks others)
#   HERE:   cp -r <files_at>/fixtures/minimax_m2* tests/fixtures/
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the folder whose files come back}"
FIXTURES=${FIXTURES:-"minimax_m2 minimax_m2_fp8"}
WANT_TRANSFORMERS=${WANT_TRANSFORMERS:-5.23.0}
if ! compgen -G ".whl/transformers-${WANT_TRANSFORMERS}-*.whl" >/dev/null; then
  echo "device_fixtures: .whl/transformers-${WANT_TRANSFORMERS}-*.whl absent: download it here and carry .whl" >&2
  exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 - "$WANT_TRANSFORMERS" <<'PY'
import sys
import torch
import transformers
print(f"device_fixtures: transformers {transformers.__version__} ({transformers.__file__}), torch {torch.__version__}")
if transformers.__version__ != sys.argv[1]:
    sys.exit(f"device_fixtures: transformers {transformers.__version__} imported, {sys.argv[1]} wanted")
PY
mkdir -p "$OUT/fixtures"
# shellcheck disable=SC2086  # FIXTURES is a list of names
PYTHONUNBUFFERED=1 python3 python/training/make_fixtures.py --out "$OUT/fixtures" --only $FIXTURES 2>&1 |
  tee "$OUT/make_fixtures.log"
ls -la "$OUT"/fixtures/*
