#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps: the io_uring page-cache A/B of issue 5.
# SECTIONS (default "hot sweep cold"): hot = REPS runs of bench_io's page-cache expert cells plus
# AB_ROUNDS interleaved rounds of pread pool vs rings (rows hotab); sweep = hot 1M/4M sweeps;
# cold = O_DIRECT expert cells and the interleaved depth study. Every run adds the old
# batch-submit rows (uringN_bs). Text in $OUT, JSON packed into $OUT/json.tar.gz (8 files return).
source "$(dirname "$0")/device_env.sh"
mkdir -p "$W/json"
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
for s in ${SECTIONS:-hot sweep cold}; do
  case $s in
    hot) for i in $(seq 1 "${REPS:-2}"); do
           "$B" "${common[@]}" --no-device --no-sweep --seconds "${HOT_SECONDS:-0.1}" \
             --hot-ab-rounds "${AB_ROUNDS:-20}" --json "$W/json/hot$i.json" >"$O/hot$i.txt" 2>&1
           echo "hot run $i: rc $?"
         done ;;
    sweep) "$B" "${common[@]}" --no-device --seconds 0.2 --blocks 1M,4M --json "$W/json/sweep.json" \
             >"$O/sweep.txt" 2>&1; echo "hot sweep: rc $?" ;;
    cold) "$B" "${common[@]}" --no-page-cache --no-sweep --seconds 1.0 --depth-reps 4 \
            --json "$W/json/cold.json" >"$O/cold.txt" 2>&1; echo "cold: rc $?" ;;
  esac
done
tar czf "$O/json.tar.gz" -C "$W" json
rm -rf "$F" "$W/json"
grep -hE "^(expert|limit|sweep|hotab|depth)" "$O"/hot*.txt "$O"/sweep.txt "$O"/cold.txt 2>/dev/null || true
