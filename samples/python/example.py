"""kvscope from Python, end to end: a KV cache, its statistics, every codec level, a plot.

    PYTHONPATH=build/dev/python /usr/bin/python3 samples/python/example.py [KV.h5] [--plot out.png]

Without a KV file it uses the synthetic cache `kvscope-cli synth` makes (8 layers, 4 heads of 64,
1024 tokens). With --plot and matplotlib installed it draws the per-layer key/value absmax and
the token-locality ratio (CacheGen's first observation).
"""

import argparse

import numpy as np

import kvscope


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kv", nargs="?", help="KV file (HDF5); default: a synthetic cache")
    ap.add_argument("--plot", help="write a PNG of per-layer statistics (needs matplotlib)")
    args = ap.parse_args()

    kv = kvscope.read_kv(args.kv) if args.kv else kvscope.synthetic()
    print(kv)

    # The arrays are views of the cache (no copy); the cache lives while they do.
    k0 = kv.keys(0)
    print(f"layer 0 keys: {k0.shape} {k0.dtype}, a view: {k0.base is kv}, absmax {np.abs(k0.astype(np.float32)).max():.3f}")

    st = kvscope.stats(kv)
    print(f"token locality (var raw / var delta): keys {st['key_delta_variance_ratio']:.2f}, "
          f"values {st['value_delta_variance_ratio']:.2f}")

    data = kvscope.encode(kv)  # the bytes of `kvscope-cli encode KV.h5 --out X.kvc`
    c = kvscope.Container(data)
    fp16_bytes = 2 * kv.num_layers * 2 * kv.num_kv_heads * kv.num_tokens * kv.head_dim
    print(f"{c.codec}: {c.num_chunks} chunks of {c.chunk_tokens} tokens, {c.num_levels} levels, {len(data)} bytes in all")
    for level in range(1, c.num_levels + 1):
        err = kvscope.compare(kv, kvscope.decode(data, level=level))
        size = c.level_bytes(level) + c.level_table_bytes(level)
        print(f"  level {level}: {size:9d} bytes  {fp16_bytes / size:5.2f}x vs fp16  "
              f"max abs error {err['max_abs_error']:.4g}  rms {err['rms_error']:.4g}")
    for codec in ("int8", "kivi2"):
        d = kvscope.encode(kv, codec=codec)
        err = kvscope.compare(kv, kvscope.decode(d))
        print(f"  {codec:7s}: {len(d):9d} bytes  {fp16_bytes / len(d):5.2f}x vs fp16  max abs error {err['max_abs_error']:.4g}")

    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot: matplotlib is not installed")
            return
        layers = [l["layer"] for l in st["layers"]]
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        a.plot(layers, [l["key"]["absmax"] for l in st["layers"]], label="keys")
        a.plot(layers, [l["value"]["absmax"] for l in st["layers"]], label="values")
        a.set_xlabel("layer")
        a.set_ylabel("absmax")
        a.legend()
        b.plot(layers, [l["key"]["delta_variance_ratio"] or np.nan for l in st["layers"]], label="keys")
        b.plot(layers, [l["value"]["delta_variance_ratio"] or np.nan for l in st["layers"]], label="values")
        b.set_xlabel("layer")
        b.set_ylabel("variance raw / delta")
        b.legend()
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
