#!/usr/bin/env bash
# End-to-end expert streaming: `infer` decode tokens/s with --io uring / pread (O_DIRECT and a
# host cache smaller than the experts) / mmap (page-fault baseline) and the buffered engine on
# one synthetic packed model, each run starting with the model's pages evicted; same tokens out.
# Env: BIN (infer, cpu_decode), MODEL_ROOT, OUT_DIR, LAYERS EXPERTS HIDDEN FFN TOPK, HOST_CACHE_MB,
#      N_TOKENS, THREADS.
set -euo pipefail
BIN=${BIN:-build/bin}
MODEL_ROOT=${MODEL_ROOT:-/tmp/moestream_e2e}
OUT_DIR=${OUT_DIR:-.}
LAYERS=${LAYERS:-4} EXPERTS=${EXPERTS:-32} HIDDEN=${HIDDEN:-1024} FFN=${FFN:-512} TOPK=${TOPK:-4}
HOST_CACHE_MB=${HOST_CACHE_MB:-16} N_TOKENS=${N_TOKENS:-16} THREADS=${THREADS:-0}
mkdir -p "$OUT_DIR"
M=$MODEL_ROOT/q8
# cpu_decode's generator writes (or reuses) q4 and q8 models of these shapes under MODEL_ROOT.
"$BIN/cpu_decode" --dir "$MODEL_ROOT" --layers "$LAYERS" --experts "$EXPERTS" --hidden "$HIDDEN" \
  --ffn "$FFN" --top-k "$TOPK" --vocab 4096 --tokens 1 --reps 1 -t "$THREADS" >/dev/null
du -sh "$M/experts" | cut -f1 | xargs echo "experts on disk:"
evict() {  # drops this model's pages from the page cache (per file: leaves others' caches alone)
  python3 - "$M"/experts/*.bin <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
PY
}
run() {  # name, infer flags...
  local name=$1; shift
  evict
  "$BIN/infer" -m "$M" --prompt-ids 1,2,3,4,5,6,7,8 -n "$N_TOKENS" --temp 0 --print-ids \
    --ignore-eos -t "$THREADS" --timing --stats-json "$OUT_DIR/e2e_$name.json" "$@" \
    >"$OUT_DIR/e2e_$name.ids" 2>"$OUT_DIR/e2e_$name.log"
}
run uring_direct --io uring --io-direct --host-cache-mb "$HOST_CACHE_MB"
run pread_direct --io pread --io-direct --host-cache-mb "$HOST_CACHE_MB"
run mmap --io mmap
run uring_buffered --io uring
run simple --io simple
python3 - "$OUT_DIR" <<'PY'
import json, sys, os
d = sys.argv[1]
names = ["uring_direct", "pread_direct", "mmap", "uring_buffered", "simple"]
ids = {n: open(os.path.join(d, f"e2e_{n}.ids")).read().strip() for n in names}
print("| run | decode tok/s | prefill tok/s | experts read | host-cache hits | page-cache hits"
      " | read ops before/after coalescing | expert MiB read | I/O wait not hidden, s | expert reads |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    j = json.load(open(os.path.join(d, f"e2e_{n}.json")))
    e = j["experts"]
    print(f"| {n} | {j['decode']['tokens_per_s']:.2f} | {j['prefill']['tokens_per_s']:.2f} | "
          f"{e['experts_read']} | {e.get('host_cache_hits', 0)} | {e.get('page_cache_hits', 0)} | "
          f"{e.get('read_ops_before_coalescing', 0)}/{e.get('read_ops_after_coalescing', 0)} | "
          f"{e['bytes_read'] / 2**20:.0f} | {e.get('io_wait_not_hidden_s', 0):.3f} | {j['expert_io']} |")
same = len(set(ids.values())) == 1
print(f"\nsame tokens from every run: {'yes' if same else 'NO'} ({ids[names[0]][:60]}...)")
sys.exit(0 if same else 1)
PY
