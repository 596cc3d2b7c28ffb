// The AVX2 kernels of the v2 entropy coder: 8 lanes, 4 state vectors (entropy_x86.h has the rules
// they share with AVX-512). Every function carries the AVX2 target attribute, so the file builds
// without -mavx2 and its code runs only when the dispatcher has checked the CPU.
#include "codec/entropy_x86.h"

#ifdef KVSCOPE_SIMD_X86

#include "codec/codec_detail.h"
#include "codec/rans.h"

#include <algorithm>
#include <cstring>

namespace kvscope::detail {

namespace {

// expandIndex[m][j]: the word lane j takes when the lanes in mask m need one (lane order).
struct ExpandTable {
    alignas(32) int32_t idx[256][8];
    ExpandTable()
    {
        for (int m = 0; m < 256; ++m) {
            int c = 0;
            for (int j = 0; j < 8; ++j) {
                idx[m][j] = (m >> j) & 1 ? c : 0;
                c += (m >> j) & 1;
            }
        }
    }
};
const ExpandTable kExpand;

// The AVX2 form of lookup512: 8 lanes, two gathers of 4 bucket entries.
struct Lookup8 {
    __m256i sym, start, freq;
};

KVS_AVX2 __attribute__((noinline)) void lookupRare256(const int* T, __m256i idx, __m256i slot, unsigned rare, Lookup8& lk)
{
    alignas(32) int32_t ix[8], sl[8], sy[8], st[8], fr[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ix), idx);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sl), slot);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sy), lk.sym);
    _mm256_store_si256(reinterpret_cast<__m256i*>(st), lk.start);
    _mm256_store_si256(reinterpret_cast<__m256i*>(fr), lk.freq);
    for (int j = 0; j < 8; ++j)
        if ((rare >> j) & 1) {
            const CodingTable& ct = *reinterpret_cast<const CodingTable*>(T + ix[j]);
            const int s = ct.symbolOf(uint32_t(sl[j]));
            sy[j] = s;
            st[j] = int32_t(ct.start(s));
            fr[j] = int32_t(ct.freq(s));
        }
    lk.sym = _mm256_load_si256(reinterpret_cast<const __m256i*>(sy));
    lk.start = _mm256_load_si256(reinterpret_cast<const __m256i*>(st));
    lk.freq = _mm256_load_si256(reinterpret_cast<const __m256i*>(fr));
}

// Always inlined: a call returns the Lookup8 through memory (entropy_avx512.cpp, lookup512).
KVS_AVX2 inline __attribute__((always_inline)) Lookup8 lookup256(const int* T, __m256i idx, __m256i slot)
{
    const __m256i m12 = _mm256_set1_epi32(4095), one = _mm256_set1_epi32(1);
    const __m256i b = _mm256_add_epi32(_mm256_srli_epi32(idx, 1), _mm256_srli_epi32(slot, CodingTable::kBucketShift));
    const long long* T64 = reinterpret_cast<const long long*>(T);
    const __m256i lo = gather4x64(T64, _mm256_castsi256_si128(b));
    const __m256i hi = gather4x64(T64, _mm256_extracti128_si256(b, 1));
    const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // low dwords, then high dwords
    const __m256i lp = _mm256_permutevar8x32_epi32(lo, split), hp = _mm256_permutevar8x32_epi32(hi, split);
    const __m256i a = _mm256_permute2x128_si256(lp, hp, 0x20), c = _mm256_permute2x128_si256(lp, hp, 0x31);
    const __m256i e0 = _mm256_srli_epi32(a, 20), e1 = _mm256_and_si256(c, m12), e2 = _mm256_srli_epi32(c, 12);
    // All values are below 2^12: signed compares are exact. g0, g1 are -1 where taken.
    const __m256i g0 = _mm256_cmpgt_epi32(slot, e0), g1 = _mm256_cmpgt_epi32(slot, e1);
    Lookup8 lk;
    lk.sym = _mm256_sub_epi32(_mm256_sub_epi32(_mm256_and_si256(a, _mm256_set1_epi32(0xff)), g0), g1);
    const __m256i start0 = _mm256_and_si256(_mm256_srli_epi32(a, 8), m12);
    __m256i start = _mm256_blendv_epi8(start0, _mm256_add_epi32(e0, one), g0);
    start = _mm256_blendv_epi8(start, _mm256_add_epi32(e1, one), g1);
    const __m256i end = _mm256_blendv_epi8(_mm256_blendv_epi8(e0, e1, g0), e2, g1);
    lk.start = start;
    lk.freq = _mm256_sub_epi32(_mm256_add_epi32(end, one), start);
    const unsigned rare = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(
        _mm256_or_si256(_mm256_cmpgt_epi32(slot, e2), _mm256_cmpgt_epi32(start0, slot)))));
    if (__builtin_expect(rare != 0, 0)) lookupRare256(T, idx, slot, rare, lk);
    return lk;
}

