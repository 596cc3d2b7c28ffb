"""kvscope from Python: KV caches, the CacheGen-style codec and its .kvc container.

The same core as ``kvscope-cli`` (no second implementation)::

    import kvscope
    kv = kvscope.read_kv("ctx.h5")            # HDF5 KV file, as `kvscope-cli capture` writes it
    k0 = kv.keys(0)                           # numpy view (kv_heads, tokens, head_dim)
    data = kvscope.encode(kv)                 # bytes of `kvscope-cli encode ctx.h5 --out X.kvc`
    kv2 = kvscope.decode(data, level=1)       # as `kvscope-cli decode X.kvc --level 1`
    print(kvscope.compare(kv, kv2)["max_abs_error"])

``kvscope.hf`` (imported on demand: it needs torch and transformers) holds a Hugging Face cache
that keeps the prefix compressed. See docs/python.md.
"""

from ._kvscope import (
    KV,
    Container,
    Error,
    Profile,
    compare,
    decode,
    encode,
    read_kv,
    stats,
    synthetic,
)

__all__ = [
    "KV",
    "Container",
    "Error",
    "Profile",
    "compare",
    "decode",
    "encode",
    "read_kv",
    "stats",
    "synthetic",
]
