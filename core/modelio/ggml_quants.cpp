// ggml block dequantisation: see ggml_quants.h. Block layouts (all little-endian, fp16 = IEEE half):
//   Q4_0 (18 B / 32):  d | qs[16]                  byte j: element j (low nibble), j + 16 (high)
//   Q4_1 (20 B / 32):  d | m | qs[16]
//   Q5_0 (22 B / 32):  d | qh (u32) | qs[16]       bit j of qh: fifth bit of element j
//   Q5_1 (24 B / 32):  d | m | qh (u32) | qs[16]
//   Q8_0 (34 B / 32):  d | int8 q[32]
//   Q2_K (84 B / 256):  scales[16] | qs[64] | d | dmin        scale byte: low nibble scale, high min
//   Q3_K (110 B / 256): hmask[32] | qs[64] | scales[12] | d   16 scales of 6 bits, minus 32
//   Q4_K (144 B / 256): d | dmin | scales[12] | qs[128]       8 (scale, min) pairs of 6 bits
//   Q5_K (176 B / 256): d | dmin | scales[12] | qh[32] | qs[128]
//   Q6_K (210 B / 256): ql[128] | qh[64] | int8 scales[16] | d
// Within a K-quant super-block, values come in 128-element halves; each half reads 32 bytes of
// 2-bit fields (Q2_K/Q3_K) in four passes of shift 0, 2, 4, 6, or 32 bytes of nibbles twice
// (Q4_K/Q5_K: 64 elements per 32 bytes), or 64 + 32 bytes of low/high bits (Q6_K).
#include "modelio/ggml_quants.h"

#include "common/error.h"
#include "common/half.h"

#include <cstring>

namespace kvscope {

namespace {

struct Block {
    const char* name;
    uint32_t elems;
    uint32_t bytes;
};

Block blockOf(uint32_t type)
{
    switch (type) {
    case GgmlF32: return {"F32", 1, 4};
    case GgmlF16: return {"F16", 1, 2};
    case GgmlBF16: return {"BF16", 1, 2};
    case GgmlQ4_0: return {"Q4_0", 32, 18};
    case GgmlQ4_1: return {"Q4_1", 32, 20};
    case GgmlQ5_0: return {"Q5_0", 32, 22};
    case GgmlQ5_1: return {"Q5_1", 32, 24};
    case GgmlQ8_0: return {"Q8_0", 32, 34};
    case GgmlQ2_K: return {"Q2_K", 256, 84};
    case GgmlQ3_K: return {"Q3_K", 256, 110};
    case GgmlQ4_K: return {"Q4_K", 256, 144};
    case GgmlQ5_K: return {"Q5_K", 256, 176};
    case GgmlQ6_K: return {"Q6_K", 256, 210};
    default: return {nullptr, 0, 0};
    }
}

inline float f16(const uint8_t* p)
{
    uint16_t h;
    std::memcpy(&h, p, 2);
    return halfToFloat(h);
}

inline uint32_t u32(const uint8_t* p)
{
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Scale and min j (0..7) of a Q4_K / Q5_K super-block: 6 bits each, packed in 12 bytes. Pairs 0..3
// sit in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); pairs 4..7 take their low 4 bits
// from bytes 8..11 and their top 2 bits from the spare top bits of bytes 0..7.
inline void scaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void q4_0(const uint8_t* b, float* y)
{
    const float d = f16(b);
    for (int j = 0; j < 16; ++j) {
        y[j] = float(int(b[2 + j] & 0x0f) - 8) * d;
        y[j + 16] = float(int(b[2 + j] >> 4) - 8) * d;
    }
}

void q4_1(const uint8_t* b, float* y)
{
    const float d = f16(b), m = f16(b + 2);
    for (int j = 0; j < 16; ++j) {
        y[j] = float(b[4 + j] & 0x0f) * d + m;
        y[j + 16] = float(b[4 + j] >> 4) * d + m;
    }
}

void q5_0(const uint8_t* b, float* y)
{
    const float d = f16(b);
    const uint32_t qh = u32(b + 2);
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
        const int hi0 = int((qh >> j) << 4) & 0x10;
        const int hi1 = int(qh >> (j + 12)) & 0x10;
        y[j] = float(((qs[j] & 0x0f) | hi0) - 16) * d;
        y[j + 16] = float(((qs[j] >> 4) | hi1) - 16) * d;
    }
}

void q5_1(const uint8_t* b, float* y)
{
    const float d = f16(b), m = f16(b + 2);
    const uint32_t qh = u32(b + 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
        const int hi0 = int((qh >> j) << 4) & 0x10;
        const int hi1 = int(qh >> (j + 12)) & 0x10;
        y[j] = float((qs[j] & 0x0f) | hi0) * d + m;
        y[j + 16] = float((qs[j] >> 4) | hi1) * d + m;
    }
}

void q8_0(const uint8_t* b, float* y)
{
    const float d = f16(b);
    for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

void q2_k(const uint8_t* b, float* y)
{
    const uint8_t* scales = b;
    const uint8_t* q = b + 16;
    const float d = f16(b + 80), dmin = f16(b + 82);
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int part = 0; part < 2; ++part) {
                const uint8_t sc = scales[is++];
                const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
                for (int l = 0; l < 16; ++l) *y++ = dl * float((q[16 * part + l] >> shift) & 3) - ml;
            }
        }
    }
}

