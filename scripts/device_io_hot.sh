#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps: the io_uring page-cache A/B of issue 5 —
# bench_io's expert pattern hot, REPS times, with the old batch-submit rows (uringN_bs) beside the
# engine's default, then once cold (O_DIRECT) and once the hot 1M/4M sweeps. Outputs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
mkdir -p "$O"
W=${WORK_DIR:-$PWD/.work}  # on the machine's disk (O_DIRECT needs a real filesystem, not tmpfs)
mkdir -p "$W"
{ uname -r; nproc; lscpu; } >"$O/machine.txt" 2>&1
B=${BENCH_BIN:-}  # an already built bench_io (here: build-<you>/bin/bench_io) skips the build
if [ -z "$B" ]; then
  t0=$(date +%s)
  bash scripts/device_build.sh bench_io >"$O/build.log" 2>&1 || { tail -40 "$O/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  B=build-device/bin/bench_io
fi
F=$W/bench_io_hot.bin
common=(--file "$F" --size-mb 1024 --keep --threads 16 --rings 16 --uring-batch-submit)
for i in $(seq 1 "${REPS:-3}"); do
  "$B" "${common[@]}" --no-device --no-sweep --seconds 0.5 --json "$O/hot$i.json" >"$O/hot$i.txt" 2>&1
  echo "hot run $i: rc $?"
done
if [ -n "${HOOK:-}" ]; then bash -c "$HOOK"; fi  # extra measurements on the warm file
"$B" "${common[@]}" --no-device --seconds 0.2 --blocks 1M,4M --json "$O/sweep.json" >"$O/sweep.txt" 2>&1
echo "hot sweep: rc $?"
"$B" "${common[@]}" --no-page-cache --no-sweep --seconds 0.3 --json "$O/cold.json" >"$O/cold.txt" 2>&1
echo "cold: rc $?"
rm -f "$F"
grep -hE "^(expert|limit)" "$O"/hot*.txt "$O/cold.txt"
