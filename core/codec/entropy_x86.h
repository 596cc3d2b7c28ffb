// Internal to codec/: what the x86 kernels of the v2 entropy coder share (entropy_avx2.cpp,
// entropy_avx512.cpp): the target attributes, the gathers by scalar loads, and each file's entry
// points, which the dispatcher (entropy_simd.cpp) calls only when simdPathSupported says so.
// Each kernel decodes one row of D symbols of a 32-state stream (rans.h w32) and dequantizes it
// straight into the output dtype; the encoders code the same streams, bit for bit as the scalar
// loop (entropy_stage.cpp).
//
// READ ME FIRST
// - Symbols 16k..16k+15 (8k..8k+7 for AVX2) of a row use states (lane0 + 16k) % 32 onwards: one
//   state vector per step, the vectors rotating (2 for AVX-512, 4 for AVX2). A row needs
//   D % width == 0 so that a vector never spans two rows (two roles or two scales).
// - Slot -> symbol: the 64-bit bucket entries of the lanes (CodingTable::bucket: three
//   consecutive symbols of the bucket, the first one's start and the last slots of all three),
//   gathered in two independent halves, resolve every lane without a second, dependent gather;
//   a lane whose slot lies outside those three symbols (a bucket crossed by 3+ boundaries)
//   takes the scalar walk.
// - Uniform rows (one table for all channels of a row, TableScope::Head), AVX-512: the
//   table's buckets sit in registers (W32Row::split) and are looked up with two-register
//   permutes instead of gathers; with <= 32 symbols a lane outside its entry's three symbols
//   finds its symbol by a binary search over the starts, also in registers. AVX2 (16 registers
//   cannot hold a table): a slot index of the role's table (W32Row::slots, 16 KiB, L1
//   resident) gives symbol, offset in the symbol and frequency in one load per lane.
// - The kernels load per lane instead of using vpgather (gather8x32, gather8x64, gather16x32;
//   why: below). The AVX2 rows do the next step's lookup (slot index entries, or bucket entries
//   with per-channel tables) one step ahead, since that state vector is final a step early; the
//   AVX-512 rows do not: there the same look-ahead measured slower, with register lookups and
//   with per-lane loads alike. A look-ahead stays only where the bench shows it faster; the
//   figures: docs/codecs.md "Why the entropy kernels look as they do".
// - A call decodes W32Row::rows consecutive rows of one role (a delta group after its anchor),
//   the states and the table staying in registers across them.
// - Renormalisation reads words in symbol order: the lanes that need a word take the next words
//   in lane order (AVX-512 expand; AVX2 a permutation from a 256-entry table), and the read
//   pointer moves by their count. Loads look up to 32 bytes ahead, hence w32RowSlack.
// - Values: (q - m) * scale + base in float32 (mul, then add: the product is exact, so fused or
//   not gives the same bits), then the same rounding as common/half.h; NaN (only from corrupt
//   scales) becomes the scalar reference's quiet NaN.
// Compiled with target attributes, so the binary runs on CPUs without AVX2 or AVX-512; the
// kernels are only called when simdPathSupported says so.
#pragma once

#include "codec/codec_detail.h"
#include "codec/rans.h"

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVSCOPE_SIMD_X86 1
#endif

#ifdef KVSCOPE_SIMD_X86
namespace kvscope::detail {

constexpr uint32_t kSfWords = offsetof(CodingTable, sf) / 4;  // sf[] as a word offset into a CodingTable
static_assert(offsetof(CodingTable, sf) % 4 == 0 && offsetof(CodingTable, bucket) == 0, "the kernels address bucket[] at a table's start and sf[] in words");

#define KVS_AVX2 __attribute__((target("avx2,bmi2,popcnt,f16c,fma")))
#define KVS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi2,popcnt,f16c,fma")))

// ----- Gathers by scalar loads (AVX2 and AVX-512 kernels) ----------------------------------------

// Gathers by scalar loads, one per lane from L1: on Zen 4 (and on Intel cores with the
// gather-data-sampling mitigation) vpgather* is microcoded, and in the decode and encode loops
// here per-lane loads beat vpgatherdd (AVX2 rows, per-head tables) and two vpgatherqq of 8
// bucket entries (AVX-512 rows, per-channel tables) in bench codec, both forms alternating in
// one script. The indices reach general registers two at a time (vmovq / vpextrq, then a
// shift), not through a store to the stack and eight reloads, which decoded AVX2 rows more
// slowly in tests/bench/entropy_parts (both forms in one process). The measured figures:
// docs/codecs.md "Why the entropy kernels look as they do".
#if defined(__x86_64__)
KVS_AVX2 inline void lanePairs(__m128i idx, uint64_t* a, uint64_t* b)
{
    *a = uint64_t(_mm_cvtsi128_si64(idx));
    *b = uint64_t(_mm_extract_epi64(idx, 1));
}
#else  // 32-bit x86: no 64-bit moves out of a vector register
KVS_AVX2 inline void lanePairs(__m128i idx, uint64_t* a, uint64_t* b)
{
    alignas(16) uint32_t i[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(i), idx);
    *a = i[0] | uint64_t(i[1]) << 32;
    *b = i[2] | uint64_t(i[3]) << 32;
}
#endif
KVS_AVX2 inline __m128i load4x32(const int* t, __m128i idx)
{
    uint64_t a, b;
    lanePairs(idx, &a, &b);
    __m128i v = _mm_cvtsi32_si128(t[uint32_t(a)]);
    v = _mm_insert_epi32(v, t[a >> 32], 1);
    v = _mm_insert_epi32(v, t[uint32_t(b)], 2);
    return _mm_insert_epi32(v, t[b >> 32], 3);
}
KVS_AVX2 inline __m256i gather8x32(const int* t, __m256i idx)
{
    return _mm256_inserti128_si256(_mm256_castsi128_si256(load4x32(t, _mm256_castsi256_si128(idx))),
                                   load4x32(t, _mm256_extracti128_si256(idx, 1)), 1);
}
KVS_AVX2 inline __m256i gather4x64(const long long* t, __m128i idx)
{
    uint64_t a, b;
    lanePairs(idx, &a, &b);
    return _mm256_setr_epi64x(t[uint32_t(a)], t[a >> 32], t[uint32_t(b)], t[b >> 32]);
}

// ----- Entry points ------------------------------------------------------------------------------

// entropy_avx2.cpp: the row decoder for output k (D % 8 == 0), the encoder (D % 8 == 0), the
// symbol counter (stride <= 32) and the slot index of a table.
W32RowFn avx2RowKernel(RowOut k);
W32EncFn avx2EncodeKernel(bool small);
KVS_AVX2 void countAvx2(const uint8_t* sym, int tokens, int D, int deltaGroup, int roles, int stride, size_t roleStride,
                        uint32_t* counts);
KVS_AVX2 void slotIndexAvx2(const CodingTable& t, int alphabet, uint32_t* slots);

// entropy_avx512.cpp: the same for 16 lanes (D % 16 == 0); uniform: one table for the row
// (W32Row::split).
W32RowFn avx512RowKernel(RowOut k, bool uniform);
W32EncFn avx512EncodeKernel(bool small);
KVS_AVX512 void countAvx512(const uint8_t* sym, int tokens, int D, int deltaGroup, int roles, int stride,
                            size_t roleStride, uint32_t* counts);

}  // namespace kvscope::detail
#endif