void q3_k(const uint8_t* b, float* y)
{
    const uint8_t* hm = b;
    const uint8_t* q = b + 32;
    const uint8_t* packed = b + 96;
    const float dAll = f16(b + 108);
    // 16 scales of 6 bits: low 4 bits from bytes 0..7 (nibbles), top 2 bits from bytes 8..11.
    int8_t scales[16];
    for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
        const int high = (packed[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        scales[j] = int8_t((low | (high << 4)) - 32);
    }
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1)) {
            for (int part = 0; part < 2; ++part) {
                const float dl = dAll * float(scales[is++]);
                for (int l = 0; l < 16; ++l) {
                    const int i = 16 * part + l;
                    const int v = ((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4);
                    *y++ = dl * float(v);
                }
            }
        }
    }
}

void q4_k(const uint8_t* b, float* y)
{
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    for (int j = 0; j < 8; j += 2, q += 32) {
        uint8_t sc, m;
        scaleMinK4(j, scales, &sc, &m);
        const float d1 = d * float(sc), m1 = dmin * float(m);
        scaleMinK4(j + 1, scales, &sc, &m);
        const float d2 = d * float(sc), m2 = dmin * float(m);
        for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
    }
}

void q5_k(const uint8_t* b, float* y)
{
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2, ql += 32, u1 = uint8_t(u1 << 2), u2 = uint8_t(u2 << 2)) {
        uint8_t sc, m;
        scaleMinK4(j, scales, &sc, &m);
        const float d1 = d * float(sc), m1 = dmin * float(m);
        scaleMinK4(j + 1, scales, &sc, &m);
        const float d2 = d * float(sc), m2 = dmin * float(m);
        for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
}

void q6_k(const uint8_t* b, float* y)
{
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * float(sc[is]) * float(q1);
            y[l + 32] = d * float(sc[is + 2]) * float(q2);
            y[l + 64] = d * float(sc[is + 4]) * float(q3);
            y[l + 96] = d * float(sc[is + 6]) * float(q4);
        }
    }
}

}  // namespace

const char* const kSupportedTypes = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";

bool canDequantize(uint32_t type) { return blockOf(type).name != nullptr; }

uint64_t ggmlRowBytes(uint32_t type, uint64_t elements)
{
    const Block b = blockOf(type);
    if (!b.name || elements % b.elems != 0) return 0;
    return elements / b.elems * b.bytes;
}

void dequantizeGgml(uint32_t type, const uint8_t* src, uint64_t bytes, uint64_t elements, float* dst)
{
    const Block blk = blockOf(type);
    if (!blk.name)
        throw Error("ggml type " + std::to_string(type) + ": cannot dequantize; supported: " + kSupportedTypes);
    const std::string name = blk.name;
    if (elements % blk.elems != 0)
        throw Error("ggml " + name + ": " + std::to_string(elements) + " values are not a whole number of " +
                    std::to_string(blk.elems) + "-value blocks");
    const uint64_t blocks = elements / blk.elems;
    if (bytes / blk.bytes < blocks || bytes != blocks * blk.bytes)
        throw Error("ggml " + name + ": " + std::to_string(bytes) + " bytes for " + std::to_string(blocks) +
                    " blocks of " + std::to_string(blk.bytes) + " bytes (truncated or mis-sized block data)");

    switch (type) {
    case GgmlF32: std::memcpy(dst, src, size_t(elements) * 4); return;
    case GgmlF16:
        if (reinterpret_cast<uintptr_t>(src) % alignof(uint16_t) == 0)
            halfToFloatN(reinterpret_cast<const uint16_t*>(src), dst, size_t(elements));
        else
            for (uint64_t k = 0; k < elements; ++k) dst[k] = f16(src + 2 * k);
        return;
    case GgmlBF16:
        for (uint64_t k = 0; k < elements; ++k) {
            uint16_t h;
            std::memcpy(&h, src + 2 * k, 2);
            dst[k] = bf16ToFloat(h);
        }
        return;
    default: break;
    }
    void (*fn)(const uint8_t*, float*) = nullptr;
    switch (type) {
    case GgmlQ4_0: fn = q4_0; break;
    case GgmlQ4_1: fn = q4_1; break;
    case GgmlQ5_0: fn = q5_0; break;
    case GgmlQ5_1: fn = q5_1; break;
    case GgmlQ8_0: fn = q8_0; break;
    case GgmlQ2_K: fn = q2_k; break;
    case GgmlQ3_K: fn = q3_k; break;
    case GgmlQ4_K: fn = q4_k; break;
    case GgmlQ5_K: fn = q5_k; break;
    case GgmlQ6_K: fn = q6_k; break;
    default: KVSCOPE_ASSERT(false);
    }
    for (uint64_t k = 0; k < blocks; ++k) fn(src + k * blk.bytes, dst + k * blk.elems);
}

}  // namespace kvscope
