#!/usr/bin/env python3
"""Reference figures for kvscope's ggml dequantisers (core/modelio/ggml_quants.cpp), from the `gguf`
package's numpy dequantiser (gguf.quants.dequantize), which follows llama.cpp's block layouts.

Two modes, both offline generators (not run by ctest):

  golden OUT.txt
      Seeded random blocks of every quantised type kvscope reads (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
      Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): random bytes for the quantised fields, random finite fp16
      scales. Writes the bytes and the dequantised float32 bit patterns. tst_gguf reads this file
      and demands bit-equal values. Random bytes reach every bit pattern of the packed fields,
      including those a quantiser rarely writes.

  real MODEL.gguf OUT.txt
      Dequantises every tensor of a real checkpoint and writes per tensor: name, type, element
      count and an exact checksum of the float32 bit patterns (see checksum()). tst_gguf's
      real-checkpoint test recomputes the checksum from kvscope's dequantiser when the model is
      present (opt-in, label `model`).

Usage (venv outside the repository):
  python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install gguf==0.19.0 numpy
  /tmp/refenv/bin/python tests/reference/kquants_reference.py golden tests/data/ggml/golden_blocks.txt
  /tmp/refenv/bin/python tests/reference/kquants_reference.py real \
      ~/.cache/kvscope/models/gemma-3-270m-q4_k_m.gguf tests/data/ggml/gemma3_270m_dequant.txt
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the fp16 fields in one block, per type (ggml-common.h block structs).
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def checksum(values: np.ndarray) -> int:
    """sum over i of bits(v[i]) * (2 i + 1), modulo 2^64: any changed value changes it."""
    bits = values.reshape(-1).view(np.uint32).astype(np.uint64)
    weights = np.arange(bits.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return int(np.sum(bits * weights, dtype=np.uint64))


def golden(out_path: str) -> None:
    rng = np.random.default_rng(20261201)
    lines = ["# ggml golden blocks: gguf.quants.dequantize on seeded random blocks",
             "# made by: tests/reference/kquants_reference.py golden " + out_path,
             "# per type: 'type NUMBER NAME BLOCKS', 'bytes HEX', 'values HEX32 ...' (float32 bits)"]
    for qt in FP16_FIELDS:
        block_elems, block_bytes = GGML_QUANT_SIZES[qt]
        n_blocks = 3
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for b in range(n_blocks):
            for off in FP16_FIELDS[qt]:
                # finite scales of either sign, in the range real checkpoints use
                scale = np.float16(rng.uniform(-0.05, 0.05) if b else rng.uniform(0, 0.05))
                raw[b, off:off + 2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
        values = dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert values.size == n_blocks * block_elems and np.all(np.isfinite(values))
        lines.append(f"type {int(qt)} {qt.name} {n_blocks}")
        lines.append("bytes " + raw.tobytes().hex())
        lines.append("values " + " ".join(f"{int(v):08x}" for v in values.view(np.uint32)))
        print(f"{qt.name}: {n_blocks} blocks, {values.size} values, min {values.min():.6g}, max {values.max():.6g}")
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")


def real(model_path: str, out_path: str) -> None:
    reader = GGUFReader(model_path)
    lines = ["# gguf.quants.dequantize of every tensor of " + model_path.rsplit("/", 1)[-1],
             "# made by: tests/reference/kquants_reference.py real MODEL " + out_path,
             "# name type elements checksum (sum of float32 bits * (2i+1) mod 2^64, ggml element order)"]
    counts: dict = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        assert values.size == int(np.prod(t.shape))
        lines.append(f"{t.name} {t.tensor_type.name} {values.size} {checksum(values)}")
        c = counts.setdefault(t.tensor_type.name, [0, 0])
        c[0] += 1
        c[1] += values.size
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    for name, (n, v) in sorted(counts.items()):
        print(f"{name}: {n} tensors, {v} values")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "golden":
        golden(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "real":
        real(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
