// The transform fit of wide blocks and the encoder's matrix of every block (transform_wide.h,
// READ ME FIRST there).
#include "codec/transform_wide.h"

#include "codec/linalg.h"
#include "codec/simd_path.h"
#include "common/error.h"
#include "common/half.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvscope::detail {

namespace {
std::atomic<int> gWideOrder{kWideOrder};
}

int wideOrder() { return gWideOrder.load(); }
void setWideOrder(int order) { gWideOrder.store(order); }

TransformBlock fitWideBlock(const TransformSettings& s, KvKind kind, int layer, int H, int D,
                            const std::vector<float>& rows, size_t n, const std::vector<double>& mean,
                            const std::vector<double>& root, const std::vector<double>& invRoot)
{
    const int C = H * D, N = int(n);
    // y = W^{1/2} (x - mean) per row (n x C): per head, the head's D columns times its D x D root
    // (symmetric, so its row-major storage is its column-major one).
    std::vector<float> x(n * size_t(C)), y(n * size_t(C));
    for (size_t r = 0; r < n; ++r)
        for (int c = 0; c < C; ++c) x[r * C + size_t(c)] = float(double(rows[r * C + size_t(c)]) - mean[size_t(c)]);
    const std::vector<float> rootF(root.begin(), root.end()), invRootF(invRoot.begin(), invRoot.end());
    for (int h = 0; h < H && N > 0; ++h)
        sgemmCol('N', 'N', D, N, D, rootF.data() + size_t(h) * D * D, D, x.data() + size_t(h) * D, C,
                 y.data() + size_t(h) * D, C);
    x = {};
    std::vector<float> values, basis;  // basis: C x C, rows are the components
    if (s.basis == TransformBasis::Pca && s.acrossHeads) {
        floatPca(y.data(), n, C, values, basis);
    } else {  // block-diagonal bases: each head's D x D weighted covariance is all they need
        values.assign(size_t(C), 0.0f);
        basis.assign(size_t(C) * C, 0.0f);
        for (int h = 0; h < H; ++h) {
            std::vector<double> sub(size_t(D) * D, 0.0);
            for (size_t r = 0; r < n; ++r) {
                const float* yr = &y[r * C + size_t(h) * D];
                for (int i = 0; i < D; ++i)
                    for (int j = 0; j < D; ++j) sub[size_t(i) * D + j] += double(yr[i]) * double(yr[j]);
            }
            for (double& v : sub) v /= double(std::max<size_t>(n, 1));
            const std::vector<double> bh = headBasis(s, kind, layer, h, D, sub);
            for (int i = 0; i < D; ++i) {
                double v = 0;  // lambda = b^T S' b
                for (int a = 0; a < D; ++a)
                    for (int b = 0; b < D; ++b) v += bh[size_t(i) * D + a] * sub[size_t(a) * D + b] * bh[size_t(i) * D + b];
                values[size_t(h * D + i)] = float(std::max(0.0, v));
                for (int j = 0; j < D; ++j) basis[size_t(h * D + i) * C + size_t(h * D + j)] = float(bh[size_t(i) * D + j]);
            }
        }
    }
    y = {};
    TransformBlock b;
    b.mean.assign(mean.begin(), mean.end());
    b.variance = values;
    // A = W^{-1/2} B^T. Rows [hD, hD + D) of A, read column-major, are A_h^T = B_h W_h^{-1/2}
    // (C x D), where B_h is B's columns of head h, which column-major is B_h^T.
    b.decode.resize(size_t(C) * C);
    for (int h = 0; h < H; ++h)
        sgemmCol('T', 'N', C, D, D, basis.data() + size_t(h) * D, C, invRootF.data() + size_t(h) * D * D, D,
                 b.decode.data() + size_t(h) * D * C, C);
    for (float& a : b.decode) a = halfToFloat(floatToHalf(a));
    prepareDecodeColumns(b);
    return b;
}

namespace {

// Dot product of two float rows in double, summed in 8 interleaved partial sums (sum k takes the
// terms i = 8m + k) combined in a fixed order: the products are exact in double, so any vector
// width that keeps the 8 sums apart gives the same bits.
inline double dotRows(const float* a, const float* b, int n)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += double(a[i + k]) * double(b[i + k]);
    for (; i < n; ++i) acc[0] += double(a[i]) * double(b[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// G_h = A_h A_h^T (D x D, double) of the D rows ah (each C floats) of one head.
void headGramPlain(const float* ah, int C, int D, double* g)
{
    for (int i = 0; i < D; ++i)
        for (int k = i; k < D; ++k) g[size_t(i) * D + k] = g[size_t(k) * D + i] = dotRows(ah + size_t(i) * C, ah + size_t(k) * C, C);
}

// Rows of E = A^T W: e[j][hD + k] = sum over i ascending of at[j][hD + i] * W_h[i][k], one rounded
// multiply and one rounded add per term from +0 (at: A^T, C x C; w: (H, D, D)).
void encoderRowsPlain(const float* at, const float* w, int C, int H, int D, float* e)
{
    for (int j = 0; j < C; ++j)
        for (int h = 0; h < H; ++h) {
            float* eh = e + size_t(j) * C + size_t(h) * D;
            std::fill(eh, eh + D, 0.0f);
            for (int i = 0; i < D; ++i) {
                const float a = at[size_t(j) * C + size_t(h) * D + i];
                const float* wr = w + (size_t(h) * D + i) * D;
                for (int k = 0; k < D; ++k) eh[k] += a * wr[k];
            }
        }
}

#if defined(__x86_64__) || defined(__i386__)
// The same sums in AVX2 vectors (multiply, then add: no FMA), the 8 partial sums of dotRows as
// two vectors of 4 doubles.
__attribute__((target("avx2"))) void headGramAvx2(const float* ah, int C, int D, double* g)
{
    for (int i = 0; i < D; ++i)
        for (int k = i; k < D; ++k) {
            const float *a = ah + size_t(i) * C, *b = ah + size_t(k) * C;
            __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
            int c = 0;
            for (; c + 8 <= C; c += 8) {
                lo = _mm256_add_pd(lo, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + c)), _mm256_cvtps_pd(_mm_loadu_ps(b + c))));
                hi = _mm256_add_pd(hi, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + c + 4)), _mm256_cvtps_pd(_mm_loadu_ps(b + c + 4))));
            }
            double acc[8];
            _mm256_storeu_pd(acc, lo);
            _mm256_storeu_pd(acc + 4, hi);
            for (; c < C; ++c) acc[0] += double(a[c]) * double(b[c]);
            g[size_t(i) * D + k] = g[size_t(k) * D + i] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        }
}

