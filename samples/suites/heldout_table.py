#!/usr/bin/env python3
"""Writes docs/results/iso_quality.md from the runs of samples/suites/heldout.sh.

    python3 samples/suites/heldout_table.py OUT_DIR GENRE... [--page docs/results/iso_quality.md]
        [--profile P] [--script samples/suites/heldout.sh]

Per genre, every row as `eval --suite` measured it, with the verdict `eval` computed
(core/eval/suite.h isoQuality: |pooled delta PPL| <= 1 %, accuracy >= fp16 - 2 points, McNemar
p >= 0.05). Then the rows pooled over the genres: accuracy over all questions, McNemar on the
summed discordant pairs, delta PPL and KL over all continuation tokens; the pooled verdict applies
the same rule with the thresholds the runs report in their "iso_quality" block.

Level choice, two ways:
  - every genre: the smallest transform level that passes on each held-out genre (the profile's
    default_level);
  - leave one genre out: for each genre G, the smallest level passing on all the other genres,
    judged on G (what a user gets on a genre nobody measured).
With --profile P (the shipped transform ladder), also writes into P what the `transform` rows
measured: per transform level "measured" (bits/value, x int8, pooled KL, the genres it passes on; the streamer's
planner reads mean_kl) and "default_level" = the smallest level that passes on every genre.
--script names the script that measured the rows (heldout_gemma.sh for Gemma 3's) in the page and in
"measured".
Standard library only.
"""
import json
import math
import os
import sys

# transform: the shipped ladder as it ships (per-cache means on, "adapt_mean": true, their side
# bytes counted); transform_hi: more levels of it measured by a later run (same rows, same keys).
# transform_nomean(_hi): the same ladder with adapt_mean off (what it shipped as before).
# transform_uniform(_hi): the ladder before its per-layer shape (every layer of a kind at the same
# water level), kept as the comparison the layer shape is judged against.
# transform_grouped: a calibrated profile of the ladder with "layer_group" set (one PCA across
# adjacent layers), run with TRANSFORM_GROUPED_PROFILE.
FAMILIES = ["baselines", "cachegen", "tuned", "transform", "transform_hi", "transform_nomean", "transform_nomean_hi",
            "transform_uniform", "transform_uniform_hi", "transform_grouped"]
# Rows of one family that continue another (more levels of the same ladder).
SAME_AS = {"transform_hi": "transform", "transform_nomean_hi": "transform_nomean",
           "transform_uniform_hi": "transform_uniform"}


def mcnemar_p(b, c):
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def family_rank(family):
    """Where a family's rows go in the tables: the named families in FAMILIES order, then the
    variants (ROWS=variant in heldout.sh) by name."""
    base = SAME_AS.get(family, family)
    return FAMILIES.index(base) if base in FAMILIES else len(FAMILIES)


def row_key(family, r):
    if family.startswith("variant-"):
        return ("transform, " + family[len("variant-"):].replace("_", " "), r["level"])
    if family == "tuned":
        return ("cachegen tuned", r["level"])
    if SAME_AS.get(family, family) == "transform_uniform":
        return ("transform, uniform layers", r["level"])
    if SAME_AS.get(family, family) == "transform_nomean":
        return ("transform, no per-cache means", r["level"])
    if family == "transform_grouped":
        return ("transform, layer groups", r["level"])
    return (r["codec"], r["level"])


def load(out, genres):
    runs = {}
    for g in genres:
        variants = sorted(n[len(g) + 1:-len(".json")] for n in os.listdir(out)
                          if n.startswith(f"{g}.variant-") and n.endswith(".json"))
        for f in FAMILIES + variants:
            p = os.path.join(out, f"{g}.{f}.json")
            if os.path.exists(p):
                runs[(g, f)] = json.load(open(p))
    return runs


def fmt(x, spec):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def cell(s):
    return str(s).replace("|", "\\|")


def ci(v):
    if not v or v[0] is None:
        return ""
    return f" [{v[0]:.2f}, {v[1]:.2f}]"


