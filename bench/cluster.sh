#!/usr/bin/env bash
# bench/cluster.sh: records a training and a held-out routing trace of the demo model, orders the
# experts (identity, greedy, seriation), prints modelled and measured (O_DIRECT replay) costs.
# Usage: bench/cluster.sh [BUILD_DIR] [WORK_DIR]     (one command, reproducible: greedy decoding
# is not involved, the traces come from perplexity runs over fixed text slices)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/bin
WORK=${2:-$(mktemp -d /var/tmp/moestream_cluster.XXXXXX)}
mkdir -p "$WORK"
MODEL=models/demo
TRAIN_BYTES=${TRAIN_BYTES:-400000}
REPLAY_TOKENS=${REPLAY_TOKENS:-3000}
ROUNDS=${ROUNDS:-5}
# Queue depths to replay at: 32 (the engine default, a layer's reads overlap) and 1 (one read
# in flight: the latency-bound case the cost model's ops x latency term describes).
QDS=${QDS:-"32 1"}
# Local search budget per layer (cluster_experts --search-moves; empty: its default). A count,
# not a clock: the same traces give the same order on every machine.
SEARCH_MOVES=${SEARCH_MOVES:-}

# Training text: a slice of the training corpus when present, else the part of the committed
# held-out file that heldout_head.txt does not cover (disjoint from the evaluation text).
if [[ -f data/corpus/train.txt ]]; then
  head -c "$TRAIN_BYTES" data/corpus/train.txt > "$WORK/train.txt"
else
  # head first: `tail | head` dies of SIGPIPE under pipefail once head has its bytes
  head -c $((200000 + TRAIN_BYTES)) $MODEL/heldout.txt | tail -c +200001 > "$WORK/train.txt"
fi
# HELDOUT_BYTES (default: all of heldout_head.txt) shortens the evaluation trace for quick runs.
if [[ -n "${HELDOUT_BYTES:-}" ]]; then
  head -c "$HELDOUT_BYTES" $MODEL/heldout_head.txt > "$WORK/heldout.txt"
else
  cp $MODEL/heldout_head.txt "$WORK/heldout.txt"
fi
for s in train heldout; do
  if [[ ! -s "$WORK/$s.bin" ]]; then
    "$BIN/infer" -m $MODEL --perplexity "$WORK/$s.txt" --ctx 512 --stride 512 \
      --collect-routing "$WORK/$s.bin" >&2
  fi
done

# Two copies of the model: identity order, and repacked in the seriation order.
rm -rf "$WORK/identity" "$WORK/clustered"
cp -r $MODEL "$WORK/identity"
cp -r $MODEL "$WORK/clustered"
# --io-direct: the cost model plans reads as the replay below issues them (O_DIRECT, its read cap).
"$BIN/cluster_experts" --routing "$WORK/train.bin" --evaluate "$WORK/heldout.bin" \
  --model "$WORK/clustered" --method seriation --repack --json --io-direct \
  ${SEARCH_MOVES:+--search-moves $SEARCH_MOVES} ${IO_PROFILE:+--io-profile $IO_PROFILE} \
  > "$WORK/cluster.json"

# Cold reads: O_DIRECT through io_uring, no host cache; alternate the two copies ROUNDS times.
for qd in $QDS; do
  for r in $(seq "$ROUNDS"); do
    for m in identity clustered; do
      "$BIN/cluster_replay" --model "$WORK/$m" --routing "$WORK/heldout.bin" --io uring \
        --io-qd "$qd" --io-rings 1 --max-tokens "$REPLAY_TOKENS" > "$WORK/replay_${m}_qd${qd}_$r.json"
    done
  done
done

