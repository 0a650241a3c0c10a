#!/usr/bin/env bash
# Run THERE (the device machine, after carrying .deps): issue 19, "CPU decode >= 1.0x llama.cpp at
# 16 threads with checksums on". Measures the CPU decode with checksums on (the default: each
# expert's first use is hashed, now beside its compute) against --no-verify, at -t 16 and -t 8,
# ROUNDS interleaved rounds (default 3), on a Qwen3-30B-A3B-shaped q8 pack of LAYERS layers
# (default 4), a 16-id prompt and 32 greedy tokens; every run must give the same tokens.
#
#   bash scripts/device_verify_overlap.sh [build|run]   (default run: builds what is missing, then runs)
#
# `build` only builds (and writes the pack), so that a cold machine's builds and the timed runs
# each fit the device tool's 600 s per command; both steps reuse what a warm machine has.
# BEFORE_SRC=DIR also builds the source tree DIR (e.g. main before the change, made here with
#   mkdir -p .work/before && git archive 1c0f98a CMakeLists.txt common loader kernels runtime \
#     cluster tools python bench scripts | tar -x -C .work/before
# and carried as .work/before, 2.8 MB) and runs its infer in the same rounds, so before and after
# share the machine's state. Results in $OUT: verify_overlap.md (medians, ratios), the stats
# JSON and token ids of every run (runs/), build logs. A warm machine reuses the builds and the
# pack (/tmp/q30l$LAYERS).
set -euo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
mkdir -p "$O/runs"
LAYERS=${LAYERS:-4}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-"16 8"}
BUILD=build-device-cpu
cmd=${1:-run}
case "$cmd" in build|run) ;; *) echo "device_verify_overlap: unknown command '$cmd' (build|run)" >&2; exit 1 ;; esac
{ uname -a; nproc; free -g; } >"$O/machine.txt" 2>&1
BUILD_DIR=$BUILD bash scripts/device_build.sh infer synth_model >"$O/build.log" 2>&1 ||
  { tail -40 "$O/build.log"; exit 1; }
bins=("after=$PWD/$BUILD/bin/infer")
if [ -n "${BEFORE_SRC:-}" ]; then
  [ -f "$BEFORE_SRC/scripts/device_build.sh" ] || { echo "device_verify_overlap: no $BEFORE_SRC/scripts/device_build.sh" >&2; exit 1; }
  ln -sfn "$PWD/.deps" "$BEFORE_SRC/.deps"
  (cd "$BEFORE_SRC" && BUILD_DIR=$BUILD bash scripts/device_build.sh infer) >"$O/build_before.log" 2>&1 ||
    { tail -40 "$O/build_before.log"; exit 1; }
  bins+=("before=$(cd "$BEFORE_SRC" && pwd)/$BUILD/bin/infer")
fi
M=/tmp/q30l$LAYERS
[ -f "$M/model.json" ] || "$BUILD/bin/synth_model" --shape qwen3-30b-a3b --layers "$LAYERS" --quant q8 -q \
  --max-context 1024 "$M" >"$O/synth.log" 2>&1
[ "$cmd" = build ] && { echo "device_verify_overlap: built ${bins[*]}, pack $M" >&2; exit 0; }
P=$(python3 -c "print(','.join(str((7919*i+11)%151936) for i in range(16)))")
run() {  # NAME BIN THREADS [--no-verify]
  local name=$1 bin=$2 t=$3
  shift 3
  "$bin" -m "$M" --prompt-ids "$P" -n 32 --temp 0 --ignore-eos --print-ids -t "$t" \
    --stats-json "$O/runs/$name.json" "$@" >"$O/runs/$name.out" 2>"$O/runs/$name.err" ||
    { echo "device_verify_overlap: $name failed:" >&2; tail -5 "$O/runs/$name.err" >&2; return 1; }
}
# One warm-up: the pack's pages resident, as in every timed run.
run warmup "${PWD}/$BUILD/bin/infer" 16 --no-verify
for r in $(seq 1 "$ROUNDS"); do
  for t in $THREADS; do
    for b in "${bins[@]}"; do
      run "${b%%=*}_t${t}_verify_r$r" "${b#*=}" "$t"
      run "${b%%=*}_t${t}_noverify_r$r" "${b#*=}" "$t" --no-verify
    done
  done
done
python3 - "$O" <<'PY' | tee "$O/verify_overlap.md"
import glob, json, os, statistics as st, sys
o = sys.argv[1]
runs = {}
toks = set()
for f in sorted(glob.glob(os.path.join(o, "runs", "*_r*.json"))):
    name = os.path.basename(f)[:-5]
    build, t, mode, _ = name.split("_")
    d = json.load(open(f))
    runs.setdefault((build, t, mode), []).append(d)
    toks.add(open(f[:-5] + ".out").read().split()[-1])
print("| build | threads | decode verified tok/s (runs) | decode --no-verify tok/s (runs) | verified / --no-verify "
      "| prefill verified / --no-verify | first uses verified in place | read |")
print("|---|---|---|---|---|---|---|---|")
for (build, t, mode) in sorted(runs):
    if mode != "verify":
        continue
    v = [d["decode"]["tokens_per_s"] for d in runs[(build, t, "verify")]]
    n = [d["decode"]["tokens_per_s"] for d in runs.get((build, t, "noverify"), [])]
    pv = [d["prefill"]["tokens_per_s"] for d in runs[(build, t, "verify")]]
    pn = [d["prefill"]["tokens_per_s"] for d in runs.get((build, t, "noverify"), [])]
    e = runs[(build, t, "verify")][-1]["experts"]
    fmt = lambda xs: f"{st.median(xs):.1f} ({'/'.join(f'{x:.1f}' for x in xs)})"
    print(f"| {build} | {t[1:]} | {fmt(v)} | {fmt(n)} | {st.median(v) / st.median(n):.3f} | "
          f"{st.median(pv) / st.median(pn):.3f} | {e['verified_in_place']} | {e['experts_read']} |")
print(f"\ndistinct token sequences over all runs: {len(toks)} (must be 1)")
PY
