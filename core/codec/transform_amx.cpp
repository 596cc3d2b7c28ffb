// The transform decoder's inverse transform on Intel AMX tiles (transform_kernels.h, AmxProduct).
//
// v (64 tokens, Cp) += Z (64, Kp) x B (Kp, Cp) with Z = q 2^class as bfloat16 and B = the coded
// decode columns times their steps, each float split into two bfloat16 (hi + lo). q 2^class has at
// most 8 significant bits for every symbol (|q| < M <= 127), so Z holds it exactly; hi + lo keeps
// 16 of the 24 bits of A step, and the tile unit sums the exact products in float32. The result
// is within the tolerance FORMAT.md states for the fast paths, not bit-identical to the scalar
// reference. An escape whose q 2^class does not fit 8 bits is left out of Z and added afterwards
// in float32 (fixups).
#include "codec/simd_path.h"
#include "codec/transform_kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#if defined(__x86_64__) && defined(__linux__)
#define KVS_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kvscope {

namespace {

#ifdef KVS_AMX
// The kernel hands out the tile registers' state (8 KB per thread) only on request (Linux 5.16+).
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

bool amxHardware()
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    if (!tile || !bf16 || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

std::atomic<int>& amxChoice()
{
    static std::atomic<int> on{[] {
        const char* env = std::getenv("KVSCOPE_AMX");
        return int(amxSupported() && !(env && std::strcmp(env, "0") == 0));
    }()};
    return on;
}

}  // namespace

bool amxSupported()
{
#ifdef KVS_AMX
    static const bool ok = amxHardware();
    return ok;
#else
    return false;
#endif
}

bool amxEnabled() { return amxChoice().load(std::memory_order_relaxed) != 0; }

void setAmxEnabled(bool on) { amxChoice().store(int(on && amxSupported()), std::memory_order_relaxed); }

namespace detail {

bool AmxProduct::prepare(const float* col, const float* step, const float* mean, int K_, int C_)
{
    K = K_, C = C_;
    Kp = (K + 31) / 32 * 32;
    Cp = (C + 15) / 16 * 16;
    b.resize(size_t(Kp / 32) * (Cp / 16) * 2 * 512);
    mean16.assign(size_t(16) * Cp, 0.0f);
    for (int r = 0; r < 16; ++r) std::memcpy(&mean16[size_t(r) * Cp], mean, sizeof(float) * size_t(C));
    return prepareTiles(col, step);
}

#ifdef KVS_AMX
// bfloat16 bits (round to nearest even) of each lane's finite float, in the lane's low half.
__attribute__((target("avx512f"))) static inline __m512i roundToBf16(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
}

// Tile (kc, g, half) of B: row p < 16 holds, for channel n < 16 of group g, the pair (k = 32 kc +
// 2 p, k + 1) as one 32-bit word (bfloat16 of k in the low half), the B operand's layout. Each
// value a = A step is hi + lo: hi its bfloat16 (round to nearest even), lo that of a - hi (exact).
__attribute__((target("avx512f,avx512bw"))) bool AmxProduct::prepareTiles(const float* col, const float* step)
{
    const int NG = Cp / 16;
    const __m512 limit = _mm512_set1_ps(1e30f);  // hi stays finite
    __mmask16 bad = 0;
    for (int k0 = 0; k0 < Kp; k0 += 2) {
        const int kc = k0 / 32, p = (k0 % 32) / 2;
        const __m512 s0 = _mm512_set1_ps(k0 < K ? step[k0] : 0.0f), s1 = _mm512_set1_ps(k0 + 1 < K ? step[k0 + 1] : 0.0f);
        for (int g = 0; g < NG; ++g) {
            const int n = std::min(16, C - 16 * g);
            const __mmask16 in = __mmask16(n == 16 ? 0xffffu : (1u << n) - 1);
            const __m512 a0 = k0 < K ? _mm512_mul_ps(_mm512_maskz_loadu_ps(in, col + size_t(k0) * C + 16 * g), s0) : _mm512_setzero_ps();
            const __m512 a1 =
                k0 + 1 < K ? _mm512_mul_ps(_mm512_maskz_loadu_ps(in, col + size_t(k0 + 1) * C + 16 * g), s1) : _mm512_setzero_ps();
            bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(a0), limit, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(_mm512_abs_ps(a1), limit, _CMP_NLT_UQ);
            const __m512i h0 = roundToBf16(a0), h1 = roundToBf16(a1);
            const __m512i l0 = roundToBf16(_mm512_sub_ps(a0, _mm512_castsi512_ps(_mm512_slli_epi32(h0, 16))));
            const __m512i l1 = roundToBf16(_mm512_sub_ps(a1, _mm512_castsi512_ps(_mm512_slli_epi32(h1, 16))));
            uint16_t* t = b.data() + (size_t(kc) * NG + g) * 1024 + size_t(p) * 32;
            _mm512_storeu_si512(t, _mm512_or_si512(h0, _mm512_slli_epi32(h1, 16)));
            _mm512_storeu_si512(t + 512, _mm512_or_si512(l0, _mm512_slli_epi32(l1, 16)));
        }
    }
    return bad == 0;
}
#else
bool AmxProduct::prepareTiles(const float*, const float*) { return false; }
#endif

#ifdef KVS_AMX
namespace {

struct TileConfig {
    uint8_t palette = 1, startRow = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Rows x 16 tokens of one group of 16 channels: the sums in tiles 0..Rows-1, started from the
// mean (mean16, the same stride), the rows' Z columns kc streamed through tiles 4 and 5, B's hi and
// lo tiles of (kc, g) in 6 and 7. Each B tile loaded (B does not fit the L1 cache) serves all the
// tile's rows; Z, 64 rows of Kp bfloat16, stays in L1. The sum of a token is mean + the products
// in ascending kc, hi before lo.
template <int Rows>
__attribute__((target("amx-tile,amx-bf16"))) void amxGroup(float* v, size_t ldv, const float* mean16, const uint16_t* z,
                                                           size_t ldz, const uint16_t* b, int KC, int NG, int g)
{
    const size_t rv = 16 * ldv / 4, rz = 16 * ldz / 2;
    const float* m = mean16 + 16 * g;
    _tile_loadd(0, m, ldv);
    if (Rows > 1) _tile_loadd(1, m, ldv);
    if (Rows > 2) _tile_loadd(2, m, ldv);
    if (Rows > 3) _tile_loadd(3, m, ldv);
    for (int kc = 0; kc < KC; ++kc) {
        const uint16_t* bk = b + (size_t(kc) * NG + g) * 1024;
        const uint16_t* zk = z + 32 * kc;
        _tile_loadd(6, bk, 64);
        _tile_loadd(7, bk + 512, 64);
        _tile_loadd(4, zk, ldz);
        if (Rows > 1) _tile_loadd(5, zk + rz, ldz);
        _tile_dpbf16ps(0, 4, 6);
        if (Rows > 1) _tile_dpbf16ps(1, 5, 6);
        _tile_dpbf16ps(0, 4, 7);
        if (Rows > 1) _tile_dpbf16ps(1, 5, 7);
        if (Rows > 2) {
            _tile_loadd(4, zk + 2 * rz, ldz);
            if (Rows > 3) _tile_loadd(5, zk + 3 * rz, ldz);
            _tile_dpbf16ps(2, 4, 6);
            if (Rows > 3) _tile_dpbf16ps(3, 5, 6);
            _tile_dpbf16ps(2, 4, 7);
            if (Rows > 3) _tile_dpbf16ps(3, 5, 7);
        }
    }
    float* out = v + 16 * g;
    _tile_stored(0, out, ldv);
    if (Rows > 1) _tile_stored(1, out + rv, ldv);
    if (Rows > 2) _tile_stored(2, out + 2 * rv, ldv);
    if (Rows > 3) _tile_stored(3, out + 3 * rv, ldv);
}

}  // namespace

__attribute__((target("amx-tile,amx-bf16"))) void AmxProduct::accumulate(float* v, const uint16_t* z, int nt) const
{
    static_assert(kTileTokens == 64, "a tile is at most 4 x 16 rows");
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    const int KC = Kp / 32, NG = Cp / 16, rows = (nt + 15) / 16;
    const size_t ldv = size_t(Cp) * 4, ldz = size_t(Kp) * 2;
    const float* m = mean16.data();
    for (int g = 0; g < NG; ++g) switch (rows) {
        case 1: amxGroup<1>(v, ldv, m, z, ldz, b.data(), KC, NG, g); break;
        case 2: amxGroup<2>(v, ldv, m, z, ldz, b.data(), KC, NG, g); break;
        case 3: amxGroup<3>(v, ldv, m, z, ldz, b.data(), KC, NG, g); break;
        default: amxGroup<4>(v, ldv, m, z, ldz, b.data(), KC, NG, g); break;
        }
    _tile_release();
}

// 16 small integers q (16-bit lanes) -> the bfloat16 of q * mult.
__attribute__((target("avx512f,avx512bw"))) static inline __m256i smallToBf16(__m256i q16, __m512 mult)
{
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(q16)), mult);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16));
}

