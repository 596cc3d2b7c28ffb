# %% [markdown]
# # kvscope in a notebook: capture, look, compress, generate
#
# A script in cells (`# %%`: VS Code, Jupytext and Spyder open it as a notebook; `python3
# notebook.py` runs it top to bottom). It needs the runtime module (kvscope.Model) and the default
# model (installer/setup.sh); matplotlib and transformers are optional: without them the plot and
# the last cell say so and are skipped.
#
#     PYTHONPATH=build/dev/python ~/.cache/kvscope/pyenv/bin/python samples/python/notebook.py [--plot stats.png]
#
# Each cell prints what a reader would look at; the figures it prints come from the same calls as
# `kvscope-cli capture`, `stats`, `encode`, `decode` and `generate`.

# %%
import argparse
import json
import os
import sys

import numpy as np

import kvscope

SOURCE_DIR = os.environ.get("KVSCOPE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ap = argparse.ArgumentParser(description="kvscope in a notebook: capture, look, compress, generate")
ap.add_argument("--context", default="story", help="a sample id of samples/contexts with a question")
ap.add_argument("--plot", default="kvscope_layer_stats.png", help="where the per-layer plot goes (needs matplotlib)")
ap.add_argument("--new-tokens", type=int, default=16)
args = ap.parse_args([] if "ipykernel" in sys.modules else None)

# %% [markdown]
# ## 1. Capture a context's KV cache with the default model

# %%
with open(os.path.join(SOURCE_DIR, "samples", "contexts", f"{args.context}.txt"), encoding="utf-8") as f:
    text = f.read()
with open(os.path.join(SOURCE_DIR, "samples", "contexts", f"{args.context}.json"), encoding="utf-8") as f:
    question = json.load(f)["question"]
model = kvscope.Model(threads=1)  # the embedded default, resolved as kvscope-cli resolves --model
kv = model.capture(text)          # the cache of `kvscope-cli capture --context FILE`
print(model)
print(kv, f"{kv.nbytes / 1e6:.1f} MB")

# %% [markdown]
# ## 2. Per-layer statistics (CacheGen's observations: locality, layer-wise ranges)

# %%
st = kvscope.stats(kv)
layers = st["layers"]
print("layer  key absmax  value absmax  key var/delta-var  value var/delta-var")
for l in layers:
    print(f"{l['layer']:5d}  {l['key']['absmax']:10.3f}  {l['value']['absmax']:12.3f}  "
          f"{l['key']['delta_variance_ratio'] or float('nan'):17.2f}  {l['value']['delta_variance_ratio'] or float('nan'):19.2f}")
try:
    import matplotlib

    if "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
    print("plot skipped: matplotlib is not installed (apt install python3-matplotlib)")
if plt is not None:
    x = [l["layer"] for l in layers]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in ("key", "value"):
        a.plot(x, [l[kind]["absmax"] for l in layers], label=kind)
        b.plot(x, [l[kind]["delta_variance_ratio"] or np.nan for l in layers], label=kind)
    a.set(xlabel="layer", ylabel="absmax")
    b.set(xlabel="layer", ylabel="variance raw / delta")
    a.legend()
    b.legend()
    fig.tight_layout()
    fig.savefig(args.plot)
    print(f"plot: {args.plot}")

# %% [markdown]
# ## 3. Encode at every level of the default profile, and the baselines

# %%
data = kvscope.encode(kv)  # the bytes of `kvscope-cli encode`: every level in one container
c = kvscope.Container(data)
fp16 = kv.num_layers * 2 * kv.num_kv_heads * kv.num_tokens * kv.head_dim * 2
decoded = {}
for level in range(1, c.num_levels + 1):
    decoded[f"level {level}"] = kvscope.decode(data, level=level)
    size = c.level_bytes(level) + c.level_table_bytes(level)
    err = kvscope.compare(kv, decoded[f"level {level}"])
    print(f"level {level}: {size:8d} bytes, {fp16 / size:5.2f}x smaller than fp16, rms error {err['rms_error']:.4f}")
for codec in ("int8", "kivi2"):
    d = kvscope.encode(kv, codec=codec)
    decoded[codec] = kvscope.decode(d)
    print(f"{codec:7s}: {len(d):8d} bytes, {fp16 / len(d):5.2f}x smaller than fp16, "
          f"rms error {kvscope.compare(kv, decoded[codec])['rms_error']:.4f}")

# %% [markdown]
# ## 4. Generate from each decoded cache (kvscope's runtime)

# %%
print(f"Q: {question}")
print(f"  original: {model.generate(question, kv=kv, max_new_tokens=args.new_tokens)!r}")
for name, cache in decoded.items():
    print(f"  {name}: {model.generate(question, kv=cache, max_new_tokens=args.new_tokens)!r}")

# %% [markdown]
# ## 5. The same in Hugging Face transformers, with kvscope's codec as the cache
#
# The same GGUF file read by transformers; the context is prefilled into a `KVScopeCache`, which
# compresses it (`kvscope.encode`, every layer in one container) and keeps what `kvscope.decode`
# gives back; the question is then asked after it, as `model.generate(question, kv=...)` asks it.

# %%
try:
    import torch
    from transformers import DynamicCache

    from kvscope.hf import KVScopeCache, load_gguf_model
except ImportError as e:
    print(f"transformers cell skipped: {e} (installer/setup.sh makes a venv with transformers and gguf)")
else:
    torch.set_num_threads(1)
    hf = load_gguf_model(model.info["path"])
    context = list(kv.tokens)  # the tokens capture() prefilled
    ids = context + model.generate_json(question, kv=kv, max_new_tokens=1)["prompt_tokens"]
    caches = [("original", DynamicCache())] + [(f"level {l}", KVScopeCache(level=l, residual_length=0))
                                               for l in range(1, c.num_levels + 1)]
    for name, cache in caches:
        with torch.no_grad():
            hf(torch.tensor([context]), past_key_values=cache)
            if isinstance(cache, KVScopeCache):
                cache.compress()
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              past_key_values=cache, max_new_tokens=args.new_tokens, do_sample=False,
                              pad_token_id=hf.config.eos_token_id)
        answer = model.detokenize(out[0, len(ids):].tolist())
        size = f" ({cache.compressed_bytes} bytes)" if isinstance(cache, KVScopeCache) else ""
        print(f"  transformers, {name}{size}: {answer!r}")
