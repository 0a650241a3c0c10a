#!/usr/bin/env bash
# Run THERE (the device machine; ncu installed, `infer` built with CUDA): where a decode step's GPU
# time goes. Profiles every kernel of a short greedy run with Nsight Compute (duration only, clocks
# left alone), then sums the last STEPS decode steps per kernel name: microseconds per token, launches
# per token, share of the step. Also times the same run without the profiler, for the step's wall
# time (the difference is launch gaps and host work).
#
#   scripts/device_kernel_profile.sh MODEL [infer flags...]
#   e.g. scripts/device_kernel_profile.sh /tmp/llama-models/.../pack --gpu --gpu-preload
#
# BIN (default build-device-gpu/bin), STEPS (default 4), TOKENS (default 12), NAME (default
# profile), CACHE (default none: caches stay warm between kernels as in a real step; `all` is
# ncu's own default, which flushes them before every kernel and inflates the small ones: the
# 2026-12-03 17:30 profile in docs/results.md was taken that way); writes $OUT/NAME.md (the
# table) and $OUT/NAME.csv (ncu's raw rows).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 MODEL [infer flags...]" >&2; exit 2; }
M=$1
shift
STEPS=${STEPS:-4}
TOKENS=${TOKENS:-12}
NAME=${NAME:-profile}
. scripts/device_ncu_env.sh
ARGS=(-m "$M" --prompt-ids "$P" -n "$TOKENS" --temp 0 --ignore-eos --print-ids "$@")
# The step without the profiler: decode tok/s from the stats.
"$BIN/infer" "${ARGS[@]}" --stats-json "$O/$NAME.plain.json" >/dev/null 2>"$O/$NAME.plain.err" ||
  { tail -5 "$O/$NAME.plain.err" >&2; exit 1; }
"$NCU" --clock-control none --cache-control "${CACHE:-none}" --metrics gpu__time_duration.sum --csv --log-file "$O/$NAME.csv" \
  "$BIN/infer" "${ARGS[@]}" >/dev/null 2>"$O/$NAME.ncu.err" || { tail -20 "$O/$NAME.ncu.err" >&2; exit 1; }
python3 - "$O/$NAME.csv" "$O/$NAME.plain.json" "$STEPS" "$*" <<'PY' | tee "$O/$NAME.md"
import csv, json, os, re, sys
from collections import defaultdict
path, stats_path, steps, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
unit = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
rows = []
with open(path, newline="") as f:
    lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not CSV rows
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", "")) * unit.get(r["Metric Unit"], 1.0)
    name = re.sub(r"\(.*", "", r["Kernel Name"]).strip()  # the signature's arguments out
    rows.append((int(r["ID"]), name, v))
rows.sort()
names = [n for _, n, _ in rows]
# The decode steps: the shortest period p (20 launches or more) with which the last steps x p
# launches repeat, name for name.
period = None
for p in range(20, len(names) // (steps + 1) + 1):
    tail = names[-p * steps:]
    if all(tail[i] == tail[i % p] for i in range(len(tail))):
        period = p
        break
if period is None:
    sys.exit("device_kernel_profile: no repeating decode step found in the last kernels")
last = rows[-period * steps:]
per = defaultdict(lambda: [0.0, 0])
for _, n, v in last:
    per[n][0] += v / steps
    per[n][1] += 1
total = sum(v for v, _ in per.values())
tok_s = json.load(open(stats_path))["decode"]["tokens_per_s"]
print(f"flags: {flags}; ncu --cache-control {os.environ.get('CACHE', 'none')}")
print(f"kernels per decode step: {period}; GPU time per step (sum of kernel durations): {total:.1f} us; "
      f"step wall time without the profiler: {1e6 / tok_s:.1f} us ({tok_s:.1f} tok/s); "
      f"gaps and host: {1e6 / tok_s - total:.1f} us\n")
print("| kernel | us / token | launches / token | share |\n|---|---|---|---|")
for n, (v, c) in sorted(per.items(), key=lambda kv: -kv[1][0]):
    print(f"| {n[:90]} | {v:.1f} | {c // steps} | {100 * v / total:.1f}% |")
PY