// Symbols to Z: 32 components at a time, q = s - M in 16-bit lanes, then q 2^class in float32
// (exact: |q| < 2^8, class <= 3), whose high half is its bfloat16 (exact too). A vector holding an
// escape goes component by component, in order, so that the escape list is read in the stream's
// order.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void AmxProduct::dequantRow(const uint8_t* sym, const int* M, int cls,
                                                                                int row, uint16_t* zrow, EscapeReader& esc,
                                                                                std::vector<AmxFixup>& fixups) const
{
    const float mult = float(1 << cls);
    const __m512 mv = _mm512_set1_ps(mult);
    for (int k = 0; k < K; k += 32) {
        const int n = std::min(32, K - k);
        const __mmask32 in = n == 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
        const __mmask16 in0 = __mmask16(in), in1 = __mmask16(in >> 16);
        const __m512i s = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(in, sym + k));
        const __m512i m = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_maskz_loadu_epi32(in0, M + k))),
                                             _mm512_cvtepi32_epi16(_mm512_maskz_loadu_epi32(in1, M + k + 16)), 1);
        const __mmask32 escM =
            in & (_mm512_cmpeq_epi16_mask(s, _mm512_setzero_si512()) | _mm512_cmpeq_epi16_mask(s, _mm512_add_epi16(m, m)));
        if (!escM) {
            const __m512i q = _mm512_sub_epi16(s, m);
            _mm256_mask_storeu_epi16(zrow + k, in0, smallToBf16(_mm512_castsi512_si256(q), mv));
            if (n > 16) _mm256_mask_storeu_epi16(zrow + k + 16, in1, smallToBf16(_mm512_extracti64x4_epi64(q, 1), mv));
            continue;
        }
        for (int j = k; j < k + n; ++j) {
            const int sj = sym[j];
            const int64_t q = (sj == 0 || sj == 2 * M[j]) ? esc.next(sj, M[j]) : int64_t(sj - M[j]);
            const float f = float(q) * mult;
            uint32_t u;
            std::memcpy(&u, &f, 4);
            if ((u & 0xffffu) == 0 && double(f) == double(q) * double(mult)) {
                zrow[j] = uint16_t(u >> 16);
            } else {
                zrow[j] = 0;
                fixups.push_back({row, j, cls, q});
            }
        }
    }
}
#else
void AmxProduct::accumulate(float*, const uint16_t*, int) const {}
void AmxProduct::dequantRow(const uint8_t*, const int*, int, int, uint16_t*, EscapeReader&, std::vector<AmxFixup>&) const {}
#endif

void AmxProduct::applyFixups(float* v, const float* col, const float* step, const std::vector<AmxFixup>& fixups) const
{
    for (const AmxFixup& f : fixups) {
        const float zf = float(f.q) * step[f.k] * float(1 << f.cls);
        float* row = v + size_t(f.row) * Cp;
        const float* a = col + size_t(f.k) * C;
        for (int c = 0; c < C; ++c) row[c] += a[c] * zf;
    }
}

}  // namespace detail

}  // namespace kvscope