// Tiles of 4 rows x 16 columns of E kept in registers while i runs; needs C % 4 == 0, D % 16 == 0.
__attribute__((target("avx2"))) void encoderRowsAvx2(const float* at, const float* w, int C, int H, int D, float* e)
{
    for (int j = 0; j < C; j += 4)
        for (int h = 0; h < H; ++h)
            for (int k0 = 0; k0 < D; k0 += 16) {
                __m256 acc[4][2];
                for (auto& r : acc) r[0] = r[1] = _mm256_setzero_ps();
                const float* a = at + size_t(j) * C + size_t(h) * D;
                for (int i = 0; i < D; ++i) {
                    const float* wr = w + (size_t(h) * D + i) * D + k0;
                    const __m256 w0 = _mm256_loadu_ps(wr), w1 = _mm256_loadu_ps(wr + 8);
                    for (int r = 0; r < 4; ++r) {
                        const __m256 x = _mm256_broadcast_ss(a + size_t(r) * C + i);
                        acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(x, w0));
                        acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(x, w1));
                    }
                }
                for (int r = 0; r < 4; ++r) {
                    float* er = e + size_t(j + r) * C + size_t(h) * D + k0;
                    _mm256_storeu_ps(er, acc[r][0]);
                    _mm256_storeu_ps(er + 8, acc[r][1]);
                }
            }
}
#endif

// RMS over C of (E A - I) v for a fixed +-1 probe v of components: how far E is from A^{-1} where
// it matters. A z-space error e reconstructs as A e, whose weighted size |W^{1/2} A e| = |B^T e|
// = |e|: the attention-weighted error of the reconstruction, relative to the components' size.
double inverseResidual(const TransformBlock& b, const std::vector<float>& e, int C)
{
    std::vector<float> v(static_cast<size_t>(C)), x(static_cast<size_t>(C));
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (float& vi : v) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        vi = (s * 0x2545F4914F6CDD1Dull) >> 63 ? -1.0f : 1.0f;
    }
    for (int i = 0; i < C; ++i) x[size_t(i)] = float(dotRows(b.decode.data() + size_t(i) * C, v.data(), C));
    double sq = 0;
    for (int j = 0; j < C; ++j) {
        const double d = dotRows(e.data() + size_t(j) * C, x.data(), C) - v[size_t(j)];
        sq += d * d;
    }
    return std::sqrt(sq / C);
}

}  // namespace

std::vector<float> encoderMatrix(const TransformBlock& b, int D, const std::string& what)
{
    const int C = int(b.mean.size()), H = C / std::max(D, 1);
    auto gaussJordan = [&] {
        const std::vector<double> a(b.decode.begin(), b.decode.end());
        const std::vector<double> inv = invertMatrix(a, C, what);
        return std::vector<float>(inv.begin(), inv.end());
    };
    if (C < wideOrder() || H * D != C) return gaussJordan();
    auto gram = headGramPlain;
    auto rows = encoderRowsPlain;
#if defined(__x86_64__) || defined(__i386__)
    if (simdPath() != SimdPath::Scalar) {
        gram = headGramAvx2;
        if (C % 4 == 0 && D % 16 == 0) rows = encoderRowsAvx2;
    }
#endif
    // W_h = (A_h A_h^T)^{-1}, A_h the D rows of head h.
    std::vector<float> w(size_t(C) * D);
    std::vector<double> g(size_t(D) * D);
    for (int h = 0; h < H; ++h) {
        gram(b.decode.data() + size_t(h) * D * C, C, D, g.data());
        const std::vector<double> wh = invertMatrix(g, D, what);
        std::copy(wh.begin(), wh.end(), w.begin() + std::ptrdiff_t(size_t(h) * D * D));
    }
    std::vector<float> e(size_t(C) * C);
    rows(b.columns.data(), w.data(), C, H, D, e.data());
    if (!(inverseResidual(b, e, C) <= 1.0 / 64)) return gaussJordan();
    return e;
}

}  // namespace kvscope::detail
