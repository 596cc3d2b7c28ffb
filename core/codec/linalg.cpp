// Dense linear algebra of the transform fit: the Jacobi eigensolver, Gauss-Jordan inversion, the
// symmetric square root, a product and the seeded Hadamard rotation (declared in transform.h and
// linalg.h).
#include "codec/linalg.h"

#include "codec/simd_path.h"
#include "codec/transform.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// Blocks from this order on (a layer group's G * H * head_dim channels, a 7B-wide layer's 4096)
// go to LAPACK's divide-and-conquer solver: O(n^3) with BLAS-3 blocking, far faster at these
// orders than the cyclic Jacobi below, whose O(n^3) per sweep runs down columns (figures:
// docs/transform.md "Layer groups"). Smaller blocks
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
extern "C" void ssyrk_(const char* uplo, const char* trans, const int* n, const int* k, const float* alpha, const float* a,
                       const int* lda, const float* beta, float* c, const int* ldc);
extern "C" void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w, float* work,
                        const int* lwork, int* iwork, const int* liwork, int* info);
extern "C" void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work, const int* lwork,
                        int* info);
extern "C" void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau, float* work,
                        const int* lwork, int* info);
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

namespace {

// One panel of Gauss-Jordan steps [c0, c1) as invertMatrix records them, rows named by where they
// stood when the panel began (its identity): per step the identity of its pivot row, the pivot's
// reciprocal and every identity's factor (0 for the step's pivot row).
struct PanelSteps {
    int n = 0, c0 = 0, c1 = 0;
    const int* pivotId;    // [col - c0]
    const double* recip;   // [col - c0]
    const double* factor;  // [(col - c0) n + id]
};

// The panel's steps on columns [k0, n) of x (row-major, n x n, rows still at their identities'
// places), each row's entries taking the plain loop's operations in its order: first the pivot
// rows in step order (row p of step s: the updates of steps < s, the scaling, then a copy of it,
// P_s, which is what the plain loop's step s reads), then every row's updates x -= f P_s of the
// steps left to it (all of them, or those after its own step). P: kPanel x n scratch.
inline __attribute__((always_inline)) void replayPanel(const PanelSteps& ps, double* x, int k0, double* P,
                                                       const int* stepOf)
{
    const int n = ps.n;
    auto update = [&](double* __restrict xr, int s0, int s1, int id) {
        for (int col = s0; col < s1; ++col) {
            const double f = ps.factor[size_t(col - ps.c0) * n + id];
            if (f == 0) continue;
            const double* __restrict pc = P + size_t(col - ps.c0) * n;
#pragma omp simd
            for (int k = k0; k < n; ++k) xr[k] -= f * pc[k];
        }
    };
    for (int col = ps.c0; col < ps.c1; ++col) {
        const int id = ps.pivotId[col - ps.c0];
        double* __restrict xr = x + size_t(id) * n;
        update(xr, ps.c0, col, id);
        const double r = ps.recip[col - ps.c0];
        double* __restrict pc = P + size_t(col - ps.c0) * n;
        for (int k = k0; k < n; ++k) pc[k] = xr[k] *= r;
    }
    for (int id = 0; id < n; ++id) {
        const int s = stepOf[id];
        update(x + size_t(id) * n, s < 0 ? ps.c0 : s + 1, ps.c1, id);
    }
}

void replayPlain(const PanelSteps& ps, double* x, int k0, double* P, const int* stepOf) { replayPanel(ps, x, k0, P, stepOf); }
#if defined(__x86_64__) || defined(__i386__)
// The same loops in 4-double vectors (an AVX2 target without FMA: the same rounded multiply and
// subtract per entry).
__attribute__((target("avx2"))) void replayAvx2(const PanelSteps& ps, double* x, int k0, double* P, const int* stepOf)
{
    replayPanel(ps, x, k0, P, stepOf);
}
#endif

}  // namespace

