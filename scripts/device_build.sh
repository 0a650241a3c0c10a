#!/usr/bin/env bash
# Run THERE (the device machine, which has a compiler, CMake and ninja but none of our Debian
# dependencies): unpacks the carried .deps/*.deb into /tmp/deps and builds the CPU targets.
# Usage: scripts/device_build.sh [target...]   (default: bench_io infer cpu_decode)
# DEVICE_CMAKE_ARGS (word-split) is appended last, so it overrides the defaults (the CUDA tier).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${DEPS_DIR:-/tmp/deps}
BUILD=${BUILD_DIR:-build-device}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(bench_io infer cpu_decode)
compgen -G ".deps/*.deb" >/dev/null || { echo "device_build: no .deps/*.deb (run scripts/device_deps.sh here and carry .deps)" >&2; exit 1; }
mkdir -p "$D"
for f in .deps/*.deb; do dpkg -x "$f" "$D"; done
L=$D/usr/lib/x86_64-linux-gnu
# The .pc files name /usr; point them at the unpacked tree.
sed -i -E "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=$D/usr#" "$L"/pkgconfig/*.pc "$D"/usr/share/pkgconfig/*.pc
# Link the static archives: the binaries then need nothing from $D at run time (and no
# LD_LIBRARY_PATH that could shadow the system's own libpcre2 for other programs).
for lib in liburing libxxhash libpcre2-8 libutf8proc; do rm -f "$L/$lib.so"; done
extra=()
if ! command -v pkg-config >/dev/null 2>&1; then
  # The unpacked pkgconf needs its own libpkgconf: a wrapper gives it just that.
  cat >"$D/pkg-config" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH=$L exec $D/usr/bin/pkgconf "\$@"
WRAP
  chmod +x "$D/pkg-config"
  extra+=(-DPKG_CONFIG_EXECUTABLE="$D/pkg-config")
fi
gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMOESTREAM_DEPS_PREFIX="$D/usr" \
  -DMOESTREAM_TESTS=OFF -DMOESTREAM_CUDA=OFF "${extra[@]}" ${DEVICE_CMAKE_ARGS:-} >"$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"
echo "device_build: built ${TARGETS[*]} in $BUILD/bin"
