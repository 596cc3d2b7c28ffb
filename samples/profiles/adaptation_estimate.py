#!/usr/bin/env python3
"""How many bits adapting the transform to the cache being coded could save: an estimate.

For each (kind, layer) block of a held-out capture, the Gaussian reverse water-filling rate
sum_j max(0, 1/2 log2(lambda_j / theta)) (bits per value, theta = t x the mean component
variance of that kind) of the cache's components in four bases:
  calibrated  the PCA of the calibration captures (what the codec uses today), per 256-token chunk
  own         the PCA of the held-out cache itself (an upper bound: that basis would have to travel)
  backward    chunk n in the PCA of chunks 0..n-1 of the same cache mixed with the calibration
              covariance (weight 0.1 x 2000 tokens against the tokens seen), which a decoder can
              compute from what it has already decoded, so nothing travels
  logo        the calibrated basis refitted with the other held-out captures added to the corpus
              (only with --others)
Unweighted (MSE) domain, keys with RoPE undone, sinks (4 tokens) left out; a proxy for the
codec's rate, which uses attention weights, per-layer water levels and entropy-coded integers.

  /usr/bin/python3 samples/profiles/adaptation_estimate.py --calibration A.h5,B.h5 HELD.h5 [--others X.h5,Y.h5]
Needs numpy and h5py (Debian: python3-numpy python3-h5py).
"""
import argparse

import numpy as np

from kv_rows import unroped_layers

SINKS, CHUNK = 4, 256


def load(path):
    """Per layer: (keys with RoPE undone, values), each (tokens, heads * head_dim), float64."""
    return [(k, v) for k, v, _ in unroped_layers(path, SINKS)]


def pca(rows):
    mu = rows.mean(0)
    cov = np.cov((rows - mu).T)
    return mu, cov, np.linalg.eigh(cov)[1]


def rate(rows, mu, basis, theta):
    var = (((rows - mu) @ basis) ** 2).mean(0)
    return len(rows) * np.maximum(0.0, 0.5 * np.log2(np.maximum(var, 1e-30) / theta)).sum()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("held")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--others", default="")
    ap.add_argument("--thetas", default="0.01,0.003")
    a = ap.parse_args()
    cal = [load(p) for p in a.calibration.split(",")]
    others = [load(p) for p in a.others.split(",") if p]
    held = load(a.held)
    for kind, name in ((0, "keys"), (1, "values")):
        blocks = []
        for layer, h in enumerate(held):
            X = np.concatenate([c[layer][kind] for c in cal])
            mu, cov, basis = pca(X)
            logo = pca(np.concatenate([X] + [o[layer][kind] for o in others]))[::2] if others else None
            blocks.append((h[kind], mu, cov, basis, logo))
        lbar = np.mean([(((y - mu) @ b) ** 2).mean() for y, mu, _, b, _ in blocks])
        values = sum(y.size for y, *_ in blocks)
        for t in (float(x) for x in a.thetas.split(",")):
            th = t * lbar
            r = dict(calibrated=0.0, own=0.0, backward=0.0, logo=0.0)
            for y, mu, cov, basis, logo in blocks:
                r["own"] += rate(y, y.mean(0), pca(y)[2], th)
                for s in range(0, len(y), CHUNK):
                    c = y[s:s + CHUNK]
                    r["calibrated"] += rate(c, mu, basis, th)
                    if logo:
                        r["logo"] += rate(c, logo[0], logo[1], th)
                    if s == 0:
                        r["backward"] += rate(c, mu, basis, th)
                        continue
                    seen = y[:s]
                    w = 200.0 / (200.0 + s)
                    m = w * mu + (1 - w) * seen.mean(0)
                    mixed = w * cov + (1 - w) * np.cov((seen - seen.mean(0)).T)
                    r["backward"] += rate(c, m, np.linalg.eigh(mixed)[1], th)
            keys = ["calibrated", "own", "backward"] + (["logo"] if others else [])
            print(f"{name} t {t:g}: " + ", ".join(f"{k} {r[k] / values:.3f}" for k in keys) + " bits/value")


if __name__ == "__main__":
    main()
