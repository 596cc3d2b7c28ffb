#!/usr/bin/env python3
"""Give a shipped transform ladder per-layer water levels from measured layer sensitivities.

    python3 samples/profiles/make_ladder.py LADDER SENSITIVITY [--levels K:V,...] [--out FILE]

LADDER       a shipped ladder (samples/profiles/<model>.transform.json); its levels are replaced
SENSITIVITY  the JSON printed by `kvscope-cli tune --codec transform --exponents A --multipliers 1
             --json`: its first level's key_layer_scale and value_layer_scale are the per-layer
             factors the tuner derived from its "sensitivity" list (eval/tune_transform.cpp,
             transformLevelFor; A = how far to follow the sensitivities, 1 = the theory), and
             every level made here takes them
--levels     key:value relative water levels, coarsest first (default: the ladder's own)
--multipliers M,...  instead of --levels: the levels K*m:V*m for one --base K:V (default: the
             key_theta:value_theta of the tune output's first level, which the tuner balanced
             between keys and values by the same sensitivities)
--floor F or K:V  the scales and the base level that `tune --sensitivity-floor F` would have given,
             derived from the tune output's sensitivity list without a new probe: every s_u is
             raised to F x the largest s_u (keys to K x, values to V x, for a floor per kind), as
             the tuner does (eval/tune_transform.cpp, measureSensitivity). F must not be below the
             floor the tune output was measured at (its "sensitivity_floor", 1e-3 when absent):
             what that floor clamped is not known below it. Exponent 1 only.

Why: at one water level every layer of a kind gets the same distortion, but one unit of
distortion does not cost the same everywhere. Measured on SmolLM2-135M (docs/transform.md), the
values of layer 0 cost about 1000x more KL per unit than those of the last twenty layers, because
an error in layer 0 travels through every layer after it. Minimising the rate under a KL budget
gives water levels inversely proportional to the sensitivity (eval/tune_transform.h, step 3):
theta_l ~ 1 / s_l. The tuner normalises the scales to a geometric mean of 1 per kind, so a level's
key_theta and value_theta keep their meaning (the mean level) and the ladder stays a ladder of
two numbers per level.

The sensitivities are a property of the model, measured on the calibration contexts
(technical_note, long_4k), never on a quality suite, so nothing of the held-out genres leaks in.
"""
import argparse
import json
import math
import sys


def refloor(tune, layers, floor):
    """The first level's per-layer scales and key/value thetas at another sensitivity floor.

    With exponent 1 the tuner sets theta_u = m kappa / s_u (tune_transform.h, step 3), so a kind's
    scales are (1 / s_u) over their geometric mean, t_key x t_value = m^2 x the base level's product
    (it does not depend on s), and t_key / t_value = (lambda_value / lambda_key) x
    exp(mean log s_value - mean log s_key). The calibrated mean variances' ratio is not in the tune
    output; it is recovered from the tune output's own level and sensitivities, which it fixes.
    """
    lev = tune["levels"][0]
    if lev.get("exponent", 1.0) != 1.0:
        sys.exit(f"make_ladder: --floor needs a tune output at exponent 1 (this one: {lev.get('exponent')})")
    measured = tune.get("sensitivity_floor", 1e-3)
    fk, fv = (float(x) for x in floor.split(":")) if ":" in floor else (float(floor),) * 2
    if min(fk, fv) < measured * (1 - 1e-12) or max(fk, fv) > 1:
        sys.exit(f"make_ladder: --floor {floor}: must be in [{measured:g}, 1], the floor the tune output was measured at")
    rows = sorted(tune["sensitivity"], key=lambda r: r["layer"])
    if len(rows) != layers:
        sys.exit(f"make_ladder: the tune output's sensitivity list has {len(rows)} layers, the ladder {layers}")
    s = {k: [r[f"{k}_kl_per_distortion"] for r in rows] for k in ("key", "value")}
    smax = max(max(s["key"]), max(s["value"]))
    mlog = {k: sum(math.log(x) for x in v) / layers for k, v in s.items()}
    ratio = lev["key_theta"] / lev["value_theta"] * math.exp(mlog["key"] - mlog["value"])  # lambda_v / lambda_k
    prod = lev["key_theta"] * lev["value_theta"]
    s2 = {k: [max(x, f * smax) for x in s[k]] for k, f in (("key", fk), ("value", fv))}
    m2 = {k: sum(math.log(x) for x in v) / layers for k, v in s2.items()}
    scales = {k: [math.exp(m2[k]) / x for x in v] for k, v in s2.items()}
    t_ratio = ratio * math.exp(m2["value"] - m2["key"])
    return scales["key"], scales["value"], math.sqrt(prod * t_ratio), math.sqrt(prod / t_ratio)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladder")
    ap.add_argument("sensitivity")
    ap.add_argument("--levels", default="")
    ap.add_argument("--multipliers", default="")
    ap.add_argument("--base", default="")
    ap.add_argument("--floor", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    ladder = json.load(open(a.ladder))
    tune = json.load(open(a.sensitivity))
    layers = ladder.get("num_layers")
    tuned = (tune.get("levels") or [{}])[0]
    ks, vs = tuned.get("key_layer_scale"), tuned.get("value_layer_scale")
    if not ks or not vs or len(ks) != layers or len(vs) != layers:
        sys.exit(f"make_ladder: {a.sensitivity}: expected a first level with key_layer_scale and value_layer_scale "
                 f"of {layers} layers (kvscope-cli tune --codec transform --json)")
    t = ladder["transform"]
    k0, v0 = tuned["key_theta"], tuned["value_theta"]
    if a.floor:
        ks, vs, k0, v0 = refloor(tune, layers, a.floor)
    if a.multipliers:
        if a.base:
            k0, v0 = (float(x) for x in a.base.split(":"))
        # else the tuner's own level at exponent 1, multiplier 1 (at --floor, re-derived): it sets the
        # keys' and values' balance
        pairs = [(k0 * float(m), v0 * float(m)) for m in a.multipliers.split(",")]
    elif a.levels:
        pairs = [tuple(float(x) for x in p.split(":")) for p in a.levels.split(",")]
    else:
        pairs = [(l["key_theta"], l["value_theta"]) for l in t["levels"]]
    t["levels"] = [{"name": f"t {k:.3g}/{v:.3g}", "key_theta": k, "value_theta": v,
                    "key_layer_scale": ks, "value_layer_scale": vs} for k, v in pairs]
    t["default_level"] = min(int(t.get("default_level", 1)), len(pairs))
    ladder["layer_shape"] = {
        "alpha": tuned.get("exponent"),
        # How the levels were made, so that tests/ladder_check.py can make them again.
        "multipliers": [float(m) for m in a.multipliers.split(",")] if a.multipliers else None,
        "levels": a.levels or None,
        "contexts": tune.get("tuning_contexts"),
        "source": "kvscope-cli tune --codec transform --exponents 1 --multipliers 1 --refine 0 --json (its sensitivity list)",
    }
    if a.floor:
        ladder["layer_shape"]["floor"] = a.floor
    text = json.dumps(ladder, indent=1) + "\n"
    if a.out:
        open(a.out, "w").write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
