// The AVX-512 kernels of the v2 entropy coder: 16 lanes, 2 state vectors (entropy_x86.h has the
// rules they share with AVX2). Every function carries the AVX-512 target attribute, so the file
// builds without -mavx512* and its code runs only when the dispatcher has checked the CPU.
#include "codec/entropy_x86.h"

#ifdef KVSCOPE_SIMD_X86

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build vectors from deliberately undefined ones (false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "codec/codec_detail.h"
#include "codec/rans.h"

#include <algorithm>
#include <cstring>

namespace kvscope::detail {

namespace {

KVS_AVX512 inline __m512i gather8x64(const long long* t, __m256i idx)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(gather4x64(t, _mm256_castsi256_si128(idx))),
                              gather4x64(t, _mm256_extracti128_si256(idx, 1)), 1);
}
KVS_AVX512 inline __m512i gather16x32(const int* t, __m512i idx)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(gather8x32(t, _mm512_castsi512_si256(idx))),
                              gather8x32(t, _mm512_extracti64x4_epi64(idx, 1)), 1);
}

// The slot -> (symbol, start, freq) lookup of 16 lanes: two gathers of 8 bucket entries (no
// dependency between them; scalar loads, see gather8x64), then s0 + (slot > last0) +
// (slot > last1) (prob_table.h).
struct Lookup16 {
    __m512i sym, start, freq;
    __mmask16 rare;  // lanes outside their entry's three symbols (resolve512 with T: already walked)
};

// Lanes whose slot lies outside their bucket entry's three symbols: the scalar walk (rare).
// Takes and returns the lookup by value, so that the hot path keeps it in registers.
KVS_AVX512 __attribute__((noinline)) Lookup16 lookupRare512(const int* T, __m512i idx, __m512i slot, __mmask16 rare,
                                                            Lookup16 lk)
{
    alignas(64) int32_t ix[16], sl[16], sy[16], st[16], fr[16];
    _mm512_store_si512(ix, idx);
    _mm512_store_si512(sl, slot);
    _mm512_store_si512(sy, lk.sym);
    _mm512_store_si512(st, lk.start);
    _mm512_store_si512(fr, lk.freq);
    for (int j = 0; j < 16; ++j)
        if ((rare >> j) & 1) {
            const CodingTable& ct = *reinterpret_cast<const CodingTable*>(T + ix[j]);
            const int s = ct.symbolOf(uint32_t(sl[j]));
            sy[j] = s;
            st[j] = int32_t(ct.start(s));
            fr[j] = int32_t(ct.freq(s));
        }
    lk.sym = _mm512_load_si512(sy);
    lk.start = _mm512_load_si512(st);
    lk.freq = _mm512_load_si512(fr);
    return lk;
}

// Resolves 16 lanes from their bucket entries' low words a (s0 | start0 | last0) and high words
// c (last1 | last2); the lanes outside [start0, last2] take the scalar walk.
KVS_AVX512 inline __attribute__((always_inline)) Lookup16 resolve512(__m512i a, __m512i c, __m512i slot, const int* T, __m512i idx)
{
    const __m512i m12 = _mm512_set1_epi32(4095), one = _mm512_set1_epi32(1);
    const __m512i e0 = _mm512_srli_epi32(a, 20), e1 = _mm512_and_si512(c, m12), e2 = _mm512_srli_epi32(c, 12);
    const __mmask16 g0 = _mm512_cmpgt_epu32_mask(slot, e0), g1 = _mm512_cmpgt_epu32_mask(slot, e1);
    Lookup16 lk;
    lk.sym = _mm512_and_si512(a, _mm512_set1_epi32(0xff));
    lk.sym = _mm512_mask_add_epi32(lk.sym, g0, lk.sym, one);
    lk.sym = _mm512_mask_add_epi32(lk.sym, g1, lk.sym, one);
    const __m512i start0 = _mm512_and_si512(_mm512_srli_epi32(a, 8), m12);
    __m512i start = _mm512_mask_add_epi32(start0, g0, e0, one);
    start = _mm512_mask_add_epi32(start, g1, e1, one);
    const __m512i end = _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(e0, g0, e1), g1, e2);
    lk.start = start;
    lk.freq = _mm512_sub_epi32(_mm512_add_epi32(end, one), start);
    lk.rare = _mm512_cmpgt_epu32_mask(slot, e2) | _mm512_cmplt_epu32_mask(slot, start0);
    if (__builtin_expect(lk.rare != 0, 0) && T) lk = lookupRare512(T, idx, slot, lk.rare, lk);
    return lk;
}

