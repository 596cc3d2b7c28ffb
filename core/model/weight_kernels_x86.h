// Internal to weight_kernels_avx2.cpp and weight_kernels_avx512.cpp: the block decoding both
// share, on 128-bit registers, and the row loops, written once over an instruction-set struct
// `Isa` that each file defines before including this header inside its target region:
//   Isa::Vec                         an accumulator register (8 or 16 floats)
//   Isa::zero()
//   Isa::mul16(q, x)                 the 16 signed bytes of q as floats times x[0..15]
//   Isa::fma16(q, x, acc)            acc + the same
//   Isa::scaleAdd(p, s, acc)         acc + p * s
//   Isa::hsum(v)                     the sum of the lanes
// READ ME FIRST
//  - Every format is brought to 16 signed bytes per 16 values (q - 8 for Q4_0, q - 16 for Q5_0,
//    q - 32 for Q6_K; Q4_1's and Q4_K's nibbles as they are, 0..15), so one conversion serves
//    them all. The block scale multiplies the block's (or sub-block's) products; an offset
//    (Q4_1's m, Q4_K's dmin * min) multiplies xs, the sum of x over its 32 values, given by the
//    caller (weight_kernels.cpp), one per 32 values and batch row.
//  - Included inside an anonymous namespace with the file's target pragma in force: everything
//    here has internal linkage and that file's instruction set, so no AVX code can leak into a
//    function another translation unit uses.
#pragma once

struct Blocks {
    const uint8_t* row;  // the row's first block
    const float* x;      // (batch, cols)
    const float* xs;     // (batch, cols / 32): sums of x over 32 values
    int64_t cols;
};

inline float h2f(const uint8_t* p)
{
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

inline __m128i low4(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(0x0F)); }
inline __m128i high4(__m128i v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)); }
inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// Blocks are read as one stream; a prefetch this far ahead of each block hides the miss (without
// it a decode step waited on memory: docs/models.md has the figures).
constexpr int kPrefetchBytes = 2048;
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0); }

// 0x10 in byte i where bit i of the 16 bits `h` is set (Q5_0's fifth bits).
inline __m128i fifthBits(uint32_t h)
{
    const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128(int(h)), _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m128i bit = _mm_set_epi8(-128, 64, 32, 16, 8, 4, 2, 1, -128, 64, 32, 16, 8, 4, 2, 1);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit), _mm_set1_epi8(0x10));
}

// Q4_0 (18 bytes / 32): d | qs[16]; x = (q - 8) d.
template <int B>
inline void rowQ4_0(const Blocks& k, float* out)
{
    typename Isa::Vec acc[B];
    for (int t = 0; t < B; ++t) acc[t] = Isa::zero();
    const __m128i eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < k.cols / 32; ++b) {
        const uint8_t* blk = k.row + 18 * b;
        prefetch(blk);
        const float d = h2f(blk);
        const __m128i v = load16(blk + 2);
        const __m128i lo = _mm_sub_epi8(low4(v), eight), hi = _mm_sub_epi8(high4(v), eight);
        for (int t = 0; t < B; ++t) {
            const float* x = k.x + t * k.cols + 32 * b;
            acc[t] = Isa::scaleAdd(Isa::fma16(hi, x + 16, Isa::mul16(lo, x)), d, acc[t]);
        }
    }
    for (int t = 0; t < B; ++t) out[t] = Isa::hsum(acc[t]);
}

// Q4_1 (20 bytes / 32): d | m | qs[16]; x = q d + m.
template <int B>
inline void rowQ4_1(const Blocks& k, float* out)
{
    typename Isa::Vec acc[B];
    float off[B];
    for (int t = 0; t < B; ++t) acc[t] = Isa::zero(), off[t] = 0.0f;
    const int64_t nb = k.cols / 32;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = k.row + 20 * b;
        prefetch(blk);
        const float d = h2f(blk), m = h2f(blk + 2);
        const __m128i v = load16(blk + 4);
        const __m128i lo = low4(v), hi = high4(v);
        for (int t = 0; t < B; ++t) {
            const float* x = k.x + t * k.cols + 32 * b;
            acc[t] = Isa::scaleAdd(Isa::fma16(hi, x + 16, Isa::mul16(lo, x)), d, acc[t]);
            off[t] += m * k.xs[t * nb + b];
        }
    }
    for (int t = 0; t < B; ++t) out[t] = Isa::hsum(acc[t]) + off[t];
}

