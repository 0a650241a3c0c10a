#!/usr/bin/env bash
# Run THERE (device machine, .deps and a baseline source tree carried): the speed of two builds
# of infer, a baseline (BASE_SRC: e.g. `git archive REV` unpacked into an ignored folder) against
# this tree, on a Qwen3-30B-A3B-shaped pack of LAYERS layers (synth_model, q8 experts), in
# interleaved rounds (bench/ab.py: a fresh process per run, the order flipping every round):
#   cpu       warm CPU decode and prefill at 16 threads
#   resident  --gpu --gpu-preload (every expert in VRAM)
#   gpu25     --gpu --gpu-cache-mb of 25% of the experts (the rest from the page cache)
#   cap       CPU under a memory cap of half the pack (scripts/with_memory_cap.sh, page cache
#             dropped before each run)
# Tables in $OUT/ab_<row>.txt and the summary.
#   BASE_SRC=.base bash scripts/device_ab.sh build    both builds (resumable)
#   BASE_SRC=.base bash scripts/device_ab.sh run [ROWS]   (default: cpu resident gpu25 cap)
source "$(dirname "$0")/device_gpu_env.sh" device_ab
: "${BASE_SRC:?BASE_SRC: a baseline source tree}"
LAYERS=${LAYERS:-6}
ROUNDS=${ROUNDS:-3}
step=${1:-run}
shift || true
build() {
  gpu_build 60 infer synth_model
  cp -r .deps "$BASE_SRC/" 2>/dev/null
  (cd "$BASE_SRC" && DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON" BUILD_DIR=build-base bash scripts/device_build.sh infer) \
    >"$W/build_base.log" 2>&1 || { tail -30 "$W/build_base.log" | tee -a "$S"; exit 1; }
}
if [ "$step" = build ] || [ ! -x "$B/infer" ] || [ ! -x "$BASE_SRC/build-base/bin/infer" ]; then
  t0=$(date +%s); build; say "builds: $(( $(date +%s) - t0 )) s"
fi
[ "$step" = build ] && exit 0
M=/tmp/ab_q30
[ -f $M/model.json ] || "$B/synth_model" --shape qwen3-30b-a3b --layers "$LAYERS" --quant q8 -q --max-context 4096 $M \
  >"$W/synth.log" 2>&1 || { tail -5 "$W/synth.log" | tee -a "$S"; exit 1; }
A=$BASE_SRC/build-base/bin/infer N=$PWD/$B/infer
experts_mb=$(du -sm $M/experts | cut -f1)
pack_mb=$(du -sm $M | cut -f1)
# A capped run: the page cache dropped, then infer in a fresh cgroup of half the pack.
for side in a b; do
  bin=$A; [ $side = b ] && bin=$N
  cat >"$W/capped_$side" <<WRAP
#!/bin/sh
sync; echo 1 >/proc/sys/vm/drop_caches
exec bash $PWD/scripts/with_memory_cap.sh $((pack_mb / 2)) -- $bin "\$@"
WRAP
  chmod +x "$W/capped_$side"
done
rc=0
for row in ${*:-cpu resident gpu25 cap}; do
  a=$A b=$N extra=()
  case $row in
    cpu) ;;
    resident) extra+=(--gpu --gpu-preload) ;;
    gpu25) extra+=(--gpu --gpu-cache-mb $((experts_mb / 4))) ;;
    cap) a=$W/capped_a b=$W/capped_b ;;
    *) say "device_ab: unknown row $row"; exit 2 ;;
  esac
  say "== $row: ${extra[*]:-(no extra flags)}"
  timeout 550 python3 bench/ab.py --a "$a" --b "$b" -m $M --ids --prompt-tokens 14,256 --tokens 32 --threads 16 \
    --rounds "$ROUNDS" -- "${extra[@]}" >"$O/ab_$row.txt" 2>&1 || rc=1
  tee -a "$S" <"$O/ab_$row.txt"
done
exit $rc
