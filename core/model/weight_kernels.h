// Matrix products on a GGUF matrix's stored blocks, for decode steps: y = x W^T for one to
// kWeightKernelMaxBatch activation rows, reading the file's 4.5-8.5 bits per weight instead of
// the 32 of an expanded fp32 matrix (a decode step is bound by the bytes of weights it reads).
//
// READ ME FIRST
//  - Activations stay float32. Each block's integers are converted to float and multiplied by x;
//    the block's scale multiplies that block's dot product, and a block's offset (Q4_1's m,
//    Q4_K's dmin * min) multiplies the sum of x over the block. So the result is the expanded
//    path's (dequantise, then an fp32 dot product) up to the order of the sums: there is no Q8
//    rounding of the activations as in llama.cpp's own kernels, and greedy tokens do not depend
//    on whether a step ran here or on the expanded matrix. Tolerances per format: tst_weight_kernels.
//  - Types: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K (weightKernelSupports); others take the
//    runtime's expanded or tile-by-tile path.
//  - Paths: a scalar reference and AVX2 / AVX-512 kernels (weight_kernels_avx2.cpp,
//    weight_kernels_avx512.cpp, their shared block decoding in weight_kernels_x86.h), chosen by
//    the caller from common/simd_path.h (simdPath(): the CPU, or KVSCOPE_SIMD=scalar|avx2|avx512).
//  - Threads: none here; the caller splits the rows ([r0, r1) ranges are independent).
#pragma once

#include "common/simd_path.h"

#include <cstdint>

namespace kvscope {

// One quantised matrix (rows, cols) as stored: rows x rowBytes bytes of ggml blocks
// (modelio/ggml_quants.h), each row cols values.
struct PackedMatrix {
    const uint8_t* data = nullptr;
    uint32_t type = 0;  // GgmlType
    int64_t rows = 0, cols = 0;
    uint64_t rowBytes = 0;
};

// Activation rows one call takes at most; a larger batch is better served by expanded tiles and
// BLAS (each block is decoded once per call and used by every row of the batch).
constexpr int kWeightKernelMaxBatch = 4;

// True when `type` has a kernel here.
bool weightKernelSupports(uint32_t type);

// y[t * yStride + r] = sum_k W[r][k] * x[t * w.cols + k] for rows r in [r0, r1) and t in
// [0, batch), 1 <= batch <= kWeightKernelMaxBatch. The matrix must be of a supported type with
// whole blocks per row (the loader checked both); broken preconditions abort.
void packedMatmul(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, int batch, float* y,
                  int64_t yStride, SimdPath path);

}  // namespace kvscope
