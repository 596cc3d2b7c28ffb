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
    """

    def __init__(
        self,
        codec: str = "cachegen",
        profile: Any = None,
        level: Optional[int] = None,
        residual_length: int = 128,
        kv_dtype: str = "float16",
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
        self.encode_options = encode_options
        self.compressed_tokens = 0  # tokens [0, compressed_tokens) hold decoded values
        self.segments: List[Dict[str, int]] = []  # each: start, tokens, bytes

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
        )
        data = _kvscope.encode(kv, self.codec, self.profile, self.level, **self.encode_options)
        decoded = _kvscope.decode(data)
        for l in range(layers):
            for cache, tensor in ((self.key_cache, decoded.keys(l)), (self.value_cache, decoded.values(l))):
                t = cache[l]
                t[0, :, start:total, :] = torch.from_numpy(np.asarray(tensor, dtype=np.float32)).to(t.dtype)
        self.segments.append({"start": start, "tokens": total - start, "bytes": len(data)})
        self.compressed_tokens = total

    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        self.compressed_tokens = min(self.compressed_tokens, self.get_seq_length())


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
    patch_generate_for_debian_torch(). Returns the model in eval mode."""
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
    return model.to(dtype).eval()
