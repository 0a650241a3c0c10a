#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps: builds the tools bench/cluster.sh needs and
# runs it: cold decode reads of the demo model (and a stand-in with ~14 KiB experts, SYNTHETIC=1)
# identity vs clustered vs clustered+profile, on an emulated 3000-IOPS / 250 MB/s volume (cgroup
# v2 io.max through scripts/with_io_throttle.sh) and on the raw device. Results in $OUT:
# cluster.txt (the tables), cluster_iops.json, profile_emulated.json, profile_raw.json,
# machine.txt, build.log, cluster.log. Idempotent: traces and profiles under $WORK_DIR/cluster are
# reused, so a timed-out call can be rerun. ROUNDS, EMUL_TOKENS, REPLAY_TOKENS, TRAIN_BYTES,
# RIOPS, RBPS, SYNTHETIC, SEARCH_MOVES override the defaults below (a 5000-move search budget keeps
# the whole call, build included, within the 10-minute limit of one device command).
source "$(dirname "$0")/device_env.sh"
{ uname -a; nproc; df -hT "$W"; lsblk -o NAME,MAJ:MIN,ROTA,SIZE,MODEL,MOUNTPOINT
  cat /sys/fs/cgroup/cgroup.controllers /sys/fs/cgroup/cgroup.subtree_control
  bash scripts/with_io_throttle.sh --check "$W"; } >"$O/machine.txt" 2>&1
t0=$(date +%s)
bash scripts/device_build.sh infer cluster_experts cluster_replay bench_io >"$O/build.log" 2>&1 ||
  { tail -40 "$O/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
TRAIN_BYTES=${TRAIN_BYTES:-200000} ROUNDS=${ROUNDS:-5} EMUL_TOKENS=${EMUL_TOKENS:-300} SEARCH_MOVES=${SEARCH_MOVES:-5000} \
  REPLAY_TOKENS=${REPLAY_TOKENS:-1000} SYNTHETIC=${SYNTHETIC:-1} \
  timeout "${CLUSTER_TIMEOUT:-480}" bash bench/cluster.sh "${BUILD_DIR:-build-device}" "$W/cluster" \
  >"$O/cluster.txt" 2>"$O/cluster.log"
rc=$?
echo "cluster.sh: rc $rc in $(( $(date +%s) - t0 )) s"
cp "$W/cluster/cluster_iops.json" "$W/cluster"/profile_*.json "$O/" 2>/dev/null
cat "$O/cluster.txt"
tail -5 "$O/cluster.log"
exit $rc
