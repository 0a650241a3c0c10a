#!/usr/bin/env bash
# Run HERE, around a device call: the device tool sends the tracked and untracked-not-ignored files
# of this checkout plus the carried paths, at most 64 MiB, and the tracked tree with .deps is
# about that size. `slim` takes the paths no device script reads out of the index and ignores
# them in .git/info/exclude (the files stay on disk, nothing is committed); `restore` puts both
# back; `size` prints what would travel (KiB, with .deps).
#   scripts/device_tree.sh slim [PATH...] && <device run, carry .deps> ; scripts/device_tree.sh restore
#   scripts/device_tree.sh only PATH...   takes out every tracked path except these (a Python-only
#   run such as training, whose carried data needs the room); `restore` undoes it the same way.
# (PATHs: more that this call's command does not read, e.g. bench/*.py for the GPU tests.)
# Never commit between the two: the commit would delete the slimmed paths.
set -euo pipefail
cd "$(dirname "$0")/.."
# Read by no device script: docs, the Python package and its tests, fuzz corpora, the demo's
# held-out text and routing logs (device scripts use heldout_head.txt), the figures, and the
# fixture folders no GPU test reads.
PATHS=(docs python tests/python tests/fuzz models/demo/heldout.txt models/demo/routing models/demo/figures)
# Fixture folders that no GPU test names (the CPU suites run in CI, not there).
for d in tests/fixtures/*/; do
  n=$(basename "$d")
  grep -qs -- "$n" tests/gpu_*.cpp tests/gpu_*.cu || PATHS+=("tests/fixtures/$n")
done
EXCLUDE=.git/info/exclude
MARK="# device_tree.sh slim"

size() {
  local t d
  t=$(git ls-files -z | xargs -0 du -c 2>/dev/null | tail -1 | cut -f1)
  d=$(du -s .deps 2>/dev/null | cut -f1 || echo 0)
  echo "device_tree: $((t + d)) KiB would travel with .deps (limit 65536)"
}

cmd=${1:-}
shift || true
if [ "$cmd" = only ]; then
  [ $# -gt 0 ] || { echo "device_tree: only needs the paths to keep" >&2; exit 2; }
  keep=("$@")
  # The tracked paths outside every kept one, as coarse as possible: a folder goes whole unless
  # a kept path lies inside it.
  PATHS=()
  walk() {  # $1: a folder ("" for the root)
    local e inside k
    while IFS= read -r e; do
      inside=no
      for k in "${keep[@]}"; do
        k=${k%/}
        if [ "$e" = "$k" ] || [[ "$e" == "$k/"* ]]; then inside=kept; break; fi
        [[ "$k" == "$e/"* ]] && inside=parent
      done
      case $inside in
        no) PATHS+=("$e") ;;
        parent) walk "$e/" ;;
      esac
    done < <(if [ -z "$1" ]; then git ls-tree --name-only HEAD; else git ls-tree --name-only HEAD -- "$1"; fi)
  }
  walk ""
  cmd=slim
else
  PATHS+=("$@")
fi
case "$cmd" in
  slim)
    grep -qxF "$MARK" "$EXCLUDE" 2>/dev/null && { echo "device_tree: already slim (restore first)" >&2; exit 1; }
    git diff --cached --quiet || { echo "device_tree: the index has staged changes; commit or unstage them first" >&2; exit 1; }
    echo "$MARK" >>"$EXCLUDE"
    for p in "${PATHS[@]}"; do
      git rm -r -q --cached --ignore-unmatch -- "$p"
      echo "/$p" >>"$EXCLUDE"
    done
    size
    ;;
  restore)
    grep -qxF "$MARK" "$EXCLUDE" 2>/dev/null || { echo "device_tree: not slim" >&2; exit 0; }
    # Every path the slim took out: the lines after the marker.
    mapfile -t taken < <(sed -n "/^$MARK\$/,\$p" "$EXCLUDE" | tail -n +2 | sed 's#^/##')
    git reset -q -- "${taken[@]}"
    # Drop the marker and every line after it (this script appended them).
    sed -i "/^$MARK\$/,\$d" "$EXCLUDE"
    git status --short | head -5
    size
    ;;
  size) size ;;
  *) echo "usage: scripts/device_tree.sh slim [PATH...]|only PATH...|restore|size" >&2; exit 2 ;;
esac
