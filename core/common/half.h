// IEEE binary16 and bfloat16 conversions on plain integers (no compiler half type needed).
// Both directions round to nearest-even; NaN stays NaN, overflow goes to infinity.
#pragma once

#include <cstdint>
#include <cstddef>
#include <cstring>

namespace kvscope {

inline float bitsToFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t floatToBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float halfToFloat(uint16_t h)
{
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        // zero or subnormal: man * 2^-24, exact in float
        const float mag = float(man) * (1.0f / 16777216.0f);
        return sign ? -mag : mag;
    }
    if (exp == 31) return bitsToFloat(sign | 0x7f800000u | (man << 13));
    return bitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t floatToHalf(float f)
{
    const uint32_t x = floatToBits(f);
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

inline float bf16ToFloat(uint16_t b) { return bitsToFloat(uint32_t(b) << 16); }

inline uint16_t floatToBf16(float f)
{
    uint32_t x = floatToBits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
}

}  // namespace kvscope

namespace kvscope {

// Bulk conversions for hot paths: F16C instructions when the CPU has them (checked once at run
// time), otherwise the scalar functions above. Results are identical either way for non-NaN input.
void halfToFloatN(const uint16_t* in, float* out, size_t n);
void floatToHalfN(const float* in, uint16_t* out, size_t n);

}  // namespace kvscope
