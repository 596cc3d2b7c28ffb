#!/usr/bin/env python3
"""Bit allocation by measured rate and distortion (KVTC's dynamic programming) against the codec's
reverse water-filling: an estimate of what it would save.

The codec gives every coded component of a (kind, layer) block the same step sqrt(12 theta_b)
(theta_b: the level's water level for that block, per-layer scales included) and drops the
components whose calibrated variance is below theta_b. That is optimal for Gaussian components
at high rate; at 1-2 bits/value many components sit near the water level, where a real
quantizer with an entropy coder departs from the Gaussian curve. This probe measures, for every
component of every block, the operational rate (the empirical entropy of its quantised symbols,
escapes at their varint cost) and distortion (in the attention-weighted domain, as the codec
sees it) for a grid of steps: multipliers of sqrt(12 theta_b), and "not coded". It then picks,
per component, the grid point minimising R + mu * D / theta_b (one slope mu for all blocks: the
ladder's per-layer water levels say what one unit of distortion costs in each block, so equal
slope means dD/dR proportional to theta_b), with mu set so that the total distortion sum_b D_b /
theta_b equals the codec's. It prints the rate of both at that equal distortion.

In-sample (on the calibration captures) the allocation is an optimistic bound. The chosen step
multiplier as a function of lambda_j / theta_b (median per half-octave) is then applied as a rule
to held-out captures, with the calibration captures' tables (cross-entropy, as the codec codes),
and compared with the codec's rule at equal distortion (a global scale on the rule's steps is
interpolated to the codec's distortion).

Approximations: the weighted domain is rebuilt here from the captures' query_sq and value_weight
(the codec's construction, READ ME FIRST 2); keys with RoPE undone (position 0 at token 0); the
sinks (4 tokens) left out; the held-out captures use their own means (adapt_mean, as the ladder
ships); tables are ideal counts with +0.5 per symbol (the codec's tables round counts to 12 bits).

  /usr/bin/python3 samples/profiles/rd_allocation_probe.py LADDER.json --calibration A.h5,B.h5 \
      [--level 4] [--held X.h5,Y.h5]
Needs numpy and h5py (Debian: python3-numpy python3-h5py). About 3 minutes of CPU and 2 GB of memory
at level 4 with four held-out captures.
"""
import argparse
import json

import numpy as np

from kv_rows import unroped_layers

SINKS = 4
GRID = np.array([0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 4.0])


def load(path):
    """Per layer: keys (RoPE undone), values, each (tokens - sinks, H*D) float64; query_sq; value_weight."""
    return [(k, v, g["query_sq"][:].astype(np.float64), g["value_weight"][:].astype(np.float64))
            for k, v, g in unroped_layers(path, SINKS)]


def sym_sqrt(m):
    w, u = np.linalg.eigh(m)
    w = np.maximum(w, 1e-12 * max(w.max(), 1e-30))
    return (u * np.sqrt(w)) @ u.T


