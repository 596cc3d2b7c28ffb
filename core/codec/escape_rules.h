// How the transform codec's symbols and escapes are read (transform.h READ ME FIRST, 5), written
// once for the CPU decoder (codec/transform_chunk.cpp) and the GPU decoder
// (cuda/transform_core.h): fixed-width symbols packed LSB first, and escapes as zigzag LEB128
// varints checked against their symbol.
#pragma once

#include "common/host_device.h"

#include <stdint.h>

namespace kvscope {
namespace hd {

// Bits of a fixed-width symbol of an alphabet: ceil(log2(alphabet)).
KVS_HD int bitsFor(int alphabet)
{
    int b = 0;
    while ((1 << b) < alphabet) ++b;
    return b;
}

// Fixed-width symbols, LSB first. The caller has checked that the stream holds every symbol it
// takes (the sum of the widths, rounded up to bytes), so take() reads no byte past it.
struct FixedWidthReader {
    const uint8_t* p;
    uint64_t acc;
    int bits;

    KVS_HD int take(int w)
    {
        while (bits < w) {
            acc |= uint64_t(*p++) << bits;
            bits += 8;
        }
        const int s = int(acc & ((uint64_t(1) << w) - 1));
        acc >>= w;
        bits -= w;
        return s;
    }
};

enum EscapeStatus : int { kEscapeOk = 0, kEscapeMalformed = 1, kEscapeMismatch = 2 };

// q of the escaped symbol s (0 or 2 M, M the folded max) from the varint at p (advanced past it,
// never past end): kEscapeMalformed when it is truncated or longer than 5 bytes, kEscapeMismatch
// when q does not belong to s (negative for 0, positive for 2 M, |q| >= M, |q| < 2^31).
KVS_HD int readEscape(const uint8_t*& p, const uint8_t* end, int s, int M, int64_t* q)
{
    uint64_t z = 0;
    for (int shift = 0;; shift += 7) {
        if (p == end || shift > 28) return kEscapeMalformed;
        const uint8_t byte = *p++;
        z |= uint64_t(byte & 0x7f) << shift;
        if (!(byte & 0x80)) break;
    }
    const int64_t v = (z & 1) ? -int64_t((z + 1) >> 1) : int64_t(z >> 1);
    if ((s == 0) != (v < 0) || (v > -M && v < M) || v > 2147483647 || v < -2147483647) return kEscapeMismatch;
    *q = v;
    return kEscapeOk;
}

}  // namespace hd
}  // namespace kvscope
