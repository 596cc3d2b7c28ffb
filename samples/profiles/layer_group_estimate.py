#!/usr/bin/env python3
"""How many bits one PCA across G adjacent layers could save over one PCA per layer: an estimate.

The same Gaussian reverse water-filling proxy as adaptation_estimate.py (bits per value of a
held-out capture, 256-token chunks, calibrated means and bases, keys with RoPE undone, sinks left
out, unweighted domain), with the ladder's per-layer water levels folded in: layer l's channels are
divided by sqrt(layer_scale[l]) of one level of the profile, so that one water level over a group
of layers is the ladder's per-layer water levels. G = 1 is the codec as it is (one block per kind
and layer); G > 1 fits one PCA on the G layers' channels side by side (G x heads x head_dim dims).

  /usr/bin/python3 samples/profiles/layer_group_estimate.py --calibration A.h5,B.h5 HELD.h5 \
      [--profile samples/profiles/smollm2-135m-instruct.transform.json] [--level 4] [--groups 1,2,3,5]
Needs numpy and h5py (Debian: python3-numpy python3-h5py).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adaptation_estimate import CHUNK, load, pca, rate  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("held")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--profile", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "smollm2-135m-instruct.transform.json"))
    ap.add_argument("--level", type=int, default=4)
    ap.add_argument("--groups", default="1,2,3,5")
    ap.add_argument("--thetas", default="0.02,0.006")
    a = ap.parse_args()
    lev = json.load(open(a.profile))["transform"]["levels"][a.level - 1]
    scales = [np.array(lev[k]) for k in ("key_layer_scale", "value_layer_scale")]
    cal = [load(p) for p in a.calibration.split(",")]
    held = load(a.held)
    L = len(held)
    groups = [int(g) for g in a.groups.split(",")]
    for kind, name in ((0, "keys"), (1, "values")):
        inv = 1.0 / np.sqrt(scales[kind])
        feat = lambda cache, l: cache[l][kind] * inv[l]  # noqa: E731
        # theta = t x the mean component variance of the held-out cache in the per-layer bases
        per = [pca(np.concatenate([feat(c, l) for c in cal]))[::2] for l in range(L)]
        lbar = np.mean([(((feat(held, l) - mu) @ b) ** 2).mean() for l, (mu, b) in enumerate(per)])
        values = sum(held[l][kind].size for l in range(L))
        for t in (float(x) for x in a.thetas.split(",")):
            out = []
            for G in groups:
                bits = 0.0
                for l0 in range(0, L, G):
                    ls = range(l0, min(L, l0 + G))
                    mu, _, basis = pca(np.concatenate([np.concatenate([feat(c, l) for l in ls], 1) for c in cal]))
                    y = np.concatenate([feat(held, l) for l in ls], 1)
                    for s in range(0, len(y), CHUNK):
                        bits += rate(y[s:s + CHUNK], mu, basis, t * lbar)
                out.append(f"G={G} {bits / values:.3f}")
            print(f"{name} t {t:g}: " + ", ".join(out) + " bits/value", flush=True)


if __name__ == "__main__":
    main()
