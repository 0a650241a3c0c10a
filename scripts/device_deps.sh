#!/usr/bin/env bash
# Run HERE (a Debian machine with apt): downloads the Debian packages that the device machine's
# image lacks into .deps/, to be carried to it and unpacked by scripts/device_build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  liburing-dev liburing2
  nlohmann-json3-dev libcli11-dev libeigen3-dev
  libpcre2-dev libpcre2-8-0 libpcre2-posix3   # the build links libpcre2-8 alone: not the 16/32-bit
                                              # libraries (480 KB the 64 MiB carry limit can spare)
  libxxhash-dev libxxhash0
  libutf8proc-dev libutf8proc2
  pkgconf pkgconf-bin libpkgconf3   # the device image may have no pkg-config
  libgtest-dev libgmock-dev         # gpu_kernels_test (scripts/device_kernels.sh)
)
bash scripts/xgrammar_source.sh   # runtime/grammar: xgrammar sources, carried in .deps too
mkdir -p .deps
cd .deps
missing=()
for p in "${PACKAGES[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get download "${missing[@]}"
fi
ls -1 *.deb | wc -l | xargs echo "device_deps: .deb files in .deps:"
du -sh . | cut -f1 | xargs echo "device_deps: total"