// Slots: the row's one table as a slot index (W32Row::slots): one gather of 8 words resolves
// symbol, start and frequency.
template <RowOut K, bool Slots>
KVS_AVX2 void rowAvx2(W32Stream& s, const W32Row& row_)
{
    const W32Row r = row_;  // a local copy: the output stores cannot alias its fields, so they stay in registers
    const int nv = r.D / 8, rows = r.rows;
    const int l0 = r.lane0;
    __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.x + l0));
    __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.x + ((l0 + 8) & 31)));
    __m256i x2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.x + ((l0 + 16) & 31)));
    __m256i x3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.x + ((l0 + 24) & 31)));
    const uint8_t* p = s.p;
    const int* T = reinterpret_cast<const int*>(r.tables);
    const __m256i m12 = _mm256_set1_epi32(4095), one = _mm256_set1_epi32(1);
    const __m256i zero = _mm256_setzero_si256();
    const __m256 mq = _mm256_set1_ps(float(r.m));
    uint8_t* o = r.out;
    const int* slots = reinterpret_cast<const int*>(r.slots);
    // The lookup of the next step's lanes, done one step ahead (x1 is final by then): slot-index
    // entries (Slots) or bucket lookups.
    __m256i eNext = zero;
    Lookup8 lkNext{};
    if constexpr (Slots) eNext = gather8x32(slots, _mm256_and_si256(x0, m12));
    else lkNext = lookup256(T, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.tableWord)), _mm256_and_si256(x0, m12));
    for (int row = 0; row < rows; ++row, o += size_t(r.D) * rowOutBytes(K)) {
        const __m256 tokenScale = _mm256_set1_ps(r.rowScales ? _cvtsh_ss(r.rowScales[row]) : r.scale);
        for (int v = 0; v < nv; ++v) {
            const int d0 = 8 * v;
            __m256i sym, x;
            if constexpr (Slots) {
                const __m256i e = eNext;
                eNext = gather8x32(slots, _mm256_and_si256(x1, m12));
                sym = _mm256_and_si256(e, _mm256_set1_epi32(0xff));
                const __m256i k = _mm256_and_si256(_mm256_srli_epi32(e, 8), m12);
                const __m256i freq = _mm256_add_epi32(_mm256_srli_epi32(e, 20), one);
                x = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x0, 12)), k);
            } else {
                const Lookup8 lk = lkNext;
                const int dn = v + 1 == nv ? 0 : d0 + 8;
                lkNext = lookup256(T, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.tableWord + dn)),
                                   _mm256_and_si256(x1, m12));
                sym = lk.sym;
                const __m256i k = _mm256_sub_epi32(_mm256_and_si256(x0, m12), lk.start);
                x = _mm256_add_epi32(_mm256_mullo_epi32(lk.freq, _mm256_srli_epi32(x0, 12)), k);
            }
            const __m256i needV = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), zero);
            const unsigned need = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(needV)));
            const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
            const __m256i take = _mm256_permutevar8x32_epi32(
                words, _mm256_load_si256(reinterpret_cast<const __m256i*>(kExpand.idx[need])));
            x = _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), take), needV);
            p += 2 * _mm_popcnt_u32(need);
            x0 = x1;
            x1 = x2;
            x2 = x3;
            x3 = x;
            if constexpr (K == RowOut::Symbols) {
                const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(sym), _mm256_extracti128_si256(sym, 1));
                _mm_storel_epi64(reinterpret_cast<__m128i*>(o + d0), _mm_packus_epi16(w16, w16));
            } else {
                const __m256 sc = r.scaleVec ? _mm256_loadu_ps(r.scaleVec + d0) : tokenScale;
                const __m256 q = _mm256_sub_ps(_mm256_cvtepi32_ps(sym), mq);
                __m256 val = _mm256_mul_ps(q, sc);
                if (r.base) val = _mm256_add_ps(val, _mm256_loadu_ps(r.base + d0));
                else val = _mm256_add_ps(val, _mm256_setzero_ps());
                if (r.anchorOut) _mm256_storeu_ps(r.anchorOut + d0, val);
                if constexpr (K == RowOut::F32) {
                    _mm256_storeu_ps(reinterpret_cast<float*>(o) + d0, val);
                } else if constexpr (K == RowOut::F16) {
                    __m128i hv = _mm256_cvtps_ph(val, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    const __m256 nanV = _mm256_cmp_ps(val, val, _CMP_UNORD_Q);
                    if (_mm256_movemask_ps(nanV)) {
                        const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(val), 16),
                                                              _mm256_set1_epi32(0x8000));
                        const __m256i canon = _mm256_or_si256(sign, _mm256_set1_epi32(0x7e00));
                        const __m256i n32 = _mm256_castps_si256(nanV);
                        const __m128i canon16 =
                            _mm_packus_epi32(_mm256_castsi256_si128(canon), _mm256_extracti128_si256(canon, 1));
                        const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(n32), _mm256_extracti128_si256(n32, 1));
                        hv = _mm_blendv_epi8(hv, canon16, nan16);
                    }
                    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * size_t(d0)), hv);
                } else {
                    const __m256i xb16 = _mm256_castps_si256(val);
                    const __m256i rounded = _mm256_srli_epi32(
                        _mm256_add_epi32(xb16, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                                _mm256_and_si256(_mm256_srli_epi32(xb16, 16), one))), 16);
                    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(xb16, _mm256_set1_epi32(0x7fffffff)),
                                                           _mm256_set1_epi32(0x7f800000));
                    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(xb16, 16), _mm256_set1_epi32(0x40));
                    const __m256i b = _mm256_blendv_epi8(rounded, quiet, nan);
                    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * size_t(d0)),
                                     _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
                }
            }
        }
    }
    const int next = (l0 + 8 * nv * rows) & 31;  // x0 holds lanes next..next+7
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.x + next), x0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.x + ((next + 8) & 31)), x1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.x + ((next + 16) & 31)), x2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.x + ((next + 24) & 31)), x3);
    s.p = p;
}