def ladder_note(out):
    """What the page says about the transform ladder: OUT_DIR/ladder.txt when the runs used another
    ladder than the default model's shipped one."""
    notes = ""
    for n in sorted(os.listdir(out)):
        if n.startswith("variant-") and n.endswith(".txt"):
            label = "transform, " + n[len("variant-"):-len(".txt")].replace("_", " ")
            notes += f" `{label}`: " + " ".join(open(os.path.join(out, n)).read().split())
        elif n.startswith("note-") and n.endswith(".txt"):
            # A row family measured later than the page's date says when and with what (note-<family>.txt).
            notes += " " + " ".join(open(os.path.join(out, n)).read().split())
    path = os.path.join(out, "ladder.txt")
    if os.path.exists(path):
        return " ".join(open(path).read().split()) + notes
    return ("The transform codec is calibrated on `technical_note` and `long_4k` "
            "(samples/contexts); its per-layer water levels come from sensitivities measured on the same two "
            "contexts (samples/profiles/make_ladder.py) and its levels are fixed multipliers of one base level: "
            "none of these genres was seen by the calibration or the ladder. `transform, uniform layers` is "
            "the ladder before the per-layer shape (every layer of a kind at one water level; levels 1-5 at "
            "keys t = 0.1, 0.05, 0.025, 0.012, 0.006, values 10x finer). The `transform` rows code with "
            "per-cache means (`adapt_mean`, as the ladder ships: the cache's means replace the calibrated ones "
            "and count in the size); `transform, no per-cache means` is the same ladder without them. "
            "`transform, layer groups` is the same ladder with `\"layer_group\": 5` (one PCA, water level and "
            "symbol stream across 5 adjacent layers, docs/transform.md#layer-groups-layer_group-g), calibrated "
            "on the same two contexts by `kvscope-cli calibrate --codec transform --layer-group 5` (levels 3 and 4 on every genre, "
            "measured 2026-12-04 with the CLI of commit 2a7b499 at load average about 9, "
            "`ROWS=transform_grouped TRANSFORM_GROUPED_LEVELS=3,4 TRANSFORM_GROUPED_PROFILE=... sh samples/suites/heldout.sh`).") + notes