// Gauss-Jordan with partial pivoting, in panels of kPanel pivot columns, so that a row goes
// through the cache once per panel rather than once per pivot (the plain loop is memory-bound on
// a layer group's blocks; figures in docs/transform.md#speed). Per panel: its steps run on the panel's own columns
// of m (they alone decide the pivots and give each row's factor f = m[row][col] at step col);
// then the same steps are replayed on the columns right of the panel and on inv (replayPanel),
// and the panel's row swaps are applied. Every entry takes the rounded operations of the plain
// pivot-by-pivot loop in the same order (no contraction in this file, any vector width), so the
// inverse, and so the encoder's bytes, are that loop's to the bit.
std::vector<double> invertMatrix(const std::vector<double>& a, int n, const std::string& what)
{
    constexpr int kPanel = 32;
    std::vector<double> m = a, inv(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i) inv[size_t(i) * n + i] = 1.0;
    double scale = 0;
    for (double x : a) scale = std::max(scale, std::fabs(x));
    std::vector<int> pivots(static_cast<size_t>(kPanel)), pivotId(static_cast<size_t>(kPanel));
    std::vector<int> who(static_cast<size_t>(n)), stepOf(static_cast<size_t>(n), -1);  // identity at each place; pivot step of each identity
    std::vector<double> recip(static_cast<size_t>(kPanel)), factor(size_t(kPanel) * n), P(size_t(kPanel) * n);
    auto replay = replayPlain;
#if defined(__x86_64__) || defined(__i386__)
    if (simdPath() != SimdPath::Scalar) replay = replayAvx2;
#endif
    for (int c0 = 0; c0 < n; c0 += kPanel) {
        const int c1 = std::min(n, c0 + kPanel);
        for (int i = 0; i < n; ++i) who[size_t(i)] = i;
        for (int col = c0; col < c1; ++col) {
            int piv = col;
            for (int r = col + 1; r < n; ++r)
                if (std::fabs(m[size_t(r) * n + col]) > std::fabs(m[size_t(piv) * n + col])) piv = r;
            const double pv = m[size_t(piv) * n + col];
            if (!(std::fabs(pv) > 1e-12 * scale)) throw Error(what + ": the transform matrix is singular");
            const double r = 1.0 / pv;
            pivots[size_t(col - c0)] = piv;
            recip[size_t(col - c0)] = r;
            // Columns <= col of m are never read again (later pivots and factors come from
            // columns > col): the step on the panel's columns right of col, in place.
            if (piv != col) {
                for (int k = c0; k < c1; ++k) std::swap(m[size_t(piv) * n + k], m[size_t(col) * n + k]);
                std::swap(who[size_t(piv)], who[size_t(col)]);
            }
            pivotId[size_t(col - c0)] = who[size_t(col)];
            stepOf[size_t(who[size_t(col)])] = col;
            double* __restrict mc = &m[size_t(col) * n];
            for (int k = col + 1; k < c1; ++k) mc[k] *= r;
            double* f = &factor[size_t(col - c0) * n];
            for (int row = 0; row < n; ++row) {
                const double fr = row == col ? 0.0 : m[size_t(row) * n + col];
                f[who[size_t(row)]] = fr;
                if (fr == 0) continue;
                double* __restrict mr = &m[size_t(row) * n];
                for (int k = col + 1; k < c1; ++k) mr[k] -= fr * mc[k];
            }
        }
        const PanelSteps ps{n, c0, c1, pivotId.data(), recip.data(), factor.data()};
        if (c1 < n) replay(ps, m.data(), c1, P.data(), stepOf.data());
        replay(ps, inv.data(), 0, P.data(), stepOf.data());
        for (int col = c0; col < c1; ++col) {  // the panel's swaps, in order (m's panel columns are swapped already)
            const int piv = pivots[size_t(col - c0)];
            stepOf[size_t(pivotId[size_t(col - c0)])] = -1;
            if (piv == col) continue;
            for (int k = c1; k < n; ++k) std::swap(m[size_t(piv) * n + k], m[size_t(col) * n + k]);
            for (int k = 0; k < n; ++k) std::swap(inv[size_t(piv) * n + k], inv[size_t(col) * n + k]);
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

void sgemmCol(char ta, char tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc)
{
    const float one = 1.0f, zero = 0.0f;
    const char t[2] = {ta, tb};
    sgemm_(&t[0], &t[1], &m, &n, &k, &one, a, &lda, b, &ldb, &zero, c, &ldc);
}

namespace {

// LAPACK's ssyevd on the n x n column-major a (upper triangle): eigenvalues ascending in w,
// eigenvectors in a's columns.
void floatEigen(std::vector<float>& a, int n, std::vector<float>& w)
{
    w.resize(size_t(n));
    int lwork = -1, liwork = -1, info = 0, iworkSize = 0;
    float workSize = 0;
    ssyevd_("V", "U", &n, a.data(), &n, w.data(), &workSize, &lwork, &iworkSize, &liwork, &info);
    if (info != 0) throw Error("transform: LAPACK ssyevd workspace query failed (info " + std::to_string(info) + ")");
    lwork = int(workSize) + 1, liwork = iworkSize;
    std::vector<float> work(static_cast<size_t>(std::max(lwork, 1)));
    std::vector<int> iwork(static_cast<size_t>(std::max(liwork, 1)));
    ssyevd_("V", "U", &n, a.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
    if (info != 0)
        throw Error("transform: LAPACK ssyevd did not converge on a " + std::to_string(n) + " x " + std::to_string(n) +
                    " matrix (info " + std::to_string(info) + ")");
}

// q (C x C, column-major) whose first r columns hold r vectors: q becomes orthogonal, its first r
// columns those vectors orthonormalised in order (signs kept), the rest a complement.
void completeBasis(std::vector<float>& q, int C, int r)
{
    std::vector<float> tau(static_cast<size_t>(std::max(r, 1)));
    int info = 0, lwork = -1;
    float workSize = 0;
    sgeqrf_(&C, &r, q.data(), &C, tau.data(), &workSize, &lwork, &info);
    lwork = std::max(int(workSize) + 1, C);
    std::vector<float> work(static_cast<size_t>(lwork));
    if (r > 0) sgeqrf_(&C, &r, q.data(), &C, tau.data(), work.data(), &lwork, &info);
    if (info != 0) throw Error("transform: LAPACK sgeqrf failed (info " + std::to_string(info) + ")");
    std::vector<float> sign(static_cast<size_t>(r));
    for (int i = 0; i < r; ++i) sign[size_t(i)] = q[size_t(i) * C + size_t(i)] < 0 ? -1.0f : 1.0f;  // R's diagonal
    lwork = -1;
    sorgqr_(&C, &C, &r, q.data(), &C, tau.data(), &workSize, &lwork, &info);
    lwork = std::max(int(workSize) + 1, C);
    work.resize(size_t(lwork));
    sorgqr_(&C, &C, &r, q.data(), &C, tau.data(), work.data(), &lwork, &info);
    if (info != 0) throw Error("transform: LAPACK sorgqr failed (info " + std::to_string(info) + ")");
    for (int i = 0; i < r; ++i)
        for (int k = 0; k < C; ++k) q[size_t(i) * C + size_t(k)] *= sign[size_t(i)];
}

}  // namespace

// Row-major y (n x C) is column-major Y (C x n), column t = row t: the covariance is Y Y^T / n,
// the Gram matrix Y^T Y / n. A column-major matrix whose columns are the eigenvectors is, read
// row-major, the basis with the eigenvectors as rows.
void floatPca(const float* y, size_t rows, int C, std::vector<float>& values, std::vector<float>& basis)
{
    values.assign(size_t(C), 0.0f);
    basis.assign(size_t(C) * C, 0.0f);
    const int n = int(rows);
    const float inv = 1.0f / float(std::max(n, 1)), zero = 0.0f;
    std::vector<float> w;
    if (n >= C) {
        ssyrk_("U", "N", &C, &n, &inv, y, &C, &zero, basis.data(), &C);
        floatEigen(basis, C, w);
        std::vector<float> asc = basis;
        for (int i = 0; i < C; ++i) {
            values[size_t(i)] = std::max(0.0f, w[size_t(C - 1 - i)]);
            std::copy_n(asc.data() + size_t(C - 1 - i) * C, C, basis.data() + size_t(i) * C);
        }
        return;
    }
    std::vector<float> g(size_t(n) * size_t(n));
    if (n > 0) {
        ssyrk_("U", "T", &n, &C, &inv, y, &C, &zero, g.data(), &n);
        floatEigen(g, n, w);
    }
    const float top = n > 0 ? w[size_t(n - 1)] : 0.0f;
    int r = 0;
    while (r < n && w[size_t(n - 1 - r)] > 1e-7f * top && w[size_t(n - 1 - r)] > 0) ++r;
    std::vector<float> u(size_t(n) * size_t(r));  // the r leading Gram eigenvectors, descending
    for (int i = 0; i < r; ++i) std::copy_n(g.data() + size_t(n - 1 - i) * n, n, u.data() + size_t(i) * n);
    if (r > 0) sgemmCol('N', 'N', C, r, n, y, C, u.data(), n, basis.data(), C);
    for (int i = 0; i < r; ++i) {
        const float lam = w[size_t(n - 1 - i)], s = 1.0f / std::sqrt(float(n) * lam);
        values[size_t(i)] = lam;
        for (int k = 0; k < C; ++k) basis[size_t(i) * C + size_t(k)] *= s;
    }
    completeBasis(basis, C, r);
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
