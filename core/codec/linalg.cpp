// Dense linear algebra of the transform fit: the Jacobi eigensolver, Gauss-Jordan inversion, the
// symmetric square root, a product and the seeded Hadamard rotation (declared in transform.h and
// linalg.h).
#include "codec/linalg.h"

#include "codec/transform.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// Blocks from this order on (a layer group's G * H * head_dim channels, a 7B-wide layer's 4096)
// go to LAPACK's divide-and-conquer solver: O(n^3) with BLAS-3 blocking, at n = 960 about 200x
// faster than the cyclic Jacobi below, whose O(n^3) per sweep runs down columns. Smaller blocks
// (every per-layer block of the models shipped here) keep Jacobi, which is accurate to the last
// bits on small eigenvalues and keeps their fits byte for byte what they were.
constexpr int kLapackOrder = detail::kBlasOrder;

// LAPACK's dsyevd (liblapack3, the Fortran interface): eigenvalues ascending in w and, column-
// major, the eigenvectors as the columns of a, which row-major are its rows.
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info);
// BLAS (libblas3 or the BLAS that LAPACK brings, the Fortran interface), column-major.
extern "C" void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                       const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
                       const int* ldc);
extern "C" void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                       const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);
extern "C" void dsyrk_(const char* uplo, const char* trans, const int* n, const int* k, const double* alpha, const double* a,
                       const int* lda, const double* beta, double* c, const int* ldc);

void lapackEigen(const std::vector<double>& a, int n, std::vector<double>& values, std::vector<double>& vectors)
{
    std::vector<double> m = a, w(static_cast<size_t>(n));
    int lwork = -1, liwork = -1, info = 0, iworkSize = 0;
    double workSize = 0;
    dsyevd_("V", "U", &n, m.data(), &n, w.data(), &workSize, &lwork, &iworkSize, &liwork, &info);
    if (info != 0) throw Error("transform: LAPACK dsyevd workspace query failed (info " + std::to_string(info) + ")");
    lwork = int(workSize), liwork = iworkSize;
    std::vector<double> work(static_cast<size_t>(std::max(lwork, 1)));
    std::vector<int> iwork(static_cast<size_t>(std::max(liwork, 1)));
    dsyevd_("V", "U", &n, m.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
    if (info != 0)
        throw Error("transform: LAPACK dsyevd did not converge on a " + std::to_string(n) + " x " + std::to_string(n) +
                    " covariance (info " + std::to_string(info) + ")");
    values.resize(size_t(n));
    vectors.resize(size_t(n) * n);
    for (int r = 0; r < n; ++r) {  // descending, as the Jacobi path returns them
        const int i = n - 1 - r;
        values[size_t(r)] = w[size_t(i)];
        std::copy_n(m.data() + size_t(i) * n, n, vectors.data() + size_t(r) * n);
    }
}

}  // namespace

void symmetricEigen(const std::vector<double>& a, int n, std::vector<double>& values, std::vector<double>& vectors)
{
    KVSCOPE_ASSERT(a.size() == size_t(n) * n);
    if (n >= kLapackOrder) return lapackEigen(a, n, values, vectors);
    std::vector<double> m = a;
    std::vector<double> v(size_t(n) * n, 0.0);  // columns are eigenvectors while iterating
    for (int i = 0; i < n; ++i) v[size_t(i) * n + i] = 1.0;
    auto at = [&](int i, int j) -> double& { return m[size_t(i) * n + j]; };
    double total = 0;
    for (double x : m) total += x * x;
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0;
        for (int i = 0; i < n; ++i)
            for (int j = i + 1; j < n; ++j) off += at(i, j) * at(i, j);
        if (off <= 1e-30 * total || off == 0) break;
        for (int p = 0; p < n; ++p)
            for (int q = p + 1; q < n; ++q) {
                const double apq = at(p, q);
                if (std::fabs(apq) < 1e-300) continue;
                const double app = at(p, p), aqq = at(q, q);
                const double tau = (aqq - app) / (2 * apq);
                const double t = (tau >= 0 ? 1.0 : -1.0) / (std::fabs(tau) + std::sqrt(1 + tau * tau));
                const double c = 1 / std::sqrt(1 + t * t), s = t * c;
                for (int k = 0; k < n; ++k) {  // columns p, q
                    const double mkp = at(k, p), mkq = at(k, q);
                    at(k, p) = c * mkp - s * mkq;
                    at(k, q) = s * mkp + c * mkq;
                }
                for (int k = 0; k < n; ++k) {  // rows p, q
                    const double mpk = at(p, k), mqk = at(q, k);
                    at(p, k) = c * mpk - s * mqk;
                    at(q, k) = s * mpk + c * mqk;
                }
                for (int k = 0; k < n; ++k) {
                    const double vkp = v[size_t(k) * n + p], vkq = v[size_t(k) * n + q];
                    v[size_t(k) * n + p] = c * vkp - s * vkq;
                    v[size_t(k) * n + q] = s * vkp + c * vkq;
                }
            }
    }
    std::vector<int> order(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) order[size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return at(x, x) > at(y, y); });
    values.resize(size_t(n));
    vectors.assign(size_t(n) * n, 0.0);
    for (int r = 0; r < n; ++r) {
        const int i = order[size_t(r)];
        values[size_t(r)] = at(i, i);
        for (int k = 0; k < n; ++k) vectors[size_t(r) * n + k] = v[size_t(k) * n + i];
    }
}

