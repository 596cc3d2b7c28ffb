#!/usr/bin/env python3
"""Plain numpy fp32 forward pass of a Llama-architecture GGUF model (reference only).

What it does
    Reads a GGUF file with the `gguf` Python package, dequantizes every tensor to
    float32 (gguf.quants.dequantize), and runs a straightforward Llama decoder in
    numpy: RMSNorm (eps from metadata) -> attention with RoPE and GQA -> residual ->
    RMSNorm -> SwiGLU MLP -> residual, final RMSNorm, tied (or separate) output
    projection.  No quantized matmuls, no fp16 KV cache: this is the "exact-ish"
    fp32 target for kvscope's libtorch runtime (which also dequantizes to fp32).

    It is used by llamacpp_reference.py to fill the `numpy_fp32` section of
    tests/data/reference/smollm2_llamacpp.json, and can be run on its own for a
    quick check.

Q/K row order (important, verified with this script on SmolLM2-135M)
    convert_hf_to_gguf.py permutes the rows of attn_q / attn_k per head
    (reshape(n_head, 2, head_dim/2, n_embd).swapaxes(1, 2)), undoing the
    Hugging Face permutation.  So within each 64-row head the GGUF rows are in
    "interleaved pairs" order, and llama.cpp applies RoPE in NORM mode
    (LLAMA_ROPE_TYPE_NORM): rotate the adjacent pairs (x[2i], x[2i+1]) by pos*theta_i.
    A forward on GGUF weights must therefore EITHER
      (a) use the GGUF rows as-is with interleaved (NORM) rope  -> rope="norm" (default), OR
      (b) un-permute the q/k rows back to HF order
          (reshape(n_head, head_dim/2, 2, n_embd).swapaxes(1, 2)) and use HF
          rotate_half (NEOX) rope                               -> rope="neox_unpermuted".
    (a) and (b) are the same computation up to a per-head permutation of q/k
    channels (attention scores are identical).  Using GGUF rows with NEOX rope
    without un-permuting ("neox_wrong") is wrong and changes the logits visibly.
    NOTE for KV-cache work: the K vectors a runtime caches are in whichever channel
    order it chose; (a) and (b) give the same K values but in different channel
    orders (per-channel statistics move between channel indices).

Usage
    /opt/refenv/bin/python tests/reference/numpy_forward.py \
        --model ~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --ids 504 3575 282 4649 314 [--rope norm|neox_unpermuted|neox_wrong] [--gen 8]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class NumpyLlama:
    def __init__(self, path: str, dtype=np.float32, rope: str = "norm"):
        import gguf

        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"unsupported architecture {arch!r}")
        self.dtype = dtype
        self.rope = rope
        self.n_layer = int(_field(r, "llama.block_count"))
        self.n_embd = int(_field(r, "llama.embedding_length"))
        self.n_head = int(_field(r, "llama.attention.head_count"))
        self.n_head_kv = int(_field(r, "llama.attention.head_count_kv"))
        self.n_ff = int(_field(r, "llama.feed_forward_length"))
        self.eps = float(_field(r, "llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(_field(r, "llama.rope.freq_base", 10000.0))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(_field(r, "llama.rope.dimension_count", self.head_dim))
        assert self.n_rot == self.head_dim, "partial rotary not implemented"

        w = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            # numpy shape is (rows=out_features, cols=in_features); gguf lists [in, out]
            w[t.name] = np.ascontiguousarray(a.reshape([int(x) for x in reversed(t.shape)]), dtype=dtype)
        self.tok_embd = w["token_embd.weight"]            # (vocab, n_embd)
        self.output = w.get("output.weight", self.tok_embd)  # tied if absent
        self.tied = "output.weight" not in w
        self.out_norm = w["output_norm.weight"]
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            wq = w[p + "attn_q.weight"]
            wk = w[p + "attn_k.weight"]
            if rope in ("neox_unpermuted",):
                wq = self.unpermute(wq, self.n_head)
                wk = self.unpermute(wk, self.n_head_kv)
            self.layers.append(dict(
                attn_norm=w[p + "attn_norm.weight"], wq=wq, wk=wk,
                wv=w[p + "attn_v.weight"], wo=w[p + "attn_output.weight"],
                ffn_norm=w[p + "ffn_norm.weight"], gate=w[p + "ffn_gate.weight"],
                up=w[p + "ffn_up.weight"], down=w[p + "ffn_down.weight"]))
        del w
        i = np.arange(0, self.head_dim // 2, dtype=np.float64)
        self.inv_freq = self.theta ** (-2.0 * i / self.head_dim)  # (hd/2,)
        self.reset()

    @staticmethod
    def unpermute(wt, n_head):
        """GGUF (llama.cpp NORM rope) row order -> HF (rotate_half) row order."""
        rows, cols = wt.shape
        hd = rows // n_head
        return wt.reshape(n_head, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols).copy()

    def reset(self):
        self.k_cache = [np.zeros((0, self.n_head_kv, self.head_dim), self.dtype) for _ in range(self.n_layer)]
        self.v_cache = [np.zeros((0, self.n_head_kv, self.head_dim), self.dtype) for _ in range(self.n_layer)]
        self.n_past = 0

    def _rms(self, x, w):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return (x / np.sqrt(ms + self.dtype(self.eps))) * w

    def _rope(self, x, pos):
        # x: (T, H, hd); pos: (T,)
        ang = np.outer(pos.astype(np.float64), self.inv_freq)  # (T, hd/2)
        cos = np.cos(ang).astype(self.dtype)[:, None, :]
        sin = np.sin(ang).astype(self.dtype)[:, None, :]
        if self.rope == "norm":  # pairs (2i, 2i+1)
            x0, x1 = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = x0 * cos - x1 * sin
            out[..., 1::2] = x0 * sin + x1 * cos
            return out
        # neox / HF rotate_half: pairs (i, i + hd/2)
        h = self.head_dim // 2
        x0, x1 = x[..., :h], x[..., h:]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)

    def forward(self, ids):
        """Append `ids` to the cache; return logits (len(ids), vocab) in self.dtype."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        pos = np.arange(self.n_past, self.n_past + T)
        x = self.tok_embd[ids].astype(self.dtype)
        grp = self.n_head // self.n_head_kv
        scale = self.dtype(1.0 / np.sqrt(self.head_dim))
        S = self.n_past + T
        mask = np.triu(np.full((T, S), -np.inf, dtype=self.dtype), k=self.n_past + 1)
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["attn_norm"])
            q = (h @ L["wq"].T).reshape(T, self.n_head, self.head_dim)
            k = (h @ L["wk"].T).reshape(T, self.n_head_kv, self.head_dim)
            v = (h @ L["wv"].T).reshape(T, self.n_head_kv, self.head_dim)
            q = self._rope(q, pos)
            k = self._rope(k, pos)
            self.k_cache[li] = np.concatenate([self.k_cache[li], k], axis=0)
            self.v_cache[li] = np.concatenate([self.v_cache[li], v], axis=0)
            K = self.k_cache[li]  # (S, Hkv, hd)
            V = self.v_cache[li]
            att = np.empty((T, self.n_head, self.head_dim), self.dtype)
            for hq in range(self.n_head):
                hk = hq // grp
                s = (q[:, hq, :] @ K[:, hk, :].T) * scale + mask  # (T, S)
                s = s - s.max(axis=-1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=-1, keepdims=True)
                att[:, hq, :] = p @ V[:, hk, :]
            x = x + att.reshape(T, self.n_embd) @ L["wo"].T
            h = self._rms(x, L["ffn_norm"])
            g = h @ L["gate"].T
            u = h @ L["up"].T
            act = g / (1.0 + np.exp(-g)) * u
            x = x + act @ L["down"].T
        self.n_past += T
        x = self._rms(x, self.out_norm)
        return x @ self.output.T


def log_softmax64(logits):
    z = np.asarray(logits, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ids", type=int, nargs="+", required=True)
    ap.add_argument("--rope", default="norm", choices=["norm", "neox_unpermuted", "neox_wrong"])
    ap.add_argument("--gen", type=int, default=0, help="greedy tokens to generate")
    a = ap.parse_args()
    m = NumpyLlama(a.model, rope=a.rope)
    logits = m.forward(a.ids)
    last = logits[-1]
    top = np.argsort(-last)[:10]
    print("top10:", [(int(i), float(last[i])) for i in top])
    lp = log_softmax64(logits)
    print("teacher-forced logprobs:", [float(lp[t, a.ids[t + 1]]) for t in range(len(a.ids) - 1)])
    out = []
    nxt = int(np.argmax(last))
    for _ in range(a.gen):
        out.append(nxt)
        nxt = int(np.argmax(m.forward([nxt])[-1]))
    if a.gen:
        print("greedy:", out)


if __name__ == "__main__":
    sys.exit(main())
