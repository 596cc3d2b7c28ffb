// The scalar reference of the weight kernels (weight_kernels.h) and the dispatcher that hands a
// call to the AVX2 or AVX-512 kernels. The reference follows the same decomposition as the SIMD
// kernels (integer block values times x, the scale on the block's sum, the offset on the sum of x)
// one value at a time, in the order of ggml_quants.cpp's dequantisers.
#include "model/weight_kernels.h"

#include "common/error.h"
#include "common/half.h"
#include "modelio/ggml_quants.h"

#include <cstring>
#include <vector>

namespace kvscope {

namespace detail {
#if defined(__x86_64__) || defined(__i386__)
void packedRowsAvx2(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, int batch, const float* xs,
                    float* y, int64_t yStride);
void packedRowsAvx512(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, int batch, const float* xs,
                      float* y, int64_t yStride);
#endif
}  // namespace detail

namespace {

float h2f(const uint8_t* p)
{
    uint16_t h;
    std::memcpy(&h, p, 2);
    return halfToFloat(h);
}

// The 32 values of a Q4_0/Q4_1/Q5_0/Q8_0 block as integers (before scale and offset).
void blockInts(uint32_t type, const uint8_t* b, int* q)
{
    switch (type) {
    case GgmlQ4_0:
        for (int j = 0; j < 16; ++j) q[j] = (b[2 + j] & 0xF) - 8, q[j + 16] = (b[2 + j] >> 4) - 8;
        return;
    case GgmlQ4_1:
        for (int j = 0; j < 16; ++j) q[j] = b[4 + j] & 0xF, q[j + 16] = b[4 + j] >> 4;
        return;
    case GgmlQ5_0: {
        uint32_t qh;
        std::memcpy(&qh, b + 2, 4);
        for (int j = 0; j < 16; ++j) {
            q[j] = int((b[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            q[j + 16] = int((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
        }
        return;
    }
    case GgmlQ8_0:
        for (int j = 0; j < 32; ++j) q[j] = int8_t(b[2 + j]);
        return;
    default: KVSCOPE_ASSERT(false);
    }
}

float dot(const int* q, const float* x, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += float(q[i]) * x[i];
    return s;
}

float sum(const float* x, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += x[i];
    return s;
}

// One row of w times one row of x, by the scalar rules.
float rowScalar(uint32_t type, const uint8_t* row, int64_t cols, const float* x)
{
    float acc = 0.0f;
    int q[32];
    if (type == GgmlQ4_0 || type == GgmlQ4_1 || type == GgmlQ5_0 || type == GgmlQ8_0) {
        const uint64_t bytes = ggmlRowBytes(type, 32);
        for (int64_t b = 0; b < cols / 32; ++b) {
            const uint8_t* blk = row + bytes * uint64_t(b);
            blockInts(type, blk, q);
            acc += h2f(blk) * dot(q, x + 32 * b, 32);
            if (type == GgmlQ4_1) acc += h2f(blk + 2) * sum(x + 32 * b, 32);
        }
        return acc;
    }
    if (type == GgmlQ4_K) {
        for (int64_t b = 0; b < cols / 256; ++b) {
            const uint8_t* blk = row + 144 * b;
            const float d = h2f(blk), dmin = h2f(blk + 2);
            const uint8_t* s = blk + 4;
            for (int j = 0; j < 8; ++j) {
                int sc, m;
                if (j < 4) {
                    sc = s[j] & 63, m = s[j + 4] & 63;
                } else {
                    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                }
                const uint8_t* qs = blk + 16 + 32 * (j / 2);
                for (int l = 0; l < 32; ++l) q[l] = j % 2 ? qs[l] >> 4 : qs[l] & 0xF;
                const float* xj = x + 256 * b + 32 * j;
                acc += d * float(sc) * dot(q, xj, 32) - dmin * float(m) * sum(xj, 32);
            }
        }
        return acc;
    }
    KVSCOPE_ASSERT(type == GgmlQ6_K);
    for (int64_t b = 0; b < cols / 256; ++b) {
        const uint8_t* blk = row + 210 * b;
        const float d = h2f(blk + 208);
        for (int half = 0; half < 2; ++half) {
            const uint8_t* ql = blk + 64 * half;
            const uint8_t* qh = blk + 128 + 32 * half;
            const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * half);
            for (int i = 0; i < 4; ++i) {      // value l + 32 i of the half
                for (int g = 0; g < 2; ++g) {  // 16 values, one scale
                    for (int l = 0; l < 16; ++l) {
                        const int at = 16 * g + l;
                        const int low = i % 2 ? ql[at + 32] : ql[at];
                        q[l] = int(((i < 2 ? low & 0xF : low >> 4)) | (((qh[at] >> (2 * i)) & 3) << 4)) - 32;
                    }
                    acc += d * float(sc[g + 2 * i]) * dot(q, x + 256 * b + 128 * half + 32 * i + 16 * g, 16);
                }
            }
        }
    }
    return acc;
}

}  // namespace

bool weightKernelSupports(uint32_t type)
{
    switch (type) {
    case GgmlQ4_0:
    case GgmlQ4_1:
    case GgmlQ5_0:
    case GgmlQ8_0:
    case GgmlQ4_K:
    case GgmlQ6_K: return true;
    default: return false;
    }
}

void packedMatmul(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, int batch, float* y,
                  int64_t yStride, SimdPath path)
{
    KVSCOPE_ASSERT(weightKernelSupports(w.type) && batch >= 1 && batch <= kWeightKernelMaxBatch);
    KVSCOPE_ASSERT(w.cols % 32 == 0 && w.rowBytes == ggmlRowBytes(w.type, uint64_t(w.cols)) && w.rowBytes > 0);
    KVSCOPE_ASSERT(r0 >= 0 && r0 <= r1 && r1 <= w.rows);
#if defined(__x86_64__) || defined(__i386__)
    if (path != SimdPath::Scalar) {
        // Sums of x over every 32 values: the offsets of Q4_1 and Q4_K multiply them.
        const int64_t n32 = w.cols / 32;
        std::vector<float> xs(size_t(batch * n32));
        for (int t = 0; t < batch; ++t)
            for (int64_t g = 0; g < n32; ++g) xs[size_t(t * n32 + g)] = sum(x + t * w.cols + 32 * g, 32);
        if (path == SimdPath::Avx512)
            return detail::packedRowsAvx512(w, r0, r1, x, batch, xs.data(), y, yStride);
        return detail::packedRowsAvx2(w, r0, r1, x, batch, xs.data(), y, yStride);
    }
#endif
    for (int64_t r = r0; r < r1; ++r)
        for (int t = 0; t < batch; ++t)
            y[t * yStride + r] = rowScalar(w.type, w.data + uint64_t(r) * w.rowBytes, w.cols, x + t * w.cols);
}

}  // namespace kvscope