template <RowOut K>
void rowAvx2Any(W32Stream& s, const W32Row& r)
{
    if (r.slots) rowAvx2<K, true>(s, r);
    else rowAvx2<K, false>(s, r);
}

// compressHigh[m]: the byte shuffle that moves the 16-bit words of the lanes set in m, in lane
// order, to the top popcount(m) of 8 word positions (the rest are zeroed).
struct CompressTable {
    alignas(16) uint8_t idx[256][16];
    CompressTable()
    {
        for (int m = 0; m < 256; ++m) {
            const int cnt = __builtin_popcount(unsigned(m));
            std::memset(idx[m], 0x80, 16);
            int j = 0;
            for (int lane = 0; lane < 8; ++lane)
                if ((m >> lane) & 1) {
                    const int pos = 8 - cnt + j++;
                    idx[m][2 * pos] = uint8_t(2 * lane);
                    idx[m][2 * pos + 1] = uint8_t(2 * lane + 1);
                }
        }
    }
};
const CompressTable kCompressHigh;

// The AVX2 form of encodeAvx512, 8 symbols a step (D % 8 == 0). The words of the lanes that
// renormalise are moved to the top of an 8-word vector stored just below the words written so
// far, so that they land at the new front; the words below them fall into free space (the buffer
// keeps at least one word per symbol not yet coded, plus the 64 of the flushed states).
// Entry sym (< 32) of a 32-word table: four permutes (the table operands stay in memory) and
// three blends on bits 3 and 4 of sym.
KVS_AVX2 inline __m256i lookup32Avx2(const uint32_t* t, __m256i sym)
{
    const __m256i* v = reinterpret_cast<const __m256i*>(t);
    const __m256 b3 = _mm256_castsi256_ps(_mm256_slli_epi32(sym, 28)), b4 = _mm256_castsi256_ps(_mm256_slli_epi32(sym, 27));
    const __m256 lo = _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(v), sym)),
                                       _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(v + 1), sym)), b3);
    const __m256 hi = _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(v + 2), sym)),
                                       _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(v + 3), sym)), b3);
    return _mm256_castps_si256(_mm256_blendv_ps(lo, hi, b4));
}

