#!/usr/bin/env bash
# Runs a command with its memory (page cache included) capped by a cgroup v2 memory.max, so a
# model larger than the cap is honestly streamed; says plainly when the machine cannot cap.
#
#   scripts/with_memory_cap.sh --check                 prints "cgroup-v2" (exit 0) or
#                                                      "unavailable: REASON" (exit 3)
#   scripts/with_memory_cap.sh LIMIT_MB -- CMD ARGS... runs CMD in a fresh cgroup with
#                                                      memory.max = LIMIT_MB MiB, swap 0; exits
#                                                      with CMD's status; 3 when no cap is possible
# Needs root, a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified) with the memory
# controller, and a writable hierarchy. Without one the caller falls back to O_DIRECT with a
# host-cache budget (bench/decode.py does) and reports which it used. On exit it prints the peak
# usage and the OOM-kill count to stderr and removes the cgroup.
set -uo pipefail

# Prints the cgroup2 directory to create children in, or "unavailable: reason" (returns 1).
find_root() {
  local m
  for m in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    if [[ "$(stat -f -c %T "$m" 2>/dev/null)" == cgroup2fs ]]; then
      if ! grep -qw memory "$m/cgroup.controllers" 2>/dev/null; then
        echo "unavailable: the cgroup2 hierarchy at $m has no memory controller (it is bound to cgroup v1 here)"
        return 1
      fi
      if [[ $(id -u) -ne 0 || ! -w "$m" ]]; then
        echo "unavailable: $m is not writable (needs root and a writable cgroup2 mount)"
        return 1
      fi
      echo "$m"
      return 0
    fi
  done
  echo "unavailable: no cgroup2 filesystem mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified"
  return 1
}

if [[ "${1:-}" == "--check" ]]; then
  if root=$(find_root); then echo "cgroup-v2 ($root)"; exit 0; fi
  echo "$root"
  exit 3
fi
if [[ $# -lt 3 || "$2" != "--" || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: $0 --check | LIMIT_MB -- COMMAND [ARGS...]" >&2
  exit 2
fi
limit_mb=$1
shift 2
if ! root=$(find_root); then
  echo "with_memory_cap: $root" >&2
  exit 3
fi
# Children of the root get the memory controller only through the root's subtree_control.
if ! grep -qw memory "$root/cgroup.subtree_control"; then
  if ! echo +memory >"$root/cgroup.subtree_control" 2>/dev/null; then
    echo "with_memory_cap: unavailable: cannot enable the memory controller in $root/cgroup.subtree_control" >&2
    exit 3
  fi
fi
cg="$root/moestream-cap-$$"
if ! mkdir "$cg" 2>/dev/null; then
  echo "with_memory_cap: unavailable: cannot create $cg" >&2
  exit 3
fi
cleanup() {
  local peak="" events=""
  [[ -r "$cg/memory.peak" ]] && peak=$(( $(cat "$cg/memory.peak") >> 20 ))
  [[ -r "$cg/memory.events" ]] && events=$(awk '$1=="oom_kill"{print $2}' "$cg/memory.events")
  echo "with_memory_cap: cgroup-v2 memory.max ${limit_mb} MiB, peak ${peak:-?} MiB, oom_kill ${events:-?}" >&2
  # Any process left in it (none, normally) keeps it alive: move them out first.
  if [[ -r "$cg/cgroup.procs" ]]; then
    while read -r p; do echo "$p" >"$root/cgroup.procs" 2>/dev/null; done <"$cg/cgroup.procs"
  fi
  rmdir "$cg" 2>/dev/null || echo "with_memory_cap: warning: could not remove $cg" >&2
}
trap cleanup EXIT
echo $(( limit_mb << 20 )) >"$cg/memory.max" || { echo "with_memory_cap: cannot write $cg/memory.max" >&2; exit 3; }
[[ -w "$cg/memory.swap.max" ]] && echo 0 >"$cg/memory.swap.max"
# The child joins the cgroup before exec, so every page it or its children touch is charged.
bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' capped "$cg" "$@"
exit $?
