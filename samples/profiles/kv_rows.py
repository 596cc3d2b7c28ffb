"""Reads a kvscope HDF5 capture as the probe scripts here want it: per layer, keys with RoPE undone
and values as (tokens, heads * head_dim) float64 rows, the first `sinks` tokens left out.
Needs numpy and h5py (Debian: python3-numpy python3-h5py)."""
import h5py
import numpy as np


def unroped_layers(path, sinks):
    """[(keys, values, group)] per layer; `group` is the layer's open h5py group (query_sq, ...)."""
    f = h5py.File(path, "r")
    inv = f["rope_inv_freq"][:].astype(np.float64)
    p0 = int(f.attrs.get("rope_position0", 0))
    out = []
    for layer in range(int(f.attrs["num_layers"])):
        g = f["layers/%02d" % layer]
        k = g["key"][:].astype(np.float64)
        v = g["value"][:].astype(np.float64)
        H, T, D = k.shape
        a = (p0 + np.arange(T))[:, None] * inv[None, :]
        c, s = np.cos(a), np.sin(a)
        lo, hi = k[:, :, : D // 2], k[:, :, D // 2:]
        k = np.concatenate([lo * c + hi * s, hi * c - lo * s], -1)
        rows = [x.transpose(1, 0, 2).reshape(T, H * D)[sinks:] for x in (k, v)]
        out.append((rows[0], rows[1], g))
    return out