// Small: W32EncJob::small is set; start | freq and 1 / freq come from lookup32Avx2, not from a
// gather and a division (the same reciprocal: IEEE division is correctly rounded either way).
template <bool Small>
KVS_AVX2 void encodeAvx2(const W32EncJob& j, uint32_t* x, uint16_t*& words)
{
    const int D = j.D;
    const int* T = reinterpret_cast<const int*>(j.tables);
    const __m256i sfOff = _mm256_set1_epi32(int(kSfWords)), lo16 = _mm256_set1_epi32(0xffff), one = _mm256_set1_epi32(1);
    const __m256i sign = _mm256_set1_epi32(int(0x80000000u));
    const __m256 two16 = _mm256_set1_ps(65536.0f), oneF = _mm256_set1_ps(1.0f);
    uint16_t* w = words;
    for (int t = j.tokens - 1; t >= 0; --t) {
        const int role = j.deltaGroup >= 2 && t % j.deltaGroup == 0 ? 1 : 0;
        const int32_t* tw = j.tableWord + (role ? D : 0);
        const uint32_t* small = Small ? j.small + 64 * role : nullptr;
        const uint8_t* row = j.sym + size_t(t) * D;
        for (int d0 = D - 8; d0 >= 0; d0 -= 8) {
            uint32_t* xs = x + ((size_t(t) * D + size_t(d0)) & 31);
            __m256i st = _mm256_load_si256(reinterpret_cast<const __m256i*>(xs));
            const __m256i sym = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d0)));
            __m256i sf;
            if constexpr (Small) {
                sf = lookup32Avx2(small, sym);
            } else {
                const __m256i idx = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tw + d0)),
                                                     _mm256_add_epi32(sym, sfOff));
                sf = gather8x32(T, idx);
            }
            const __m256i freq = _mm256_srli_epi32(sf, 16);
            // st >= freq << 20, unsigned (both sides flipped to signed order)
            const __m256i below = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_slli_epi32(freq, 20), sign),
                                                     _mm256_xor_si256(st, sign));
            const unsigned need = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(below))) ^ 0xffu;
            const __m256i low = _mm256_and_si256(st, lo16);
            const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(w - 8),
                             _mm_shuffle_epi8(w16, _mm_load_si128(reinterpret_cast<const __m128i*>(kCompressHigh.idx[need]))));
            w -= _mm_popcnt_u32(need);
            st = _mm256_blendv_epi8(_mm256_srli_epi32(st, 16), st, below);
            // q = floor(st / freq) as in encodeAvx512; st may exceed 2^31, so float(st) is built
            // from its halves (both exact, one rounding in the sum: float(st) correctly rounded).
            const __m256 stF = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(st, 16)), two16),
                                             _mm256_cvtepi32_ps(_mm256_and_si256(st, lo16)));
            const __m256 rcp = Small ? _mm256_castsi256_ps(lookup32Avx2(small + 32, sym))
                                     : _mm256_div_ps(oneF, _mm256_cvtepi32_ps(freq));
            __m256i q = _mm256_cvttps_epi32(_mm256_mul_ps(stF, rcp));
            __m256i r = _mm256_sub_epi32(st, _mm256_mullo_epi32(q, freq));
            const __m256i under = _mm256_cmpgt_epi32(_mm256_setzero_si256(), r);
            q = _mm256_add_epi32(q, under);  // under is -1 where taken
            r = _mm256_add_epi32(r, _mm256_and_si256(under, freq));
            const __m256i over = _mm256_cmpgt_epi32(r, _mm256_sub_epi32(freq, one));
            q = _mm256_sub_epi32(q, over);
            r = _mm256_sub_epi32(r, _mm256_and_si256(over, freq));
            st = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(q, rans::kProbBits), r), _mm256_and_si256(sf, lo16));
            _mm256_store_si256(reinterpret_cast<__m256i*>(xs), st);
        }
    }
    words = w;
}

// Adds each symbol value's 32 byte counters to counts[s] (vpsadbw: four 64-bit sums) and clears them.
KVS_AVX2 void flushByteCounters(uint8_t (*acc)[32], int stride, uint32_t* counts)
{
    const __m256i zero = _mm256_setzero_si256();
    for (int s = 0; s < stride; ++s) {
        __m256i* a = reinterpret_cast<__m256i*>(acc[s]);
        const __m256i sums = _mm256_sad_epu8(_mm256_load_si256(a), zero);
        const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        counts[s] += uint32_t(_mm_cvtsi128_si32(_mm_add_epi64(h, _mm_unpackhi_epi64(h, h))));
        _mm256_store_si256(a, zero);
    }
}

