#include "codec/prob_table.h"

#include "common/error.h"

#include <cmath>

namespace kvscope {

namespace {

void finishTable(ProbTable& t)
{
    t.start.assign(size_t(t.alphabet) + 1, 0);
    for (int s = 0; s < t.alphabet; ++s) t.start[s + 1] = uint16_t(t.start[s] + t.freq[s]);
    // start[alphabet] == kProbScale == 4096 fits uint16_t
    t.bucket.assign(rans::kProbScale >> ProbTable::kBucketShift, 0);
    int s = 0;
    for (size_t b = 0; b < t.bucket.size(); ++b) {
        const uint32_t slot = uint32_t(b) << ProbTable::kBucketShift;
        while (slot >= t.start[s + 1]) ++s;
        t.bucket[b] = uint8_t(s);
    }
}

}  // namespace

ProbTable buildProbTable(const uint32_t* counts, int alphabet)
{
    KVSCOPE_ASSERT(alphabet >= 1 && alphabet <= kMaxAlphabet);
    ProbTable t;
    t.alphabet = alphabet;
    t.freq.assign(size_t(alphabet), 1);
    uint64_t total = 0;
    int top = alphabet / 2;  // receives the rounding remainder: the most frequent symbol
    for (int s = 0; s < alphabet; ++s) {
        total += counts[s];
        if (counts[s] > counts[top]) top = s;
    }
    const uint32_t spare = rans::kProbScale - uint32_t(alphabet);  // mass beyond the floor of 1
    uint32_t used = uint32_t(alphabet);
    if (total > 0) {
        for (int s = 0; s < alphabet; ++s) {
            const uint32_t extra = uint32_t((uint64_t(counts[s]) * spare) / total);
            t.freq[s] = uint16_t(t.freq[s] + extra);
            used += extra;
        }
    }
    t.freq[top] = uint16_t(t.freq[top] + (rans::kProbScale - used));
    finishTable(t);
    return t;
}

void serializeProbTable(const ProbTable& t, std::vector<uint8_t>& out)
{
    int lo = 0, hi = t.alphabet - 1;
    while (lo < t.alphabet && t.freq[lo] == 1) ++lo;
    while (hi >= 0 && t.freq[hi] == 1) --hi;
    if (lo > hi) {
        out.push_back(1);
        out.push_back(0);
        return;
    }
    out.push_back(uint8_t(lo));
    out.push_back(uint8_t(hi));
    for (int s = lo; s <= hi; ++s) {
        uint32_t v = t.freq[s] - 1u;
        while (v >= 0x80) {
            out.push_back(uint8_t(v | 0x80));
            v >>= 7;
        }
        out.push_back(uint8_t(v));
    }
}

bool parseProbTable(const uint8_t** pp, const uint8_t* end, int alphabet, ProbTable* out, std::string* why)
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
    ProbTable t;
    t.alphabet = alphabet;
    t.freq.assign(size_t(alphabet), 1);
    uint32_t sum = uint32_t(alphabet);
    if (lo <= hi) {
        if (hi >= alphabet) {
            *why = "probability table names symbol " + std::to_string(hi) + " of a " +
                   std::to_string(alphabet) + "-symbol alphabet";
            return false;
        }
        for (int s = lo; s <= hi; ++s) {
            uint32_t v = 0;
            int shift = 0;
            for (;;) {
                if (p == end) {
                    *why = "probability table truncated";
                    return false;
                }
                const uint8_t b = *p++;
                v |= uint32_t(b & 0x7f) << shift;
                if (!(b & 0x80)) break;
                shift += 7;
                if (shift > 14) {
                    *why = "probability table frequency too long";
                    return false;
                }
            }
            if (v >= rans::kProbScale) {
                *why = "probability table frequency out of range";
                return false;
            }
            t.freq[s] = uint16_t(v + 1);
            sum += v;
        }
    }
    if (sum != rans::kProbScale) {
        *why = "probability table sums to " + std::to_string(sum) + ", not " +
               std::to_string(rans::kProbScale);
        return false;
    }
    finishTable(t);
    *out = std::move(t);
    *pp = p;
    return true;
}

double codeLengthBits(const ProbTable& t, const uint32_t* counts)
{
    double bits = 0;
    for (int s = 0; s < t.alphabet; ++s)
        if (counts[s]) bits += double(counts[s]) * (rans::kProbBits - std::log2(double(t.freq[s])));
    return bits;
}

}  // namespace kvscope
