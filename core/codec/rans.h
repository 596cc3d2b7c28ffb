// Static rANS entropy coders with 12-bit probabilities, two stream layouts:
//   v1 (format 1.x): 4 interleaved 32-bit states, byte-wise renormalisation, L = 2^23;
//   v2 (format 2.x, namespace w32): 32 interleaved 32-bit states, 16-bit renormalisation,
//       L = 2^16, so that 8 or 16 SIMD lanes (or a GPU warp) step through one stream together.
//
// READ ME FIRST
// - rANS is last-in, first-out. The encoder must visit symbols from LAST to FIRST and writes its
//   bytes backwards, from the end of its buffer towards the start; the decoder then reads forward
//   and gets the symbols in their original order. RansWriter hides the backwards buffer.
// - Streams interleave kRansWays states: symbol i of a stream is coded by state i % kRansWays.
//   The encoder flushes the states in reverse way order so the decoder reads way 0 first.
// - Every symbol of an alphabet has a frequency >= 1 (see prob_table.h), so any symbol can be
//   coded; frequencies sum to exactly kProbScale.
// - The decoder never trusts its input: reads past the end of a stream yield zero bytes and set
//   `overrun`, and the caller checks that the stream ended exactly where it should.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace kvscope::rans {

constexpr uint32_t kProbBits = 12;
constexpr uint32_t kProbScale = 1u << kProbBits;
constexpr uint32_t kRansL = 1u << 23;  // lower bound of the normalised state interval [L, 256 L)
constexpr int kRansWays = 4;

// Grows a byte buffer backwards: bytes pushed last come first in the final stream.
class RansWriter {
public:
    void reserve(size_t n) { m_buf.reserve(n); }
    void putByte(uint8_t b) { m_buf.push_back(b); }
    // The stream in reading order (reverse of push order).
    void finishInto(std::vector<uint8_t>& out) const { out.insert(out.end(), m_buf.rbegin(), m_buf.rend()); }
    size_t size() const { return m_buf.size(); }
    void clear() { m_buf.clear(); }

private:
    std::vector<uint8_t> m_buf;  // reversed stream
};

inline void encInit(uint32_t* x) { *x = kRansL; }

// Division by a frequency without a divide instruction (the encoder's hot path): q = (x * magic) >> shift is exact for
// every x < 2^31 (the encoder's states stay below (L >> kProbBits) << 8 * freq <= 2^31) and every
// freq in [1, kProbScale] (Granlund-Montgomery with a 33-bit magic).
struct FreqDivider {
    uint64_t magic[kProbScale + 1];
    uint8_t shift[kProbScale + 1];

    FreqDivider()
    {
        magic[0] = 0;
        shift[0] = 0;
        for (uint32_t d = 1; d <= kProbScale; ++d) {
            uint32_t l = 0;
            while ((1u << l) < d) ++l;  // l = ceil(log2 d)
            shift[d] = uint8_t(31 + l);
            magic[d] = ((uint64_t(1) << (31 + l)) + d - 1) / d;
        }
    }
    uint32_t div(uint32_t x, uint32_t d) const { return uint32_t((uint64_t(x) * magic[d]) >> shift[d]); }
};

inline const FreqDivider& freqDivider()
{
    static const FreqDivider table;
    return table;
}

// Encodes one symbol with frequency `freq` and cumulative start `start`: the plain reference
// (hardware divide, a renormalisation loop); entropy_stage.cpp's encoder is the unrolled, branch-free
// form of the same arithmetic and must produce the same bytes.
inline void encPut(uint32_t* x, RansWriter& w, uint32_t start, uint32_t freq)
{
    const uint32_t xMax = ((kRansL >> kProbBits) << 8) * freq;
    uint32_t s = *x;
    while (s >= xMax) {
        w.putByte(uint8_t(s & 0xff));
        s >>= 8;
    }
    *x = ((s / freq) << kProbBits) + (s % freq) + start;
}

// Flushes a state as 4 bytes, little-endian in reading order.
inline void encFlush(uint32_t x, RansWriter& w)
{
    w.putByte(uint8_t(x >> 24));
    w.putByte(uint8_t(x >> 16));
    w.putByte(uint8_t(x >> 8));
    w.putByte(uint8_t(x >> 0));
}

