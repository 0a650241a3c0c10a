#!/usr/bin/env bash
# Run THERE (the device machine; ncu installed, `infer` built with CUDA): why a decode step's
# kernels take the time they do. Nsight Compute's detail sections (speed of light, memory
# workload, warp states, scheduler, occupancy, launch statistics) for every launch of the
# kernels whose name matches KERNEL in a short greedy run; prints the last COUNT of them (the last
# decode step's) and keeps the whole report. device_kernel_profile.sh says which kernels matter;
# this says what bounds one (latency, issue, memory, occupancy).
#
#   scripts/device_kernel_detail.sh MODEL [infer flags...]
#   e.g. KERNEL=decode_gemv_q8_0 COUNT=5 scripts/device_kernel_detail.sh \
#          /tmp/llama-models/qwen3-30b-a3b-shape-L6-seed1/qwen3moe-L6-Q8_0.pack --gpu --gpu-preload
#
# KERNEL (a regex on the kernel's name; default decode_gemv_q8_0), COUNT (default 5: one layer's
# products and lm_head), TOKENS (default 4), BIN (default build-device-gpu/bin), NAME (default
# detail); writes $OUT/NAME.txt (the last COUNT launches) and $OUT/NAME.full.txt (all of them).
# Caches stay warm between kernels (--cache-control none) and clocks as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 MODEL [infer flags...]" >&2; exit 2; }
M=$1
shift
KERNEL=${KERNEL:-decode_gemv_q8_0}
COUNT=${COUNT:-5}
TOKENS=${TOKENS:-4}
NAME=${NAME:-detail}
. scripts/device_ncu_env.sh
"$NCU" --clock-control none --cache-control none --kernel-name "regex:$KERNEL" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy --section LaunchStats \
  "$BIN/infer" -m "$M" --prompt-ids "$P" -n "$TOKENS" --temp 0 --ignore-eos --print-ids "$@" \
  >"$O/$NAME.full.txt" 2>"$O/$NAME.err" || { tail -20 "$O/$NAME.err" >&2; exit 1; }
python3 - "$O/$NAME.full.txt" "$COUNT" <<'PY' | tee "$O/$NAME.txt"
import re, sys
text, count = open(sys.argv[1]).read().splitlines(), int(sys.argv[2])
# A launch's report starts with its name, grid and block: "  name(...) (396, 1, 1)x(256, 1, 1), Context ..."
starts = [i for i, l in enumerate(text) if re.search(r"\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context", l)]
if not starts:
    sys.exit("device_kernel_detail: no matching launch in the report")
starts.append(len(text))
print(f"{len(starts) - 1} matching launches; the last {min(count, len(starts) - 1)}:\n")
for a, b in zip(starts[-count - 1:-1], starts[-count:]):
    print("\n".join(text[a:b]).rstrip() + "\n")
PY
