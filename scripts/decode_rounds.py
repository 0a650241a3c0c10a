"""The decode rounds of the device_gpu_* scripts: each run's `infer --stats-json` is
OUT/MODE.ROUND.json; per mode the decode tok/s of every round, their median, and the last run's
phase times and GPU counters. Imported by the scripts' summaries (sys.path has scripts/)."""
import json
import statistics


def runs_of(out, mode, rounds):
    """The stats of MODE's rounds 1..rounds that wrote their JSON (a failed run writes none)."""
    runs = []
    for r in range(1, rounds + 1):
        try:
            runs.append(json.load(open(f"{out}/{mode}.{r}.json")))
        except OSError:
            pass
    return runs


def print_medians(out, rounds, modes, gpu_keys, prefill=False):
    """Prints one line per mode (decode tok/s per round and median; the last run's prefill tok/s
    with `prefill`, its phases_s and the gpu_cache counters named in gpu_keys) and returns
    {mode: median decode tok/s} of the modes that ran."""
    width = max(len(m) for m in modes) + 1
    med = {}
    for mode in modes:
        runs = runs_of(out, mode, rounds)
        if not runs:
            print(f"{mode}: no run")
            continue
        tps = [x["decode"]["tokens_per_s"] for x in runs]
        med[mode] = statistics.median(tps)
        d = runs[-1]["decode"]
        g = d.get("gpu_cache", {})
        line = f"{mode:{width}s} decode tok/s {' '.join(f'{t:.1f}' for t in tps)} (median {med[mode]:.1f});"
        if prefill:
            line += f" prefill {runs[-1]['prefill']['tokens_per_s']:.0f} tok/s;"
        line += (f" last run phases_s {json.dumps({k: round(v, 3) for k, v in d['phases_s'].items()})};"
                 f" gpu {json.dumps({k: g.get(k) for k in gpu_keys})}")
        print(line)
    return med
