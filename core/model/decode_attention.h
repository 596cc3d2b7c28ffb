// Attention of one query position over a long cache, for decode steps: the blocked attention of
// llama_session.cpp runs through BLAS, whose packing copies every key block once more for a
// 1-row product; this reads each cached key and value once, for all query heads of its group.
//
// READ ME FIRST
//  - Per KV head: scores s_gj = q_g . K_j (q already multiplied by the model's scale), optional
//    soft-capping (c tanh(s / c)), a softmax over keys j in [first, S), out_g = sum_j p_gj V_j.
//    The result is the blocked attention's up to the order of the sums and expf's last bit.
//  - The cache is read in the dtype the session holds it in (fp16 by default, bf16 or fp32), each
//    value converted to fp32 as it is loaded: the conversion is exact, so the result is the same
//    to the bit as on an fp32 copy of the cache, with half the bytes read.
//  - Paths: a scalar reference and AVX2 with F16C (decode_attention_avx2.cpp; chosen when
//    simdPath() is AVX2 or AVX-512 and head_dim is a multiple of 8: memory-bound, AVX-512 would
//    not pay).
#pragma once

#include "common/simd_path.h"

#include <cstdint>

namespace kvscope {

// How the cache stores a value: fp32, IEEE fp16 or bfloat16 (the upper half of an fp32).
enum class KvElem : uint8_t { F32, F16, BF16 };

struct DecodeAttention {
    const float* q = nullptr;  // (groups, headDim): the group's query heads, scaled
    const void* K = nullptr;   // (>= S, headDim) this KV head's keys, row j at element j * headDim
    const void* V = nullptr;   // (>= S, headDim) its values
    KvElem elem = KvElem::F32; // of K and V
    int groups = 1, headDim = 0;
    int64_t first = 0, S = 0;  // keys [first, S) are visible (first > 0: a sliding window)
    double softcap = 0.0;      // > 0: scores become softcap * tanh(score / softcap)
};

// out (groups, headDim). scratch: at least groups * (S - first) floats. Broken preconditions
// (no key, null pointers) abort.
void decodeAttention(const DecodeAttention& a, float* out, float* scratch, SimdPath path);

}  // namespace kvscope
