// The v2 entropy decoder's SIMD row kernels (AVX2: 8 lanes, AVX-512: 16 lanes) and the run-time
// choice between them and the scalar reference (simd_path.h). Each kernel decodes one row of D
// symbols of a 32-state stream (rans.h w32) and dequantizes it straight into the output dtype;
// the encoders (AVX2, AVX-512) code the same streams, bit for bit as the scalar loop.
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
// - The kernels load per lane instead of using vpgather (gather8x32, gather8x64, gather16x32:
//   faster on Zen 4). The AVX2 rows do the next step's lookup (slot index entries, or bucket
//   entries with per-channel tables) one step ahead, since that state vector is final a step
//   early: AVX2 decode 7-12% faster on Zen 4. The same look-ahead in the AVX-512 rows was
//   slower, both with register lookups (0.83 against 0.81 ns per symbol) and with per-channel
//   per-lane loads (960-1,069 against 1,161-1,328 MB/s).
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
#include "codec/codec_detail.h"
#include "codec/simd_path.h"

#include "codec/rans.h"
#include "common/error.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build vectors from deliberately undefined ones (false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVSCOPE_SIMD_X86 1
#endif

namespace kvscope {

const char* simdPathName(SimdPath p)
{
    switch (p) {
    case SimdPath::Scalar: return "scalar";
    case SimdPath::Avx2: return "avx2";
    case SimdPath::Avx512: return "avx512";
    }
    return "?";
}

bool parseSimdPath(const std::string& s, SimdPath* out)
{
    if (s == "scalar") *out = SimdPath::Scalar;
    else if (s == "avx2") *out = SimdPath::Avx2;
    else if (s == "avx512") *out = SimdPath::Avx512;
    else if (s == "auto") *out = bestSimdPath();
    else return false;
    return true;
}

bool simdPathSupported(SimdPath p)
{
#ifdef KVSCOPE_SIMD_X86
    static const bool f16c = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    }();
    static const bool avx2 = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
    static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    switch (p) {
    case SimdPath::Scalar: return true;
    case SimdPath::Avx2: return avx2;
    case SimdPath::Avx512: return avx512;
    }
    return false;
#else
    return p == SimdPath::Scalar;
#endif
}

SimdPath bestSimdPath()
{
    if (simdPathSupported(SimdPath::Avx512)) return SimdPath::Avx512;
    if (simdPathSupported(SimdPath::Avx2)) return SimdPath::Avx2;
    return SimdPath::Scalar;
}

namespace {

SimdPath fromEnvironment()
{
    SimdPath p = bestSimdPath();
    const char* env = std::getenv("KVSCOPE_SIMD");
    SimdPath want;
    if (env && parseSimdPath(env, &want)) {
        while (!simdPathSupported(want)) want = SimdPath(uint8_t(want) - 1);
        p = want;
    }
    return p;
}

std::atomic<int>& chosenPath()
{
    static std::atomic<int> p{int(fromEnvironment())};
    return p;
}

}  // namespace

SimdPath simdPath() { return SimdPath(chosenPath().load(std::memory_order_relaxed)); }

void setSimdPath(SimdPath p)
{
    if (!simdPathSupported(p)) throw Error(std::string("SIMD path ") + simdPathName(p) + " is not supported by this CPU");
    chosenPath().store(int(p), std::memory_order_relaxed);
}

