#!/usr/bin/env bash
# Runs a command with its reads from one block device limited by a cgroup (an emulated
# IOPS-limited volume, e.g. a cloud disk of 3000 IOPS and 250 MB/s); says plainly when the
# machine cannot throttle.
#
#   scripts/with_io_throttle.sh --check PATH             prints "cgroup-v2 io.max on MAJ:MIN (DIR)"
#                                                        or "cgroup-v1 blkio on MAJ:MIN (DIR)"
#                                                        (exit 0), or "unavailable: REASON" (exit 3)
#   scripts/with_io_throttle.sh RIOPS RBPS PATH -- CMD ARGS...
#                                                        runs CMD in a fresh cgroup whose reads from
#                                                        the disk under PATH are limited to RIOPS
#                                                        reads/s and RBPS bytes/s; exits with CMD's
#                                                        status; 3 when no throttle is possible
# Needs root and either a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified) with the io
# controller (io.max "MAJ:MIN riops=N rbps=N") or a cgroup v1 blkio hierarchy at
# /sys/fs/cgroup/blkio with the throttle files (blkio.throttle.read_iops_device and
# read_bps_device). v2 is preferred. The limit is on the whole disk holding PATH's filesystem (a
# partition is mapped to its disk). Only reads that reach the block layer are counted: page-cache
# hits are not, so the command must read with O_DIRECT (or drop the cache). On exit it prints the
# reads the cgroup issued to stderr and removes the cgroup.
set -uo pipefail

# Prints MAJ:MIN of the disk under $1, or "unavailable: reason" (returns 1).
disk_of() {
  local mm fstype sys
  mm=$(findmnt -no MAJ:MIN -T "$1" 2>/dev/null | head -1 | tr -d ' ')
  fstype=$(findmnt -no FSTYPE -T "$1" 2>/dev/null | head -1)
  if [[ -z "$mm" ]]; then echo "unavailable: cannot find the filesystem of $1 (findmnt)"; return 1; fi
  if [[ "${mm%%:*}" == 0 || ! -e "/sys/dev/block/$mm" ]]; then
    echo "unavailable: $1 is on $fstype ($mm), not on a block device: put the work directory on a disk-backed filesystem"
    return 1
  fi
  sys=$(readlink -f "/sys/dev/block/$mm")
  if [[ -e "$sys/partition" ]]; then mm=$(cat "$sys/../dev"); fi
  echo "$mm"
}

# Sets $version and $root (a hierarchy that can throttle), or prints why none can (returns 1).
pick_hierarchy() {
  local m why2="" why1=""
  for m in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    [[ "$(stat -f -c %T "$m" 2>/dev/null)" == cgroup2fs ]] || continue
    if ! grep -qw io "$m/cgroup.controllers" 2>/dev/null; then
      why2="the cgroup2 hierarchy at $m has no io controller (bound to cgroup v1 here)"
    elif [[ $(id -u) -ne 0 || ! -w "$m" ]]; then
      why2="$m is not writable (needs root)"
    else
      version=2 root=$m
      return 0
    fi
    break
  done
  [[ -n "$why2" ]] || why2="no cgroup2 filesystem at /sys/fs/cgroup or /sys/fs/cgroup/unified"
  m=/sys/fs/cgroup/blkio
  if [[ "$(stat -f -c %T "$m" 2>/dev/null)" != cgroupfs || ! -e "$m/blkio.throttle.read_iops_device" ]]; then
    why1="no cgroup v1 blkio hierarchy with throttle files at $m (kernel without CONFIG_BLK_DEV_THROTTLING?)"
  elif [[ $(id -u) -ne 0 || ! -w "$m" ]]; then
    why1="$m is not writable (needs root)"
  else
    version=1 root=$m
    return 0
  fi
  echo "unavailable: $why2; $why1"
  return 1
}

