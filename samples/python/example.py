"""kvscope from Python, end to end: a KV cache, its statistics, every codec level, a plot.

    PYTHONPATH=build/dev/python /usr/bin/python3 samples/python/example.py [KV.h5] [--plot out.png]
    PYTHONPATH=build/dev/python /usr/bin/python3 samples/python/example.py --model [MODEL] [--context TEXT_FILE]

Without a KV file it uses the synthetic cache `kvscope-cli synth` makes (8 layers, 4 heads of 64,
1024 tokens). With --model (no path: the embedded default) it captures a short context with the
model instead, and after the codec levels asks a question from each decoded cache (kvscope.Model:
the runtime module, libtorch). With --plot and matplotlib installed it draws the per-layer
key/value absmax and the token-locality ratio (CacheGen's first observation).
"""

import argparse

import numpy as np

import kvscope

CONTEXT = ("The lighthouse on Skerry Point was built in 1871 by the engineer Ada Morven. Its lamp burned whale oil "
           "until 1902, when a paraffin burner replaced it, and the keeper's logbook records every storm since.")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kv", nargs="?", help="KV file (HDF5); default: a synthetic cache")
    ap.add_argument("--plot", help="write a PNG of per-layer statistics (needs matplotlib)")
    ap.add_argument("--model", nargs="?", const="", help="capture the context with this model (no path: the embedded default)")
    ap.add_argument("--context", help="UTF-8 text file to capture with --model (default: a short built-in text)")
    ap.add_argument("--question", default="Who built the lighthouse, and when?", help="asked from each decoded cache")
    ap.add_argument("--threads", type=int, default=1, help="the model's CPU threads (0 = all cores)")
    args = ap.parse_args()

    model = None
    if args.model is not None:
        model = kvscope.Model(args.model or None, threads=args.threads)  # imports the runtime module
        print(model)
        text = CONTEXT
        if args.context:
            with open(args.context, encoding="utf-8") as f:
                text = f.read()
        kv = model.capture(text)  # the cache of `kvscope-cli capture --context FILE`
    else:
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

    if model is not None:
        # The question after the cached context, as `kvscope-cli generate --kv` asks it.
        print(f"Q: {args.question}")
        print(f"  original: {model.generate(args.question, kv=kv, max_new_tokens=16)!r}")
        for level in range(1, c.num_levels + 1):
            answer = model.generate(args.question, kv=kvscope.decode(data, level=level), max_new_tokens=16)
            print(f"  level {level}:  {answer!r}")

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
