// Probability tables for the rANS coder: one per (K/V, layer, role, channel), where role is
// "anchor" or "delta" when delta coding is on (otherwise every symbol is a "delta" role symbol).
//
// Frequencies are normalised to sum to exactly rans::kProbScale and every symbol of the alphabet
// keeps a frequency of at least 1, so a table built on one chunk (or calibrated on other contexts)
// can code any symbol. Serialised form (also in FORMAT.md):
//     u8 lo, u8 hi, then for s in [lo, hi]: LEB128 varint (freq[s] - 1)
// Symbols outside [lo, hi] have frequency 1. lo > hi (e.g. 1, 0) means "all ones", which only a
// one-symbol alphabet can satisfy.
#pragma once

#include "codec/rans.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

constexpr int kMaxAlphabet = 255;

struct ProbTable {
    int alphabet = 0;
    std::vector<uint16_t> freq;   // (alphabet)
    std::vector<uint16_t> start;  // (alphabet + 1), start[alphabet] = kProbScale
};

// The form the coding loops use: fixed arrays (no allocation, reusable scratch) plus, for the
// decoder, a bucket index from slot to symbol so that a lookup takes one 64-bit load.
struct CodingTable {
    static constexpr int kBucketShift = 6;
    static constexpr int kBuckets = rans::kProbScale >> kBucketShift;  // 64 buckets of 64 slots
    // bucket[b] describes three consecutive symbols s0, s0 + 1, s0 + 2 that own slots of the
    // bucket (slots 64 b .. 64 b + 63):
    //   bits  0..7   s0
    //   bits  8..19  start(s0)
    //   bits 20..31  last(s0), bits 32..43 last(s0 + 1), bits 44..55 last(s0 + 2)
    // where last(s) = start(s + 1) - 1 is the last slot of s (4095 past the alphabet). A slot's
    // symbol is s0 + (slot > last(s0)) + (slot > last(s0 + 1)) when start(s0) <= slot <=
    // last(s0 + 2); the decoder walks sf[] for the other slots. s0 is the symbol owning the
    // bucket's first slot, unless the bucket holds more than three symbols (it is crossed by 3
    // or more boundaries: the tails of an alphabet, symbols of frequency < 64). Then s0 starts
    // the three consecutive symbols that own the most slots of the bucket (the first such), so
    // that the slow walk is left to the least probable ones.
    uint64_t bucket[kBuckets];
    // start | freq << 16 per symbol, and start = kProbScale after the last one: one load per step.
    uint32_t sf[kMaxAlphabet + 1];

    uint32_t start(int s) const { return sf[s] & 0xffffu; }
    uint32_t freq(int s) const { return sf[s] >> 16; }
    // Symbol owning `slot`.
    int symbolOf(uint32_t slot) const
    {
        const uint64_t e = bucket[slot >> kBucketShift];
        int s = int(e & 0xffu) + int(slot > ((e >> 20) & 0xfffu)) + int(slot > ((e >> 32) & 0xfffu));
        while (slot < (sf[s] & 0xffffu)) --s;
        while (slot >= (sf[s + 1] & 0xffffu)) ++s;
        return s;
    }
};
static_assert(sizeof(CodingTable) % 64 == 0, "SIMD gathers index tables as arrays of 32-bit words");

// rans::encPut's step for a coding table without a divide or a branch (the encoders' hot loops):
// the 0, 1 or 2 bytes renormalisation emits are both stored below ptr, which moves back by the
// count (a byte stored but not taken is overwritten by the next). The same bytes as encPut; the
// symbol's frequency must not be 0.
inline void encPutFast(uint32_t& x, uint8_t*& ptr, const CodingTable& t, int s, const rans::FreqDivider& div)
{
    const uint32_t sf = t.sf[s], freq = sf >> 16;
    const uint32_t xMax = ((rans::kRansL >> rans::kProbBits) << 8) * freq;  // < 2^31
    const uint32_t k = uint32_t(x >= xMax) + uint32_t(uint64_t(x) >= (uint64_t(xMax) << 8));
    ptr[-1] = uint8_t(x);
    ptr[-2] = uint8_t(x >> 8);
    ptr -= k;
    x >>= 8 * k;
    const uint32_t q = div.div(x, freq);
    x = (q << rans::kProbBits) + (x - q * freq) + (sf & 0xffffu);
}

// Fills c from t; builds the decoder's bucket index when forDecoding.
void toCodingTable(const ProbTable& t, CodingTable* c, bool forDecoding);
// Builds the table for `counts` directly in coding form (same result as buildProbTable).
void buildCodingTable(const uint32_t* counts, int alphabet, CodingTable* c, bool forDecoding);

// Normalises counts (alphabet entries) to a table. Deterministic: the same counts give the same
// table on every machine. A zero total gives the centre symbol nearly all the mass.
ProbTable buildProbTable(const uint32_t* counts, int alphabet);

// The frequencies of a Laplace law of `variance` quantized with `step` on the symbols -M..M (the
// edge symbols take the tails): the table of a component known only by its variance.
std::vector<uint16_t> laplaceFreq(double variance, double step, int M);

// Appends the serialised table to out.
void serializeProbTable(const ProbTable& t, std::vector<uint8_t>& out);

// Parses one table of `alphabet` symbols at *p (advancing it). Returns false with a reason in
// *why when the bytes are truncated, out of range or do not sum to kProbScale.
bool parseProbTable(const uint8_t** p, const uint8_t* end, int alphabet, ProbTable* out, std::string* why);
// Same, straight into coding form (with the decoder's index): the in-band decode path.
bool parseCodingTable(const uint8_t** p, const uint8_t* end, int alphabet, CodingTable* out, std::string* why);
// Appends the serialised form of a coding table of `alphabet` symbols.
void serializeCodingTable(const CodingTable& c, int alphabet, std::vector<uint8_t>& out);

// Bits needed to code `counts` with table t (the cost the encoder will pay, up to a few bytes
// of rANS flush overhead per stream).
double codeLengthBits(const ProbTable& t, const uint32_t* counts);

}  // namespace kvscope
