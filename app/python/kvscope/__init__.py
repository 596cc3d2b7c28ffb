"""kvscope from Python: KV caches, the CacheGen-style codec and its .kvc container.

The same core as ``kvscope-cli`` (no second implementation)::

    import kvscope
    kv = kvscope.read_kv("ctx.h5")            # HDF5 KV file, as `kvscope-cli capture` writes it
    k0 = kv.keys(0)                           # numpy view (kv_heads, tokens, head_dim)
    data = kvscope.encode(kv)                 # bytes of `kvscope-cli encode ctx.h5 --out X.kvc`
    kv2 = kvscope.decode(data, level=1)       # as `kvscope-cli decode X.kvc --level 1`
    print(kvscope.compare(kv, kv2)["max_abs_error"])

The model runtime (libtorch) is a second native module, loaded when ``kvscope.Model`` or
``kvscope.eval_suite`` is first used, so ``import kvscope`` and the codec load no torch::

    model = kvscope.Model()                   # the embedded default, as kvscope-cli resolves --model
    kv = model.capture(text)                  # the cache of `kvscope-cli capture`
    print(model.generate("Who is it about?", kv=kvscope.decode(kvscope.encode(kv))))

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

# The runtime part (kvscope._kvscope_runtime: libtorch), imported on first use (PEP 562). Not in
# __all__, so that `from kvscope import *` stays free of torch too.
_RUNTIME = ("Model", "eval_suite", "model_fingerprint")
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~30 ms); checkers know the name
if TYPE_CHECKING:
    from ._kvscope_runtime import Model, eval_suite, model_fingerprint  # noqa: F401


def __getattr__(name):
    if name in _RUNTIME:
        try:
            from . import _kvscope_runtime
        except ImportError as e:
            raise ImportError(
                f"kvscope.{name} needs the runtime module kvscope._kvscope_runtime (libtorch), which this install "
                "lacks: build it with the CMake build (KVSCOPE_PYTHON_RUNTIME=ON, the default) or "
                "pip install . --config-settings=cmake.define.KVSCOPE_PYTHON_RUNTIME=ON"
            ) from e
        return getattr(_kvscope_runtime, name)
    raise AttributeError(f"module 'kvscope' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + list(_RUNTIME))
