// IEEE binary16 and bfloat16 conversions on plain integers (no compiler half type needed).
// Both directions round to nearest-even; NaN stays NaN, overflow goes to infinity.
#pragma once

#include "common/half_rules.h"

#include <cstdint>
#include <cstddef>
#include <cstring>

namespace kvscope {

inline float bitsToFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t floatToBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// The rounding rules themselves live in common/half_rules.h, shared with the GPU decoder.
using hd::bf16ToFloat;
using hd::floatToBf16;
using hd::floatToHalf;
using hd::halfToFloat;

}  // namespace kvscope

namespace kvscope {

// Bulk conversions for hot paths: F16C instructions when the CPU has them (checked once at run
// time), otherwise the scalar functions above. Results are identical either way for non-NaN input.
void halfToFloatN(const uint16_t* in, float* out, size_t n);
void floatToHalfN(const float* in, uint16_t* out, size_t n);

}  // namespace kvscope
