#!/usr/bin/env bash
# Trains a model of python/training/train_moe.py on the device machine and sends the run back
# through $OUT in pieces the device tool returns (at most 8 files of 16 MiB).
#   HERE:   python3 python/training/tokenize_corpus.py          # data/tokens/{train,heldout}.bin
#           git commit ...; scripts/device_tree.sh only python/training models/demo/tokenizer.json \
#               models/demo/heldout.txt scripts/device_train.sh
#   DEVICE: CONFIG=wide128 BALANCE=layer STEPS=3000 OUT=$OUT bash scripts/device_train.sh
#           CONFIG=grouped128 STEPS=3000 OUT=$OUT bash scripts/device_train.sh
#           (carry data/tokens; BALANCE: train_moe.py --balance, pooled, layer or bias; default:
#           the config's own, as train_moe.py --help lists)
#   HERE:   scripts/device_tree.sh restore
#           cat <files_at>/run.tar.xz.* | xz -d | tar -x -C data/      # data/<NAME>_run/...
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that comes back}"
CONFIG=${CONFIG:-wide128}
STEPS=${STEPS:-3000}
MAX_MINUTES=${MAX_MINUTES:-6}
STOP_AFTER=${STOP_AFTER:-0}   # steps (0: none); the schedule still spans STEPS
BALANCE=${BALANCE:-}
NAME=${NAME:-${CONFIG}${BALANCE:+_$BALANCE}}
RUN=/tmp/${NAME}_run
for f in data/tokens/train.bin data/tokens/heldout.bin; do
  [ -s "$f" ] || { echo "device_train: $f is missing (carry data/tokens)" >&2; exit 1; }
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1
python3 python/training/train_moe.py --config "$CONFIG" ${BALANCE:+--balance "$BALANCE"} --steps "$STEPS" --max-minutes "$MAX_MINUTES" \
  --stop-after "$STOP_AFTER" \
  --out "$RUN" 2>&1 | tee "$OUT/train.log"
# One archive, cut into pieces under the tool's per-file limit.
tar -C /tmp -c "${NAME}_run" | xz -1 -T0 | split -b 15M -d - "$OUT/run.tar.xz."
ls -l "$OUT"
