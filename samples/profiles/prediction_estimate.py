#!/usr/bin/env python3
"""What predicting each token's transform components from the previous token's could save: an estimate.

CacheGen's first observation is token-wise locality (nearby tokens' values are similar, so deltas
have less variance than raw values). The transform codec codes every token independently in a PCA
basis. This script asks whether the locality survives the PCA: per (kind, layer) block of a capture,
PCA of the block (keys with RoPE undone, sinks left out), water level theta = t x the mean component
variance of that kind, the components above it quantized with the step sqrt(12 theta), and the
empirical entropy of the symbols (one table per component) in two ways:
  plain   q_t = rint(z_t / step)                       (what the codec does)
  dpcm    q_t = rint((z_t - rho z^_{t-1}) / step), z^_t = rho z^_{t-1} + q_t step
          (closed loop on the decoder's own reconstruction, rho per component from the data,
          restarted every 256 tokens so chunks stay independent)
Both have the same step, so the same distortion; the difference in entropy is what prediction
buys. Unweighted (MSE) domain, one water level per kind: a proxy for the codec's rate. The
lag-1 correlation of the leading components is high (0.75-0.98 for keys), but after quantization
the closed loop predicts from a noisy reconstruction and little of it is left.

  /usr/bin/python3 samples/profiles/prediction_estimate.py CAPTURE.h5 [--key-t 0.028] [--value-t 0.0064]
Needs numpy and h5py (Debian: python3-numpy python3-h5py).
"""
import argparse

import numpy as np

# The capture's rows as the other estimate reads them: keys with RoPE undone, sinks left out.
from adaptation_estimate import load

CHUNK = 256


def entropy_bits(sym):
    """Total bits of the symbols with one ideal table per column."""
    total = 0.0
    for j in range(sym.shape[1]):
        _, cnt = np.unique(sym[:, j], return_counts=True)
        total -= (cnt * np.log2(cnt / cnt.sum())).sum()
    return total


def components(x):
    """PCA components z (tokens, C) of one block's rows, sorted by variance, and their variances."""
    x = x - x.mean(0)
    lam, vec = np.linalg.eigh(x.T @ x / len(x))
    order = np.argsort(lam)[::-1]
    return x @ vec[:, order], lam[order]


def code(z, step):
    """Symbols without and with closed-loop prediction from the previous token."""
    plain = np.rint(z / step)
    rho = np.clip((z[1:] * z[:-1]).sum(0) / np.maximum((z[:-1] ** 2).sum(0), 1e-30), 0, 1)
    pred_q = np.zeros_like(z)
    rec = np.zeros(z.shape[1])
    for t in range(len(z)):
        pred = rec * rho if t % CHUNK else np.zeros_like(rec)
        pred_q[t] = np.rint((z[t] - pred) / step)
        rec = pred + pred_q[t] * step
    return plain, pred_q


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("capture")
    ap.add_argument("--key-t", type=float, default=0.028)
    ap.add_argument("--value-t", type=float, default=0.0064)
    a = ap.parse_args()
    layers = load(a.capture)
    for kind, t in (("key", a.key_t), ("value", a.value_t)):
        blocks = [components(kv[0 if kind == "key" else 1]) for kv in layers]
        theta = t * np.mean([lam.mean() for _, lam in blocks])
        step = np.sqrt(12 * theta)
        bits0 = bits1 = values = 0.0
        for z, lam in blocks:
            values += z.size
            k = int((lam > theta).sum())
            if k:
                plain, pred = code(z[:, :k], step)
                bits0 += entropy_bits(plain)
                bits1 += entropy_bits(pred)
        print("%-5s t %-7g bits/value plain %.3f, with prediction %.3f (%+.1f %%)"
              % (kind, t, bits0 / values, bits1 / values, 100 * (bits1 / bits0 - 1)))


if __name__ == "__main__":
    main()
