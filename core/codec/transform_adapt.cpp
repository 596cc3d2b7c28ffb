// The backward-adaptive basis (transform_adapt.h). Compiled with -ffp-contract=off: encoder and
// decoders must derive the same bits (READ ME FIRST there). The vector kernels below do only
// element-wise products and sums (no reordered reductions), so every path gives the scalar bits.
#include "codec/transform_adapt.h"

#include "codec/prob_table.h"

#include "common/error.h"
#include "common/simd_path.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// a' = c a - s b, b' = s a + c b, element by element: two rounded products and one rounded sum
// per element on every path.
void rotateScalar(double* a, double* b, int n, double c, double s)
{
    for (int k = 0; k < n; ++k) {
        const double x = a[k], y = b[k];
        a[k] = c * x - s * y;
        b[k] = s * x + c * y;
    }
}

// y[k] += a * x[k] (a rounded product, then a rounded sum).
void axpyScalar(double* y, const double* x, int n, double a)
{
    for (int k = 0; k < n; ++k) y[k] += a * x[k];
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) void rotateAvx2(double* a, double* b, int n, double c, double s)
{
    const __m256d cv = _mm256_set1_pd(c), sv = _mm256_set1_pd(s);
    int k = 0;
    for (; k + 4 <= n; k += 4) {
        const __m256d x = _mm256_loadu_pd(a + k), y = _mm256_loadu_pd(b + k);
        _mm256_storeu_pd(a + k, _mm256_sub_pd(_mm256_mul_pd(cv, x), _mm256_mul_pd(sv, y)));
        _mm256_storeu_pd(b + k, _mm256_add_pd(_mm256_mul_pd(sv, x), _mm256_mul_pd(cv, y)));
    }
    rotateScalar(a + k, b + k, n - k, c, s);
}

__attribute__((target("avx2"))) void axpyAvx2(double* y, const double* x, int n, double a)
{
    const __m256d av = _mm256_set1_pd(a);
    int k = 0;
    for (; k + 4 <= n; k += 4)
        _mm256_storeu_pd(y + k, _mm256_add_pd(_mm256_loadu_pd(y + k), _mm256_mul_pd(av, _mm256_loadu_pd(x + k))));
    axpyScalar(y + k, x + k, n - k, a);
}

__attribute__((target("avx512f"))) void rotateAvx512(double* a, double* b, int n, double c, double s)
{
    const __m512d cv = _mm512_set1_pd(c), sv = _mm512_set1_pd(s);
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m512d x = _mm512_loadu_pd(a + k), y = _mm512_loadu_pd(b + k);
        _mm512_storeu_pd(a + k, _mm512_sub_pd(_mm512_mul_pd(cv, x), _mm512_mul_pd(sv, y)));
        _mm512_storeu_pd(b + k, _mm512_add_pd(_mm512_mul_pd(sv, x), _mm512_mul_pd(cv, y)));
    }
    rotateScalar(a + k, b + k, n - k, c, s);
}

__attribute__((target("avx512f"))) void axpyAvx512(double* y, const double* x, int n, double a)
{
    const __m512d av = _mm512_set1_pd(a);
    int k = 0;
    for (; k + 8 <= n; k += 8)
        _mm512_storeu_pd(y + k, _mm512_add_pd(_mm512_loadu_pd(y + k), _mm512_mul_pd(av, _mm512_loadu_pd(x + k))));
    axpyScalar(y + k, x + k, n - k, a);
}
#endif

void rotate(SimdPath path, double* a, double* b, int n, double c, double s)
{
#if defined(__x86_64__) || defined(__i386__)
    if (path == SimdPath::Avx512) return rotateAvx512(a, b, n, c, s);
    if (path == SimdPath::Avx2) return rotateAvx2(a, b, n, c, s);
#endif
    rotateScalar(a, b, n, c, s);
}

void axpy(SimdPath path, double* y, const double* x, int n, double a)
{
#if defined(__x86_64__) || defined(__i386__)
    if (path == SimdPath::Avx512) return axpyAvx512(y, x, n, a);
    if (path == SimdPath::Avx2) return axpyAvx2(y, x, n, a);
#endif
    axpyScalar(y, x, n, a);
}

}  // namespace

// The rotations' column updates are not written as they happen (strided stores, most of the time
// of a sweep): within pass p (pivot row p, q = p + 1..), row q is brought up to date just before
// its rotation from the rows rotated before it, and after the pass the columns are written as rows
// (column p from row p, the upper triangle of rows > p from their lower one). The arithmetic is the
// same as updating rows and columns at every rotation.
int jacobiSweeps(std::vector<double>& m, int n, std::vector<double>& v, int sweeps, double minCorrelation)
{
    KVSCOPE_ASSERT(m.size() == size_t(n) * n && v.size() == size_t(n) * n);
    const SimdPath path = simdPath();
    double* const a = m.data();
    auto row = [&](int i) { return a + size_t(i) * n; };
    const double min2 = minCorrelation * minCorrelation;
    double total = 0;
    for (double x : m) total += x * x;
    int done = 0;
    for (; done < sweeps; ++done) {
        double off = 0;
        for (int i = 0; i < n; ++i)
            for (int j = i + 1; j < n; ++j) off += row(i)[j] * row(i)[j];
        if (off <= 1e-24 * total) break;
        bool rotated = false;
        for (int p = 0; p + 1 < n; ++p) {
            double* mp = row(p);
            for (int q = p + 1; q < n; ++q) {
                double* mq = row(q);
                for (int k = p + 1; k < q; ++k) mq[k] = row(k)[q];
                const double apq = mp[q], app = mp[p], aqq = mq[q];
                if (apq * apq <= 1e-30 * (app * app + aqq * aqq) || std::fabs(apq) < 1e-300) continue;
                if (apq * apq <= min2 * std::fabs(app * aqq)) continue;
                const double tau = (aqq - app) / (2 * apq);
                const double t = (tau >= 0 ? 1.0 : -1.0) / (std::fabs(tau) + std::sqrt(1 + tau * tau));
                const double c = 1 / std::sqrt(1 + t * t), s = t * c;
                // m <- J^T m J: rows p and q rotated, the 2 x 2 block set to its exact result.
                rotate(path, mp, mq, n, c, s);
                mp[p] = app - t * apq;
                mq[q] = aqq + t * apq;
                mp[q] = mq[p] = 0;
                rotate(path, v.data() + size_t(p) * n, v.data() + size_t(q) * n, n, c, s);
                rotated = true;
            }
            for (int k = p + 1; k < n; ++k) {
                double* mk = row(k);
                mk[p] = mp[k];
                for (int q = k + 1; q < n; ++q) mk[q] = row(q)[k];
            }
        }
        // Row i's columns > i went stale in the passes after pass i; its lower part is current.
        for (int i = 0; i < n; ++i)
            for (int j = i + 1; j < n; ++j) row(i)[j] = row(j)[i];
        if (!rotated) return done + 1;
    }
    return done;
}