if [[ "${1:-}" == "--check" && $# -eq 2 ]]; then
  disk=$(disk_of "$2") || { echo "$disk"; exit 3; }
  why=$(pick_hierarchy) || { echo "$why"; exit 3; }
  pick_hierarchy
  [[ $version == 2 ]] && echo "cgroup-v2 io.max on $disk ($root)" || echo "cgroup-v1 blkio on $disk ($root)"
  exit 0
fi
if [[ $# -lt 5 || "$4" != "--" || ! "$1" =~ ^[0-9]+$ || ! "$2" =~ ^[0-9]+$ || "$1" -lt 1 || "$2" -lt 1 ]]; then
  echo "usage: $0 --check PATH | RIOPS RBPS PATH -- COMMAND [ARGS...]" >&2
  exit 2
fi
riops=$1 rbps=$2 path=$3
shift 4
disk=$(disk_of "$path") || { echo "with_io_throttle: $disk" >&2; exit 3; }
why=$(pick_hierarchy) || { echo "with_io_throttle: $why" >&2; exit 3; }
pick_hierarchy
if [[ $version == 2 ]] && ! grep -qw io "$root/cgroup.subtree_control"; then
  # Children get the io controller only through the parent's subtree_control.
  echo +io >"$root/cgroup.subtree_control" 2>/dev/null ||
    { echo "with_io_throttle: unavailable: cannot enable the io controller in $root/cgroup.subtree_control" >&2; exit 3; }
fi
cg="$root/moestream-iops-$$"
mkdir "$cg" 2>/dev/null || { echo "with_io_throttle: unavailable: cannot create $cg" >&2; exit 3; }
cleanup() {
  local stat=""
  if [[ $version == 2 ]]; then
    stat=$(grep "^$disk " "$cg/io.stat" 2>/dev/null | tr ' ' '\n' | grep -E '^r(bytes|ios)=' | tr '\n' ' ')
  else
    stat="rios=$(awk -v d="$disk" '$1==d && $2=="Read"{print $3}' "$cg/blkio.throttle.io_serviced" 2>/dev/null)"
    stat+=" rbytes=$(awk -v d="$disk" '$1==d && $2=="Read"{print $3}' "$cg/blkio.throttle.io_service_bytes" 2>/dev/null)"
  fi
  echo "with_io_throttle: cgroup-v$version on $disk: riops $riops, rbps $rbps; read by the command: ${stat:-?}" >&2
  if [[ -r "$cg/cgroup.procs" ]]; then
    while read -r p; do echo "$p" >"$root/cgroup.procs" 2>/dev/null; done <"$cg/cgroup.procs"
  fi
  rmdir "$cg" 2>/dev/null || echo "with_io_throttle: warning: could not remove $cg" >&2
}
trap cleanup EXIT
if [[ $version == 2 ]]; then
  echo "$disk riops=$riops rbps=$rbps" >"$cg/io.max" 2>/dev/null ||
    { echo "with_io_throttle: unavailable: the kernel refused '$disk riops=$riops rbps=$rbps' in $cg/io.max" >&2; exit 3; }
  grep -q "^$disk .*riops=$riops" "$cg/io.max" ||
    { echo "with_io_throttle: unavailable: $cg/io.max does not hold the limit after writing it" >&2; exit 3; }
else
  { echo "$disk $riops" >"$cg/blkio.throttle.read_iops_device" && echo "$disk $rbps" >"$cg/blkio.throttle.read_bps_device"; } 2>/dev/null ||
    { echo "with_io_throttle: unavailable: the kernel refused the limits for $disk in $cg/blkio.throttle.read_*_device" >&2; exit 3; }
  grep -q "^$disk $riops\$" "$cg/blkio.throttle.read_iops_device" ||
    { echo "with_io_throttle: unavailable: $cg/blkio.throttle.read_iops_device does not hold the limit" >&2; exit 3; }
fi
# The child joins the cgroup before exec, so every read it or its threads issue is throttled.
bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' throttled "$cg" "$@"
exit $?