def main():
    args = sys.argv[1:]
    page = "docs/results/iso_quality.md"
    profile = None
    script = "samples/suites/heldout.sh"
    for opt in ("--page", "--profile", "--script"):
        if opt in args:
            i = args.index(opt)
            if opt == "--page":
                page = args[i + 1]
            elif opt == "--profile":
                profile = args[i + 1]
            else:
                script = args[i + 1]
            del args[i:i + 2]
    out, genres = args[0], args[1:]
    runs = load(out, genres)
    machine = json.load(open(os.path.join(out, "machine.json"))) if os.path.exists(os.path.join(out, "machine.json")) else {}
    iso = next((r["iso_quality"] for r in runs.values()), {})
    max_ppl = iso.get("max_abs_delta_ppl_pct", 1.0)
    max_drop = iso.get("max_accuracy_drop", 0.02)
    alpha = iso.get("mcnemar_alpha", 0.05)

    lines = ["# Iso-quality on held-out genres", ""]
    lines.append(f"Generated by `sh {script}` (rows) and `samples/suites/heldout_table.py` (this page); "
                 "do not edit by hand.")
    lines.append("")
    if machine:
        lines.append(f"Measured {machine.get('date')} at commit `{machine.get('commit')}` on {machine.get('cpu')}, "
                     f"{machine.get('cores')} cores, load average {machine.get('load_average'):.2f} at the start.")
        lines.append("")
    lines.append(f"Model: {next((r['model'] for r in runs.values()), '?')}. Rule ({iso.get('rule', 'iso-quality')}): "
                 f"a row passes when |pooled delta PPL| <= {max_ppl:g} %, accuracy >= fp16 - {100 * max_drop:g} points and "
                 f"McNemar p >= {alpha:g}. " + ladder_note(out))
    lines.append("")

    # rows[(codec, level)][genre] = row json
    rows, order, fp16 = {}, [], {}
    for (g, f), run in runs.items():
        fp16[g] = (run["fp16"], run["questions"], run["continuation_tokens"])
        for r in run["results"]:
            if r["codec"] == "fp16":
                continue
            k = row_key(f, r)
            if k not in rows:
                rows[k] = {}
                order.append((family_rank(f), k))
            rows[k][g] = r
    order.sort(key=lambda x: (x[0], x[1][0], x[1][1]))
    keys = [k for _, k in order]

    header = ("| codec | level | bits/value | x int8 | accuracy [95% CI] | McNemar p | delta PPL % [95% CI] | KL | "
              "dLL [95% CI] | passes |")
    sep = "|---|---|---|---|---|---|---|---|---|---|"
    for g in genres:
        if g not in fp16:
            continue
        f, q, t = fp16[g]
        lines += [f"## {g}", "", f"{q} questions, {t} continuation tokens; fp16 accuracy {f['accuracy']:.3f}"
                  f"{ci(f['accuracy_ci'])}.", "", header, sep]
        for k in keys:
            r = rows[k].get(g)
            if not r:
                continue
            lines.append(f"| {k[0]} | {k[1]} | {r['bits_per_value']:.2f} | {r['ratio_vs_int8']:.2f} | "
                         f"{fmt(r['accuracy'], '.3f')}{ci(r['accuracy_ci'])} | {r['mcnemar_p']:.3f} | "
                         f"{fmt(r['delta_ppl_pct'], '+.2f')}{ci(r['delta_ppl_pct_ci'])} | {fmt(r['kl'], '.4f')} | "
                         f"{fmt(r['answer_logprob_delta'], '+.3f')}{ci(r.get('answer_logprob_delta_ci'))} | {'yes' if r['meets_iso_quality'] else 'no: ' + cell(r.get('iso_quality_fails', ''))} |")
        lines.append("")

    # Pooled over the genres that have every row.
    have = [g for g in genres if g in fp16]
    if len(have) > 1:
        Q = sum(fp16[g][1] for g in have)
        T = sum(fp16[g][2] for g in have)
        acc0 = sum(fp16[g][0]["accuracy"] * fp16[g][1] for g in have) / Q
        nll0 = sum(math.log(fp16[g][0]["ppl"]) * fp16[g][2] for g in have) / T
        lines += [f"## Pooled over {', '.join(have)}", "",
                  f"{Q} questions, {T} continuation tokens; fp16 accuracy {acc0:.3f}.", "",
                  "| codec | level | bits/value | x int8 | accuracy | McNemar p | delta PPL % | KL | passes pooled | passes on every genre |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for k in keys:
            rs = [rows[k].get(g) for g in have]
            if any(r is None for r in rs):
                continue
            acc = sum(r["accuracy"] * fp16[g][1] for r, g in zip(rs, have)) / Q
            b = sum(r["mcnemar_b"] for r in rs)
            c = sum(r["mcnemar_c"] for r in rs)
            p = mcnemar_p(b, c)
            nll = sum(math.log(r["ppl"]) * fp16[g][2] for r, g in zip(rs, have)) / T
            dppl = 100 * (math.exp(nll - nll0) - 1)
            kl = sum(r["kl"] * fp16[g][2] for r, g in zip(rs, have)) / T
            bits = sum(r["bytes"] for r in rs) * 8 / sum(r["bytes"] * 8 / r["bits_per_value"] for r in rs)
            xint8 = sum(r["bytes"] * r["ratio_vs_int8"] for r in rs) / sum(r["bytes"] for r in rs)
            pooled = abs(dppl) <= max_ppl and acc >= acc0 - max_drop - 1e-12 and not p < alpha
            every = all(r["meets_iso_quality"] for r in rs)
            rows[k]["_pooled"] = pooled
            rows[k]["_every"] = every
            rows[k]["_bits"] = bits
            rows[k]["_xint8"] = xint8
            lines.append(f"| {k[0]} | {k[1]} | {bits:.2f} | {xint8:.2f} | {acc:.3f} | {p:.3f} | {dppl:+.2f} | {kl:.4f} | "
                         f"{'yes' if pooled else 'no'} | {'yes' if every else 'no'} |")
        lines.append("")

        lines += ["## Level choice", ""]
        for codec in sorted({k[0] for k in keys}):
            ks = sorted([k for k in keys if k[0] == codec and "_every" in rows[k]], key=lambda k: rows[k]["_bits"])
            if not ks:
                continue
            every = next((k for k in ks if rows[k]["_every"]), None)
            pooled = next((k for k in ks if rows[k]["_pooled"]), None)
            lines.append(f"- **{codec}**: smallest level passing on every genre: "
                         + (f"level {every[1]}, {rows[every]['_bits']:.2f} bits/value, {rows[every]['_xint8']:.2f}x smaller than int8"
                            if every else "none")
                         + "; smallest passing pooled: "
                         + (f"level {pooled[1]}, {rows[pooled]['_bits']:.2f} bits/value, {rows[pooled]['_xint8']:.2f}x" if pooled else "none")
                         + ".")
            # Leave one genre out: choose on the others, judge on the one left out.
            logo = []
            for g in have:
                others = [h for h in have if h != g]
                pick = next((k for k in ks if all(rows[k][h]["meets_iso_quality"] for h in others)), None)
                if pick is None:
                    logo.append(f"{g}: no level passes on the others")
                else:
                    r = rows[pick][g]
                    logo.append(f"{g}: level {pick[1]} ({r['bits_per_value']:.2f} bits, {r['ratio_vs_int8']:.2f}x) "
                                f"{'passes' if r['meets_iso_quality'] else 'fails (' + r.get('iso_quality_fails', '') + ')'}")
            lines.append("  - leave one genre out (chosen on the others, judged on the one named): " + "; ".join(logo) + ".")
        lines.append("")

    # Where the accuracy goes: per question kind (the suites tag each question), pooled over the
    # genres, accuracy of each transform level minus fp16's on the same questions.
    kinds = {}
    for k in keys:
        if k[0] != "transform":
            continue
        for g, r in rows[k].items():
            if g.startswith("_"):
                continue
            for name, s in r.get("kinds", {}).items():
                e = kinds.setdefault(name, {}).setdefault(k[1], [0, 0, 0])
                e[0] += s["questions"]
                e[1] += round(s["accuracy"] * s["questions"])
                e[2] += round(s["fp16_accuracy"] * s["questions"])
    if kinds:
        levels = sorted({l for v in kinds.values() for l in v})
        lines += ["## Where accuracy is lost (transform, per question kind, pooled)", "",
                  "Accuracy of each level minus fp16's on the same questions, in points; n = questions of that kind.", "",
                  "| kind | n | fp16 | " + " | ".join(f"level {l}" for l in levels) + " |",
                  "|---|---|---|" + "---|" * len(levels)]
        for name in sorted(kinds):
            v = kinds[name]
            n = next(iter(v.values()))[0]
            f0 = next(iter(v.values()))[2] / n if n else 0
            cells = [f"{100 * (v[l][1] - v[l][2]) / v[l][0]:+.1f}" if l in v and v[l][0] else "-" for l in levels]
            lines.append(f"| {name} | {n} | {f0:.3f} | " + " | ".join(cells) + " |")
        lines.append("")

    if profile and len(have) > 1:
        p = json.load(open(profile))
        levels = p["transform"]["levels"]
        for lv in levels:
            lv.pop("measured", None)
        passing = []
        for k in keys:
            if k[0] != "transform" or "_every" not in rows[k] or not 1 <= k[1] <= len(levels):
                continue
            rs = [rows[k][g] for g in have]
            T = sum(fp16[g][2] for g in have)
            levels[k[1] - 1]["measured"] = {
                "source": script + " on " + ", ".join(have),
                "bits_per_value": round(rows[k]["_bits"], 4),
                "ratio_vs_int8": round(rows[k]["_xint8"], 4),
                "mean_kl": round(sum(r["kl"] * fp16[g][2] for r, g in zip(rs, have)) / T, 6),
                "passes_on": [g for g, r in zip(have, rs) if r["meets_iso_quality"]],
                "passes_pooled": rows[k]["_pooled"]}
            if rows[k]["_every"]:
                passing.append(k[1])
        if passing:
            p["transform"]["default_level"] = min(passing)
        tmp = profile + ".tmp"
        with open(tmp, "w") as f:
            json.dump(p, f, indent=1)
            f.write("\n")
        os.replace(tmp, profile)
        print(f"wrote {profile}: default_level {p['transform']['default_level']}", file=sys.stderr)

    os.makedirs(os.path.dirname(page) or ".", exist_ok=True)
    tmp = page + ".tmp"
    open(tmp, "w").write("\n".join(lines))
    os.replace(tmp, page)
    print(f"wrote {page}", file=sys.stderr)


if __name__ == "__main__":
    main()
