#!/usr/bin/env bash
# bench/cluster.sh: records a training and a held-out routing trace of the demo model, orders the
# experts (identity, greedy, seriation), prints the modelled costs, then measures cold decode
# reads (the held-out trace's expert fetches replayed through the engine with O_DIRECT, no host
# cache) of three variants: identity, clustered (laid out and read as before: fixed gap and caps)
# and clustered+profile (laid out with the device's profile and read with its merge rule,
# --io-profile), on two devices: an emulated IOPS-limited volume (RIOPS reads/s, RBPS bytes/s
# through scripts/with_io_throttle.sh: cgroup v2 io.max or v1 blkio throttling) and the raw
# device. Rounds are interleaved (every variant once per round); medians and per-round ratios.
# Usage: bench/cluster.sh [BUILD_DIR] [WORK_DIR]     (one command, reproducible: greedy decoding
# is not involved, the traces come from perplexity runs over fixed text slices)
# Environment: TRAIN_BYTES, HELDOUT_BYTES, REPLAY_TOKENS (raw device), EMUL_TOKENS (emulated),
# ROUNDS, QD (reads in flight, one ring), RIOPS (3000), RBPS (250000000), EMULATE (1; 0 measures
# the raw device only and says so), SEARCH_MOVES, SYNTHETIC=1 (also a stand-in of SYN_HIDDEN x
# SYN_FFN q8 experts with the same routing: 128 x 32 = ~14 KiB experts by default).
# Exit 3 when the volume cannot be emulated (the reason is printed), 4 when the throttle is set
# but the measured profile shows it does not limit the reads.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/bin
WORK=${2:-$(mktemp -d /var/tmp/moestream_cluster.XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
MODEL=models/demo
TRAIN_BYTES=${TRAIN_BYTES:-400000}
REPLAY_TOKENS=${REPLAY_TOKENS:-1000}
EMUL_TOKENS=${EMUL_TOKENS:-$REPLAY_TOKENS}
ROUNDS=${ROUNDS:-5}
QD=${QD:-32}
RIOPS=${RIOPS:-3000}
RBPS=${RBPS:-250000000}
EMULATE=${EMULATE:-1}
THROTTLE=scripts/with_io_throttle.sh
DEVICES="raw"
if [[ "$EMULATE" != 0 ]]; then
  if ! why=$(bash $THROTTLE --check "$WORK"); then
    echo "cluster.sh: cannot emulate the IOPS-limited volume under $WORK: $why" >&2
    echo "cluster.sh: (EMULATE=0 measures the raw device only)" >&2
    exit 3
  fi
  echo "emulated volume: $RIOPS reads/s, $RBPS bytes/s through $why" >&2
  DEVICES="emulated raw"
else
  echo "cluster.sh: EMULATE=0: the raw device only, no emulated volume" >&2
fi
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

# Device profiles (bench_io --profile-only): the raw device, and the same disk throttled. The
# throttled profile must show the limit, else the throttle does not see our reads: stop.
for dev in $DEVICES; do
  if [[ ! -s "$WORK/profile_$dev.json" ]]; then
    wrap=(); [[ $dev == emulated ]] && wrap=(bash $THROTTLE "$RIOPS" "$RBPS" "$WORK" --)
    "${wrap[@]}" "$BIN/bench_io" --file "$WORK/profile.bin" --size-mb 256 --keep --profile-only \
      --profile-out "$WORK/profile_$dev.json" >&2
  fi
done
rm -f "$WORK/profile.bin"
if [[ "$EMULATE" != 0 ]]; then
  python3 - "$WORK/profile_emulated.json" "$RIOPS" "$RBPS" <<'PY' || exit 4
import json, sys
p, riops, rbps = json.load(open(sys.argv[1])), float(sys.argv[2]), float(sys.argv[3])
if p["iops_limit"] > 1.3 * riops or p["bandwidth_gbps"] * 1e9 > 1.3 * rbps:
    sys.exit(f"cluster.sh: the throttle does not limit the reads: measured {p['iops_limit']:.0f} reads/s, "
             f"{p['bandwidth_gbps']:.3f} GB/s under a limit of {riops:.0f} reads/s, {rbps / 1e9:.3f} GB/s")
PY
fi

# One set of layouts: identity, clustered (no profile, as before) and clustered with each
# device's profile; cost model planned as the replay reads (O_DIRECT, the engine's caps).
# layouts SET BASE_MODEL [--shape-only]
layouts() {
  local set=$1 base=$2 shape=${3:-}
  mkdir -p "$WORK/$set"
  rm -rf "$WORK/$set/identity" "$WORK/$set"/clustered*
  cp -r "$base" "$WORK/$set/identity"
  for v in clustered $(for d in $DEVICES; do echo "clustered_$d"; done); do
    cp -r "$base" "$WORK/$set/$v"
    prof=(); [[ $v == clustered_* ]] && prof=(--io-profile "$WORK/profile_${v#clustered_}.json")
    "$BIN/cluster_experts" --routing "$WORK/train.bin" --evaluate "$WORK/heldout.bin" $shape \
      --model "$WORK/$set/$v" --method seriation --repack --json --io-direct "${prof[@]}" \
      ${SEARCH_MOVES:+--search-moves $SEARCH_MOVES} > "$WORK/$set/$v.json"
  done
}

# Cold reads: O_DIRECT through io_uring (1 ring, QD reads in flight), no host cache; every
# variant once per round, rounds interleaved.  replays SET [--shape-only]
replays() {
  local set=$1 shape=${2:-} dev r v
  for dev in $DEVICES; do
    local tokens=$REPLAY_TOKENS wrap=()
    if [[ $dev == emulated ]]; then tokens=$EMUL_TOKENS; wrap=(bash $THROTTLE "$RIOPS" "$RBPS" "$WORK" --); fi
    for r in $(seq "$ROUNDS"); do
      for v in identity clustered clustered+profile; do
        local model=$v prof=()
        if [[ $v == clustered+profile ]]; then model=clustered_$dev; prof=(--io-profile "$WORK/profile_$dev.json"); fi
        "${wrap[@]}" "$BIN/cluster_replay" --model "$WORK/$set/$model" --routing "$WORK/heldout.bin" $shape \
          --io uring --io-qd "$QD" --io-rings 1 --max-tokens "$tokens" "${prof[@]}" \
          > "$WORK/$set/replay_${dev}_${v}_$r.json" 2>> "$WORK/$set/replay.log"
      done
    done
  done
}

layouts demo $MODEL
replays demo
SETS=demo
# Optional: a synthetic stand-in of the same layers/experts/top-k with experts of another size
# (SYN_HIDDEN x SYN_FFN, q8), laid out from the same training trace, replaying the same trace.
if [[ -n "${SYNTHETIC:-}" ]]; then
  if [[ ! -f "$WORK/syn_base/model.json" ]]; then
    "$BIN/cluster_replay" --routing "$WORK/train.bin" --write-synthetic "$WORK/syn_base" \
      --hidden "${SYN_HIDDEN:-128}" --ffn "${SYN_FFN:-32}"
  fi
  layouts syn "$WORK/syn_base" --shape-only
  replays syn --shape-only
  SETS="demo syn"
fi

python3 - "$WORK" "$ROUNDS" "$DEVICES" "$SETS" "$RIOPS" "$RBPS" <<'PY'
import json, statistics, sys
work, rounds, devices, sets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
riops, rbps = float(sys.argv[5]), float(sys.argv[6])
VARIANTS = ("identity", "clustered", "clustered+profile")
summary = {"rounds": rounds, "riops": riops, "rbps": rbps, "profiles": {}, "sets": {}}
for dev in devices:
    p = json.load(open(f"{work}/profile_{dev}.json"))
    summary["profiles"][dev] = p
    print(f"profile {dev:9}: {p['op_latency_us']:.1f} us/op at QD 1, {p['iops_limit']:.0f} reads/s at QD "
          f"{p['queue_depth']:.0f}, {p['bandwidth_gbps']:.3f} GB/s")
for s in sets:
    c = json.load(open(f"{work}/{s}/clustered.json"))
    g = c["geometry"]
    print(f"\n[{s}] expert {g['expert_bytes']} B, stride {g['expert_stride']} B; modelled (default prices "
          f"{c['io_profile']['op_latency_us']:.0f} us/op, {c['io_profile']['bandwidth_gbps']:.2f} GB/s; "
          f"search {c['search']['moves']} moves):")
    print(f"{'trace':8} {'method':10} {'read ops/tok':>12} {'vs identity':>11} {'KiB/tok':>9} {'model us/tok':>12}")
    for trace in ("train", "heldout"):
        base = c[trace]["identity"]["read_ops_per_token"]
        for m in ("identity", "greedy", "chosen"):
            x = c[trace][m]
            print(f"{trace:8} {'seriation' if m == 'chosen' else m:10} {x['read_ops_per_token']:12.2f} "
                  f"{100*(x['read_ops_per_token']/base-1):+10.1f}% {x['bytes_per_token']/1024:9.1f} "
                  f"{x['modelled_us_per_token']:12.1f}")
    summary["sets"][s] = {"expert_bytes": g["expert_bytes"], "devices": {}}
    for dev in devices:
        runs = {v: [json.load(open(f"{work}/{s}/replay_{dev}_{v}_{r}.json")) for r in range(1, rounds + 1)]
                for v in VARIANTS}
        tokens = runs["identity"][0]["tokens"]
        print(f"[{s}] cold decode reads, {dev} device, held-out trace, {tokens} tokens, "
              f"median of {rounds} interleaved rounds:")
        print(f"  {'variant':18} {'us/token':>9} {'ops/tok':>8} {'KiB/tok':>8} {'speed-up':>9} "
              f"{'per-round min..max':>18}  runs us/token")
        out = {}
        for v in VARIANTS:
            us = [x["us_per_token"] for x in runs[v]]
            ratio = [i["us_per_token"] / x["us_per_token"] for i, x in zip(runs["identity"], runs[v])]
            out[v] = {"us_per_token_median": statistics.median(us), "us_per_token_runs": us,
                      "read_ops_per_token": runs[v][0]["read_ops_per_token"],
                      "bytes_per_token": runs[v][0]["bytes_per_token"],
                      "speedup_vs_identity_median": statistics.median(ratio), "speedup_runs": ratio}
            print(f"  {v:18} {statistics.median(us):9.1f} {runs[v][0]['read_ops_per_token']:8.2f} "
                  f"{runs[v][0]['bytes_per_token']/1024:8.1f} {statistics.median(ratio):8.2f}x "
                  f"{min(ratio):8.2f}..{max(ratio):.2f}x  {[round(x) for x in us]}")
        if dev == "emulated":
            best = max(out["clustered"]["speedup_vs_identity_median"], out["clustered+profile"]["speedup_vs_identity_median"])
            print(f"  goal (emulated {riops:.0f} IOPS / {rbps/1e6:.0f} MB/s): clustered >= 1.25x identity: "
                  f"{'met' if best >= 1.25 else 'NOT met'} ({best:.3f}x)")
        else:
            worst = out["clustered+profile"]["speedup_vs_identity_median"]
            print(f"  goal (raw device): clustered+profile never slower than identity: "
                  f"{'met' if worst >= 1.0 else 'NOT met'} (median {worst:.3f}x)")
        summary["sets"][s]["devices"][dev] = {"tokens": tokens, "variants": out}
    d = summary["sets"][s]["devices"]
    if "emulated" in d and "raw" in d:
        emu, raw = (d[k]["variants"]["identity"]["us_per_token_median"] for k in ("emulated", "raw"))
        if emu < 1.1 * raw:
            print(f"  note: identity reads {emu:.0f} us/token on the emulated volume and {raw:.0f} on the raw "
                  f"device: the throttle is not what limits them here (a slow or shared disk)")
json.dump(summary, open(f"{work}/cluster_iops.json", "w"), indent=1)
print(f"\nsummary: {work}/cluster_iops.json")
PY
