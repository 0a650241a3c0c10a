#!/usr/bin/env bash
# End-to-end expert streaming: `infer` decode tokens/s with --io uring / pread (O_DIRECT and a
# host cache smaller than the experts) / mmap (page-fault baseline) and the buffered engine on
# one synthetic packed model, each run starting with the model's pages evicted; same tokens out.
# The page-cache runs are repeated under a memory cap equal to the O_DIRECT run's peak memory
# (scripts/with_memory_cap.sh, cgroup v2 memory.max, page cache included), so mmap gets the same
# memory as the engine's host cache; where no cap is possible this says so and skips them.
# Env: BIN (infer, cpu_decode), MODEL_ROOT, OUT_DIR, LAYERS EXPERTS HIDDEN FFN TOPK, HOST_CACHE_MB,
#      N_TOKENS, THREADS, MEM_CAP_MB (default: the uring O_DIRECT run's peak RSS; "off": none).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-build/bin}
MODEL_ROOT=${MODEL_ROOT:-/tmp/moestream_e2e}
OUT_DIR=${OUT_DIR:-.}
LAYERS=${LAYERS:-4} EXPERTS=${EXPERTS:-32} HIDDEN=${HIDDEN:-1024} FFN=${FFN:-512} TOPK=${TOPK:-4}
HOST_CACHE_MB=${HOST_CACHE_MB:-16} N_TOKENS=${N_TOKENS:-16} THREADS=${THREADS:-0}
MEM_CAP_MB=${MEM_CAP_MB:-auto}
mkdir -p "$OUT_DIR"
M=$MODEL_ROOT/q8
# cpu_decode's generator writes (or reuses) q4 and q8 models of these shapes under MODEL_ROOT.
"$BIN/cpu_decode" --dir "$MODEL_ROOT" --layers "$LAYERS" --experts "$EXPERTS" --hidden "$HIDDEN" \
  --ffn "$FFN" --top-k "$TOPK" --vocab 4096 --tokens 1 --reps 1 -t "$THREADS" >/dev/null
du -sh "$M/experts" | cut -f1 | xargs echo "experts on disk:"
evict() {  # drops this model's pages from the page cache (per file: leaves others' caches alone)
  python3 - "$M"/experts/*.bin "$M"/*.safetensors <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
PY
}
# Runs a command and writes its peak RSS (KiB, children included) to $1.
peak_rss() {
  local out=$1; shift
  python3 -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)' "$out" "$@"
}
run() {  # name, [cap MiB or -], infer flags...
  local name=$1 cap=$2; shift 2
  local pre=()
  [[ "$cap" != - ]] && pre=(bash "$HERE/scripts/with_memory_cap.sh" "$cap" --)
  evict
  peak_rss "$OUT_DIR/e2e_$name.rss" "${pre[@]}" "$BIN/infer" -m "$M" --prompt-ids 1,2,3,4,5,6,7,8 \
    -n "$N_TOKENS" --temp 0 --print-ids --ignore-eos -t "$THREADS" --timing \
    --stats-json "$OUT_DIR/e2e_$name.json" "$@" >"$OUT_DIR/e2e_$name.ids" 2>"$OUT_DIR/e2e_$name.log"
}
run uring_direct - --io uring --io-direct --host-cache-mb "$HOST_CACHE_MB"
run pread_direct - --io pread --io-direct --host-cache-mb "$HOST_CACHE_MB"
run mmap - --io mmap
run uring_buffered - --io uring
run simple - --io simple
names="uring_direct pread_direct mmap uring_buffered simple"
cap_note="no memory cap asked for (MEM_CAP_MB=off)"
if [[ "$MEM_CAP_MB" != off ]]; then
  cap=$MEM_CAP_MB
  [[ "$cap" == auto ]] && cap=$(( $(cat "$OUT_DIR/e2e_uring_direct.rss") / 1024 ))
  if check=$(bash "$HERE/scripts/with_memory_cap.sh" --check); then
    run mmap_capped "$cap" --io mmap
    run uring_buffered_capped "$cap" --io uring
    names="$names mmap_capped uring_buffered_capped"
    cap_note="capped runs: $check memory.max $cap MiB (= the uring O_DIRECT run's peak RSS, host cache included)"
  else
    cap_note="no memory cap possible here ($check): mmap and buffered runs use an unbudgeted page cache; the budgeted comparison is the O_DIRECT runs with --host-cache-mb $HOST_CACHE_MB"
  fi
fi
python3 - "$OUT_DIR" "$cap_note" $names <<'PY'
import json, sys, os
d, note, names = sys.argv[1], sys.argv[2], sys.argv[3:]
ids = {n: open(os.path.join(d, f"e2e_{n}.ids")).read().strip() for n in names}
print("| run | decode tok/s | prefill tok/s | experts read | host-cache hits | page-cache hits"
      " | read ops before/after coalescing | expert MiB read | I/O wait not hidden, s | checksums, s"
      " | peak RSS MiB | expert reads |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    j = json.load(open(os.path.join(d, f"e2e_{n}.json")))
    e = j["experts"]
    rss = int(open(os.path.join(d, f"e2e_{n}.rss")).read()) / 1024
    print(f"| {n} | {j['decode']['tokens_per_s']:.2f} | {j['prefill']['tokens_per_s']:.2f} | "
          f"{e['experts_read']} | {e.get('host_cache_hits', 0)} | {e.get('page_cache_hits', 0)} | "
          f"{e.get('read_ops_before_coalescing', 0)}/{e.get('read_ops_after_coalescing', 0)} | "
          f"{e['bytes_read'] / 2**20:.0f} | {e.get('io_wait_not_hidden_s', 0):.3f} | "
          f"{e.get('checksum_s', 0):.3f} | {rss:.0f} | {j['expert_io']} |")
print(f"\n{note}")
same = len(set(ids.values())) == 1
print(f"same tokens from every run: {'yes' if same else 'NO'} ({ids[names[0]][:60]}...)")
sys.exit(0 if same else 1)
PY
