// The transform decoder's tile loop (transform_kernels.h, InverseJob): a block's coded tokens in
// tiles of kTileTokens, each tile dequantised, multiplied (TileKernels::accumulate or AMX tiles)
// and stored. The store re-applies RoPE to the keys (double arithmetic, FORMAT.md) and rounds to
// the output dtype; on the AVX-512 and AVX2 paths with fp16 output it does both in one pass from
// the tile's sums straight into the KV set, the same operations in the same order as the scalar
// path's applyRopeTable and floatToHalfN, so the same bytes for the same sums.
#include "codec/transform_kernels.h"

#include "codec/transform.h"
#include "common/half.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define KVS_STORE_X86 1
#endif

#include <algorithm>
#include <cstring>

namespace kvscope::detail {

namespace {

// One head's row of D sums to fp16 at dst, rotated back by RoPE with the pair table e (cos, sin
// of pair i at e[2i], e[2i + 1]) when e is set: x_i' = x_i c - x_{i+D/2} s, x_{i+D/2}' =
// x_{i+D/2} c + x_i s, each product and sum rounded in double, then to float, then to fp16
// (rope.cpp's loop, then floatToHalfN).
#ifdef KVS_STORE_X86
__attribute__((target("avx512f,f16c,avx"))) void storeHeadAvx512(const float* r, const double* e, int D, uint16_t* dst)
{
    const int half = D / 2;
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    if (!e) {
        for (int d = 0; d < D; d += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), _mm512_cvtps_ph(_mm512_loadu_ps(r + d), kRound));
        return;
    }
    const __m512i evens = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odds = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    for (int i = 0; i < half; i += 8) {
        const __m512d lo = _mm512_loadu_pd(e + 2 * i), hi = _mm512_loadu_pd(e + 2 * i + 8);
        const __m512d c = _mm512_permutex2var_pd(lo, evens, hi), s = _mm512_permutex2var_pd(lo, odds, hi);
        const __m512d x1 = _mm512_cvtps_pd(_mm256_loadu_ps(r + i)), x2 = _mm512_cvtps_pd(_mm256_loadu_ps(r + i + half));
        const __m256 y1 = _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_mul_pd(x1, c), _mm512_mul_pd(x2, s)));
        const __m256 y2 = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(x2, c), _mm512_mul_pd(x1, s)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(y1, kRound));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + half), _mm256_cvtps_ph(y2, kRound));
    }
}

__attribute__((target("avx2,f16c,avx"))) void storeHeadAvx2(const float* r, const double* e, int D, uint16_t* dst)
{
    const int half = D / 2;
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    if (!e) {
        for (int d = 0; d < D; d += 8)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + d), _mm256_cvtps_ph(_mm256_loadu_ps(r + d), kRound));
        return;
    }
    for (int i = 0; i < half; i += 4) {
        // (c0 s0 c1 s1), (c2 s2 c3 s3) -> (c0 c1 c2 c3), (s0 s1 s2 s3)
        const __m256d a = _mm256_loadu_pd(e + 2 * i), b = _mm256_loadu_pd(e + 2 * i + 4);
        const __m256d c = _mm256_permute4x64_pd(_mm256_unpacklo_pd(a, b), 0xd8);
        const __m256d s = _mm256_permute4x64_pd(_mm256_unpackhi_pd(a, b), 0xd8);
        const __m256d x1 = _mm256_cvtps_pd(_mm_loadu_ps(r + i)), x2 = _mm256_cvtps_pd(_mm_loadu_ps(r + i + half));
        const __m128 y1 = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_mul_pd(x1, c), _mm256_mul_pd(x2, s)));
        const __m128 y2 = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(x2, c), _mm256_mul_pd(x1, s)));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_cvtps_ph(y1, kRound));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i + half), _mm_cvtps_ph(y2, kRound));
    }
}
#endif

using StoreHeadFn = void (*)(const float*, const double*, int, uint16_t*);

