// Dequantisation of ggml tensor blocks (the block layouts of llama.cpp's ggml-quants), torch-free.
//
// Every function here works on raw little-endian bytes and never reads past the `bytes` it is
// given: a caller that passes a short buffer gets kvscope::Error, not an out-of-bounds read.
// Values are computed in the same float operations and order as ggml's reference
// dequantize_row_* functions, so results equal llama.cpp's and the `gguf` Python package's
// bit for bit (tests/reference/kquants_reference.py checks that on real tensors).
#pragma once

#include <cstdint>
#include <string>

namespace kvscope {

// ggml type numbers (ggml.h) of the types dequantizeGgml() handles.
enum GgmlType : uint32_t {
    GgmlF32 = 0,
    GgmlF16 = 1,
    GgmlQ4_0 = 2,   // blocks of 32: fp16 d, 16 bytes of nibbles; x = (q - 8) * d
    GgmlQ4_1 = 3,   // blocks of 32: fp16 d, fp16 m, 16 bytes of nibbles; x = q * d + m
    GgmlQ5_0 = 6,   // blocks of 32: fp16 d, 32 high bits, 16 bytes of nibbles; x = (q - 16) * d
    GgmlQ5_1 = 7,   // blocks of 32: fp16 d, fp16 m, 32 high bits, nibbles; x = q * d + m
    GgmlQ8_0 = 8,   // blocks of 32: fp16 d, 32 x int8; x = q * d
    GgmlQ2_K = 10,  // super-blocks of 256: 16 sub-blocks of 16 with 4-bit scale and min, 2-bit q
    GgmlQ3_K = 11,  // 256: 16 sub-blocks with 6-bit signed scales, 3-bit q (2 low + 1 high bit)
    GgmlQ4_K = 12,  // 256: 8 sub-blocks of 32 with 6-bit scale and min, 4-bit q
    GgmlQ5_K = 13,  // 256: as Q4_K with a fifth bit per value
    GgmlQ6_K = 14,  // 256: 16 sub-blocks of 16 with int8 scales, 6-bit q (4 low + 2 high bits)
    GgmlBF16 = 30,
};

// True for the types dequantizeGgml() handles.
bool canDequantize(uint32_t type);
// "F32, F16, BF16, Q4_0, ..." for error messages.
extern const char* const kSupportedTypes;

// Bytes that `elements` values of `type` occupy; 0 when `type` is not handled or `elements` is
// not a whole number of blocks.
uint64_t ggmlRowBytes(uint32_t type, uint64_t elements);

// Dequantises `elements` values of `type` from `src` (`bytes` long) into dst. Throws
// kvscope::Error ("ggml TYPE: reason") for an unhandled type, an element count that is not a
// whole number of blocks, or `bytes` that does not hold exactly that many blocks (a truncated
// block). Callers add the file and tensor to the message.
void dequantizeGgml(uint32_t type, const uint8_t* src, uint64_t bytes, uint64_t elements, float* dst);

}  // namespace kvscope
