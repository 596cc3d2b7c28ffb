#!/usr/bin/env python3
"""Write an all-F32 copy of a GGUF file (diagnostic helper for the reference figures).

What it does
    Copies every metadata key of the input GGUF (general.file_type set to 0 = ALL_F32)
    and writes every tensor dequantized to float32 with gguf.quants.dequantize, same
    names, same row order (so attn_q/attn_k stay in llama.cpp's NORM-rope row order).
    llama.cpp running this file does F32 x F32 matmuls (no Q8 activation quantization),
    which isolates quantization noise from forward-pass bugs: with an F32 KV cache its
    logits must match tests/reference/numpy_forward.py to ~1e-4.
    llamacpp_reference.py --f32-gguf PATH uses such a file for the
    "diagnostic_llamacpp_f32gguf_vs_numpy_fp32" figures.

Usage (≈540 MB output; keep it outside the repository)
    /opt/refenv/bin/python tests/reference/dequantize_gguf_f32.py \
        ~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/SmolLM2-135M-Instruct.F32.gguf
"""
import sys

import numpy as np
import gguf


def main(src, dst):
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        val = field.contents()
        if field.name == "general.file_type":
            val = 0  # LLAMA_FTYPE_ALL_F32
        w.add_key_value(field.name, val, vt, sub_type=sub)
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        a = a.reshape([int(x) for x in reversed(t.shape)])
        w.add_tensor(t.name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