# Optional: a synthetic stand-in of the same layers/experts with larger experts (SYN_HIDDEN x
# SYN_FFN, q8), laid out from the same training trace and replaying the same held-out trace.
if [[ -n "${SYNTHETIC:-}" ]]; then
  SYN_TOKENS=${SYN_TOKENS:-300}
  if [[ ! -f "$WORK/syn_identity/model.json" ]]; then
    "$BIN/cluster_replay" --routing "$WORK/train.bin" --write-synthetic "$WORK/syn_identity" \
      --hidden "${SYN_HIDDEN:-512}" --ffn "${SYN_FFN:-256}"
  fi
  rm -rf "$WORK/syn_clustered"
  cp -r "$WORK/syn_identity" "$WORK/syn_clustered"
  "$BIN/cluster_experts" --routing "$WORK/train.bin" --evaluate "$WORK/heldout.bin" --shape-only \
    --model "$WORK/syn_clustered" --method seriation --repack --json --io-direct \
    ${SEARCH_MOVES:+--search-moves $SEARCH_MOVES} ${IO_PROFILE:+--io-profile $IO_PROFILE} \
    > "$WORK/syn_cluster.json"
  for r in $(seq "$ROUNDS"); do
    for m in syn_identity syn_clustered; do
      "$BIN/cluster_replay" --model "$WORK/$m" --routing "$WORK/heldout.bin" --io uring --shape-only \
        --io-rings 1 --max-tokens "$SYN_TOKENS" > "$WORK/replay_${m}_$r.json"
    done
  done
fi

python3 - "$WORK" "$ROUNDS" "$QDS" <<'PY'
import json, statistics, sys
work, rounds, qds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()


def replay(name):
    """Median us/token, read ops/token, each round's us/token and tokens of replay_{name}_<round>.json."""
    runs = [json.load(open(f"{work}/replay_{name}_{r}.json")) for r in range(1, rounds + 1)]
    return (statistics.median(x["us_per_token"] for x in runs), runs[0]["read_ops_per_token"],
            [round(x["us_per_token"]) for x in runs], runs[0]["tokens"])


c = json.load(open(f"{work}/cluster.json"))
print(f"io profile: {c['io_profile']['op_latency_us']:.1f} us/op, {c['io_profile']['bandwidth_gbps']:.2f} GB/s;"
      f" expert {c['geometry']['expert_bytes']} B, stride {c['geometry']['expert_stride']} B;"
      f" reads planned {'O_DIRECT' if c['geometry']['direct'] else 'buffered'};"
      f" search {c['search']['moves']} moves (budget {c['search']['max_moves_per_layer']}/layer)")
print(f"{'trace':8} {'method':10} {'read ops/tok':>12} {'vs identity':>11} {'KiB/tok':>9} {'model us/tok':>12}")
for trace in ("train", "heldout"):
    base = c[trace]["identity"]["read_ops_per_token"]
    for m in ("identity", "greedy", "chosen"):
        x = c[trace][m]
        name = "seriation" if m == "chosen" else m
        print(f"{trace:8} {name:10} {x['read_ops_per_token']:12.2f} {100*(x['read_ops_per_token']/base-1):+10.1f}% "
              f"{x['bytes_per_token']/1024:9.1f} {x['modelled_us_per_token']:12.1f}")
for qd in qds:
    res = {}
    for m in ("identity", "clustered"):
        res[m] = replay(f"{m}_qd{qd}")
    print(f"measured cold replay (io_uring 1 ring, QD {qd}, O_DIRECT, no host cache), held-out, "
          f"{res['identity'][3]} tokens, median of {rounds}:")
    for m in ("identity", "clustered"):
        us, ops, all_us, _ = res[m]
        print(f"  {m:10} {us:9.1f} us/token  {ops:6.2f} read ops/token  runs {all_us}")
    print(f"  clustered vs identity: {100*(res['clustered'][0]/res['identity'][0]-1):+.1f}% time")
import os
if os.path.exists(f"{work}/syn_cluster.json"):
    c = json.load(open(f"{work}/syn_cluster.json"))
    print(f"synthetic stand-in: expert {c['geometry']['expert_bytes']} B; held-out modelled:")
    base = c["heldout"]["identity"]
    for m in ("identity", "greedy", "chosen"):
        x = c["heldout"][m]
        print(f"  {m if m != 'chosen' else 'seriation':10} {x['read_ops_per_token']:6.2f} ops/tok "
              f"({100*(x['read_ops_per_token']/base['read_ops_per_token']-1):+.1f}%) {x['modelled_us_per_token']:9.1f} us/tok")
    res = {}
    for m in ("syn_identity", "syn_clustered"):
        res[m] = replay(m)
        print(f"  measured {m:14} {res[m][0]:9.1f} us/token {res[m][1]:6.2f} ops/token runs {res[m][2]}"
              f" ({res[m][3]} tokens, QD 32, 1 ring)")
    print(f"  clustered vs identity: {100*(res['syn_clustered'][0]/res['syn_identity'][0]-1):+.1f}% time")
PY
