#!/usr/bin/env python3
"""Do fp16 recent tokens (KVTC keeps the last 128) pay on held-out genres? A screen on four items.

Copies the default model's calibrated transform profile (the one `--codec transform` caches in
~/.cache/kvscope/profiles/) with "recent_tokens" set to each of --recent (no refit: the fit never
reads it), scores every level of every copy on one item of each held-out suite (code, narrative,
meetings, inventory: context + its continuation, `eval --only-transform`, one process per item so
the four copies share the fp16 reference), and prints, pooled over the four items:
- per level and copy: bits per value (weighted by the items' tokens), KL (weighted by continuation
  tokens) and delta PPL (the token-weighted mean log-PPL ratio);
- each copy's levels against the first copy's level curve at the same bits (ln KL and delta PPL
  interpolated linearly in bits): a lower KL at the same level is not a gain if it costs more bits;
- each copy's KL over the first's at the same level: what the fp16 tokens buy before their cost,
  an upper bound for any finer coding of the same tokens.

  python3 samples/profiles/recent_probe.py [--profile P.json] [--recent 0,16,64,128] [--cli CLI] [--work DIR]
About 5 minutes of CPU (four evaluations of 28 codecs, about 70 s each); reruns reuse DIR.
"""
import argparse
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_probe import ITEMS, ROOT, write_item  # noqa: E402


def cached_profile():
    fp = json.load(open(os.path.join(ROOT, "samples/profiles/smollm2-135m-instruct.transform.json")))["model_fingerprint"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "kvscope/profiles", fp + ".transform.json")


def pooled(evals):
    """{copy: {level: (bits, kl, delta_ppl_pct)}} over the items."""
    acc = {}
    for path in evals:
        d = json.load(open(path))
        T, n = d["num_tokens"], d["continuation_tokens"]
        for r in d["results"]:
            name = r["level_name"]
            copy = name.split(":")[0] if name.startswith("recent") else "first"
            fp16_ppl = r["ppl"] / (1 + r["delta_ppl_pct"] / 100)
            e = acc.setdefault(copy, {}).setdefault(r["level"], [0.0, 0, 0.0, 0.0, 0])
            e[0] += T * r["bits_per_value"]
            e[1] += T
            e[2] += n * r["kl"]
            e[3] += n * math.log(r["ppl"] / fp16_ppl)
            e[4] += n
    return {c: {lv: (e[0] / e[1], e[2] / e[4], 100 * (math.exp(e[3] / e[4]) - 1)) for lv, e in lvs.items()}
            for c, lvs in acc.items()}


def interp(x, xs, ys):
    for (x1, y1), (x2, y2) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x1 <= x <= x2:
            return y1 + (y2 - y1) * (x - x1) / (x2 - x1) if x2 > x1 else y1
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=cached_profile(), help="a calibrated transform profile")
    ap.add_argument("--recent", default="0,16,64,128")
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/dev/app/cli/kvscope-cli"))
    ap.add_argument("--work", default="/tmp/kvscope-recent-probe")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    w = lambda *p: os.path.join(a.work, *p)  # noqa: E731
    recent = [int(x) for x in a.recent.split(",")]
    prof = json.load(open(a.profile))
    paths = []
    for r in recent:
        prof["transform"]["recent_tokens"] = r
        paths.append(w(f"recent{r}.json"))
        json.dump(prof, open(paths[-1], "w"))
    evals = []
    for genre, item in ITEMS.items():
        write_item(genre, item, w)
        out = w("eval_" + genre + ".json")
        if not os.path.exists(out):
            cmd = [a.cli, "eval", "--context", w(genre + ".txt"), "--codec", "transform", "--profile", paths[0]]
            for p in paths[1:]:
                cmd += ["--transform-profile", p]
            cmd += ["--only-transform", "--no-text", "--json", "--threads", "1"]
            with open(out + ".tmp", "w") as f:
                subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.DEVNULL)
            os.replace(out + ".tmp", out)
        evals.append(out)
    pool = pooled(evals)
    names = ["first"] + [f"recent{r}" for r in recent[1:]]
    label = {n: f"recent {r}" for n, r in zip(names, recent)}
    levels = sorted(pool["first"])
    print("pooled over", ", ".join(f"{g} ({i})" for g, i in ITEMS.items()))
    print("| level | " + " | ".join(f"{label[n]}: bits/value, KL, delta PPL" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for lv in levels:
        print(f"| {lv} | " + " | ".join("%.3f, %.4f, %+.2f %%" % pool[n][lv] for n in names) + " |")
    base = pool["first"]
    bb = [base[lv][0] for lv in levels]
    print(f"\n| copy | level | bits/value | KL | {label['first']} at these bits: KL | KL ratio | delta PPL | "
          f"{label['first']} at these bits: delta PPL |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names[1:]:
        for lv in levels:
            b, kl, dp = pool[n][lv]
            lk = interp(b, bb, [math.log(base[x][1]) for x in levels])
            if lk is None:
                continue
            ip = interp(b, bb, [base[x][2] for x in levels])
            print(f"| {label[n]} | {lv} | {b:.3f} | {kl:.4f} | {math.exp(lk):.4f} | {kl / math.exp(lk):.2f} | "
                  f"{dp:+.2f} % | {ip:+.2f} % |")
    print(f"\nKL over {label['first']}'s at the same level:")
    for n in names[1:]:
        print(f"  {label[n]}: " + ", ".join(f"L{lv} {pool[n][lv][1] / base[lv][1]:.2f}" for lv in levels))


if __name__ == "__main__":
    main()
