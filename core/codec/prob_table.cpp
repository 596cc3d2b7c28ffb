#include "codec/prob_table.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvscope {

namespace {

// Normalises counts into freq (alphabet entries, each >= 1, summing to kProbScale).
void normalise(const uint32_t* counts, int alphabet, uint16_t* freq)
{
    KVSCOPE_ASSERT(alphabet >= 1 && alphabet <= kMaxAlphabet);
    uint64_t total = 0;
    int top = alphabet / 2;  // receives the rounding remainder: the most frequent symbol
    for (int s = 0; s < alphabet; ++s) {
        total += counts[s];
        if (counts[s] > counts[top]) top = s;
    }
    const uint32_t spare = rans::kProbScale - uint32_t(alphabet);  // mass beyond the floor of 1
    uint32_t used = uint32_t(alphabet);
    for (int s = 0; s < alphabet; ++s) {
        const uint32_t extra = total ? uint32_t((uint64_t(counts[s]) * spare) / total) : 0;
        freq[s] = uint16_t(1 + extra);
        used += extra;
    }
    freq[top] = uint16_t(freq[top] + (rans::kProbScale - used));
}

void finishCoding(CodingTable* c, const uint16_t* freq, int alphabet, bool forDecoding)
{
    uint32_t start = 0;
    for (int s = 0; s < alphabet; ++s) {
        c->sf[s] = start | uint32_t(freq[s]) << 16;
        start += freq[s];
    }
    c->sf[alphabet] = start;  // == kProbScale, freq 0: the walk's sentinel
    if (!forDecoding) return;
    // The last slot of symbol s, 4095 for the two positions past the alphabet.
    auto last = [c, alphabet](int s) -> uint64_t { return s < alphabet ? c->start(s + 1) - 1 : rans::kProbScale - 1; };
    // Bucket b belongs to the symbol owning its first slot 64 b: symbol s owns the buckets from
    // ceil(start(s) / 64) to ceil(start(s + 1) / 64) - 1, one run of equal entries per symbol
    // (runs of plain stores: in-band tables are rebuilt for every chunk, so this is a hot path).
    auto entry = [c, &last](int s) -> uint64_t {
        return uint64_t(s) | uint64_t(c->start(s)) << 8 | last(s) << 20 | last(s + 1) << 32 | last(s + 2) << 44;
    };
    constexpr int width = 1 << CodingTable::kBucketShift;
    constexpr uint32_t round = width - 1;
    // A bucket whose entry's three symbols do not reach its last slot ("crowded") is one with 3+
    // symbols starting inside it (after its first slot): starts[b] counts them, and `crowded`
    // lists each such bucket once, so the fix-up below visits only those (the tails of the
    // alphabet) instead of testing all 64 (in-band tables are rebuilt for every chunk).
    uint16_t starts[CodingTable::kBuckets] = {};  // up to kMaxAlphabet: symbols of frequency 0 share a start
    uint8_t crowded[CodingTable::kBuckets];
    int nCrowded = 0;
    int b = 0;
    for (int s = 0; s < alphabet; ++s) {
        const uint64_t e = entry(s);
        const uint32_t st = c->start(s);
        if (st & round) {
            const int sb = int(st >> CodingTable::kBucketShift);
            if (++starts[sb] == 3) crowded[nCrowded++] = uint8_t(sb);
        }
        const int end = int((c->start(s + 1) + round) >> CodingTable::kBucketShift);  // start(alphabet) = 4096: 64
        for (; b < end; ++b) c->bucket[b] = e;
    }
    // A bucket crossed by 3+ boundaries holds more symbols than an entry resolves. Its entry then
    // names the three consecutive symbols that own the most of its slots, not the first three:
    // in an alphabet's tail, symbols of a few slots each come before ones of tens of slots, and
    // a slot's chance of being visited is about its symbol's frequency, so fewer lanes take the
    // slow walk (SmolLM2 KV, AVX-512 rows: 3.2% of 16-lane steps against 6.7%).
    for (int k = 0; k < nCrowded; ++k) {
        b = crowded[k];
        const uint32_t lo = uint32_t(b) * width, hi = lo + round;
        const int first = int(c->bucket[b] & 0xffu);
        KVSCOPE_ASSERT(last(first + 2) < hi);  // what starts[b] >= 3 means
        int best = first;
        uint32_t bestCover = 0;
        for (int s = first; s < alphabet && c->start(s) <= hi; ++s) {
            const uint32_t from = std::max(c->start(s), lo), to = uint32_t(std::min<uint64_t>(last(s + 2), hi));
            if (to - from + 1 > bestCover) {
                bestCover = to - from + 1;
                best = s;
            }
        }
        c->bucket[b] = entry(best);
    }
}

// Decodes the serialised form into freq; see prob_table.h for the layout.
bool parseFreq(const uint8_t** pp, const uint8_t* end, int alphabet, uint16_t* freq, std::string* why)
{
    const uint8_t* p = *pp;
    if (alphabet < 1 || alphabet > kMaxAlphabet) {
        *why = "alphabet size " + std::to_string(alphabet) + " out of range";
        return false;
    }
    if (end - p < 2) {
        *why = "probability table truncated";
        return false;
    }
    const int lo = p[0], hi = p[1];
    p += 2;
    for (int s = 0; s < alphabet; ++s) freq[s] = 1;
    uint32_t sum = uint32_t(alphabet);
    if (lo <= hi) {
        if (hi >= alphabet) {
            *why = "probability table names symbol " + std::to_string(hi) + " of a " + std::to_string(alphabet) +
                   "-symbol alphabet";
            return false;
        }
        for (int s = lo; s <= hi; ++s) {
            uint32_t v = 0;
            for (int shift = 0;; shift += 7) {
                if (shift > 14) {
                    *why = "probability table frequency too long";
                    return false;
                }
                if (p == end) {
                    *why = "probability table truncated";
                    return false;
                }
                const uint8_t b = *p++;
                v |= uint32_t(b & 0x7f) << shift;
                if (!(b & 0x80)) break;
            }
            if (v >= rans::kProbScale) {
                *why = "probability table frequency out of range";
                return false;
            }
            freq[s] = uint16_t(v + 1);
            sum += v;
        }
    }
    if (sum != rans::kProbScale) {
        *why = "probability table sums to " + std::to_string(sum) + ", not " + std::to_string(rans::kProbScale);
        return false;
    }
    *pp = p;
    return true;
}

void serializeFreq(const uint16_t* freq, int alphabet, std::vector<uint8_t>& out)
{
    int lo = 0, hi = alphabet - 1;
    while (lo < alphabet && freq[lo] == 1) ++lo;
    while (hi >= 0 && freq[hi] == 1) --hi;
    if (lo > hi) {
        out.push_back(1);
        out.push_back(0);
        return;
    }
    uint8_t buf[2 + 2 * kMaxAlphabet];  // every varint is 1 or 2 bytes (freq - 1 < 2^12)
    size_t n = 0;
    buf[n++] = uint8_t(lo);
    buf[n++] = uint8_t(hi);
    for (int s = lo; s <= hi; ++s) {
        const uint32_t v = freq[s] - 1u;
        buf[n] = uint8_t(v | 0x80);
        buf[n + 1] = uint8_t(v >> 7);
        const size_t two = v >= 0x80;
        buf[n] = two ? buf[n] : uint8_t(v);
        n += 1 + two;
    }
    out.insert(out.end(), buf, buf + n);
}

ProbTable fromFreq(const uint16_t* freq, int alphabet)
{
    ProbTable t;
    t.alphabet = alphabet;
    t.freq.assign(freq, freq + alphabet);
    t.start.assign(size_t(alphabet) + 1, 0);
    for (int s = 0; s < alphabet; ++s) t.start[size_t(s) + 1] = uint16_t(t.start[size_t(s)] + freq[s]);
    return t;
}

}  // namespace

