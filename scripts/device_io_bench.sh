#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps: builds the CPU targets, then bench_io and the
# end-to-end --io comparison (bench/io_e2e.sh). At most 8 files land in $OUT (the tool's limit).
source "$(dirname "$0")/device_env.sh"
{ uname -a; nproc; free -g; df -hT "$W"; lsblk -o NAME,ROTA,SIZE,MODEL,MOUNTPOINT; g++ --version | head -1
  for f in /sys/block/vd*/queue/{read_ahead_kb,max_sectors_kb,max_hw_sectors_kb,max_segments,nr_requests,scheduler}; do
    echo "$f $(cat "$f")"; done; ls /sys/block/vda/mq; bash scripts/with_memory_cap.sh --check
  cat /sys/kernel/mm/transparent_hugepage/enabled; } >"$O/machine.txt" 2>&1
t0=$(date +%s)
bash scripts/device_build.sh bench_io infer cpu_decode bench_residency >"$O/build.log" 2>&1 || { tail -40 "$O/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
B=build-device/bin
t0=$(date +%s)
timeout "${BENCH_TIMEOUT:-100}" stdbuf -oL "$B/bench_io" --file "$W/bench_io.bin" --size-mb "${BENCH_MB:-1024}" \
  --threads 16 --rings 16 --seconds 0.1 --blocks "${BENCH_BLOCKS:-1M,4M}" --depth-reps "${DEPTH_REPS:-3}" \
  --hot-ab-rounds "${AB_ROUNDS:-10}" \
  --json "$O/bench_io.json" >"$O/bench_io.txt" 2>&1
echo "bench_io: rc $? in $(( $(date +%s) - t0 )) s"
rm -f "$W/bench_io.bin"
t0=$(date +%s)
BIN=$B MODEL_ROOT=$W/e2e OUT_DIR=$W/e2e_out LAYERS=8 EXPERTS=64 HIDDEN=2048 FFN=1024 TOPK=8 \
  HOST_CACHE_MB=512 N_TOKENS=16 timeout "${E2E_TIMEOUT:-120}" bash bench/io_e2e.sh >"$O/e2e.md" 2>&1
echo "e2e: rc $? in $(( $(date +%s) - t0 )) s"
tar czf "$O/e2e_runs.tar.gz" -C "$W" e2e_out 2>/dev/null
"$B/bench_residency" -m "$W/e2e/q8" --host-cache-mb 512 >"$O/residency.txt" 2>&1
cat "$O/residency.txt"
cat "$O/e2e.md"
grep -E "^(expert|limit|depth|hotab|residency|checksum)" "$O/bench_io.txt" | head -50