def weight_root(cal, layer, kind):
    """W^1/2 (C x C, block-diagonal per KV head) the way the codec builds it."""
    if kind == 0:
        q = np.mean([c[layer][2] for c in cal], axis=0)  # (H, D)
        H, D = q.shape
        q = 0.5 * (q[:, : D // 2] + q[:, D // 2:])
        q = np.concatenate([q, q], 1).reshape(-1)
        q = np.maximum(q, max(1e-30, 1e-4 * q.max()))
        return np.diag(np.sqrt(q))
    m = cal[0][layer][3]  # (H, D, D)
    H, D, _ = m.shape
    r = np.zeros((H * D, H * D))
    for h in range(H):
        r[h * D:(h + 1) * D, h * D:(h + 1) * D] = sym_sqrt(m[h])
    return r


def symbols(z, step, lam):
    """Quantised symbols (clamped to the alphabet), escape bits and squared error per component."""
    M = np.clip(np.ceil(6 * np.sqrt(lam) / step), 1, 127)
    q = np.rint(z / step)
    err = ((z - q * step) ** 2).sum(0)
    esc = np.abs(q) >= M
    zz = np.where(q >= 0, 2 * q, -2 * q - 1)  # zigzag LEB128: 8 bits per 7 payload bits
    nbytes = np.maximum(1, np.ceil(np.log2(zz + 1) / 7))
    escbits = np.where(esc, 8 * nbytes, 0).sum(0)
    sym = (np.clip(q, -M, M) + M).astype(np.int64)
    return sym, M.astype(np.int64), escbits, err


def counts(sym, M):
    C = sym.shape[1]
    off = np.arange(C) * 255
    return np.bincount((sym + off).ravel(), minlength=255 * C).reshape(C, 255), M


def rate_own(sym, M):
    cnt, _ = counts(sym, M)
    p = cnt / cnt.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -(cnt * np.where(cnt > 0, np.log2(p), 0)).sum(1)


def rate_cross(sym, cal_sym, M):
    cnt, _ = counts(cal_sym, M)
    cnt = cnt + 0.5 * (np.arange(255)[None, :] <= 2 * M[:, None])
    p = cnt / cnt.sum(1, keepdims=True)
    C = sym.shape[1]
    return -np.log2(p[np.arange(C)[None, :], sym]).sum(0)


def block_table(zc, lam, theta, zh=None):
    """Rate and distortion per (grid multiplier, component); row len(GRID) is 'not coded'."""
    C = zc.shape[1]
    base = np.sqrt(12 * theta)
    R = np.zeros((len(GRID) + 1, C))
    Dc = np.zeros_like(R)
    Dh = np.zeros_like(R)
    Rh = np.zeros_like(R)
    for i, m in enumerate(GRID):
        sym, M, esc, err = symbols(zc, m * base, lam)
        R[i] = rate_own(sym, M) + esc
        Dc[i] = err
        if zh is not None:
            hs, hM, hesc, herr = symbols(zh, m * base, lam)
            Rh[i] = rate_cross(hs, sym, M) + hesc
            Dh[i] = herr
    Dc[-1] = (zc ** 2).sum(0)
    if zh is not None:
        Dh[-1] = (zh ** 2).sum(0)
    return R, Dc, Rh, Dh


def codec_choice(lam, theta):
    """The codec's rule: multiplier 1 for lambda > theta, else not coded (index len(GRID))."""
    return np.where(lam > theta, int(np.argmin(np.abs(GRID - 1.0))), len(GRID))


def lagrangian(blocks, target):
    """One slope mu for all blocks: per component argmin R + mu D / theta; mu matched to target."""
    def at(mu):
        R = D = 0.0
        picks = []
        for b in blocks:
            cost = b["R"] + mu * b["D"] / b["theta"]
            i = np.argmin(cost, 0)
            c = np.arange(cost.shape[1])
            R += b["R"][i, c].sum()
            D += (b["D"][i, c] / b["theta"]).sum()
            picks.append(i)
        return R, D, picks
    lo, hi = 1e-3, 1e3
    for _ in range(60):
        mid = np.sqrt(lo * hi)
        if at(mid)[1] > target:
            lo = mid
        else:
            hi = mid
    return at(np.sqrt(lo * hi)) + (np.sqrt(lo * hi),)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ladder")
    ap.add_argument("--held", default="", help="held-out captures, comma-separated")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--level", type=int, default=4)
    a = ap.parse_args()
    lev = json.load(open(a.ladder))["transform"]["levels"][a.level - 1]
    cal = [load(p) for p in a.calibration.split(",")]
    held = [(p, load(p)) for p in a.held.split(",") if p]
    L = len(cal[0])
    fit = []  # per block: kind, layer, mean, root, basis, lambda
    for kind in (0, 1):
        for layer in range(L):
            x = np.concatenate([c[layer][kind] for c in cal])
            mu = x.mean(0)
            root = weight_root(cal, layer, kind)
            xw = (x - mu) @ root
            lam, basis = np.linalg.eigh(xw.T @ xw / len(xw))
            lam = np.maximum(lam, 0)
            fit.append(dict(kind=kind, layer=layer, mu=mu, root=root, basis=basis, lam=lam, zc=xw @ basis))
    lbar = [np.mean([b["lam"] for b in fit if b["kind"] == k]) for k in (0, 1)]
    for b in fit:
        scale = lev["key_layer_scale" if b["kind"] == 0 else "value_layer_scale"][b["layer"]]
        b["theta"] = (lev["key_theta"] if b["kind"] == 0 else lev["value_theta"]) * scale * lbar[b["kind"]]
        b["R"], b["D"], _, _ = block_table(b["zc"], b["lam"], b["theta"])
    values_cal = sum(b["zc"].size for b in fit)
    cur = [codec_choice(b["lam"], b["theta"]) for b in fit]
    R0 = sum(b["R"][i, np.arange(len(i))].sum() for b, i in zip(fit, cur))
    D0 = sum((b["D"][i, np.arange(len(i))] / b["theta"]).sum() for b, i in zip(fit, cur))
    R1, D1, picks, mu = lagrangian(fit, D0)
    print(f"level {a.level} ({lev['name']}), calibration {a.calibration}: {values_cal} values")
    print(f"  water-filling: {R0 / values_cal:.4f} bits/value, distortion sum D/theta {D0 / values_cal:.4f} per value")
    print(f"  measured-R-D allocation at equal distortion: {R1 / values_cal:.4f} bits/value "
          f"({100 * (R1 / R0 - 1):+.2f} %), mu {mu:.3f} (high-rate Gaussian: 1 / (2 ln 2) = {0.5 / np.log(2):.3f})")
    # Within each block at that block's own distortion (the ladder's balance between blocks kept).
    Rb = 0.0
    for b, i in zip(fit, cur):
        r, _, _, _ = lagrangian([b], (b["D"][i, np.arange(len(i))] / b["theta"]).sum())
        Rb += r
    print(f"  same, each block held at its own distortion: {Rb / values_cal:.4f} bits/value ({100 * (Rb / R0 - 1):+.2f} %)")
    # The rule: the chosen multiplier (inf = not coded) per half-octave of lambda / theta.
    edges = np.arange(-4, 14.01, 0.5)
    ratio = np.concatenate([np.log2(np.maximum(b["lam"], 1e-30) / b["theta"]) for b in fit])
    chosen = np.concatenate([np.where(p < len(GRID), GRID[np.minimum(p, len(GRID) - 1)], np.inf) for p in picks])
    rule = []
    print("  log2(lambda/theta)  components  not coded  median multiplier (codec: 1, not coded below 0)")
    for lo in edges[:-1]:
        sel = (ratio >= lo) & (ratio < lo + 0.5)
        if not sel.any():
            continue
        c = chosen[sel]
        med = float(np.median(c))
        rule.append((lo, med))
        print(f"  [{lo:5.1f}, {lo + 0.5:5.1f})  {sel.sum():6d}  {np.mean(np.isinf(c)):6.2f}  {med:.2f}")
    rule_x = np.array([r[0] + 0.25 for r in rule])
    rule_m = np.array([r[1] for r in rule])

    def rule_mult(lam, theta):
        x = np.log2(np.maximum(lam, 1e-30) / theta)
        idx = np.clip(np.searchsorted(rule_x, x) - 1, 0, len(rule_x) - 1)
        m = rule_m[idx]
        m = np.where(x < rule_x[0] - 0.25, np.inf, m)
        return m

    # Held-out captures: the codec's rule against the rule above, calibration tables, equal distortion.
    for path, h in held:
        tot = dict(cur_R=0.0, cur_D=0.0, n=0)
        scales = np.array([0.8, 0.9, 1.0, 1.1, 1.25])
        rR = np.zeros(len(scales))
        rD = np.zeros(len(scales))
        for b in fit:
            y = h[b["layer"]][b["kind"]]
            zh = ((y - y.mean(0)) @ b["root"]) @ b["basis"]
            tot["n"] += zh.size
            base = np.sqrt(12 * b["theta"])
            keep = b["lam"] > b["theta"]
            tot["cur_D"] += ((zh[:, ~keep] ** 2).sum()) / b["theta"]
            if keep.any():
                cs, cM, _, _ = symbols(b["zc"][:, keep], base, b["lam"][keep])
                hs, _, hesc, herr = symbols(zh[:, keep], base, b["lam"][keep])
                tot["cur_R"] += (rate_cross(hs, cs, cM) + hesc).sum()
                tot["cur_D"] += herr.sum() / b["theta"]
            m = rule_mult(b["lam"], b["theta"])
            code = np.isfinite(m)
            for k, s in enumerate(scales):
                rD[k] += (zh[:, ~code] ** 2).sum() / b["theta"]
                if code.any():
                    st = s * m[code] * base
                    cs, cM, _, _ = symbols(b["zc"][:, code], st, b["lam"][code])
                    hs, _, hesc, herr = symbols(zh[:, code], st, b["lam"][code])
                    rR[k] += (rate_cross(hs, cs, cM) + hesc).sum()
                    rD[k] += herr.sum() / b["theta"]
        n = tot["n"]
        o = np.argsort(rD)
        r_eq = np.interp(tot["cur_D"], rD[o], rR[o])
        print(f"{path}: water-filling {tot['cur_R'] / n:.4f} bits/value at D/theta {tot['cur_D'] / n:.4f}; "
              f"rule {rR[2] / n:.4f} at {rD[2] / n:.4f}; rule at equal distortion {r_eq / n:.4f} "
              f"({100 * (r_eq / tot['cur_R'] - 1):+.2f} %)")


if __name__ == "__main__":
    main()