// Always inlined: a call returns the Lookup16 through memory (three vectors on the stack), on
// the chain from one state vector to the next.
KVS_AVX512 inline __attribute__((always_inline)) Lookup16 lookup512(const int* T, __m512i idx, __m512i slot)
{
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i b = _mm512_add_epi32(_mm512_srli_epi32(idx, 1), _mm512_srli_epi32(slot, CodingTable::kBucketShift));
    const long long* T64 = reinterpret_cast<const long long*>(T);
    const __m512i lo = gather8x64(T64, _mm512_castsi512_si256(b));
    const __m512i hi = gather8x64(T64, _mm512_extracti64x4_epi64(b, 1));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i a = _mm512_permutex2var_epi32(lo, even, hi);                                // s0 | start0 | last0
    const __m512i c = _mm512_permutex2var_epi32(lo, _mm512_add_epi32(even, one), hi);         // last1 | last2
    return resolve512(a, c, slot, T, idx);
}

// One table for all 16 lanes (W32Row::split): its 64 bucket entries held in registers, the low
// words in a[0..3] and the high words in c[0..3], looked up with two-register permutes instead
// of gathers: no memory access on the decoding chain.
// With an alphabet of at most 32 symbols st[0..1] also hold start(s) for s < 32 (4096 past the
// alphabet), and lanes outside the entry's three symbols find theirs by a binary search over them.
struct Regs16 {
    __m512i a[4], c[4], st[2];
};

KVS_AVX512 inline Regs16 loadSplit512(const uint32_t* split)
{
    Regs16 R;
    for (int j = 0; j < 4; ++j) {
        R.a[j] = _mm512_load_si512(split + 16 * j);
        R.c[j] = _mm512_load_si512(split + 64 + 16 * j);
    }
    R.st[0] = _mm512_load_si512(split + 128);
    R.st[1] = _mm512_load_si512(split + 144);
    return R;
}

// The largest s < 32 with start(s) <= slot, for the lanes in `m`: five halving steps.
KVS_AVX512 inline void searchSmall512(const Regs16& R, __m512i slot, __mmask16 m, Lookup16& lk)
{
    __m512i sym = _mm512_setzero_si512();
    for (int step = 16; step >= 1; step >>= 1) {
        const __m512i cand = _mm512_add_epi32(sym, _mm512_set1_epi32(step));
        const __m512i st = _mm512_permutex2var_epi32(R.st[0], cand, R.st[1]);
        sym = _mm512_mask_mov_epi32(sym, _mm512_cmple_epu32_mask(st, slot), cand);
    }
    const __m512i next = _mm512_add_epi32(sym, _mm512_set1_epi32(1));
    const __m512i start = _mm512_permutex2var_epi32(R.st[0], sym, R.st[1]);
    // next == 32 wraps to index 0 in the permute: the end of the alphabet is slot 4096.
    const __m512i end = _mm512_mask_mov_epi32(_mm512_permutex2var_epi32(R.st[0], next, R.st[1]),
                                              _mm512_cmpeq_epi32_mask(next, _mm512_set1_epi32(32)),
                                              _mm512_set1_epi32(int(rans::kProbScale)));
    lk.sym = _mm512_mask_mov_epi32(lk.sym, m, sym);
    lk.start = _mm512_mask_mov_epi32(lk.start, m, start);
    lk.freq = _mm512_mask_mov_epi32(lk.freq, m, _mm512_sub_epi32(end, start));
}