namespace detail {

#ifdef KVSCOPE_SIMD_X86
namespace {

constexpr uint32_t kSfWords = offsetof(CodingTable, sf) / 4;  // sf[] as a word offset into a CodingTable
static_assert(offsetof(CodingTable, sf) % 4 == 0 && offsetof(CodingTable, bucket) == 0, "the kernels address bucket[] at a table's start and sf[] in words");

// ----- Gathers by scalar loads (AVX2 and AVX-512 kernels) ----------------------------------------

#define KVS_AVX2 __attribute__((target("avx2,bmi2,popcnt,f16c,fma")))

// Gathers by scalar loads, one per lane from L1: on Zen 4 (and on Intel cores with the
// gather-data-sampling mitigation) vpgather* is microcoded, and in the decode and encode loops
// here the loads were faster (bench codec, alternating in one script: AVX2 rows, per-head
// tables, 1232-1574 MB/s against 1046-1316 for vpgatherdd; AVX-512 rows, per-channel tables,
// 1198-1328 MB/s against 925-1008 for two vpgatherqq of 8 bucket entries). The indices reach
// general registers two at a time (vmovq / vpextrq, then a shift), not through a store to the
// stack and eight reloads: 0.82 against 0.89-1.01 ns per symbol of AVX2 row decoding, the two
// forms alternating in one process (tests/bench/entropy_parts).
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

// ----- AVX-512: 16 lanes, 2 state vectors ----------------------------------------------------

#define KVS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi2,popcnt,f16c,fma")))

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
KVS_AVX512 inline Lookup16 resolve512(__m512i a, __m512i c, __m512i slot, const int* T, __m512i idx)
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

KVS_AVX512 inline Lookup16 lookup512(const int* T, __m512i idx, __m512i slot)
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

// ----- AVX2: 8 lanes, 4 state vectors --------------------------------------------------------

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

KVS_AVX2 inline Lookup8 lookup256(const int* T, __m256i idx, __m256i slot)
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

}  // namespace
#endif

#ifdef KVSCOPE_SIMD_X86
namespace {
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
#endif

#ifdef KVSCOPE_SIMD_X86
namespace {
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
// two compares, two subtracts and one load and store per 64 symbols (the compare, movemask,
// popcount and add per 32 symbols that this replaced: 0.418 against 0.243 ns per symbol for
// count + build + serialise, tests/bench/entropy_parts with both in one process). Before any
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
}  // namespace
#endif

CountFn countKernel(SimdPath path, int stride)
{
#ifdef KVSCOPE_SIMD_X86
    if (path == SimdPath::Avx512 && stride <= 32) return countAvx512;
    if (path == SimdPath::Avx2 && stride <= 32) return countAvx2;
#else
    (void)path;
    (void)stride;
#endif
    return nullptr;
}

W32EncFn w32EncodeKernel(SimdPath path, int D, bool small)
{
#ifdef KVSCOPE_SIMD_X86
    if (path == SimdPath::Avx512 && D % 16 == 0) return small ? encodeAvx512<true> : encodeAvx512<false>;
    if ((path == SimdPath::Avx2 || path == SimdPath::Avx512) && D % 8 == 0) return small ? encodeAvx2<true> : encodeAvx2<false>;
#else
    (void)path;
    (void)D;
    (void)small;
#endif
    return nullptr;
}

bool w32RowUsesSlots(SimdPath path, int D)
{
#ifdef KVSCOPE_SIMD_X86
    return (path == SimdPath::Avx2 || (path == SimdPath::Avx512 && D % 16 != 0)) && D % 8 == 0;
#else
    (void)path;
    (void)D;
    return false;
#endif
}

void w32SlotIndex(const CodingTable& t, int alphabet, uint32_t* slots)
{
#ifdef KVSCOPE_SIMD_X86
    if (simdPathSupported(SimdPath::Avx2)) return slotIndexAvx2(t, alphabet, slots);
#endif
    for (int sy = 0; sy < alphabet; ++sy)
        for (uint32_t k = 0; k < t.freq(sy); ++k) slots[t.start(sy) + k] = uint32_t(sy) | k << 8 | (t.freq(sy) - 1) << 20;
}

W32RowFn w32RowKernel(SimdPath path, RowOut k, int D, bool uniform)
{
#ifdef KVSCOPE_SIMD_X86
    if (path == SimdPath::Avx512 && D % 16 == 0) return uniform ? rowAvx512For<true>(k) : rowAvx512For<false>(k);
    if ((path == SimdPath::Avx2 || path == SimdPath::Avx512) && D % 8 == 0) {
        switch (k) {
        case RowOut::F16: return rowAvx2Any<RowOut::F16>;
        case RowOut::BF16: return rowAvx2Any<RowOut::BF16>;
        case RowOut::F32: return rowAvx2Any<RowOut::F32>;
        case RowOut::Symbols: return rowAvx2Any<RowOut::Symbols>;
        }
    }
#else
    (void)path;
    (void)k;
    (void)D;
    (void)uniform;
#endif
    return nullptr;
}

}  // namespace detail

}  // namespace kvscope