// Forward reader over one stream; out-of-range reads return 0 and set `overrun`.
struct RansReader {
    const uint8_t* p = nullptr;
    const uint8_t* end = nullptr;
    bool overrun = false;

    uint8_t byte()
    {
        if (p < end) return *p++;
        overrun = true;
        return 0;
    }
};

inline uint32_t decInit(RansReader& r)
{
    uint32_t x = r.byte();
    x |= uint32_t(r.byte()) << 8;
    x |= uint32_t(r.byte()) << 16;
    x |= uint32_t(r.byte()) << 24;
    return x;
}

// The slot (cumulative frequency position) the next symbol occupies.
inline uint32_t decSlot(uint32_t x) { return x & (kProbScale - 1); }

// Advances the state past a symbol (start, freq) and renormalises. A valid state is >= 2^11 after
// the update, so it takes k = (x < 2^23) + (x < 2^15) bytes; reading exactly k (never "until
// x >= L") keeps a corrupt stream (say, all zeros) from looping forever, and matches the
// unrolled fast path in entropy_stage.cpp byte for byte on any input.
inline void decAdvance(uint32_t* x, RansReader& r, uint32_t start, uint32_t freq)
{
    uint32_t s = freq * (*x >> kProbBits) + (*x & (kProbScale - 1)) - start;
    const int k = int(s < kRansL) + int(s < (kRansL >> 8));
    for (int i = 0; i < k; ++i) s = (s << 8) | r.byte();
    *x = s;
}

// The same with no loop and no branch, for callers that know the stream has at least 2 bytes past
// what this symbol takes (*p advances by the k bytes taken; the two bytes at *p are read either
// way). k is known before any byte is read, so interleaved states share the read pointer only by
// adding their k. Same bytes and states as decAdvance.
inline void decAdvanceAhead(uint32_t* x, const uint8_t** p, uint32_t start, uint32_t freq)
{
    const uint32_t s = freq * (*x >> kProbBits) + (*x & (kProbScale - 1)) - start;
    const uint32_t k = uint32_t(s < kRansL) + uint32_t(s < (kRansL >> 8));
    const uint32_t two = uint32_t((*p)[0]) << 8 | (*p)[1];  // the next two bytes, first one high
    const uint32_t bits = 8 * k;                             // 0, 8 or 16: shifts, no branches
    *x = (s << bits) | (two >> (16 - bits));
    *p += k;
}

// ---------------------------------------------------------------------------------------------
// v2: 32 states x 16-bit words. Symbol i of a stream uses state i % 32. A state lives in
// [2^16, 2^32); after a symbol's update a state below 2^16 takes exactly one 16-bit word (a
// valid state is then >= 2^20). Words are read in symbol order: symbol i's word (if it needs
// one) follows every word of symbols < i, whichever SIMD width decodes the stream. The encoder
// visits symbols from last to first and pushes words (and finally the 32 states, lane 31 first)
// towards the front of its buffer, so the stream reads: u32 state[0..31], then u16 words.
namespace w32 {

constexpr int kLanes = 32;
constexpr uint32_t kL = 1u << 16;
constexpr size_t kFlushBytes = 4 * kLanes;  // the initial decoder states at a stream's start

// Encodes one symbol (start, freq): the plain reference (hardware divide). `words` points just
// past the free space below the stream built so far; a word emitted goes to *--words.
inline void encPut(uint32_t* x, uint16_t*& words, uint32_t start, uint32_t freq)
{
    const uint64_t xMax = uint64_t((kL >> kProbBits) << 16) * freq;  // 2^20 f
    uint32_t s = *x;
    if (s >= xMax) {
        *--words = uint16_t(s);
        s >>= 16;
    }
    *x = ((s / freq) << kProbBits) + (s % freq) + start;
}

// The state update of the decoder for symbol (start, freq) at `slot`, before renormalisation.
// Unsigned 32-bit arithmetic: a corrupt stream wraps the same way on every path.
inline uint32_t decStep(uint32_t x, uint32_t start, uint32_t freq)
{
    return freq * (x >> kProbBits) + (x & (kProbScale - 1)) - start;
}

}  // namespace w32

}  // namespace kvscope::rans