KVS_AVX512 inline Lookup16 lookupRegs512(const Regs16& R, bool small, const int* T, const int32_t* tw, __m512i slot)
{
    const __m512i b = _mm512_srli_epi32(slot, CodingTable::kBucketShift);  // 0..63: bit 5 picks the pair
    const __mmask16 top = _mm512_test_epi32_mask(b, _mm512_set1_epi32(32));
    const __m512i a = _mm512_mask_mov_epi32(_mm512_permutex2var_epi32(R.a[0], b, R.a[1]), top,
                                            _mm512_permutex2var_epi32(R.a[2], b, R.a[3]));
    const __m512i c = _mm512_mask_mov_epi32(_mm512_permutex2var_epi32(R.c[0], b, R.c[1]), top,
                                            _mm512_permutex2var_epi32(R.c[2], b, R.c[3]));
    Lookup16 lk = resolve512(a, c, slot, nullptr, _mm512_setzero_si512());
    if (__builtin_expect(lk.rare != 0, 0)) {
        if (small) searchSmall512(R, slot, lk.rare, lk);
        else lk = lookupRare512(T, _mm512_loadu_si512(tw), slot, lk.rare, lk);
    }
    return lk;
}

template <RowOut K, bool Uniform>
KVS_AVX512 void rowAvx512(W32Stream& s, const W32Row& row_)
{
    const W32Row r = row_;  // a local copy: the output stores cannot alias its fields, so they stay in registers
    const int nv = r.D / 16, rows = r.rows;
    __m512i xa = _mm512_load_si512(s.x + r.lane0), xb = _mm512_load_si512(s.x + (r.lane0 ^ 16));
    const uint8_t* p = s.p;
    const int* T = reinterpret_cast<const int*>(r.tables);
    const __m512i m12 = _mm512_set1_epi32(4095), one = _mm512_set1_epi32(1);
    const __m512i lowL = _mm512_set1_epi32(int(rans::w32::kL));
    const __m512 mq = _mm512_set1_ps(float(r.m));
    Regs16 R;
    const bool small = Uniform && r.split[160] != 0;
    if constexpr (Uniform) R = loadSplit512(r.split);
    uint8_t* o = r.out;
    for (int row = 0; row < rows; ++row, o += size_t(r.D) * rowOutBytes(K)) {
        const __m512 tokenScale = _mm512_set1_ps(r.rowScales ? _cvtsh_ss(r.rowScales[row]) : r.scale);
        for (int v = 0; v < nv; ++v) {
            const int d0 = 16 * v;
            const __m512i slot = _mm512_and_si512(xa, m12);
            Lookup16 lk;
            if constexpr (Uniform) lk = lookupRegs512(R, small, T, r.tableWord + d0, slot);
            else lk = lookup512(T, _mm512_loadu_si512(r.tableWord + d0), slot);
            const __m512i sym = lk.sym;
            const __m512i k = _mm512_sub_epi32(slot, lk.start);
            __m512i x = _mm512_add_epi32(_mm512_mullo_epi32(lk.freq, _mm512_srli_epi32(xa, 12)), k);
            const __mmask16 need = _mm512_cmplt_epu32_mask(x, lowL);
            const __m512i words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
            x = _mm512_mask_or_epi32(x, need, _mm512_slli_epi32(x, 16), _mm512_maskz_expand_epi32(need, words));
            p += 2 * _mm_popcnt_u32(need);
            xa = xb;
            xb = x;
            if constexpr (K == RowOut::Symbols) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(o + d0), _mm512_cvtepi32_epi8(sym));
            } else {
                const __m512 sc = r.scaleVec ? _mm512_loadu_ps(r.scaleVec + d0) : tokenScale;
                const __m512 q = _mm512_sub_ps(_mm512_cvtepi32_ps(sym), mq);  // exact: small integers
                __m512 val = _mm512_mul_ps(q, sc);
                if (r.base) val = _mm512_add_ps(val, _mm512_loadu_ps(r.base + d0));
                else val = _mm512_add_ps(val, _mm512_setzero_ps());
                if (r.anchorOut) _mm512_storeu_ps(r.anchorOut + d0, val);
                if constexpr (K == RowOut::F32) {
                    _mm512_storeu_ps(reinterpret_cast<float*>(o) + d0, val);
                } else if constexpr (K == RowOut::F16) {
                    __m256i hv = _mm512_cvtps_ph(val, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    const __mmask16 nan = _mm512_cmp_ps_mask(val, val, _CMP_UNORD_Q);
                    if (nan) {
                        const __m256i sign = _mm512_cvtepi32_epi16(
                            _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(val), 16), _mm512_set1_epi32(0x8000)));
                        hv = _mm256_mask_blend_epi16(nan, hv, _mm256_or_si256(sign, _mm256_set1_epi16(0x7e00)));
                    }
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2 * size_t(d0)), hv);
                } else {
                    const __m512i xb16 = _mm512_castps_si512(val);
                    const __m512i rounded = _mm512_srli_epi32(
                        _mm512_add_epi32(xb16, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                                _mm512_and_si512(_mm512_srli_epi32(xb16, 16), one))), 16);
                    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(xb16, _mm512_set1_epi32(0x7fffffff)),
                                                                  _mm512_set1_epi32(0x7f800000));
                    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(xb16, 16), _mm512_set1_epi32(0x40));
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2 * size_t(d0)),
                                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
                }
            }
        }
    }
    // xa holds the states of the next symbol's vector: lanes (lane0 + 16 nv rows) % 32.
    const int next = (r.lane0 + 16 * nv * rows) & 31;
    _mm512_store_si512(s.x + next, xa);
    _mm512_store_si512(s.x + (next ^ 16), xb);
    s.p = p;
}