std::vector<double> invertMatrix(const std::vector<double>& a, int n, const std::string& what)
{
    std::vector<double> m = a, inv(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i) inv[size_t(i) * n + i] = 1.0;
    double scale = 0;
    for (double x : a) scale = std::max(scale, std::fabs(x));
    for (int col = 0; col < n; ++col) {
        int piv = col;
        for (int r = col + 1; r < n; ++r)
            if (std::fabs(m[size_t(r) * n + col]) > std::fabs(m[size_t(piv) * n + col])) piv = r;
        const double pv = m[size_t(piv) * n + col];
        if (!(std::fabs(pv) > 1e-12 * scale)) throw Error(what + ": the transform matrix is singular");
        if (piv != col)
            for (int k = 0; k < n; ++k) {
                std::swap(m[size_t(piv) * n + k], m[size_t(col) * n + k]);
                std::swap(inv[size_t(piv) * n + k], inv[size_t(col) * n + k]);
            }
        const double r = 1.0 / pv;
        for (int k = 0; k < n; ++k) {
            m[size_t(col) * n + k] *= r;
            inv[size_t(col) * n + k] *= r;
        }
        // Columns <= col of m are never read again (later pivots and factors come from columns
        // > col), so only the rest is updated; each entry takes the same rounded multiply and
        // subtract in any vector width (no contraction in this file), so the inverse is the
        // plain loop's to the bit.
        const double* __restrict mc = &m[size_t(col) * n];
        const double* __restrict ic = &inv[size_t(col) * n];
        for (int row = 0; row < n; ++row) {
            if (row == col) continue;
            const double f = m[size_t(row) * n + col];
            if (f == 0) continue;
            double* __restrict mr = &m[size_t(row) * n];
            double* __restrict ir = &inv[size_t(row) * n];
#pragma omp simd
            for (int k = col + 1; k < n; ++k) mr[k] -= f * mc[k];
#pragma omp simd
            for (int k = 0; k < n; ++k) ir[k] -= f * ic[k];
        }
    }
    return inv;
}

namespace detail {

std::vector<double> randomHadamard(int n, uint64_t seed)
{
    std::vector<double> h(size_t(n) * n);
    const double norm = 1.0 / std::sqrt(double(n));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    std::vector<double> sign(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        sign[size_t(j)] = ((x * 0x2545F4914F6CDD1Dull) >> 63) ? -1.0 : 1.0;
    }
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
            h[size_t(i) * n + j] = (__builtin_popcount(unsigned(i & j)) & 1 ? -norm : norm) * sign[size_t(j)];
    return h;
}

void sqrtPair(const std::vector<double>& m, int n, std::vector<double>& root, std::vector<double>& invRoot)
{
    std::vector<double> val, vec;
    symmetricEigen(m, n, val, vec);
    const double floor = std::max(1e-30, 1e-4 * std::max(0.0, val.front()));
    root.assign(size_t(n) * n, 0.0);
    invRoot.assign(size_t(n) * n, 0.0);
    for (int k = 0; k < n; ++k) {
        const double l = std::max(val[size_t(k)], floor), r = std::sqrt(l), ir = 1.0 / r;
        const double* u = &vec[size_t(k) * n];
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j) {
                root[size_t(i) * n + j] += r * u[i] * u[j];
                invRoot[size_t(i) * n + j] += ir * u[i] * u[j];
            }
    }
}

// Row-major c = a op(b) is column-major c^T = op(b)^T a^T: b's memory as the first operand
// (transposed when op(b) = b^T), a's as the second.
void gemm(bool transB, int m, int n, int k, const double* a, const double* b, double* c)
{
    const double one = 1.0, zero = 0.0;
    const int ldb = transB ? k : n;
    dgemm_(transB ? "T" : "N", "N", &n, &m, &k, &one, b, &ldb, a, &k, &zero, c, &n);
}

void gemm(bool transB, int m, int n, int k, const float* a, const float* b, float* c)
{
    const float one = 1.0f, zero = 0.0f;
    const int ldb = transB ? k : n;
    sgemm_(transB ? "T" : "N", "N", &n, &m, &k, &one, b, &ldb, a, &k, &zero, c, &n);
}

// x row-major (rows x n) is column-major X (n x rows); X X^T = x^T x.
void gram(int rows, int n, double alpha, const double* x, double* c)
{
    const double zero = 0.0;
    dsyrk_("U", "N", &n, &rows, &alpha, x, &n, &zero, c, &n);
    for (int i = 0; i < n; ++i)  // column-major upper = row-major lower: mirror it up
        for (int j = i + 1; j < n; ++j) c[size_t(i) * n + j] = c[size_t(j) * n + i];
}

std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int n)
{
    if (n >= kBlasOrder) {
        std::vector<double> c(size_t(n) * n);
        gemm(false, n, n, n, a.data(), b.data(), c.data());
        return c;
    }
    std::vector<double> c(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k) {
            const double x = a[size_t(i) * n + k];
            if (x == 0) continue;
            const double* br = &b[size_t(k) * n];
            double* cr = &c[size_t(i) * n];
            for (int j = 0; j < n; ++j) cr[j] += x * br[j];
        }
    return c;
}

}  // namespace detail
}  // namespace kvscope
