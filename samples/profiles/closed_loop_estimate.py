#!/usr/bin/env python3
"""Does a backward-adaptive basis pay when it is fitted on what the decoder has: a closed-loop estimate.

adaptation_estimate.py fitted chunk n's basis on the ORIGINAL chunks 0..n-1; a decoder only has
them as decoded. This script codes a held-out capture with the calibrated model of a transform
profile (its means are replaced by the cache's, as with adapt_mean; its basis, variances and the
steps of the chosen levels as stored, in the profile's weighted domain: attention-weighted for the
default profile, where the squared error of the components z is the weighted error) and compares,
per kind and level, at EQUAL squared error:
  calibrated  every chunk in the calibrated basis (what the codec does)
  closed P    chunk n (of the profile's chunk_tokens) in the eigenbasis of
                (P diag(lambda) + sum of zhat zhat^T over the coded tokens of chunks 0..n-1) / (P + n)
              where zhat are those tokens AS RECONSTRUCTED (coded components quantized, the others 0)
              and lambda the calibrated variances: the prior weighs as P tokens. The components
              whose eigenvalue exceeds the block's water level theta are coded, step sqrt(12 theta).
  open P      the same fitted on the original tokens (the earlier proxy; not realisable)
The adaptive codes are run at the level's theta times factors found by a secant search until two
bracket the calibrated point's error, and their bits are interpolated there (linear in log error). Bits: the empirical entropy of each
component's symbols over the cache ("emp", no escapes, no table cost: a lower bound), and what a
codec could spend ("real"): calibrated = the profile's counted tables with escapes as in the codec;
adaptive = a discretised Laplace table of the eigenvalue (a decoder derives it from the same
covariance), alphabet and escapes as in the codec.

  /usr/bin/python3 samples/profiles/closed_loop_estimate.py --profile P.transform.json HELD.h5 [...]
      [--levels 2,3,4] [--priors 500,2000,8000] [--open-prior 2000] [--verbose]
Needs numpy and h5py.
"""
import argparse
import base64
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adaptation_estimate import SINKS, load  # noqa: E402



class Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def take(self, fmt, n=1):
        size = struct.calcsize("<" + fmt) * n
        v = np.frombuffer(self.b, dtype=np.dtype(fmt).newbyteorder("<"), count=n, offset=self.o)
        self.o += size
        return v

    def u(self, fmt="I"):
        return int(self.take(fmt)[0])

    def varint(self):
        v, s = 0, 0
        while True:
            c = self.b[self.o]
            self.o += 1
            v |= (c & 127) << s
            s += 7
            if c < 128:
                return v


def parse_model(blob):
    """The transform section (core/codec/FORMAT.md): blocks (mean, variance, A) and levels."""
    r = Reader(blob)
    assert blob[:4] == b"KVTR", "not a transform model"
    r.o = 4
    version = r.u("H")
    flags = r.take("B", 6)
    r.take("I", 2)
    if version == 2:
        r.o += 9
    L, H, D, levels = r.u(), r.u(), r.u(), r.u()
    r.take("f", r.u())
    r.u()
    C = H * D
    blocks = []
    for _ in range(2 * L):
        mean = r.take("f", C).astype(np.float64)
        var = r.take("f", C).astype(np.float64)
        A = r.take("e", C * C).astype(np.float64).reshape(C, C)
        blocks.append((mean, var, A))
    lv = []
    for _ in range(levels):
        r.take("d", 2)
        per = []
        for _ in range(2 * L):
            step, M = np.zeros(C), np.zeros(C, dtype=int)
            for j in range(C):
                step[j] = r.take("f")[0]
                M[j] = r.u("B")
            tables = {}
            if flags[5] != 0:
                for j in np.nonzero(step > 0)[0]:
                    A_ = 2 * M[j] + 1
                    f = np.ones(A_)
                    lo, hi = r.u("B"), r.u("B")
                    for s in range(lo, hi + 1) if lo <= hi else ():
                        f[s] = r.varint() + 1
                    tables[j] = np.log2(4096.0 / f)
            per.append((step, M, tables))
        lv.append(per)
    return L, C, blocks, lv


def escape_bits(q):
    zz = np.where(q >= 0, 2 * q, -2 * q - 1)
    return 8.0 * np.maximum(1, np.ceil(np.log2(zz + 1) / 7))


