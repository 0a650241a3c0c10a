#!/usr/bin/env bash
# Puts the xgrammar C++ sources (constrained decoding: runtime/grammar) in .deps/xgrammar-VERSION.
# They come from xgrammar's PyPI sdist, which vendors everything its C++ core includes (picojson,
# dlpack); CMake builds the core as a static library from there (runtime/grammar/CMakeLists.txt).
# Idempotent; .deps/ also travels to the device machine (scripts/device_build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.2.8
SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
DIR=.deps/xgrammar-$VERSION
TGZ=.deps/xgrammar-$VERSION.tar.gz
PY=${PYTHON:-python3}
die() { echo "xgrammar_source: $*" >&2; exit 1; }

if [ -f "$DIR/include/xgrammar/xgrammar.h" ]; then
  echo "xgrammar_source: sources present in $DIR"
  exit 0
fi
mkdir -p .deps
if [ ! -f "$TGZ" ]; then
  # pip prepares an sdist's metadata before saving it; the backend (scikit-build-core with
  # setuptools-scm) must be importable for --no-build-isolation, which avoids fetching a whole
  # build environment (nanobind, cmake) for a download.
  "$PY" -c "import scikit_build_core, setuptools_scm" 2>/dev/null \
    || "$PY" -m pip install -q --disable-pip-version-check scikit-build-core setuptools-scm >&2
  "$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
    --no-build-isolation "xgrammar==$VERSION" -d .deps >&2 || die "pip download xgrammar==$VERSION failed"
fi
echo "$SHA256  $TGZ" | sha256sum -c --quiet - || die "$TGZ: sha256 mismatch (expected $SHA256)"
tar xzf "$TGZ" -C .deps || die "cannot unpack $TGZ"
[ -f "$DIR/include/xgrammar/xgrammar.h" ] || die "$DIR has no include/xgrammar/xgrammar.h"
# Only cpp/, include/ and the header-only 3rdparty/picojson, dlpack are built: the rest would
# weigh on the device machine's carry (scripts/device_build.sh).
rm -rf "$DIR"/{tests,web,docs,site,examples,python,assets,3rdparty/cpptrace,3rdparty/googletest} "$TGZ"
echo "xgrammar_source: sources in $DIR"
