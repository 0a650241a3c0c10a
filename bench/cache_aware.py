#!/usr/bin/env python3
"""Cache-aware routing on a packed model (--model, the demo by default): for each host-cache budget
(O_DIRECT) and tolerance, decode miss rate, read bytes per token and tokens/s, perplexity and
routing agreement; prints a markdown table. Every run starts from an empty host cache (a new
process, O_DIRECT reads).

Perplexity runs with --batch 1 so every token is routed against the residency decode would see
(see docs/cache_aware.md); its miss rate and agreement are over all (token, layer, slot) choices.
"""
import argparse, json, os, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/bin")
ap.add_argument("--model", default="models/demo")
ap.add_argument("--budgets-mb", default="4,8", help="host cache sizes, MiB")
ap.add_argument("--tolerances", default="0,0.05,0.10,0.20")
ap.add_argument("--ppl-chars", type=int, default=6000, help="slice of heldout.txt for perplexity")
ap.add_argument("--ctx", type=int, default=256)
ap.add_argument("--prompt-chars", type=int, default=300)
ap.add_argument("--n-decode", type=int, default=128)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--out", default=None, help="directory for the runs' JSON (default: a temp dir)")
a = ap.parse_args()

out = a.out or tempfile.mkdtemp(prefix="cache_aware_")
os.makedirs(out, exist_ok=True)
held = open(os.path.join(a.model, "heldout.txt"), encoding="utf-8").read()
ppl_file = os.path.join(out, "ppl_slice.txt")
open(ppl_file, "w", encoding="utf-8").write(held[: a.ppl_chars])
prompt = held[a.ppl_chars : a.ppl_chars + a.prompt_chars]  # text the perplexity slice does not hold

layer = os.path.join(a.model, "experts", "layer_000.bin")
cfg = json.load(open(os.path.join(a.model, "model.json")))
n_total = cfg["n_layers"] * cfg["n_experts"]
slot = (os.path.getsize(layer) - 4096) // cfg["n_experts"]  # 4 KiB header, 4 KiB-aligned slots


def infer(name, extra):
    js = os.path.join(out, name + ".json")
    cmd = [os.path.join(a.bin, "infer"), "-m", a.model, "-t", str(a.threads), "--io-direct",
           "--stats-json", js] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return json.load(open(js))


rows = []
for mb in [int(x) for x in a.budgets_mb.split(",")]:
    frac = min(1.0, (mb << 20) // slot / n_total)
    base = None
    for tol in [float(x) for x in a.tolerances.split(",")]:
        flags = ["--host-cache-mb", str(mb), "--cache-aware", "--cache-tolerance", str(tol)]
        g = infer(f"gen_{mb}_{tol}", flags + ["-p", prompt, "-n", str(a.n_decode), "--temp", "0",
                                               "--ignore-eos", "--print-ids"])
        p = infer(f"ppl_{mb}_{tol}", flags + ["--perplexity", ppl_file, "--ctx", str(a.ctx),
                                               "--stride", str(a.ctx), "--batch", "1"])
        d, ca = g["decode"], g["decode"]["cache_aware"]
        pc = p["perplexity"]["cache_aware"]
        r = dict(mb=mb, frac=frac, tol=tol,
                 miss=ca["misses_after"] / ca["slots"],
                 miss_before=ca["misses_before"] / ca["slots"],
                 bytes_tok=g["decode_experts"]["bytes_read_per_token"],
                 tps=d["tokens_per_s"], subs_tok=ca["substitutions_per_token"],
                 ppl=p["perplexity"]["perplexity"],
                 ppl_miss=pc["misses_after"] / pc["slots"], agree=pc["agreement"],
                 agree_dec=ca["agreement"])
        if base is None:
            base = r
        r["miss_red"] = 1 - r["ppl_miss"] / base["ppl_miss"] if base["ppl_miss"] else 0.0
        r["ppl_inc"] = r["ppl"] / base["ppl"] - 1
        rows.append(r)
        print(f"# done {mb} MiB tol {tol}", file=sys.stderr)

print(f"{a.model}: {n_total} experts of {slot} B; ppl slice {a.ppl_chars} chars of heldout.txt, "
      f"ctx {a.ctx}, --batch 1; decode {a.n_decode} greedy tokens after a {a.prompt_chars}-char "
      f"prompt; O_DIRECT; {a.threads} threads; JSON in {out}\n")
print("| host cache | tolerance | decode miss rate | decode MiB read/token | decode tok/s | "
      "subs/token | ppl-run miss rate | misses vs tol 0 | perplexity | ppl vs tol 0 | "
      "agreement (ppl run) | agreement (decode) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['mb']} MiB ({r['frac']:.0%}) | {r['tol']:.2f} | {r['miss']:.3f} | "
          f"{r['bytes_tok'] / 2**20:.3f} | {r['tps']:.1f} | {r['subs_tok']:.2f} | "
          f"{r['ppl_miss']:.3f} | {-r['miss_red']:+.1%} | {r['ppl']:.4f} | {r['ppl_inc']:+.2%} | "
          f"{r['agree']:.4f} | {r['agree_dec']:.4f} |")
