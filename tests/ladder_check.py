#!/usr/bin/env python3
"""Every shipped transform ladder with per-layer water levels is what its documented command makes
(docs/transform.md): samples/profiles/<name>.transform.json from <name>.sensitivity.json.

    python3 tests/ladder_check.py ROOT

Runs samples/profiles/make_ladder.py on each shipped sensitivity file and compares its levels with
the shipped ladder's (names, water levels, per-layer scales; `measured` and `default_level` are
written later by heldout_table.py and are not compared). Also checks the rule the scales follow:
geometric mean 1 per kind, and scale x sensitivity^alpha the same for every layer of a kind
(the sensitivities raised to the ladder's `floor` when it was made with `make_ladder.py --floor`).

And the --floor derivation against a measured probe: the ladder derived from the floor-1e-6
sensitivity pass (samples/profiles/variants) at --floor 1e-3 must be the shipped SmolLM2 ladder,
which `tune` measured at 1e-3, up to the probe's run-to-run scatter (the two passes' resolved
sensitivities differ by up to 5 %, threads).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
prof = os.path.join(root, "samples/profiles")


def close(x, y):
    if isinstance(x, str):
        return x == y
    xs, ys = (x, y) if isinstance(x, list) else ([x], [y])
    return len(xs) == len(ys) and all(math.isclose(p, q, rel_tol=1e-9) for p, q in zip(xs, ys))


def check(ladder, sens_file, fails):
    shipped = json.load(open(ladder))
    shape = shipped["layer_shape"]
    # The same arguments the shipped ladder records it was made with.
    args = []
    if shape.get("multipliers"):
        args += ["--multipliers", ",".join(repr(m) for m in shape["multipliers"])]
    elif shape.get("levels"):
        args += ["--levels", shape["levels"]]
    if shape.get("floor"):
        args += ["--floor", shape["floor"]]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ladder.json")
        subprocess.run([sys.executable, os.path.join(prof, "make_ladder.py"), ladder, sens_file] + args + ["--out", out],
                       check=True)
        made = json.load(open(out))["transform"]["levels"]
    if len(made) != len(shipped["transform"]["levels"]):
        fails.append(f"{ladder}: {len(shipped['transform']['levels'])} levels, make_ladder.py makes {len(made)}")
    for i, (a, b) in enumerate(zip(made, shipped["transform"]["levels"])):
        for k in ("name", "key_theta", "value_theta", "key_layer_scale", "value_layer_scale"):
            if not close(a[k], b[k]):
                fails.append(f"{ladder}: level {i + 1} {k} differs from make_ladder.py's output")
    sens = sorted(json.load(open(sens_file))["sensitivity"], key=lambda x: x["layer"])
    lev = shipped["transform"]["levels"][0]
    floors = str(shape.get("floor") or "0").split(":")
    smax = max(max(s["key_kl_per_distortion"], s["value_kl_per_distortion"]) for s in sens)
    for kind, floor in zip(("key", "value"), floors * 2 if len(floors) == 1 else floors):
        sc = lev[f"{kind}_layer_scale"]
        g = math.exp(sum(math.log(v) for v in sc) / len(sc))
        if not math.isclose(g, 1.0, rel_tol=1e-9):
            fails.append(f"{ladder}: {kind}_layer_scale has geometric mean {g}, not 1")
        alpha = shape["alpha"]
        prod = [v * max(s[f"{kind}_kl_per_distortion"], float(floor) * smax) ** alpha for v, s in zip(sc, sens)]
        if max(prod) / min(prod) > 1 + 1e-9:
            fails.append(f"{ladder}: {kind}_layer_scale is not inversely proportional to the sensitivity")
    return len(made)


def check_floor_derivation(fails):
    ladder = os.path.join(prof, "smollm2-135m-instruct.transform.json")
    sens = os.path.join(prof, "variants/smollm2-135m-instruct.floor1e-6.sensitivity.json")
    shipped = json.load(open(ladder))
    mult = ",".join(repr(m) for m in shipped["layer_shape"]["multipliers"])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ladder.json")
        subprocess.run([sys.executable, os.path.join(prof, "make_ladder.py"), ladder, sens, "--multipliers", mult,
                        "--floor", "1e-3", "--out", out], check=True)
        made = json.load(open(out))["transform"]["levels"]
    for i, (a, b) in enumerate(zip(made, shipped["transform"]["levels"])):
        # The key/value balance follows the mean log sensitivity of 30 layers: 0.2 % apart measured.
        for k in ("key_theta", "value_theta"):
            if not math.isclose(a[k], b[k], rel_tol=0.01):
                fails.append(f"--floor 1e-3 from the 1e-6 pass: level {i + 1} {k} {a[k]:.5g}, the 1e-3 pass {b[k]:.5g}")
        for k in ("key_layer_scale", "value_layer_scale"):
            worst = max(abs(p / q - 1) for p, q in zip(a[k], b[k]))
            if worst > 0.08:
                fails.append(f"--floor 1e-3 from the 1e-6 pass: level {i + 1} {k} up to {100 * worst:.1f} % off the 1e-3 pass")
    return "--floor 1e-3 from the 1e-6 pass matches the shipped ladder"


fails = []
made = []
for name in sorted(os.listdir(prof)):
    if name.endswith(".sensitivity.json"):
        ladder = os.path.join(prof, name[:-len(".sensitivity.json")] + ".transform.json")
        if not os.path.exists(ladder):
            fails.append(f"{name}: no ladder {os.path.basename(ladder)} next to it")
            continue
        made.append(f"{os.path.basename(ladder)} ({check(ladder, os.path.join(prof, name), fails)} levels)")
if not made:
    fails.append(f"{prof}: no <name>.sensitivity.json with its ladder")
for name in sorted(os.listdir(os.path.join(prof, "variants"))):
    if name.endswith(".transform.json"):
        # A variant ladder names no sensitivity file: those made with --floor come from the floor-1e-6 pass.
        v = os.path.join(prof, "variants", name)
        if json.load(open(v)).get("layer_shape", {}).get("floor"):
            made.append(f"variants/{name} ({check(v, os.path.join(prof, 'variants/smollm2-135m-instruct.floor1e-6.sensitivity.json'), fails)} levels)")
made.append(check_floor_derivation(fails))
print("\n".join(fails) if fails else "ok: make_ladder.py makes " + ", ".join(made))
sys.exit(1 if fails else 0)
