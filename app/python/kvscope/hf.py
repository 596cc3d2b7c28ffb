"""Hugging Face transformers with a kvscope-compressed KV cache.

``KVScopeCache`` is a ``transformers.DynamicCache`` whose tokens, once they leave a short recent
window, are encoded with kvscope's codec (every layer of a segment in one ``.kvc`` container, as
``kvscope-cli encode`` codes a whole cache, so per-layer bins apply) and replaced by what the
decoder gives back. Attention then reads exactly what a receiver of the compressed cache would::

    from kvscope.hf import KVScopeCache, load_gguf_model
    model = load_gguf_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    cache = KVScopeCache(codec="cachegen", level=1)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=32, do_sample=False)
    print(cache.compressed_bytes, cache.compressed_tokens)

READ ME FIRST:
- Compression happens at the start of a forward pass (layer 0's update), for all layers at once:
  the prefill's own logits are computed from the full-precision states (as transformers'
  ``QuantizedCache`` does), and every later token attends to the decoded prefix. To score text
  against a compressed context, prefill the context, call ``cache.compress()``, then run the rest.
- The decoded values are held as tensors (the model's dtype), so that each step does not decode
  every container again; ``compressed_bytes`` counts what the containers take, the figure a
  transfer or a store would pay.
- Batch size 1 only (a kvscope KV cache is one sequence).
- The transform codec (``codec="transform"``) undoes RoPE before coding the keys, so the cache
  must know the model's RoPE (``rope_inv_freq``; each segment's first position is where it starts
  in the sequence) and, for the calibrated default profile that ``kvscope-cli encode --codec
  transform`` uses, the model's kvscope fingerprint. ``KVScopeCache(model=m)`` takes both from
  the model: the frequencies its rotary embedding applies, and the fingerprint
  ``load_gguf_model`` records. Without them the transform is fitted on each segment and keys are
  coded with RoPE in (a note on stderr says so).

Needs torch and transformers (4.46.3 on Debian 12's python3-torch 1.13; docs/python.md).
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from transformers import DynamicCache

from . import _kvscope


class KVScopeCache(DynamicCache):
    """A DynamicCache that keeps all but the ``residual_length`` most recent tokens kvscope-coded.

    codec, profile, level and ``encode_options`` (chunk_tokens, delta_group, tables, ...) are passed
    to ``kvscope.encode``; level None keeps every level in the containers and decodes the profile's
    default. kv_dtype is the precision the KV is handed to the codec in (what ``kvscope-cli capture
    --kv-dtype`` sets). The prompt is compressed as one segment; later tokens are compressed
    ``residual_length`` at a time (0: never, only the prompt).

    model (a transformers model), or rope_inv_freq and model_fingerprint, tell the codec what the
    keys carry and which model they come from (see READ ME FIRST; the transform codec needs them,
    the others ignore the RoPE). A codec whose containers hold every level (transform) is encoded
    with all of them and ``level`` (None: the profile's default) is the one decoded.
    """

    def __init__(
        self,
        codec: str = "cachegen",
        profile: Any = None,
        level: Optional[int] = None,
        residual_length: int = 128,
        kv_dtype: str = "float16",
        model: Any = None,
        rope_inv_freq: Any = None,
        model_fingerprint: str = "",
        **encode_options: Any,
    ) -> None:
        super().__init__()
        if residual_length < 0:
            raise _kvscope.Error(f"residual_length: {residual_length} is negative")
        self.codec = codec
        self.profile = profile
        self.level = level
        self.residual_length = residual_length
        self.kv_dtype = kv_dtype
        if model is not None:
            rope_inv_freq = rope_inv_freq if rope_inv_freq is not None else model_rope_inv_freq(model)
            model_fingerprint = model_fingerprint or getattr(model, "kvscope_fingerprint", "")
        self.rope_inv_freq = None if rope_inv_freq is None else np.asarray(rope_inv_freq, dtype=np.float32)
        self.model_fingerprint = model_fingerprint
        self.encode_options = encode_options
        self.compressed_tokens = 0  # tokens [0, compressed_tokens) hold decoded values
        # each: start, tokens, bytes (the decoded level's chunks, tables and side information: what
        # a receiver of that level fetches, as kvscope-cli eval counts it), container_bytes (the
        # whole .kvc, every level it holds)
        self.segments: List[Dict[str, int]] = []

    @property
    def compressed_bytes(self) -> int:
        return sum(s["bytes"] for s in self.segments)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        cache_kwargs: Optional[Dict[str, Any]] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[0] != 1:
            raise _kvscope.Error(f"KVScopeCache: batch size {key_states.shape[0]}, only 1 is supported")
        if layer_idx == 0 and len(self.key_cache) > 0:
            pending = self.get_seq_length() - self.compressed_tokens
            if self.compressed_tokens == 0 and pending > 0:
                self.compress()
            elif self.residual_length > 0 and pending >= self.residual_length:
                self.compress()
        return super().update(key_states, value_states, layer_idx, cache_kwargs)

    def compress(self) -> None:
        """Encodes the tokens not yet coded (every layer) and puts the decoded values in their place."""
        total = self.get_seq_length()
        start = self.compressed_tokens
        if total <= start:
            return
        layers = len(self.key_cache)

        def host(t: torch.Tensor) -> np.ndarray:
            return t[0, :, start:total, :].detach().to(torch.float32).cpu().numpy()

        kv = _kvscope.KV.from_arrays(
            [host(self.key_cache[l]) for l in range(layers)],
            [host(self.value_cache[l]) for l in range(layers)],
            dtype=self.kv_dtype,
            model_fingerprint=self.model_fingerprint,
            rope_inv_freq=self.rope_inv_freq,
            rope_position0=start,
        )
        # CacheGen with a level: a container of that level alone; otherwise every level, one decoded
        one_level = self.codec == "cachegen" and self.level is not None
        report: Dict[str, Any] = {}
        data = _kvscope.encode(kv, self.codec, self.profile, self.level if one_level else None, report=report,
                               **self.encode_options)
        level = 1 if one_level else (self.level or report["default_level"])
        if not 1 <= level <= len(report["levels"]):
            raise _kvscope.Error(f"level: {level} does not exist (the profile has {len(report['levels'])})")
        decoded = _kvscope.decode(data, level)
        for l in range(layers):
            for cache, tensor in ((self.key_cache, decoded.keys(l)), (self.value_cache, decoded.values(l))):
                t = cache[l]
                t[0, :, start:total, :] = torch.from_numpy(np.asarray(tensor, dtype=np.float32)).to(t.dtype)
        sent = report["levels"][level - 1]["bytes"]
        self.segments.append({"start": start, "tokens": total - start, "bytes": sent, "container_bytes": len(data)})
        self.compressed_tokens = total

    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        self.compressed_tokens = min(self.compressed_tokens, self.get_seq_length())


def model_rope_inv_freq(model: Any) -> np.ndarray:
    """(head_dim / 2) float32: the RoPE frequencies a transformers model applies to its keys: its
    rotary embedding's ``inv_freq`` (scaling included) when it has one, else 1 / rope_theta^(2i /
    head_dim) from its config (plain RoPE only)."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rotary is not None and getattr(rotary, "inv_freq", None) is not None:
        return rotary.inv_freq.detach().to(torch.float32).cpu().numpy()
    c = model.config
    if getattr(c, "rope_scaling", None):
        raise _kvscope.Error(f"rope_inv_freq: the config's rope_scaling {c.rope_scaling} needs the model's rotary embedding")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    theta = getattr(c, "rope_theta", 10000.0)
    return (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)).astype(np.float32)