def table_bits(q, M, lengths):
    """Bits of symbols q of one component coded with code lengths `lengths` (2M+1), escapes at |q| >= M."""
    sym = np.clip(q, -M, M).astype(int) + M
    esc = np.abs(q) >= M
    return lengths[sym].sum() + escape_bits(q[esc]).sum()


def laplace_bits(q, var, step):
    """Bits of symbols q (rows, K) under discretised Laplace laws of variances var (K) with one step:
    alphabet M = clamp(ceil(6 sigma / step), 1, 127) as in the codec, 12-bit probabilities (floor
    1/4096, not renormalised), the edge symbols escapes (their tail mass, plus the varint)."""
    b = np.sqrt(np.maximum(var, 1e-30) / 2)[None, :]
    M = np.clip(np.ceil(6 * np.sqrt(var) / step), 1, 127)[None, :]
    a = np.minimum(np.abs(q), M)
    edge = a >= M
    p = np.where(a == 0, 1 - np.exp(-0.5 * step / b),
                 0.5 * np.exp(-(a - 0.5) * step / b) * np.where(edge, 1.0, 1 - np.exp(-step / b)))
    bits = -np.log2(np.maximum(p, 1 / 4096)).sum()
    return bits + escape_bits(q[edge]).sum()


def entropy_bits(q):
    """Sum over the columns of q (rows, K; NaN = not coded) of each column's empirical entropy."""
    if q.size == 0:
        return 0.0
    col = np.broadcast_to(np.arange(q.shape[1])[None, :], q.shape)
    ok = ~np.isnan(q)
    key = col[ok] * 1_000_000 + (q[ok].astype(np.int64) + 500_000)
    u, c = np.unique(key, return_counts=True)
    tot = np.bincount(u // 1_000_000, weights=c)[u // 1_000_000]
    return -(c * np.log2(c / tot)).sum()


def code_calibrated(z, lam, theta, level_block=None):
    """(emp bits, real bits or None, squared error) of z in the calibrated basis at water level theta."""
    step = np.sqrt(12 * theta)
    keep = lam > theta if level_block is None else level_block[0] > 0  # the stored steps decide ties
    q = np.rint(z[:, keep] / step)
    err = ((z[:, keep] - q * step) ** 2).sum() + (z[:, ~keep] ** 2).sum()
    emp = entropy_bits(q)
    real = lap = None
    if level_block is not None:
        s, M, tables = level_block
        real = sum(table_bits(q[:, k], M[j], tables[j]) for k, j in enumerate(np.nonzero(keep)[0]))
        lap = laplace_bits(q, lam[keep], step)
    return emp, real, err, lap


def code_adaptive(z, lam, theta, chunks, prior, closed):
    """The same with chunk n in the eigenbasis of the prior and chunks 0..n-1 (reconstructed if closed)."""
    step = np.sqrt(12 * theta)
    C = z.shape[1]
    acc, seen = np.zeros((C, C)), 0
    err = real = 0.0
    qs = []  # per chunk: symbols (rows, C), component j = the j-th largest eigenvalue
    for lo, hi in chunks:
        zc = z[lo:hi]
        if seen == 0:
            mu, R = lam, np.eye(C)
        else:
            mu, R = np.linalg.eigh((prior * np.diag(lam) + acc) / (prior + seen))
        order = np.argsort(-mu)
        mu, R = mu[order], R[:, order]
        y = zc @ R
        keep = mu > theta
        q = np.zeros_like(y)
        q[:, keep] = np.rint(y[:, keep] / step)
        yh = q * step
        err += ((y - yh) ** 2).sum()
        real += laplace_bits(q[:, keep], mu[keep], step)
        zh = yh @ R.T
        src = zh if closed else zc
        acc += src.T @ src
        seen += hi - lo
        qs.append(np.where(keep[None, :], q, np.nan))
    return entropy_bits(np.concatenate(qs)), real, err


def equal_error_points(run, target):
    """run(f) -> (emp bits, real bits, error) at theta x f, evaluated until two points bracket the
    target error (error grows about linearly with theta: a secant step in log-log)."""
    pts, f = [], 1.0
    for _ in range(6):
        pts.append(run(f) + (f,))
        below = [p for p in pts if p[2] <= target]
        above = [p for p in pts if p[2] >= target]
        if below and above:
            lo, hi = max(below, key=lambda p: p[2]), min(above, key=lambda p: p[2])
            if abs(np.log(hi[2] / lo[2])) < 0.15 or len(pts) >= 3:
                return [lo, hi]
            f = np.exp(np.interp(np.log(target), [np.log(lo[2]), np.log(hi[2])], [np.log(lo[3]), np.log(hi[3])]))
        else:
            near = min(pts, key=lambda p: abs(np.log(p[2] / target)))
            f = near[3] * (target / near[2]) * (1.03 if near[2] < target else 0.97)
    return pts


def bits_at(curve, err):
    """Bits interpolated (linear in log error) at `err` on a curve of (bits, err) points."""
    pts = sorted(curve, key=lambda p: p[1])
    for (b1, e1), (b2, e2) in zip(pts, pts[1:]):
        if e1 <= err <= e2:
            w = (np.log(err) - np.log(e1)) / (np.log(e2) - np.log(e1)) if e2 > e1 else 0.0
            return b1 + w * (b2 - b1)
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("held", nargs="+")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--levels", default="2,3,4")
    ap.add_argument("--priors", default="500,2000,8000")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--open-prior", type=float, default=2000.0)
    a = ap.parse_args()
    prof = json.load(open(a.profile))
    tr = prof["transform"]
    L, C, blocks, lv = parse_model(base64.b64decode(tr["model"]))
    N = int(prof.get("chunk_tokens", 256))
    priors = [float(p) for p in a.priors.split(",")]
    lbar = [np.mean([blocks[k * L + l][1].mean() for l in range(L)]) for k in (0, 1)]
    print(f"profile {os.path.basename(a.profile)}: {L} layers, C {C}, chunk {N}, weighting {tr.get('weighting')}; "
          "bits per coded value; saving = 1 - adaptive / calibrated at the calibrated error")
    for path in a.held:
        held = load(path)
        T = len(held[0][0]) + SINKS
        chunks = [(max(c, SINKS) - SINKS, min(c + N, T) - SINKS) for c in range(0, T, N)]
        for kind, name in ((0, "keys"), (1, "values")):
            zs = []
            for l in range(L):
                x = held[l][kind]
                mean, lam, A = blocks[kind * L + l]
                zs.append(((x - x.mean(0)) @ np.linalg.inv(A).T, lam))
            values = sum(z.size for z, _ in zs)
            for level in (int(x) for x in a.levels.split(",")):
                t = tr["levels"][level - 1]
                tk = t["key_theta" if kind == 0 else "value_theta"]
                sc = t.get("key_layer_scale" if kind == 0 else "value_layer_scale") or [1.0] * L
                thetas = [tk * sc[l] * lbar[kind] for l in range(L)]
                for l in range(L):  # the stored steps must be the model's theta
                    s = lv[level - 1][kind * L + l][0]
                    if (s > 0).any():
                        assert abs(s[s > 0][0] ** 2 / 12 / thetas[l] - 1) < 1e-3, (l, s[s > 0][0] ** 2 / 12, thetas[l])
                cal = [code_calibrated(z, lam, th, lv[level - 1][kind * L + l]) for l, ((z, lam), th) in enumerate(zip(zs, thetas))]
                ce, cr, cerr, cl = (sum(c[i] for c in cal) for i in range(4))
                line = (f"{os.path.basename(path)} {name} L{level} t {tk:.4g}: error {cerr / values / lbar[kind]:.4f}; "
                        f"calibrated emp {ce / values:.3f} real {cr / values:.3f} (Laplace tables {cl / values:.3f})")
                for closed, P in [(True, P) for P in priors] + [(False, a.open_prior)]:
                    def run(f):
                        r = [code_adaptive(z, lam, th * f, chunks, P, closed) for (z, lam), th in zip(zs, thetas)]
                        return sum(x[0] for x in r), sum(x[1] for x in r), sum(x[2] for x in r)
                    pts = equal_error_points(run, cerr)
                    be, br = bits_at([(p[0], p[2]) for p in pts], cerr), bits_at([(p[1], p[2]) for p in pts], cerr)
                    if a.verbose:
                        print("   ", "closed" if closed else "open", P, [(round(p[1] / values, 3), round(p[2] / values / lbar[kind], 4)) for p in pts])
                    line += (f" | {'closed' if closed else 'open'} {P:g}: emp {be / values:.3f} ({(1 - be / ce) * 100:+.1f} %)"
                             f" real {br / values:.3f} ({(1 - br / cr) * 100:+.1f} %, {(1 - br / cl) * 100:+.1f} %)")
                print(line, flush=True)


if __name__ == "__main__":
    main()