// The encoder, 16 symbols a step from the last to the first (D % 16 == 0): gather the symbols'
// start | freq << 16, emit the low words of the states that need renormalising (compressed, in
// lane order, as one block in front of the words already written), and divide by the frequency
// in single precision with an exact correction.
// Small: one table of <= 32 symbols per role (W32EncJob::small), start | freq and 1 / freq looked
// up with permutes instead of a gather and a division (the same reciprocal: IEEE division is
// correctly rounded either way).
template <bool Small>
KVS_AVX512 void encodeAvx512(const W32EncJob& j, uint32_t* x, uint16_t*& words)
{
    const int D = j.D;
    const int* T = reinterpret_cast<const int*>(j.tables);
    const __m512i sfOff = _mm512_set1_epi32(int(kSfWords)), lo16 = _mm512_set1_epi32(0xffff), one = _mm512_set1_epi32(1);
    __m512i sfR[2][2], rcpR[2][2];
    if constexpr (Small)
        for (int role = 0; role < 2; ++role)
            for (int k = 0; k < 2; ++k) {
                sfR[role][k] = _mm512_load_si512(j.small + 64 * role + 16 * k);
                rcpR[role][k] = _mm512_load_si512(j.small + 64 * role + 32 + 16 * k);
            }
    uint16_t* w = words;
    for (int t = j.tokens - 1; t >= 0; --t) {
        const int role = j.deltaGroup >= 2 && t % j.deltaGroup == 0 ? 1 : 0;
        const int32_t* tw = j.tableWord + (role ? D : 0);
        const uint8_t* row = j.sym + size_t(t) * D;
        for (int d0 = D - 16; d0 >= 0; d0 -= 16) {
            uint32_t* xs = x + ((size_t(t) * D + size_t(d0)) & 31);
            __m512i st = _mm512_load_si512(xs);
            const __m512i sym = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d0)));
            __m512i sf;
            __m512 rcp;
            if constexpr (Small) {
                sf = _mm512_permutex2var_epi32(sfR[role][0], sym, sfR[role][1]);
                rcp = _mm512_castsi512_ps(_mm512_permutex2var_epi32(rcpR[role][0], sym, rcpR[role][1]));
            } else {
                const __m512i idx = _mm512_add_epi32(_mm512_loadu_si512(tw + d0), _mm512_add_epi32(sym, sfOff));
                sf = gather16x32(T, idx);
            }
            const __m512i freq = _mm512_srli_epi32(sf, 16);
            if constexpr (!Small) rcp = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_cvtepi32_ps(freq));
            const __mmask16 need = _mm512_cmpge_epu32_mask(st, _mm512_slli_epi32(freq, 20));
            const int cnt = _mm_popcnt_u32(need);
            w -= cnt;
            _mm256_mask_storeu_epi16(w, __mmask16((1u << cnt) - 1u),
                                     _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(need, st)));
            st = _mm512_mask_srli_epi32(st, need, st, 16);
            // q = floor(st / freq) in float32: st < 2^20 freq, so float(st) * (1 / freq) is within
            // 0.2 of the true quotient (three roundings of 2^-24 on a value < 2^20) and one
            // correction either way makes it exact; r = st - q freq wraps to its signed value.
            __m512i q = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_cvtepu32_ps(st), rcp));
            __m512i r = _mm512_sub_epi32(st, _mm512_mullo_epi32(q, freq));
            const __mmask16 under = _mm512_cmplt_epi32_mask(r, _mm512_setzero_si512());
            q = _mm512_mask_sub_epi32(q, under, q, one);
            r = _mm512_mask_add_epi32(r, under, r, freq);
            const __mmask16 over = _mm512_cmpge_epi32_mask(r, freq);
            q = _mm512_mask_add_epi32(q, over, q, one);
            r = _mm512_mask_sub_epi32(r, over, r, freq);
            st = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(q, rans::kProbBits), r), _mm512_and_si512(sf, lo16));
            _mm512_store_si512(xs, st);
        }
    }
    words = w;
}