ProbTable buildProbTable(const uint32_t* counts, int alphabet)
{
    uint16_t freq[kMaxAlphabet];
    normalise(counts, alphabet, freq);
    return fromFreq(freq, alphabet);
}

void buildCodingTable(const uint32_t* counts, int alphabet, CodingTable* c, bool forDecoding)
{
    uint16_t freq[kMaxAlphabet];
    normalise(counts, alphabet, freq);
    finishCoding(c, freq, alphabet, forDecoding);
}

void toCodingTable(const ProbTable& t, CodingTable* c, bool forDecoding)
{
    finishCoding(c, t.freq.data(), t.alphabet, forDecoding);
}

void serializeProbTable(const ProbTable& t, std::vector<uint8_t>& out) { serializeFreq(t.freq.data(), t.alphabet, out); }

void serializeCodingTable(const CodingTable& c, int alphabet, std::vector<uint8_t>& out)
{
    uint16_t freq[kMaxAlphabet];
    for (int s = 0; s < alphabet; ++s) freq[s] = uint16_t(c.freq(s));
    serializeFreq(freq, alphabet, out);
}

bool parseProbTable(const uint8_t** pp, const uint8_t* end, int alphabet, ProbTable* out, std::string* why)
{
    uint16_t freq[kMaxAlphabet];
    if (!parseFreq(pp, end, alphabet, freq, why)) return false;
    *out = fromFreq(freq, alphabet);
    return true;
}

bool parseCodingTable(const uint8_t** pp, const uint8_t* end, int alphabet, CodingTable* out, std::string* why)
{
    uint16_t freq[kMaxAlphabet];
    if (!parseFreq(pp, end, alphabet, freq, why)) return false;
    finishCoding(out, freq, alphabet, true);
    return true;
}

double codeLengthBits(const ProbTable& t, const uint32_t* counts)
{
    double bits = 0;
    for (int s = 0; s < t.alphabet; ++s)
        if (counts[s]) bits += double(counts[s]) * (rans::kProbBits - std::log2(double(t.freq[size_t(s)])));
    return bits;
}

std::vector<uint16_t> laplaceFreq(double variance, double step, int M)
{
    const int A = 2 * M + 1;
    const double b = std::sqrt(std::max(variance, 1e-30) / 2.0);
    auto cdf = [b](double x) { return x < 0 ? 0.5 * std::exp(x / b) : 1.0 - 0.5 * std::exp(-x / b); };
    std::vector<uint32_t> counts(static_cast<size_t>(A));
    for (int q = -M; q <= M; ++q) {
        const double lo = q == -M ? -1e300 : (q - 0.5) * step, hi = q == M ? 1e300 : (q + 0.5) * step;
        counts[size_t(q + M)] = uint32_t(std::lround((cdf(hi) - cdf(lo)) * double(1 << 24)));
    }
    return buildProbTable(counts.data(), A).freq;
}

}  // namespace kvscope
