#!/usr/bin/env python3
"""Three more ways the transform codec could adapt to the cache being coded: estimates.

Each mode codes the held-out captures in the PCA basis of the calibration captures (unweighted,
keys with RoPE undone, sinks left out, the cache's own means as with adapt_mean), at relative
water levels t (theta = t x the mean calibrated variance of that kind), with the codec's quantizer
(step sqrt(12 theta), components whose calibrated variance is below theta not coded):

  recon   reconstruction inside a quantizer bin: the codec's midpoint q * step against the
          centroid of a Laplace law of the calibrated variance (nothing travels) and the centroid
          measured on the cache (one offset per component and bin class |q| = 1 / |q| >= 2, which
          would travel); printed as the coded components' squared error relative to the midpoint's
          (the rate does not change)
  var     which components are coded and their tables: calibrated (the codec: tables counted on
          the calibration symbols, cross-entropy) against the cache's own variances (components
          whose cache variance exceeds theta, each with its own empirical entropy, a lower bound
          for tables that travel); bits per value and squared error per value (over the mean
          calibrated variance) at each t
  rot     the Gaussian rate sum_j max(0, log2(var_j / theta) / 2) in the calibrated basis, after a
          rotation of its top k components fitted on the cache (k x k fp16 numbers per block
          travel, printed after the +), and in the cache's own PCA (an upper bound)

  python3 samples/profiles/quantizer_estimate.py MODE --calibration A.h5,B.h5 HELD.h5 [HELD2.h5 ...]
Needs numpy and h5py.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adaptation_estimate import load, pca  # noqa: E402


def calibrated_blocks(cal, held, kind):
    """Per layer: the held-out rows (own means removed), the calibration's z and variances, basis."""
    out = []
    for layer, h in enumerate(held):
        x = np.concatenate([c[layer][kind] for c in cal])
        mu, _, basis = pca(x)
        zc = (x - mu) @ basis
        y = h[kind]
        out.append(((y - y.mean(0)) @ basis, zc, (zc ** 2).mean(0), basis, y - y.mean(0)))
    return out


def entropy(q):
    _, c = np.unique(q, return_counts=True)
    return -(c * np.log2(c / c.sum())).sum()


def cross_entropy(q, qc):
    lo, hi = min(q.min(), qc.min()), max(q.max(), qc.max())
    cnt = np.bincount((qc - lo).astype(int), minlength=int(hi - lo + 1)) + 0.5
    return -np.log2((cnt / cnt.sum())[(q - lo).astype(int)]).sum()


def recon(blocks, th):
    step = np.sqrt(12 * th)
    mid = lap = emp = 0.0
    for z, _, lam, _, _ in blocks:
        keep = lam > th
        zk = z[:, keep]
        q = np.rint(zk / step)
        a, s = np.abs(q), np.sign(q)
        mid += ((zk - q * step) ** 2).sum()
        b = np.sqrt(lam[keep] / 2)
        off = step / 2 - b + step / (np.exp(step / b) - 1)  # Laplace centroid's offset from the midpoint
        lap += ((zk - s * (a * step - off)) ** 2).sum()
        r = np.zeros_like(zk)
        for cls in (a == 1, a >= 2):
            o = np.where(cls, a - np.abs(zk) / step, 0).sum(0) / np.maximum(cls.sum(0), 1)
            r = np.where(cls, o, r)
        emp += ((zk - s * (a - r) * step) ** 2).sum()
    return f"coded error vs midpoint: Laplace centroid {lap / mid:.3f}, measured centroid {emp / mid:.3f}"


def var(blocks, th, lbar):
    step = np.sqrt(12 * th)
    n = sum(z.size for z, *_ in blocks)
    cb = cd = ab = ad = 0.0
    for z, zc, lam, _, _ in blocks:
        keep = lam > th
        q, qc = np.rint(z[:, keep] / step), np.rint(zc[:, keep] / step)
        cb += sum(cross_entropy(q[:, j], qc[:, j]) for j in range(q.shape[1]))
        cd += ((z[:, keep] - q * step) ** 2).sum() + (z[:, ~keep] ** 2).sum()
        own = (z ** 2).mean(0) > th
        q2 = np.rint(z[:, own] / step)
        ab += sum(entropy(q2[:, j]) for j in range(q2.shape[1]))
        ad += ((z[:, own] - q2 * step) ** 2).sum() + (z[:, ~own] ** 2).sum()
    return (f"calibrated {cb / n:.3f} bits/value, error {cd / n / lbar:.4f} | "
            f"cache's variances {ab / n:.3f} bits/value, error {ad / n / lbar:.4f}")


def rot(blocks, th):
    def rate(v):
        return np.maximum(0, 0.5 * np.log2(np.maximum(v, 1e-30) / th)).sum()
    n = sum(z.size for z, *_ in blocks)
    res = {"calibrated": 0.0, "own": 0.0}
    ks = (16, 32, 64, 96)
    for k in ks:
        res[k] = res[-k] = 0.0
    for z, _, lam, _, y in blocks:
        order = np.argsort(-lam)
        s = np.cov(z[:, order].T)
        d, t = np.diag(s), len(z)
        res["calibrated"] += t * rate(d)
        res["own"] += t * rate(np.linalg.eigvalsh(np.cov(y.T)))
        for k in ks:
            res[k] += t * (rate(np.linalg.eigvalsh(s[:k, :k])) + rate(d[k:]))
            res[-k] += k * k * 16
    return (f"calibrated {res['calibrated'] / n:.3f}, own PCA {res['own'] / n:.3f}, "
            + ", ".join(f"top {k} rotated {res[k] / n:.3f} + {res[-k] / n:.3f}" for k in ks))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("recon", "var", "rot"))
    ap.add_argument("held", nargs="+")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--thetas", default="0.1,0.05,0.025", help="t for keys; values take t / 10")
    a = ap.parse_args()
    cal = [load(p) for p in a.calibration.split(",")]
    for path in a.held:
        held = load(path)
        for kind, name, div in ((0, "keys", 1), (1, "values", 10)):
            blocks = calibrated_blocks(cal, held, kind)
            lbar = np.mean([b[2].mean() for b in blocks])
            for t in (float(x) / div for x in a.thetas.split(",")):
                th = t * lbar
                line = recon(blocks, th) if a.mode == "recon" else var(blocks, th, lbar) if a.mode == "var" else rot(blocks, th)
                print(f"{os.path.basename(path)} {name} t={t:g}: {line}", flush=True)


if __name__ == "__main__":
    main()