// Q5_0 (22 bytes / 32): d | qh (32 fifth bits) | qs[16]; x = (q - 16) d.
template <int B>
inline void rowQ5_0(const Blocks& k, float* out)
{
    typename Isa::Vec acc[B];
    for (int t = 0; t < B; ++t) acc[t] = Isa::zero();
    const __m128i sixteen = _mm_set1_epi8(16);
    for (int64_t b = 0; b < k.cols / 32; ++b) {
        const uint8_t* blk = k.row + 22 * b;
        prefetch(blk);
        const float d = h2f(blk);
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        const __m128i v = load16(blk + 6);
        const __m128i lo = _mm_sub_epi8(_mm_or_si128(low4(v), fifthBits(qh & 0xFFFF)), sixteen);
        const __m128i hi = _mm_sub_epi8(_mm_or_si128(high4(v), fifthBits(qh >> 16)), sixteen);
        for (int t = 0; t < B; ++t) {
            const float* x = k.x + t * k.cols + 32 * b;
            acc[t] = Isa::scaleAdd(Isa::fma16(hi, x + 16, Isa::mul16(lo, x)), d, acc[t]);
        }
    }
    for (int t = 0; t < B; ++t) out[t] = Isa::hsum(acc[t]);
}

// Q8_0 (34 bytes / 32): d | int8 q[32]; x = q d.
template <int B>
inline void rowQ8_0(const Blocks& k, float* out)
{
    typename Isa::Vec acc[B];
    for (int t = 0; t < B; ++t) acc[t] = Isa::zero();
    for (int64_t b = 0; b < k.cols / 32; ++b) {
        const uint8_t* blk = k.row + 34 * b;
        prefetch(blk);
        const float d = h2f(blk);
        const __m128i q0 = load16(blk + 2), q1 = load16(blk + 18);
        for (int t = 0; t < B; ++t) {
            const float* x = k.x + t * k.cols + 32 * b;
            acc[t] = Isa::scaleAdd(Isa::fma16(q1, x + 16, Isa::mul16(q0, x)), d, acc[t]);
        }
    }
    for (int t = 0; t < B; ++t) out[t] = Isa::hsum(acc[t]);
}