// Per role and symbol value, 32 byte counters (acc[role][s]): a compare gives -1 in the bytes
// that hold s and is subtracted, two 32-symbol pieces of a row at a time, so a symbol value costs
// two compares, two subtracts and one load and store per 64 symbols (it replaced a compare,
// movemask, popcount and add per 32 symbols, slower for count + build + serialise in
// tests/bench/entropy_parts with both in one process; figures in docs/codecs.md). Before any
// byte could pass 255 the counters are summed into counts. A row's last D % 64 symbols go
// through a one-piece step, then one by one.
// One role's byte counters: acc[s] for symbol value s, and the most any of their bytes may hold.
struct ByteCounters {
    alignas(32) uint8_t acc[32][32];
    int added;
};

// Adds the bytes of x0 and x1 that match each symbol value to its counters, after a flush into
// counts if they could pass 255. x1 of 0xff bytes (no symbol value is 255: stride <= 32) makes
// a one-piece step.
KVS_AVX2 inline void addPieces(ByteCounters& b, __m256i x0, __m256i x1, int pieces, int stride, uint32_t* counts)
{
    if (b.added + pieces > 255) {
        flushByteCounters(b.acc, stride, counts);
        b.added = 0;
    }
    b.added += pieces;
    __m256i sv = _mm256_setzero_si256();
    for (int s = 0; s < stride; ++s, sv = _mm256_add_epi8(sv, _mm256_set1_epi8(1))) {
        __m256i* a = reinterpret_cast<__m256i*>(b.acc[s]);
        _mm256_store_si256(a, _mm256_sub_epi8(_mm256_sub_epi8(_mm256_load_si256(a), _mm256_cmpeq_epi8(x0, sv)),
                                              _mm256_cmpeq_epi8(x1, sv)));
    }
}

}  // namespace

W32RowFn avx2RowKernel(RowOut k)
{
    switch (k) {
    case RowOut::F16: return rowAvx2Any<RowOut::F16>;
    case RowOut::BF16: return rowAvx2Any<RowOut::BF16>;
    case RowOut::F32: return rowAvx2Any<RowOut::F32>;
    case RowOut::Symbols: return rowAvx2Any<RowOut::Symbols>;
    }
    return nullptr;
}

W32EncFn avx2EncodeKernel(bool small) { return small ? encodeAvx2<true> : encodeAvx2<false>; }

KVS_AVX2 void countAvx2(const uint8_t* sym, int tokens, int D, int deltaGroup, int roles, int stride, size_t roleStride,
                        uint32_t* counts)
{
    ByteCounters bc[2];
    std::memset(bc, 0, sizeof bc);
    const __m256i none = _mm256_set1_epi8(char(0xff));
    for (int t = 0; t < tokens; ++t) {
        const int role = (roles == 2 && deltaGroup >= 2 && t % deltaGroup == 0) ? 1 : 0;
        uint32_t* c = counts + size_t(role) * roleStride;
        const uint8_t* row = sym + size_t(t) * D;
        int d = 0;
        for (; d + 64 <= D; d += 64)
            addPieces(bc[role], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d)),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d + 32)), 2, stride, c);
        if (d + 32 <= D) {
            addPieces(bc[role], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d)), none, 1, stride, c);
            d += 32;
        }
        for (; d < D; ++d) c[row[d]]++;
    }
    for (int role = 0; role < roles; ++role) flushByteCounters(bc[role].acc, stride, counts + size_t(role) * roleStride);
}

KVS_AVX2 void slotIndexAvx2(const CodingTable& t, int alphabet, uint32_t* slots)
{
    const __m256i step = _mm256_set1_epi32(8 << 8), ramp = _mm256_setr_epi32(0, 1 << 8, 2 << 8, 3 << 8, 4 << 8, 5 << 8,
                                                                             6 << 8, 7 << 8);
    for (int sy = 0; sy < alphabet; ++sy) {
        const uint32_t start = t.start(sy), freq = t.freq(sy);
        if (!freq) continue;
        const uint32_t e = uint32_t(sy) | (freq - 1) << 20;
        uint32_t k = 0;
        __m256i v = _mm256_add_epi32(_mm256_set1_epi32(int(e)), ramp);
        for (; k + 8 <= freq; k += 8, v = _mm256_add_epi32(v, step))
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(slots + start + k), v);
        for (; k < freq; ++k) slots[start + k] = e | k << 8;
    }
}

}  // namespace kvscope::detail

#endif