template <bool Uniform>
W32RowFn rowAvx512For(RowOut k)
{
    switch (k) {
    case RowOut::F16: return rowAvx512<RowOut::F16, Uniform>;
    case RowOut::BF16: return rowAvx512<RowOut::BF16, Uniform>;
    case RowOut::F32: return rowAvx512<RowOut::F32, Uniform>;
    case RowOut::Symbols: return rowAvx512<RowOut::Symbols, Uniform>;
    }
    return nullptr;
}

}  // namespace

W32RowFn avx512RowKernel(RowOut k, bool uniform) { return uniform ? rowAvx512For<true>(k) : rowAvx512For<false>(k); }

W32EncFn avx512EncodeKernel(bool small) { return small ? encodeAvx512<true> : encodeAvx512<false>; }

// Per row and 64 symbols: one compare per symbol value, its popcount added to the role's count.
// Bytes past the row are masked off (they would read as zeros and count as symbol 0).
KVS_AVX512 void countAvx512(const uint8_t* sym, int tokens, int D, int deltaGroup, int roles, int stride, size_t roleStride,
                            uint32_t* counts)
{
    for (int t = 0; t < tokens; ++t) {
        const int role = (roles == 2 && deltaGroup >= 2 && t % deltaGroup == 0) ? 1 : 0;
        uint32_t* c = counts + size_t(role) * roleStride;
        const uint8_t* row = sym + size_t(t) * D;
        for (int d = 0; d < D; d += 64) {
            const int n = std::min(64, D - d);
            const __mmask64 m = n == 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1;
            const __m512i x = _mm512_maskz_loadu_epi8(m, row + d);
            for (int s = 0; s < stride; ++s)
                c[s] += uint32_t(_mm_popcnt_u64(_mm512_mask_cmpeq_epi8_mask(m, x, _mm512_set1_epi8(char(s)))));
        }
    }
}

}  // namespace kvscope::detail

#endif
