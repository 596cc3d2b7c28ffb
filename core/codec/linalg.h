// Internal to codec/: the dense linear algebra of the transform fit (transform.h READ ME FIRST, 2
// and 3) besides the public symmetricEigen and invertMatrix, on row-major n x n matrices of
// doubles. All of it is defined in linalg.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

// symmetricEigen and invertMatrix are declared in transform.h (public, tests call them).

namespace detail {

// Sylvester-Hadamard matrix of order n (a power of two), scaled to be orthonormal, with the signs
// of its columns flipped by a seeded generator: the randomized rotation H diag(s) / sqrt(n).
std::vector<double> randomHadamard(int n, uint64_t seed);
inline bool powerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }
// Symmetric square root and inverse square root of a symmetric positive semi-definite matrix,
// eigenvalues floored at 1e-4 of the largest so that the inverse stays bounded.
void sqrtPair(const std::vector<double>& m, int n, std::vector<double>& root, std::vector<double>& invRoot);
// a b (n x n each).
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int n);

// Orders from which the fit hands its dense products and its eigendecomposition to BLAS and
// LAPACK (linalg.cpp): the large blocks of layer groups and 7B-wide layers. Smaller blocks keep
// the loops here, so their fits stay byte for byte what they were.
constexpr int kBlasOrder = 256;
// Row-major c (m x n) = a (m x k) b (k x n), or a b^T with b (n x k) when transB: BLAS dgemm/sgemm.
void gemm(bool transB, int m, int n, int k, const double* a, const double* b, double* c);
void gemm(bool transB, int m, int n, int k, const float* a, const float* b, float* c);
// Row-major c (n x n) = alpha x^T x for x (rows x n), both triangles filled: BLAS dsyrk.
void gram(int rows, int n, double alpha, const double* x, double* c);
// Column-major BLAS sgemm as it is (c = op(a) op(b), op "N" or "T"), for strided sub-matrices.
void sgemmCol(char ta, char tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc);
// The eigenvectors of y^T y / n for n rows y (n x C, row-major floats), in float: basis (C x C)
// holds them as its rows, orthonormal, by descending eigenvalue (values, C). With fewer rows than
// channels they come from the n x n Gram matrix y y^T (LAPACK ssyevd on it, v = y^T u / sqrt(n
// lambda)), and the components beyond the rows' rank (eigenvalue under 1e-7 of the largest, or 0)
// are an orthonormal complement (Householder QR: sgeqrf, sorgqr) with eigenvalue 0; else
// ssyevd on the C x C covariance.
void floatPca(const float* y, size_t n, int C, std::vector<float>& values, std::vector<float>& basis);

}  // namespace detail
}  // namespace kvscope