// Scale and min j (0..7) of a Q4_K super-block, 6 bits each in 12 bytes (ggml_quants.cpp).
inline void scaleMinQ4K(int j, const uint8_t* q, int* sc, int* m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K (144 bytes / 256): d | dmin | scales[12] | qs[128]; 32 bytes of nibbles hold sub-blocks
// 2j (low) and 2j + 1 (high); x = d sc q - dmin m.
template <int B>
inline void rowQ4_K(const Blocks& k, float* out)
{
    typename Isa::Vec acc[B];
    float off[B];
    for (int t = 0; t < B; ++t) acc[t] = Isa::zero(), off[t] = 0.0f;
    const int64_t n32 = k.cols / 32;
    for (int64_t b = 0; b < k.cols / 256; ++b) {
        const uint8_t* blk = k.row + 144 * b;
        prefetch(blk);
        const float d = h2f(blk), dmin = h2f(blk + 2);
        for (int j = 0; j < 4; ++j) {
            const uint8_t* qs = blk + 16 + 32 * j;
            const __m128i v0 = load16(qs), v1 = load16(qs + 16);
            int sc0, m0, sc1, m1;
            scaleMinQ4K(2 * j, blk + 4, &sc0, &m0);
            scaleMinQ4K(2 * j + 1, blk + 4, &sc1, &m1);
            const float d0 = d * float(sc0), d1 = d * float(sc1);
            const float o0 = dmin * float(m0), o1 = dmin * float(m1);
            const __m128i a0 = low4(v0), a1 = low4(v1), h0 = high4(v0), h1 = high4(v1);
            for (int t = 0; t < B; ++t) {
                const float* x = k.x + t * k.cols + 256 * b + 64 * j;
                acc[t] = Isa::scaleAdd(Isa::fma16(a1, x + 16, Isa::mul16(a0, x)), d0, acc[t]);
                acc[t] = Isa::scaleAdd(Isa::fma16(h1, x + 48, Isa::mul16(h0, x + 32)), d1, acc[t]);
                const float* xs = k.xs + t * n32 + 8 * b + 2 * j;
                off[t] += o0 * xs[0] + o1 * xs[1];
            }
        }
    }
    for (int t = 0; t < B; ++t) out[t] = Isa::hsum(acc[t]) - off[t];
}

// Q6_K (210 bytes / 256): ql[128] | qh[64] | int8 scales[16] | d; per half of 128 values, value
// l + 32i (i = 0..3) takes low bits from ql (nibble i / 2 of byte l + 32 (i % 2)) and high bits
// 2i, 2i + 1 of qh[l]; x = d sc (q - 32), one scale per 16 values.
template <int B>
inline void rowQ6_K(const Blocks& k, float* out)
{
    typename Isa::Vec acc[B];
    for (int t = 0; t < B; ++t) acc[t] = Isa::zero();
    const __m128i m30 = _mm_set1_epi8(0x30), m32 = _mm_set1_epi8(32);
    for (int64_t b = 0; b < k.cols / 256; ++b) {
        const uint8_t* blk = k.row + 210 * b;
        prefetch(blk);
        const float d = h2f(blk + 208);
        for (int half = 0; half < 2; ++half) {
            const uint8_t* ql = blk + 64 * half;
            const uint8_t* qh = blk + 128 + 32 * half;
            const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * half);
            for (int g = 0; g < 2; ++g) {
                const __m128i a = load16(ql + 16 * g), c = load16(ql + 32 + 16 * g), h = load16(qh + 16 * g);
                const __m128i q[4] = {
                    _mm_sub_epi8(_mm_or_si128(low4(a), _mm_and_si128(_mm_slli_epi16(h, 4), m30)), m32),
                    _mm_sub_epi8(_mm_or_si128(low4(c), _mm_and_si128(_mm_slli_epi16(h, 2), m30)), m32),
                    _mm_sub_epi8(_mm_or_si128(high4(a), _mm_and_si128(h, m30)), m32),
                    _mm_sub_epi8(_mm_or_si128(high4(c), _mm_and_si128(_mm_srli_epi16(h, 2), m30)), m32),
                };
                for (int i = 0; i < 4; ++i) {
                    const float s = d * float(sc[g + 2 * i]);
                    for (int t = 0; t < B; ++t) {
                        const float* x = k.x + t * k.cols + 256 * b + 128 * half + 32 * i + 16 * g;
                        acc[t] = Isa::scaleAdd(Isa::mul16(q[i], x), s, acc[t]);
                    }
                }
            }
        }
    }
    for (int t = 0; t < B; ++t) out[t] = Isa::hsum(acc[t]);
}

// Rows [r0, r1) of w for a batch of B rows of x.
template <int B>
inline void rowsOf(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, const float* xs, float* y,
                   int64_t yStride)
{
    void (*row)(const Blocks&, float*) = nullptr;
    switch (w.type) {
    case GgmlQ4_0: row = rowQ4_0<B>; break;
    case GgmlQ4_1: row = rowQ4_1<B>; break;
    case GgmlQ5_0: row = rowQ5_0<B>; break;
    case GgmlQ8_0: row = rowQ8_0<B>; break;
    case GgmlQ4_K: row = rowQ4_K<B>; break;
    case GgmlQ6_K: row = rowQ6_K<B>; break;
    default: KVSCOPE_ASSERT(false);
    }
    for (int64_t r = r0; r < r1; ++r) {
        float out[B];
        row(Blocks{w.data + uint64_t(r) * w.rowBytes, x, xs, w.cols}, out);
        for (int t = 0; t < B; ++t) y[t * yStride + r] = out[t];
    }
}

inline void packedRows(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, int batch, const float* xs,
                       float* y, int64_t yStride)
{
    switch (batch) {
    case 1: return rowsOf<1>(w, r0, r1, x, xs, y, yStride);
    case 2: return rowsOf<2>(w, r0, r1, x, xs, y, yStride);
    case 3: return rowsOf<3>(w, r0, r1, x, xs, y, yStride);
    case 4: return rowsOf<4>(w, r0, r1, x, xs, y, yStride);
    default: KVSCOPE_ASSERT(false);
    }
}
