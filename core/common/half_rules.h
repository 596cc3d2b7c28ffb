// The fp16 and bf16 rounding rules, written once for the CPU (common/half.h) and the GPU decoder
// (cuda/decode_core.h): on integers, so that both give the same bits. Both directions round to
// nearest-even; NaN stays NaN (quiet), overflow goes to infinity.
#pragma once

#include "common/host_device.h"

#include <stdint.h>

namespace kvscope {
namespace hd {

// IEEE binary16 -> float, exact.
KVS_HD float halfToFloat(uint16_t h)
{
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        // zero or subnormal: man * 2^-24, exact in float
        const float mag = fmulRn(float(man), 1.0f / 16777216.0f);
        return sign ? -mag : mag;
    }
    if (exp == 31) return bitsFloat(sign | 0x7f800000u | (man << 13));
    return bitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

// float -> binary16, round to nearest even.
KVS_HD uint16_t floatToHalf(float f)
{
    const uint32_t x = floatBits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u)  // inf or nan
        return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504
    if (absx < 0x38800000u) {
        // result is subnormal or zero: round man * 2^-24 to an integer, nearest-even
        if (absx < 0x33000000u) return sign;  // below half of the smallest subnormal
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;  // 14..24 bits to drop
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return uint16_t(sign | r);
    }
    uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15, still 23-bit mantissa
    r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    return uint16_t(sign | r);
}

KVS_HD float bf16ToFloat(uint16_t b) { return bitsFloat(uint32_t(b) << 16); }

// float -> bfloat16, round to nearest even; NaN becomes a quiet NaN.
KVS_HD uint16_t floatToBf16(float f)
{
    uint32_t x = floatBits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
}

}  // namespace hd
}  // namespace kvscope