// The fused store for this path and shape, or null (the generic store: applyRopeTable, writeRows).
StoreHeadFn fusedStore(SimdPath path, DType dtype, int D)
{
#ifdef KVS_STORE_X86
    if (dtype != DType::F16) return nullptr;
    if (path == SimdPath::Avx512 && D % 16 == 0) return storeHeadAvx512;
    if (path == SimdPath::Avx2 && D % 8 == 0) return storeHeadAvx2;
#else
    (void)path, (void)dtype, (void)D;
#endif
    return nullptr;
}

}  // namespace

void inverseTiles(const InverseJob& j, EscapeReader& escapes, KvSet& out)
{
    const int K = j.K, C = j.C, D = j.D, H = j.H, R = j.R;
    const SimdPath path = simdPath();
    const TileKernels kernels = kernelsFor(path);
    const AmxProduct* amx = j.amx;
    const int ldv = amx ? amx->Cp : C;
    const StoreHeadFn fused = fusedStore(path, out.dtype(), D);
    // Row pointers of each block head's tensor (kv_heads, tokens, head_dim) at token t0.
    std::vector<uint16_t*> dst(static_cast<size_t>(H), nullptr);
    const size_t T = size_t(out.shape().numTokens);
    if (fused)
        for (int h = 0; h < H; ++h)
            dst[size_t(h)] = reinterpret_cast<uint16_t*>(out.data(j.kind, j.layer * j.G + h / j.Hc)) +
                             (size_t(h % j.Hc) * T + size_t(j.t0)) * size_t(D);
    thread_local CacheLineVector<float> v;  // the tile's sums: AMX tile rows, so 64-byte aligned
    thread_local std::vector<float> zq;
    thread_local CacheLineVector<uint16_t> zb;  // (kTileTokens, Kp) bfloat16 for AMX
    thread_local std::vector<AmxFixup> fixups;
    // Every row a tile reads is written first: the sums by the mean (memcpy or AMX's start),
    // Z's rows by dequantRow with their padding past K zeroed here, and the rows past nt zeroed.
    v.resize(size_t(kTileTokens) * std::max(ldv, D));
    if (amx) zb.resize(size_t(kTileTokens) * amx->Kp);
    else zq.resize(size_t(kTileTokens) * K);
    for (int r0 = 0; r0 < R; r0 += kTileTokens) {
        const int nt = std::min(kTileTokens, R - r0);
        fixups.clear();
        for (int i = 0; i < nt; ++i) {
            const int cls = j.rowClass[size_t(r0 + i)];
            const uint8_t* srow = j.sym + size_t(r0 + i) * K;
            if (amx) {
                uint16_t* zrow = zb.data() + size_t(i) * amx->Kp;
                amx->dequantRow(srow, j.folded + size_t(cls) * K, cls, i, zrow, escapes, fixups);
                std::fill(zrow + K, zrow + amx->Kp, uint16_t(0));
            } else {
                kernels.dequant(srow, j.folded + size_t(cls) * K, j.step, float(1 << cls), K, zq.data() + size_t(i) * K, escapes);
                std::memcpy(&v[size_t(i) * ldv], j.mean, sizeof(float) * size_t(C));
            }
        }
        if (amx) {
            std::fill(zb.begin() + std::ptrdiff_t(size_t(nt) * amx->Kp), zb.end(), uint16_t(0));  // rows past nt
            amx->accumulate(v.data(), zb.data(), nt);
            amx->applyFixups(v.data(), j.col, j.step, fixups);
        } else {
            kernels.accumulate(Tile{v.data(), j.col, zq.data(), j.lo, j.hi, nt, K, C, j.plain});
        }
        for (int i = 0; i < nt; ++i) {
            const int t = j.tokens[size_t(r0 + i)];
            const double* e = j.rope ? j.rope + size_t(t) * D : nullptr;
            for (int h = 0; h < H; ++h) {
                float* row = &v[size_t(i) * ldv + size_t(h) * D];
                if (fused) {
                    fused(row, e, D, dst[size_t(h)] + size_t(t) * D);
                    continue;
                }
                if (e) applyRopeTable(row, 1, D, e, false);
                out.writeRows(j.kind, j.layer * j.G + h / j.Hc, h % j.Hc, j.t0 + t, 1, row);
            }
        }
    }
}

}  // namespace kvscope::detail
