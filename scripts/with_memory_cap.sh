#!/usr/bin/env bash
# Runs a command with its memory (page cache included) capped by a cgroup, so a model larger than
# the cap is honestly streamed; says plainly when the machine cannot cap.
#
#   scripts/with_memory_cap.sh --check                 prints "cgroup-v2 (DIR)" or "cgroup-v1
#                                                      (DIR)" (exit 0) or "unavailable: REASON"
#                                                      (exit 3)
#   scripts/with_memory_cap.sh LIMIT_MB -- CMD ARGS... runs CMD in a fresh cgroup capped at
#                                                      LIMIT_MB MiB, swap 0; exits with CMD's
#                                                      status; 3 when no cap is possible
# Needs root and either a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified) with the
# memory controller (memory.max, memory.swap.max = 0) or a cgroup v1 memory hierarchy at
# /sys/fs/cgroup/memory (memory.limit_in_bytes, memory.memsw.limit_in_bytes the same when swap
# is accounted); both charge the page cache to the cgroup. v2 is preferred. Without either the
# caller falls back to O_DIRECT with a host-cache budget (bench/decode.py does) and reports which
# it used. On exit it prints the peak usage and the OOM-kill count to stderr and removes the cgroup.
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

# Prints the cgroup v1 memory hierarchy to create children in, or "unavailable: reason".
find_v1_root() {
  local m=/sys/fs/cgroup/memory
  if [[ "$(stat -f -c %T "$m" 2>/dev/null)" != cgroupfs || ! -e "$m/memory.limit_in_bytes" ]]; then
    echo "unavailable: no cgroup v1 memory hierarchy at $m"
    return 1
  fi
  if [[ $(id -u) -ne 0 || ! -w "$m" ]]; then
    echo "unavailable: $m is not writable (needs root)"
    return 1
  fi
  echo "$m"
}

# Sets $version and $root to the hierarchy to use, or prints why none can cap (returns 1).
pick_hierarchy() {
  local why2 why1
  if root=$(find_root); then version=2; return 0; fi
  why2=$root
  if root=$(find_v1_root); then version=1; return 0; fi
  why1=$root
  echo "${why2}; ${why1#unavailable: }"
  return 1
}

# Runs the command in cgroup $1 and returns its status. The child joins the cgroup before exec, so
# every page it or its children touch is charged. SIGTERM, SIGINT and SIGHUP sent to this script
# are passed on to the command (a benchmark stops a capped server that way), and the script waits
# for it, so the cgroup is always removed after the command is gone. The explicit <&0 keeps stdin
# (a background job would otherwise read /dev/null).
run_in() {
  local cg=$1 child status
  shift
  bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' capped "$cg" "$@" <&0 &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null' TERM HUP
  trap 'kill -INT "$child" 2>/dev/null' INT
  # A signal passed on cuts wait short (status > 128) whether or not the command has exited, so
  # wait until it is gone, then ask once more: bash returns the status it recorded for it.
  while kill -0 "$child" 2>/dev/null; do wait "$child"; done
  wait "$child"
  status=$?
  trap - TERM HUP INT
  return "$status"
}

if [[ "${1:-}" == "--check" ]]; then
  if why=$(pick_hierarchy) && pick_hierarchy >/dev/null; then echo "cgroup-v$version ($root)"; exit 0; fi
  echo "$why"
  exit 3
fi
if [[ $# -lt 3 || "$2" != "--" || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: $0 --check | LIMIT_MB -- COMMAND [ARGS...]" >&2
  exit 2
fi
limit_mb=$1
shift 2
if ! why=$(pick_hierarchy); then
  echo "with_memory_cap: $why" >&2
  exit 3
fi
pick_hierarchy >/dev/null
# On exit from the cgroup $cg: report_and_remove LIMIT_NAME PEAK_FILE OOM_FILE prints the cap, the
# peak usage (PEAK_FILE, bytes) and the OOM kills (the oom_kill line of OOM_FILE) to stderr, then
# removes $cg.
report_and_remove() {
  local peak="" kills=""
  [[ -r "$cg/$2" ]] && peak=$(( $(cat "$cg/$2") >> 20 ))
  [[ -r "$cg/$3" ]] && kills=$(awk '$1=="oom_kill"{print $2}' "$cg/$3")
  echo "with_memory_cap: $1 ${limit_mb} MiB, peak ${peak:-?} MiB, oom_kill ${kills:-?}" >&2
  # Any process left in it (none, normally) keeps it alive: move them out first.
  if [[ -r "$cg/cgroup.procs" ]]; then
    while read -r p; do echo "$p" >"$root/cgroup.procs" 2>/dev/null; done <"$cg/cgroup.procs"
  fi
  rmdir "$cg" 2>/dev/null || echo "with_memory_cap: warning: could not remove $cg" >&2
}
if [[ $version == 1 ]]; then
  cg="$root/moestream-cap-$$"
  mkdir "$cg" 2>/dev/null || { echo "with_memory_cap: unavailable: cannot create $cg" >&2; exit 3; }
  trap 'report_and_remove "cgroup-v1 memory.limit_in_bytes" memory.max_usage_in_bytes memory.oom_control' EXIT
  echo $(( limit_mb << 20 )) >"$cg/memory.limit_in_bytes" ||
    { echo "with_memory_cap: cannot write $cg/memory.limit_in_bytes" >&2; exit 3; }
  # memory+swap at the same limit: no swap (present only when the kernel accounts swap).
  [[ -w "$cg/memory.memsw.limit_in_bytes" ]] && echo $(( limit_mb << 20 )) >"$cg/memory.memsw.limit_in_bytes"
  run_in "$cg" "$@"
  exit $?
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
trap 'report_and_remove "cgroup-v2 memory.max" memory.peak memory.events' EXIT
echo $(( limit_mb << 20 )) >"$cg/memory.max" || { echo "with_memory_cap: cannot write $cg/memory.max" >&2; exit 3; }
[[ -w "$cg/memory.swap.max" ]] && echo 0 >"$cg/memory.swap.max"
run_in "$cg" "$@"
exit $?
