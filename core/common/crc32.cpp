#include "common/crc32.h"

#include <zlib.h>

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVSCOPE_CRC32_CLMUL 1
#endif

namespace kvscope {

namespace {

// zlib's crc32 (table-driven): short ranges, tails, and CPUs without PCLMULQDQ. It takes a uInt
// length, so large ranges go in pieces.
uint32_t crc32Zlib(const uint8_t* p, size_t size, uint32_t seed)
{
    uLong crc = seed;
    while (size > 0) {
        const uInt n = uInt(std::min<size_t>(size, 1u << 30));
        crc = ::crc32(crc, p, n);
        p += n;
        size -= n;
    }
    return uint32_t(crc);
}

#if KVSCOPE_CRC32_CLMUL
// CRC-32 by carry-less multiplication (PCLMULQDQ), the folding method of Intel's "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ Instruction" (2009) for the reflected
// polynomial 0xEDB88320. Four 128-bit lanes are folded 64 bytes ahead, then into one lane, then
// 128 -> 64 -> 32 bits with a Barrett reduction; the constants are the paper's k1..k5, P' and mu
// for this polynomial (bit-reflected powers of x modulo P). tests/tst_crc32.cpp checks every
// length and alignment against a bitwise reference. `state` is the CRC register (the running CRC
// inverted); size >= 64 and a multiple of 16.
#define KVSCOPE_CLMUL_TARGET __attribute__((target("pclmul,sse2")))

// x * (k's pair of x^n mod P) folded onto `next`: the low half times k's low constant, the high
// half times its high one.
KVSCOPE_CLMUL_TARGET inline __m128i fold(__m128i x, __m128i k, __m128i next)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

KVSCOPE_CLMUL_TARGET inline __m128i load(const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); }

KVSCOPE_CLMUL_TARGET uint32_t crc32Clmul(const uint8_t* p, size_t size, uint32_t state)
{
    const __m128i fold4 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i fold1 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i fold64 = _mm_set_epi64x(0, 0x163cd6124);
    const __m128i barrett = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    __m128i a = _mm_xor_si128(load(p), _mm_cvtsi32_si128(int(state)));
    __m128i b = load(p + 16), c = load(p + 32), d = load(p + 48);
    p += 64;
    size -= 64;
    for (; size >= 64; p += 64, size -= 64) {
        a = fold(a, fold4, load(p));
        b = fold(b, fold4, load(p + 16));
        c = fold(c, fold4, load(p + 32));
        d = fold(d, fold4, load(p + 48));
    }
    a = fold(fold(fold(a, fold1, b), fold1, c), fold1, d);
    for (; size >= 16; p += 16, size -= 16) a = fold(a, fold1, load(p));
    // 128 -> 64 bits: the low half times x^(128-32) onto the high half, then the low 32 bits times x^64.
    a = _mm_xor_si128(_mm_srli_si128(a, 8), _mm_clmulepi64_si128(a, fold1, 0x10));
    a = _mm_xor_si128(_mm_srli_si128(a, 4), _mm_clmulepi64_si128(_mm_and_si128(a, low32), fold64, 0x00));
    // Barrett: q = (a mod x^32) * mu, then a - q * P; the CRC is the second 32-bit word.
    __m128i q = _mm_clmulepi64_si128(_mm_and_si128(a, low32), barrett, 0x10);
    q = _mm_clmulepi64_si128(_mm_and_si128(q, low32), barrett, 0x00);
    return uint32_t(_mm_cvtsi128_si32(_mm_srli_si128(_mm_xor_si128(a, q), 4)));
}

bool haveClmul()
{
    static const bool have = __builtin_cpu_supports("pclmul");
    return have;
}
#endif

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t seed)
{
    auto p = static_cast<const uint8_t*>(data);
#if KVSCOPE_CRC32_CLMUL
    // The container's payloads and sections: folded 16 bytes at a time, the last size % 16 bytes
    // by zlib (docs/codecs.md has the speeds).
    if (size >= 64 && haveClmul()) {
        const size_t n = size & ~size_t(15);
        seed = ~crc32Clmul(p, n, ~seed);
        p += n;
        size -= n;
    }
#endif
    return crc32Zlib(p, size, seed);
}

}  // namespace kvscope
