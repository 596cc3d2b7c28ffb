#!/usr/bin/env python3
"""The backward-adaptive basis on held-out genres: the default transform profile with and without it.

Writes a copy of the default model's calibrated profile with `"adapt_basis": {"prior_tokens": P,
"sweeps": J}`, scores every level of both on one item of each held-out suite (code, narrative,
meetings, inventory: context + its continuation, `eval --only-transform`, as corpus_probe.py) and
prints, pooled over the four items (continuation-token weighted KL), bits per value, KL and delta
PPL per level, the bits each needs at equal KL, and the codec's encode and decode seconds.

  python3 samples/profiles/adapt_probe.py [--cli build/dev/app/cli/kvscope-cli] [--work DIR] [--prior 500]
About 40 minutes on 2 loaded cores (the adaptive chain is coded by one thread per block); reruns reuse DIR.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_probe import ITEMS, ROOT, bits_at, pooled, write_item  # noqa: E402


def timing(paths, name):
    """Per level: encode and decode seconds summed over the items."""
    out = {}
    for p in paths:
        for r in json.load(open(p))["results"]:
            if (r["level_name"].split(":")[0] if ":" in r["level_name"] else "shipped") != name:
                continue
            e = out.setdefault(r["level"], [0.0, 0.0])
            e[0] += r.get("encode_s", 0.0)
            e[1] += r.get("decode_s", 0.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/dev/app/cli/kvscope-cli"))
    ap.add_argument("--work", default="/tmp/kvscope-adapt-probe")
    ap.add_argument("--profile", default=os.path.expanduser("~/.cache/kvscope/profiles/2b5d3154c5afb0c8.transform.json"))
    ap.add_argument("--prior", type=float, default=500.0)
    ap.add_argument("--sweeps", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    w = lambda *p: os.path.join(a.work, *p)  # noqa: E731
    name = "adapt%g" % a.prior
    prof = json.load(open(a.profile))
    prof["transform"]["adapt_basis"] = {"prior_tokens": a.prior, "sweeps": a.sweeps}
    json.dump(prof, open(w(name + ".json"), "w"))
    evals = []
    for genre, item in ITEMS.items():
        write_item(genre, item, w)
        out = w("eval_" + genre + ".json")
        if not os.path.exists(out) or os.path.getsize(out) == 0:
            with open(out, "w") as f:
                subprocess.run([a.cli, "eval", "--context", w(genre + ".txt"), "--codec", "transform", "--profile", a.profile,
                                "--transform-profile", w(name + ".json"), "--only-transform", "--no-text", "--json",
                                "--threads", "1"], check=True, stdout=f, stderr=subprocess.DEVNULL)
        evals.append(out)
    curves = {n: pooled(evals, n) for n in ("shipped", name)}
    times = {n: timing(evals, n) for n in curves}
    print("pooled over", ", ".join(f"{g} ({i})" for g, i in ITEMS.items()))
    for n, c in curves.items():
        print(f"  {n:9s}", "  ".join(f"L{lv} {b:.3f} b/v KL {k:.4f} dPPL {d:+.2f}%" for lv, b, k, d in c))
        print(f"  {'':9s}", "  ".join(f"L{lv} enc {e:.1f} s dec {d:.1f} s" for lv, (e, d) in sorted(times[n].items())))
    for kl in (0.01, 0.007, 0.005, 0.0035, 0.0025, 0.0015):
        s, x = bits_at(curves["shipped"], kl), bits_at(curves[name], kl)
        if s and x:
            print(f"  at KL {kl}: calibrated {s:.3f}, adaptive {x:.3f} bits/value ({(x / s - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
