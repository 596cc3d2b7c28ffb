#!/usr/bin/env python3
"""The shipped SmolLM2 transform ladder is what its documented command makes (docs/transform.md).

    python3 tests/ladder_check.py ROOT

Runs samples/profiles/make_ladder.py on the shipped sensitivity file and compares its levels with
the shipped ladder's (names, water levels, per-layer scales; `measured` and `default_level` are
written later by heldout_table.py and are not compared). Also checks the rule the scales follow:
geometric mean 1 per kind, and scale x sensitivity^alpha the same for every layer of a kind.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
prof = os.path.join(root, "samples/profiles")
ladder = os.path.join(prof, "smollm2-135m-instruct.transform.json")
sens_file = os.path.join(prof, "smollm2-135m-instruct.sensitivity.json")
shipped = json.load(open(ladder))
fails = []
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "ladder.json")
    subprocess.run([sys.executable, os.path.join(prof, "make_ladder.py"), ladder, sens_file, "--alpha",
                    str(shipped["layer_shape"]["alpha"]), "--multipliers", "5.66,2.83,2,1.41,1,0.71,0.5", "--out", out],
                   check=True)
    made = json.load(open(out))["transform"]["levels"]
for i, (a, b) in enumerate(zip(made, shipped["transform"]["levels"])):
    for k in ("name", "key_theta", "value_theta", "key_layer_scale", "value_layer_scale"):
        x, y = a[k], b[k]
        same = x == y if isinstance(x, str) else all(math.isclose(p, q, rel_tol=1e-9) for p, q in zip(x if isinstance(x, list) else [x], y if isinstance(y, list) else [y]))
        if not same:
            fails.append(f"{ladder}: level {i + 1} {k} differs from make_ladder.py's output")
if len(made) != len(shipped["transform"]["levels"]):
    fails.append(f"{ladder}: {len(shipped['transform']['levels'])} levels, make_ladder.py makes {len(made)}")
sens = sorted(json.load(open(sens_file))["sensitivity"], key=lambda x: x["layer"])
lev = shipped["transform"]["levels"][0]
for kind in ("key", "value"):
    sc = lev[f"{kind}_layer_scale"]
    g = math.exp(sum(math.log(v) for v in sc) / len(sc))
    if not math.isclose(g, 1.0, rel_tol=1e-9):
        fails.append(f"{ladder}: {kind}_layer_scale has geometric mean {g}, not 1")
    alpha = shipped["layer_shape"]["alpha"]
    prod = [v * s[f"{kind}_kl_per_distortion"] ** alpha for v, s in zip(sc, sens)]
    if max(prod) / min(prod) > 1 + 1e-9:
        fails.append(f"{ladder}: {kind}_layer_scale is not inversely proportional to the sensitivity")
print("\n".join(fails) if fails else f"ok: {len(made)} levels match make_ladder.py")
sys.exit(1 if fails else 0)
