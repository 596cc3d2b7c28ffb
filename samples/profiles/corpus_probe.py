#!/usr/bin/env python3
"""Does a wider calibration corpus help on held-out genres? The shipped ladder calibrated two ways.

Calibrates the default model's shipped transform ladder on the shipped corpus (technical_note,
long_4k) and on that corpus plus more texts (--extra: by default the three written for this probe,
samples/profiles/corpus/*.txt: a science explainer, a help-desk FAQ, a set of tenancy terms; none
of the held-out genres), then scores every level of both on one item of each held-out suite
(code, narrative, meetings, inventory: context + its continuation, `eval --only-transform`) and
prints, pooled over the four items (continuation-token weighted KL), bits per value, KL and delta
PPL per level and the bits each needs at equal KL (ln KL interpolated linearly in bits).

  python3 samples/profiles/corpus_probe.py [--cli build/dev/app/cli/kvscope-cli] [--work DIR]
About 20 minutes on 2 idle cores (captures, two calibrations, eight evaluations); reruns reuse DIR.
"""
import argparse
import glob
import json
import math
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ITEMS = {"code": "feirkse-605", "narrative": "hasstead-705", "meetings": "brindford-405", "inventory": "drusstead-505"}


def run(cmd, out=None):
    with open(out, "w") if out else open(os.devnull, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.DEVNULL)


def write_item(genre, item, w):
    """The held-out item's context and continuation as w(genre + ".txt") and w(genre + ".continuation.txt")."""
    suite = json.load(open(os.path.join(ROOT, "samples/suites", genre + ".json")))
    it = next(x for x in suite["items"] if x["id"] == item)
    open(w(genre + ".txt"), "w").write(it["context"])
    open(w(genre + ".continuation.txt"), "w").write(it["continuation"])


def capture(cli, text, h5):
    if not os.path.exists(h5):
        run([cli, "capture", "--context", text, "--out", h5, "--threads", "1"])
    return h5


def pooled(paths, name):
    rows = {}
    for p in paths:
        d = json.load(open(p))
        n = d["continuation_tokens"]
        for r in d["results"]:
            if (r["level_name"].split(":")[0] if ":" in r["level_name"] else "shipped") != name:
                continue
            e = rows.setdefault(r["level"], [0.0, 0.0, 0.0, 0, 0])
            e[0] += r["bits_per_value"]
            e[1] += n * r["kl"]
            e[2] += n * r["delta_ppl_pct"]
            e[3] += n
            e[4] += 1
    return [(lv, e[0] / e[4], e[1] / e[3], e[2] / e[3]) for lv, e in sorted(rows.items())]


def bits_at(curve, kl):
    pts = sorted(curve, key=lambda r: -r[2])
    for (_, b1, k1, _), (_, b2, k2, _) in zip(pts, pts[1:]):
        if k1 >= kl >= k2 > 0:
            w = (math.log(k1) - math.log(kl)) / (math.log(k1) - math.log(k2)) if k1 > k2 else 0.0
            return b1 + w * (b2 - b1)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/dev/app/cli/kvscope-cli"))
    ap.add_argument("--work", default="/tmp/kvscope-corpus-probe")
    ap.add_argument("--extra", default=",".join(sorted(glob.glob(os.path.join(ROOT, "samples/profiles/corpus/*.txt")))))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    w = lambda *p: os.path.join(a.work, *p)  # noqa: E731
    ladder = os.path.join(ROOT, "samples/profiles/smollm2-135m-instruct.transform.json")
    shipped = [capture(a.cli, c, w(c + ".h5")) for c in ("technical_note", "long_4k")]
    extra = [capture(a.cli, t, w(os.path.basename(t)[:-4] + ".h5")) for t in a.extra.split(",") if t]
    for name, kvs in (("shipped", shipped), ("wider", shipped + extra)):
        if not os.path.exists(w(name + ".json")):
            run([a.cli, "calibrate", "--codec", "transform", *kvs, "--profile", ladder, "--out", w(name + ".json")])
    evals = []
    for genre, item in ITEMS.items():
        write_item(genre, item, w)
        out = w("eval_" + genre + ".json")
        if not os.path.exists(out):
            run([a.cli, "eval", "--context", w(genre + ".txt"), "--codec", "transform", "--profile", w("shipped.json"),
                 "--transform-profile", w("wider.json"), "--only-transform", "--no-text", "--json", "--threads", "1"], out)
        evals.append(out)
    curves = {n: pooled(evals, n) for n in ("shipped", "wider")}
    print("pooled over", ", ".join(f"{g} ({i})" for g, i in ITEMS.items()))
    for n, c in curves.items():
        print(f"  {n:8s}", "  ".join(f"L{lv} {b:.3f} b/v KL {k:.4f} dPPL {d:+.2f}%" for lv, b, k, d in c))
    for kl in (0.01, 0.007, 0.005, 0.0035, 0.0025):
        s, x = bits_at(curves["shipped"], kl), bits_at(curves["wider"], kl)
        if s and x:
            print(f"  at KL {kl}: shipped {s:.3f}, wider {x:.3f} bits/value ({(x / s - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
