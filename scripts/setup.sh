#!/usr/bin/env bash
# Installs everything moestream needs to build and test, from Debian packages and PyPI.
# Idempotent: packages already present are not fetched again. Run as root (or with sudo).
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  liburing-dev libeigen3-dev googletest libgtest-dev libgmock-dev
  pybind11-dev nlohmann-json3-dev libpcre2-dev libxxhash-dev
  libcli11-dev libfmt-dev libcpp-httplib-dev python3-dev
  libutf8proc-dev
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer and clang's sanitizer runtimes
)
# matplotlib: test_bindings runs python/examples; anthropic, langchain-openai: test_server_tools's clients;
# jsonschema, pydantic: test_server_structured; xxhash: the oracle of test_dense_checksum
PIP_PACKAGES=(tokenizers numpy pytest requests jinja2 matplotlib openai gguf anthropic langchain-openai jsonschema pydantic xxhash)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
need_pip=()
for p in "${PIP_PACKAGES[@]}"; do
  "$PY" -c "import ${p//-/_}" 2>/dev/null || need_pip+=("$p")  # the module name of langchain-openai is langchain_openai
done
if [ ${#need_pip[@]} -gt 0 ]; then
  echo "setup: installing Python packages: ${need_pip[*]}"
  "$PY" -m pip install -q --disable-pip-version-check "${need_pip[@]}"
fi
# runtime/grammar builds xgrammar's C++ core from its PyPI sdist (.deps/xgrammar-VERSION).
bash "$(dirname "$0")/xgrammar_source.sh"
echo "setup: all dependencies present"