AdaptiveBasis startAdaptiveBasis(const std::vector<float>& lambda, double priorTokens)
{
    if (!(priorTokens > 0) || !std::isfinite(priorTokens))
        throw Error("adaptive basis: prior_tokens must be a positive number");
    AdaptiveBasis a;
    a.C = int(lambda.size());
    a.priorTokens = priorTokens;
    a.lambda.assign(lambda.begin(), lambda.end());
    a.rotation.assign(size_t(a.C) * a.C, 0.0);
    a.cov.assign(size_t(a.C) * a.C, 0.0);
    for (int i = 0; i < a.C; ++i) {
        a.rotation[size_t(i) * a.C + i] = 1.0;
        a.cov[size_t(i) * a.C + i] = priorTokens * a.lambda[size_t(i)];
    }
    a.variance = a.lambda;
    return a;
}

void advanceAdaptiveBasis(AdaptiveBasis& a, int sweeps)
{
    if (a.tokens <= 0) return;
    const int C = a.C;
    jacobiSweeps(a.cov, C, a.rotation, sweeps, kAdaptiveMinCorrelation);
    std::vector<int> order(static_cast<size_t>(C));
    for (int i = 0; i < C; ++i) order[size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return a.cov[size_t(x) * C + x] > a.cov[size_t(y) * C + y]; });
    std::vector<double> rot(a.rotation.size()), cov(a.cov.size());
    const double w = a.priorTokens + a.tokens;
    for (int r = 0; r < C; ++r) {
        const int i = order[size_t(r)];
        a.variance[size_t(r)] = std::max(0.0, a.cov[size_t(i) * C + i] / w);
        std::copy_n(a.rotation.data() + size_t(i) * C, C, rot.data() + size_t(r) * C);
        for (int s = 0; s < C; ++s) cov[size_t(r) * C + s] = a.cov[size_t(i) * C + order[size_t(s)]];
    }
    a.rotation = std::move(rot);
    a.cov = std::move(cov);
}

TransformLevelBlock adaptiveLevelBlock(const AdaptiveBasis& a, double theta)
{
    TransformLevelBlock lb;
    lb.step.assign(size_t(a.C), 0.0f);
    lb.maxQ.assign(size_t(a.C), 0);
    const float st = float(std::sqrt(12.0 * theta));
    if (!(st > 0) || !std::isfinite(st)) return lb;
    for (int j = 0; j < a.C; ++j) {
        const double lam = a.variance[size_t(j)];
        if (!(lam > theta)) continue;
        lb.step[size_t(j)] = st;
        const int M = int(std::max(1.0, std::min(127.0, std::ceil(6.0 * std::sqrt(lam) / double(st)))));
        lb.maxQ[size_t(j)] = uint8_t(M);
        lb.freq.push_back(laplaceFreq(lam, double(st), M));
    }
    return lb;
}

void accumulateAdaptive(AdaptiveBasis& a, const TransformLevelBlock& lb, const int32_t* q, int rows)
{
    const int C = a.C;
    std::vector<int> coded;
    for (int j = 0; j < C; ++j)
        if (lb.step[size_t(j)] > 0) coded.push_back(j);
    const int K = int(coded.size());
    a.tokens += rows;
    if (K == 0 || rows == 0) return;
    // G = Y^T Y of the chunk's reconstructed components y = q Delta (K x K; its upper triangle,
    // row i from column i, summed over the rows in order), added to cov at the coded components:
    // in the chunk's own basis the chunk adds exactly G.
    const SimdPath path = simdPath();
    std::vector<double> g(size_t(K) * K, 0.0), y(static_cast<size_t>(K));
    for (int r = 0; r < rows; ++r) {
        for (int k = 0; k < K; ++k) y[size_t(k)] = double(q[size_t(r) * K + k]) * double(lb.step[size_t(coded[size_t(k)])]);
        for (int i = 0; i < K; ++i)
            if (y[size_t(i)] != 0) axpy(path, g.data() + size_t(i) * K + i, y.data() + i, K - i, y[size_t(i)]);
    }
    for (int i = 0; i < K; ++i)
        for (int j = i; j < K; ++j) {
            const double gij = g[size_t(i) * K + j];
            a.cov[size_t(coded[size_t(i)]) * C + coded[size_t(j)]] += gij;
            if (j != i) a.cov[size_t(coded[size_t(j)]) * C + coded[size_t(i)]] += gij;
        }
}

}  // namespace kvscope
