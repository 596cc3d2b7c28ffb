// Internal to codec/: the transform fit's path for wide blocks (7B-wide layers, layer groups of
// kWideOrder channels and more) and the encoder's matrix of every block (transform.h READ ME
// FIRST, 3). Defined in transform_wide.cpp, except headBasis (transform_fit.cpp).
//
// READ ME FIRST: below kWideOrder channels a block's fit and its encoder matrix are what they have
// always been, to the bit (the shipped profiles' blocks: SmolLM2's 192, Gemma 3's 256, layer
// groups up to 960). From kWideOrder on, the fit works in float (LAPACK's ssyevd, through the
// tokens' Gram matrix when there are fewer tokens than channels) and the encoder's matrix is
// A^T W instead of the Gauss-Jordan inverse of A (FORMAT.md, "Transform section"): other bytes
// than the double-precision path would give, in seconds instead of hours at 4096 channels.
#pragma once

#include "codec/transform.h"

#include <string>
#include <vector>

namespace kvscope::detail {

constexpr int kWideOrder = 1024;
// The order from which blocks take the wide path: kWideOrder, unless setWideOrder chose another
// (tests fit one cache both ways; not for production use).
int wideOrder();
void setWideOrder(int order);

// The basis of head h (D x D, rows are the components) of a block whose basis is not one PCA
// across heads: the eigenvectors of `sub`, the head's weighted covariance (pca; D x D), the
// seeded Hadamard rotation (hadamard) or the identity (none; `sub` is not read for these two).
std::vector<double> headBasis(const TransformSettings& s, KvKind kind, int layer, int h, int D,
                              const std::vector<double>& sub);

// The block of one (kind, layer) of H heads of D dims (C = H D >= wideOrder()) from its n
// calibration rows (n x C floats, RoPE undone when asked) and their column means: mean, decode
// matrix A = W^{-1/2} B^T rounded to fp16, variances lambda_j = the eigenvalues (0 for the
// components beyond the rows' rank), decode columns. root and invRoot: W^{1/2} and W^{-1/2} per
// head, (H, D, D) row-major.
TransformBlock fitWideBlock(const TransformSettings& s, KvKind kind, int layer, int H, int D,
                            const std::vector<float>& rows, size_t n, const std::vector<double>& mean,
                            const std::vector<double>& root, const std::vector<double>& invRoot);

// The encoder's matrix E (C x C, row-major: z = E (x - mean)) of a block with its decode columns,
// heads of D dims. Below wideOrder() channels: A^{-1} by Gauss-Jordan in double (invertMatrix),
// rounded to float. From wideOrder() on: A = W^{-1/2} B^T with B orthogonal and W block-diagonal
// per head, so A A^T = W^{-1} and A^{-1} = A^T W; W is taken per head from A A^T itself, and
// E = A^T W is kept when E A stays within 2^-6 (RMS) of the identity on a fixed probe of
// components (the weighted reconstruction error that E's inexactness adds, relative to the
// components; measured 3e-4 with diagonal weights, 2e-3 with o_proj's dense value weights, from
// the fp16 rounding of A), else (a model not of that form) Gauss-Jordan decides. Deterministic
// loops, no BLAS: the same E on every machine and SIMD path. Throws kvscope::Error "what: the
// transform matrix is singular".
std::vector<float> encoderMatrix(const TransformBlock& b, int D, const std::string& what);

}  // namespace kvscope::detail