def patch_generate_for_debian_torch() -> None:
    """transformers 4.46's generate() asks whether the model is FSDP-managed, which imports
    torch.distributed.fsdp; on torch 1.13 with Python 3.11 that import fails (a dataclass default
    in torch.distributed._shard). No kvscope user shards a model with FSDP: answer False."""
    import transformers.generation.utils as gen

    gen.is_fsdp_managed_module = lambda module: False


def load_gguf_model(path: str, dtype: torch.dtype = torch.float32):
    """A transformers LlamaForCausalLM from a GGUF file (the default model's Q4_1 file), without
    accelerate (which torch 1.13 on Python 3.11 cannot import): transformers dequantises the
    tensors, lm_head is tied to embed_tokens (the GGUF has no output tensor). Also applies
    patch_generate_for_debian_torch(). Returns the model in eval mode, with ``kvscope_fingerprint``
    set to the fingerprint kvscope gives the same file (``kvscope.model_fingerprint``; "" when the
    runtime module is not installed), which ``KVScopeCache(model=...)`` passes on."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    patch_generate_for_debian_torch()
    ckpt = load_gguf_checkpoint(path, return_tensors=True)
    config = dict(ckpt["config"])
    config.pop("model_type", None)
    config["tie_word_embeddings"] = "lm_head.weight" not in ckpt["tensors"]
    model = LlamaForCausalLM(LlamaConfig(**config))
    missing, unexpected = model.load_state_dict(ckpt["tensors"], strict=False)
    missing = [m for m in missing if m != "lm_head.weight" and "rotary_emb" not in m]
    if missing or unexpected:
        raise _kvscope.Error(f"{path}: GGUF tensors do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model = model.to(dtype).eval()
    try:
        from . import _kvscope_runtime
    except ImportError:  # pip install . without the runtime part: no fingerprint, no calibrated transform
        model.kvscope_fingerprint = ""
    else:
        model.kvscope_fingerprint = _kvscope_runtime.model_fingerprint(path)
    return model
