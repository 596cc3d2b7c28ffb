// rANS coder (core/codec/rans.h) and its probability tables (core/codec/prob_table.h):
// 4-way interleaved round trips laid out exactly like entropy_stage.cpp's head streams, a scalar
// reference coder written here from the math, the entropy bound, and table parsing of bad bytes.
#include "testmain.h"

#include "codec/prob_table.h"
#include "codec/rans.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

using namespace kvscope;

namespace {

enum Distribution { Uniform = 0, Skewed = 1, OneSymbol = 2, MismatchedTable = 3 };

// Deterministic on every platform: mt19937_64 is specified bit-exactly, the mapping is ours.
std::vector<uint8_t> drawSymbols(int alphabet, size_t n, Distribution dist, uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> s(n);
    const int centre = alphabet / 2;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rng();
        switch (dist) {
        case Uniform:
            s[i] = uint8_t(r % uint64_t(alphabet));
            break;
        case OneSymbol:
            s[i] = uint8_t(centre);
            break;
        case Skewed:
        case MismatchedTable: {
            // Two-sided geometric around the centre, like quantized KV deltas: P(|k|) ~ 2^-|k|.
            int k = 0;
            uint64_t bits = r;
            while ((bits & 1) && k < alphabet) {
                ++k;
                bits >>= 1;
            }
            const int sign = (r >> 63) ? 1 : -1;
            s[i] = uint8_t(std::clamp(centre + sign * k, 0, alphabet - 1));
            break;
        }
        }
    }
    return s;
}

std::vector<uint32_t> countSymbols(const std::vector<uint8_t>& s, int alphabet)
{
    std::vector<uint32_t> c(size_t(alphabet), 0);
    for (uint8_t v : s) c[v]++;
    return c;
}

// The 4-way interleave of entropy_stage.cpp's encodeHeadStream: symbol i by state i % 4, symbols
// visited last to first, states flushed 3..0 so the decoder reads way 0 first.
std::vector<uint8_t> encodeInterleaved(const std::vector<uint8_t>& sym, const ProbTable& t)
{
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) rans::encInit(&v);
    rans::RansWriter w;
    for (size_t i = sym.size(); i-- > 0;)
        rans::encPut(&x[i % rans::kRansWays], w, t.start[sym[i]], t.freq[sym[i]]);
    for (int k = rans::kRansWays - 1; k >= 0; --k) rans::encFlush(x[k], w);
    std::vector<uint8_t> out;
    w.finishInto(out);
    return out;
}

// decodeHeadStream's loop. Returns false when the stream is not exactly consumed or a state did
// not come back to its initial value (the corruption checks the codec relies on).
bool decodeInterleaved(const std::vector<uint8_t>& bytes, size_t n, const ProbTable& t, std::vector<uint8_t>& sym)
{
    // Slot -> symbol by a plain lookup array: the coder's fast CodingTable is tested separately.
    std::vector<uint8_t> owner(rans::kProbScale);
    for (int s = 0; s < t.alphabet; ++s)
        for (uint32_t k = t.start[s]; k < t.start[s + 1]; ++k) owner[k] = uint8_t(s);
    rans::RansReader r{bytes.data(), bytes.data() + bytes.size(), false};
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) v = rans::decInit(r);
    sym.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
        uint32_t& st = x[i % rans::kRansWays];
        const int s = owner[rans::decSlot(st)];
        sym[i] = uint8_t(s);
        rans::decAdvance(&st, r, t.start[s], t.freq[s]);
    }
    bool ok = !r.overrun && r.p == r.end;
    for (uint32_t v : x) ok = ok && v == rans::kRansL;
    return ok;
}

// One state through rans.h, for comparison with the reference below.
std::vector<uint8_t> encodeSingleWithLibrary(const std::vector<uint8_t>& sym, const ProbTable& t)
{
    uint32_t x;
    rans::encInit(&x);
    rans::RansWriter w;
    for (size_t i = sym.size(); i-- > 0;) rans::encPut(&x, w, t.start[sym[i]], t.freq[sym[i]]);
    rans::encFlush(x, w);
    std::vector<uint8_t> out;
    w.finishInto(out);
    return out;
}

// Plain scalar rANS written from the definition (Duda 2013; byte renormalisation as in ryg_rans):
// state in [L, 256 L), L = 2^23, M = 2^12. C(x, s) = floor(x / f) * M + x mod f + c_s.
namespace ref {

constexpr uint64_t L = uint64_t(1) << 23;
constexpr uint64_t M = uint64_t(1) << 12;

std::vector<uint8_t> encode(const std::vector<uint8_t>& sym, const std::vector<uint16_t>& freq)
{
    std::vector<uint64_t> cum(freq.size() + 1, 0);
    for (size_t s = 0; s < freq.size(); ++s) cum[s + 1] = cum[s] + freq[s];
    uint64_t x = L;
    std::vector<uint8_t> rev;  // bytes in emission order; the stream is its reverse
    for (size_t i = sym.size(); i-- > 0;) {
        const uint64_t f = freq[sym[i]];
        // The state after coding must stay below 256 L: x / f * M < 256 L  <=>  x < 256 L / M * f.
        while (x >= (256 * L / M) * f) {
            rev.push_back(uint8_t(x % 256));
            x /= 256;
        }
        x = (x / f) * M + x % f + cum[sym[i]];
    }
    for (int k = 0; k < 4; ++k) {  // most significant first, so the stream reads little-endian
        rev.push_back(uint8_t(x >> (8 * (3 - k))));
    }
    return std::vector<uint8_t>(rev.rbegin(), rev.rend());
}

bool decode(const std::vector<uint8_t>& bytes, size_t n, const std::vector<uint16_t>& freq, std::vector<uint8_t>& sym)
{
    std::vector<uint64_t> cum(freq.size() + 1, 0);
    for (size_t s = 0; s < freq.size(); ++s) cum[s + 1] = cum[s] + freq[s];
    size_t p = 0;
    if (bytes.size() < 4) return false;
    uint64_t x = 0;
    for (int k = 0; k < 4; ++k) x |= uint64_t(bytes[p++]) << (8 * k);
    sym.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
        const uint64_t slot = x % M;
        size_t s = 0;
        while (cum[s + 1] <= slot) ++s;  // linear search: slow and obviously right
        sym[i] = uint8_t(s);
        x = freq[s] * (x / M) + slot - cum[s];
        while (x < L) {
            if (p == bytes.size()) return false;
            x = x * 256 + bytes[p++];
        }
    }
    return p == bytes.size() && x == L;
}

}  // namespace ref

QString tableDiff(const ProbTable& a, const ProbTable& b)
{
    if (a.alphabet != b.alphabet) return QString("alphabet %1 vs %2").arg(a.alphabet).arg(b.alphabet);
    for (int s = 0; s < a.alphabet; ++s)
        if (a.freq[s] != b.freq[s]) return QString("freq[%1] %2 vs %3").arg(s).arg(a.freq[s]).arg(b.freq[s]);
    if (a.start != b.start) return "start differs";
    return QString();
}

// Differences between t and the coding table `fill` produces, seen only through the coding
// table's public behaviour: its serialised bytes and the symbol it finds for every slot.
template <typename Fill>
QString codingDiff(const ProbTable& t, int alphabet, Fill fill)
{
    auto c = std::make_unique<CodingTable>();
    fill(c.get());
    std::vector<uint8_t> a, b;
    serializeProbTable(t, a);
    serializeCodingTable(*c, alphabet, b);
    if (a != b) return "serialised bytes differ";
    for (uint32_t slot = 0; slot < rans::kProbScale; ++slot) {
        const int s = c->symbolOf(slot);
        if (!(s >= 0 && s < alphabet && t.start[s] <= slot && slot < t.start[s + 1]))
            return QString("symbolOf(%1) = %2 does not own the slot").arg(slot).arg(s);
    }
    // The bucket index the SIMD decoders read directly, against its definition in prob_table.h:
    // the three consecutive symbols owning the most slots of the bucket, the first such.
    auto last = [&](int s) -> uint64_t { return s < alphabet ? t.start[size_t(s) + 1] - 1u : rans::kProbScale - 1; };
    std::vector<int> owner(rans::kProbScale);
    for (int s = 0; s < alphabet; ++s)
        for (uint32_t slot = t.start[size_t(s)]; slot < t.start[size_t(s) + 1]; ++slot) owner[slot] = s;
    for (int b = 0; b < CodingTable::kBuckets; ++b) {
        const uint32_t first = uint32_t(b) << CodingTable::kBucketShift;
        int s0 = owner[first], most = 0;
        for (int s = owner[first]; s <= owner[first + 63]; ++s) {
            int owned = 0;
            for (uint32_t slot = first; slot < first + 64; ++slot) owned += owner[slot] >= s && owner[slot] <= s + 2;
            if (owned > most) most = owned, s0 = s;
        }
        const uint64_t want = uint64_t(s0) | uint64_t(t.start[size_t(s0)]) << 8 | last(s0) << 20 | last(s0 + 1) << 32 |
                              last(s0 + 2) << 44;
        if (c->bucket[b] != want) return QString("bucket %1 is %2, expected %3").arg(b).arg(c->bucket[b], 0, 16).arg(want, 0, 16);
    }
    return QString();
}

void verifyTableInvariants(const ProbTable& t, int alphabet)
{
    QCOMPARE(t.alphabet, alphabet);
    QCOMPARE(int(t.freq.size()), alphabet);
    QCOMPARE(int(t.start.size()), alphabet + 1);
    uint32_t sum = 0;
    for (int s = 0; s < alphabet; ++s) {
        QVERIFY2(t.freq[s] >= 1, qPrintable(QString("freq[%1] is 0: symbol %1 cannot be coded").arg(s)));
        QCOMPARE(uint32_t(t.start[s]), sum);
        sum += t.freq[s];
    }
    QCOMPARE(sum, rans::kProbScale);
    QCOMPARE(uint32_t(t.start[alphabet]), rans::kProbScale);
    QVERIFY2(codingDiff(t, t.alphabet, [&](CodingTable* c) { toCodingTable(t, c, true); }).isEmpty(),
             qPrintable(codingDiff(t, t.alphabet, [&](CodingTable* c) { toCodingTable(t, c, true); })));
}

}  // namespace

class TestRans : public QObject {
    Q_OBJECT
private slots:
    void roundTrip_data();
    void roundTrip();
    void scalarReferenceMatchesLibrary_data();
    void scalarReferenceMatchesLibrary();
    void corruptStreamIsDetected();
    void buildProbTableInvariants_data();
    void buildProbTableInvariants();
    void buildProbTableZeroCounts();
    void serializeParseRoundTrip_data();
    void serializeParseRoundTrip();
    void parseRejects_data();
    void parseRejects();
    void parseRejectsEveryTruncation();
    void freqDividerIsExact();
};

void TestRans::roundTrip_data()
{
    QTest::addColumn<int>("alphabet");
    QTest::addColumn<int>("length");
    QTest::addColumn<int>("dist");
    QTest::addColumn<quint64>("seed");

    QTest::newRow("empty stream") << 31 << 0 << int(Skewed) << quint64(1);
    QTest::newRow("1 symbol") << 31 << 1 << int(Skewed) << quint64(2);
    QTest::newRow("3 symbols, fewer than the ways") << 15 << 3 << int(Uniform) << quint64(3);
    QTest::newRow("5 symbols, one past the ways") << 15 << 5 << int(Skewed) << quint64(4);
    QTest::newRow("alphabet 3 skewed") << 3 << 10000 << int(Skewed) << quint64(5);
    QTest::newRow("alphabet 3 uniform") << 3 << 10000 << int(Uniform) << quint64(6);
    QTest::newRow("alphabet 7 skewed") << 7 << 4097 << int(Skewed) << quint64(7);
    QTest::newRow("alphabet 15 skewed") << 15 << 20000 << int(Skewed) << quint64(8);
    QTest::newRow("alphabet 31 skewed 100k") << 31 << 100000 << int(Skewed) << quint64(9);
    QTest::newRow("alphabet 31 uniform") << 31 << 30000 << int(Uniform) << quint64(10);
    QTest::newRow("alphabet 63 uniform") << 63 << 30000 << int(Uniform) << quint64(11);
    QTest::newRow("alphabet 255 uniform 100k") << 255 << 100000 << int(Uniform) << quint64(12);
    QTest::newRow("alphabet 255 skewed") << 255 << 50000 << int(Skewed) << quint64(13);
    QTest::newRow("alphabet 255 one symbol") << 255 << 50000 << int(OneSymbol) << quint64(14);
    // A calibrated (shared) table that never saw these symbols still codes them: freq >= 1.
    QTest::newRow("alphabet 31 table from other data") << 31 << 20000 << int(MismatchedTable) << quint64(15);
    QTest::newRow("alphabet 255 table from other data") << 255 << 20000 << int(MismatchedTable) << quint64(16);
}

void TestRans::roundTrip()
{
    QFETCH(int, alphabet);
    QFETCH(int, length);
    QFETCH(int, dist);
    QFETCH(quint64, seed);

    const std::vector<uint8_t> sym = drawSymbols(alphabet, size_t(length), Distribution(dist), seed);
    const std::vector<uint32_t> counts = countSymbols(sym, alphabet);
    ProbTable t;
    if (dist == MismatchedTable) {
        // Table from a narrow distribution over the centre only; the data spreads wider.
        std::vector<uint32_t> other(size_t(alphabet), 0);
        other[size_t(alphabet / 2)] = 1000;
        other[size_t(alphabet / 2 + 1)] = 10;
        t = buildProbTable(other.data(), alphabet);
    } else {
        t = buildProbTable(counts.data(), alphabet);
    }

    const std::vector<uint8_t> bytes = encodeInterleaved(sym, t);
    std::vector<uint8_t> back;
    QVERIFY2(decodeInterleaved(bytes, sym.size(), t, back), "stream not consumed exactly or final states wrong");
    QCOMPARE(back.size(), sym.size());
    for (size_t i = 0; i < sym.size(); ++i)
        if (back[i] != sym[i])
            QFAIL(qPrintable(QString("symbol %1: decoded %2, encoded %3").arg(i).arg(back[i]).arg(sym[i])));

    // The scalar reference, written from the definition, decodes its own stream and costs about
    // the same: interleaving adds at most three more state flushes (and a byte of slack per way).
    const std::vector<uint8_t> refBytes = ref::encode(sym, t.freq);
    std::vector<uint8_t> refBack;
    QVERIFY(ref::decode(refBytes, sym.size(), t.freq, refBack));
    QVERIFY(refBack == sym);
    QVERIFY2(std::abs(double(bytes.size()) - double(refBytes.size())) <= 3 * 4 + 4,
             qPrintable(QString("4-way %1 bytes vs scalar %2 bytes").arg(bytes.size()).arg(refBytes.size())));

    // Within 1% + 32 bytes of the ideal code length under this table, and not below it.
    const double bits = codeLengthBits(t, counts.data());
    const double bound = std::ceil(bits / 8.0) * 1.01 + 32.0;
    QVERIFY2(double(bytes.size()) <= bound,
             qPrintable(QString("%1 bytes, entropy bound %2 bytes").arg(bytes.size()).arg(bits / 8.0, 0, 'f', 1)));
    QVERIFY2(double(bytes.size()) * 8.0 >= bits,
             qPrintable(QString("%1 bytes beats the code length %2 bits: the size is wrong").arg(bytes.size()).arg(bits)));
    if (length == 0) QCOMPARE(int(bytes.size()), 4 * rans::kRansWays);
    if (dist == Uniform && length >= 10000) {
        // The table is close to uniform, so the cost is close to log2(alphabet) per symbol.
        const double perSymbol = double(bytes.size()) * 8.0 / length;
        QVERIFY2(perSymbol < std::log2(double(alphabet)) * 1.01 + 0.02, qPrintable(QString::number(perSymbol)));
    }
}

void TestRans::scalarReferenceMatchesLibrary_data()
{
    QTest::addColumn<int>("alphabet");
    QTest::addColumn<int>("length");
    QTest::addColumn<int>("dist");
    QTest::newRow("alphabet 3") << 3 << 5000 << int(Skewed);
    QTest::newRow("alphabet 31") << 31 << 20000 << int(Skewed);
    QTest::newRow("alphabet 255") << 255 << 20000 << int(Uniform);
    QTest::newRow("empty") << 15 << 0 << int(Uniform);
}

// One state through rans.h's encPut/encFlush gives byte-for-byte the reference stream, and
// rans.h's decoder reads the reference stream back: the arithmetic itself is pinned.
void TestRans::scalarReferenceMatchesLibrary()
{
    QFETCH(int, alphabet);
    QFETCH(int, length);
    QFETCH(int, dist);
    const std::vector<uint8_t> sym = drawSymbols(alphabet, size_t(length), Distribution(dist), 77);
    const std::vector<uint32_t> counts = countSymbols(sym, alphabet);
    const ProbTable t = buildProbTable(counts.data(), alphabet);
    const std::vector<uint8_t> lib = encodeSingleWithLibrary(sym, t);
    const std::vector<uint8_t> refBytes = ref::encode(sym, t.freq);
    QCOMPARE(lib.size(), refBytes.size());
    QVERIFY(lib == refBytes);

    auto c = std::make_unique<CodingTable>();
    toCodingTable(t, c.get(), true);
    rans::RansReader r{refBytes.data(), refBytes.data() + refBytes.size(), false};
    uint32_t x = rans::decInit(r);
    for (size_t i = 0; i < sym.size(); ++i) {
        const int s = c->symbolOf(rans::decSlot(x));
        if (s != sym[i]) QFAIL(qPrintable(QString("symbol %1: %2 vs %3").arg(i).arg(s).arg(sym[i])));
        rans::decAdvance(&x, r, t.start[s], t.freq[s]);
    }
    QVERIFY(!r.overrun);
    QVERIFY(r.p == r.end);
    QCOMPARE(x, rans::kRansL);
}

// What decodeHeadStream relies on to report "entropy-coded stream is corrupt": a truncated stream
// overruns, a longer one is not consumed, and a damaged one ends in the wrong states.
void TestRans::corruptStreamIsDetected()
{
    const int alphabet = 31;
    const std::vector<uint8_t> sym = drawSymbols(alphabet, 5000, Skewed, 99);
    const std::vector<uint32_t> counts = countSymbols(sym, alphabet);
    const ProbTable t = buildProbTable(counts.data(), alphabet);
    const std::vector<uint8_t> good = encodeInterleaved(sym, t);
    std::vector<uint8_t> back;

    std::vector<uint8_t> shorter(good.begin(), good.end() - 1);
    QVERIFY(!decodeInterleaved(shorter, sym.size(), t, back));
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    QVERIFY(!decodeInterleaved(longer, sym.size(), t, back));

    // Every single-byte change in the body is caught by the checks or changes the symbols.
    int undetected = 0;
    for (size_t i = 0; i < good.size(); i += 7) {
        std::vector<uint8_t> bad = good;
        bad[i] ^= 0x5a;
        if (decodeInterleaved(bad, sym.size(), t, back) && back == sym) ++undetected;
    }
    QCOMPARE(undetected, 0);
}

void TestRans::buildProbTableInvariants_data()
{
    QTest::addColumn<int>("alphabet");
    QTest::addColumn<int>("kind");  // 0 random, 1 one symbol only, 2 huge counts, 3 geometric, 4 bell
    QTest::newRow("alphabet 1") << 1 << 0;
    QTest::newRow("alphabet 2") << 2 << 0;
    QTest::newRow("alphabet 3 random") << 3 << 0;
    QTest::newRow("alphabet 31 random") << 31 << 0;
    QTest::newRow("alphabet 255 random") << 255 << 0;
    QTest::newRow("alphabet 31 one symbol") << 31 << 1;
    QTest::newRow("alphabet 255 one symbol") << 255 << 1;
    QTest::newRow("alphabet 255 huge counts") << 255 << 2;
    QTest::newRow("alphabet 63 geometric") << 63 << 3;
    QTest::newRow("alphabet 31 bell") << 31 << 4;
}

void TestRans::buildProbTableInvariants()
{
    QFETCH(int, alphabet);
    QFETCH(int, kind);
    std::mt19937_64 rng(uint64_t(alphabet * 131 + kind));
    std::vector<uint32_t> counts(size_t(alphabet), 0);
    for (int s = 0; s < alphabet; ++s) {
        switch (kind) {
        case 0: counts[s] = uint32_t(rng() % 1000); break;
        case 1: counts[s] = s == alphabet / 3 ? 123456u : 0u; break;
        case 2: counts[s] = 0xffffffffu - uint32_t(rng() % 1000); break;
        case 3: counts[s] = uint32_t(1u << std::max(0, 24 - std::abs(s - alphabet / 2))); break;
        case 4: counts[s] = uint32_t(1 + 40000.0 * std::exp(-0.5 * std::pow((s - 15) / 3.0, 2))); break;
        }
    }
    const ProbTable t = buildProbTable(counts.data(), alphabet);
    verifyTableInvariants(t, alphabet);
    const ProbTable again = buildProbTable(counts.data(), alphabet);
    QVERIFY2(tableDiff(t, again).isEmpty(), qPrintable(tableDiff(t, again)));
    // The in-band encoder and decoder build coding tables directly: same result as buildProbTable.
    const QString direct = codingDiff(t, alphabet, [&](CodingTable* c) { buildCodingTable(counts.data(), alphabet, c, true); });
    QVERIFY2(direct.isEmpty(), qPrintable(direct));

    // More counts never means less probability, and the most frequent symbol gets the most.
    for (int a = 0; a < alphabet; ++a)
        for (int b = 0; b < alphabet; ++b)
            if (counts[a] > counts[b] && t.freq[a] < t.freq[b])
                QFAIL(qPrintable(QString("counts %1 > %2 but freq %3 < %4").arg(counts[a]).arg(counts[b]).arg(t.freq[a]).arg(t.freq[b])));
    // Proportional: each frequency within the floor of 1 and the rounding of the normalisation.
    uint64_t total = 0;
    for (uint32_t c : counts) total += c;
    if (total > 0 && alphabet > 1) {
        for (int s = 0; s < alphabet; ++s) {
            const double ideal = double(counts[s]) / double(total) * rans::kProbScale;
            QVERIFY2(std::abs(double(t.freq[s]) - ideal) <= double(alphabet) + 1.0,
                     qPrintable(QString("freq[%1] = %2, ideal %3").arg(s).arg(t.freq[s]).arg(ideal)));
        }
    }
    if (kind == 1) QCOMPARE(int(t.freq[size_t(alphabet / 3)]), int(rans::kProbScale) - (alphabet - 1));
    if (kind == 4) {
        // A KV-like tail: symbols of a few slots, then tens. The first bucket's entry skips the
        // smallest (codingDiff checked which one it names); the lookup still finds every slot.
        auto c = std::make_unique<CodingTable>();
        toCodingTable(t, c.get(), true);
        QVERIFY2(t.freq[0] < 16 && (c->bucket[0] & 0xffu) > 0,
                 qPrintable(QString("freq[0] %1, bucket 0 names symbol %2").arg(t.freq[0]).arg(c->bucket[0] & 0xffu)));
    }
}

// No data at all: the zero symbol (centre of a symmetric quantizer) takes nearly all the mass.
void TestRans::buildProbTableZeroCounts()
{
    for (int alphabet : {1, 3, 31, 255}) {
        std::vector<uint32_t> counts(size_t(alphabet), 0);
        const ProbTable t = buildProbTable(counts.data(), alphabet);
        verifyTableInvariants(t, alphabet);
        QCOMPARE(int(t.freq[size_t(alphabet / 2)]), int(rans::kProbScale) - (alphabet - 1));
    }
}

void TestRans::serializeParseRoundTrip_data()
{
    QTest::addColumn<int>("alphabet");
    QTest::addColumn<int>("dist");
    QTest::newRow("alphabet 1") << 1 << int(Skewed);
    QTest::newRow("alphabet 3 skewed") << 3 << int(Skewed);
    QTest::newRow("alphabet 31 skewed") << 31 << int(Skewed);
    QTest::newRow("alphabet 31 one symbol") << 31 << int(OneSymbol);
    QTest::newRow("alphabet 255 uniform") << 255 << int(Uniform);
    QTest::newRow("alphabet 255 skewed") << 255 << int(Skewed);
}

void TestRans::serializeParseRoundTrip()
{
    QFETCH(int, alphabet);
    QFETCH(int, dist);
    const std::vector<uint8_t> sym = drawSymbols(alphabet, 3000, Distribution(dist), 5);
    const std::vector<uint32_t> counts = countSymbols(sym, alphabet);
    const ProbTable t = buildProbTable(counts.data(), alphabet);

    // Two tables back to back: each parse must stop exactly at the end of its own bytes.
    std::vector<uint8_t> bytes;
    serializeProbTable(t, bytes);
    const size_t first = bytes.size();
    serializeProbTable(t, bytes);
    QCOMPARE(bytes.size(), 2 * first);
    QVERIFY(first >= 2);

    const uint8_t* p = bytes.data();
    const uint8_t* end = bytes.data() + bytes.size();
    for (int k = 0; k < 2; ++k) {
        ProbTable back;
        std::string why;
        QVERIFY2(parseProbTable(&p, end, alphabet, &back, &why), why.c_str());
        QCOMPARE(size_t(p - bytes.data()), (k + 1) * first);
        QVERIFY2(tableDiff(t, back).isEmpty(), qPrintable(tableDiff(t, back)));
        verifyTableInvariants(back, alphabet);
    }
    // The coding-table forms write the same bytes and read the same table.
    auto c = std::make_unique<CodingTable>();
    toCodingTable(t, c.get(), false);
    std::vector<uint8_t> fromCoding;
    serializeCodingTable(*c, alphabet, fromCoding);
    QVERIFY(fromCoding == std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(first)));
    p = bytes.data();
    for (int k = 0; k < 2; ++k) {
        bool parsed = false;
        std::string why;
        const QString diff = codingDiff(t, alphabet, [&](CodingTable* out) { parsed = parseCodingTable(&p, end, alphabet, out, &why); });
        QVERIFY2(parsed, why.c_str());
        QCOMPARE(size_t(p - bytes.data()), (k + 1) * first);
        QVERIFY2(diff.isEmpty(), qPrintable(diff));
    }
    // The one-symbol table is small: only the run [lo, hi] of frequencies above 1 is stored.
    if (dist == OneSymbol) QVERIFY2(first <= 4, qPrintable(QString::number(first)));
}

void TestRans::parseRejects_data()
{
    QTest::addColumn<int>("alphabet");
    QTest::addColumn<QByteArray>("bytes");
    QTest::addColumn<QString>("reason");

    auto b = [](std::initializer_list<int> v) {
        QByteArray a;
        for (int x : v) a.append(char(uint8_t(x)));
        return a;
    };
    // alphabet 3, symbol 1 takes 4094: varint 4093 - 0 ... freq-1 = 4093 = 0xFD 0x1F
    QTest::newRow("empty") << 3 << QByteArray() << "truncated";
    QTest::newRow("only lo") << 3 << b({0}) << "truncated";
    QTest::newRow("varints missing") << 3 << b({0, 2, 0}) << "truncated";
    QTest::newRow("varint cut in the middle") << 3 << b({1, 1, 0xfd}) << "truncated";
    QTest::newRow("hi == alphabet") << 3 << b({0, 3, 0, 0, 0, 0}) << "names symbol 3";
    QTest::newRow("hi = 255 of 31") << 31 << b({0, 255}) << "names symbol 255";
    QTest::newRow("sum too small") << 3 << b({1, 1, 0xfc, 0x1f}) << "sums to 4095";
    QTest::newRow("sum too large") << 3 << b({0, 1, 0x01, 0xfd, 0x1f}) << "sums to 4097";
    QTest::newRow("all ones for alphabet 3") << 3 << b({1, 0}) << "sums to 3";
    QTest::newRow("overlong varint") << 3 << b({1, 1, 0x80, 0x80, 0x80, 0x01}) << "too long";
    QTest::newRow("frequency out of range") << 3 << b({1, 1, 0x80, 0x20}) << "out of range";
    QTest::newRow("alphabet 0") << 0 << b({1, 0}) << "alphabet size 0";
    QTest::newRow("alphabet 256") << 256 << b({0, 0, 0}) << "alphabet size 256";
}

void TestRans::parseRejects()
{
    QFETCH(int, alphabet);
    QFETCH(QByteArray, bytes);
    QFETCH(QString, reason);
    const std::vector<uint8_t> v(bytes.begin(), bytes.end());
    const uint8_t* p = v.data();
    ProbTable t;
    std::string why;
    QVERIFY(!parseProbTable(&p, v.data() + v.size(), alphabet, &t, &why));
    QVERIFY2(QString::fromStdString(why).contains(reason), why.c_str());
    QVERIFY2(p == v.data(), "a failed parse must not advance the cursor");

    // The decoder's direct path refuses the same bytes for the same reason.
    auto c = std::make_unique<CodingTable>();
    std::string whyCoding;
    QVERIFY(!parseCodingTable(&p, v.data() + v.size(), alphabet, c.get(), &whyCoding));
    QCOMPARE(QString::fromStdString(whyCoding), QString::fromStdString(why));
    QVERIFY(p == v.data());
}

// Any strict prefix of a valid table is reported as truncated, never parsed as something else.
void TestRans::parseRejectsEveryTruncation()
{
    for (int alphabet : {3, 31, 255}) {
        const std::vector<uint8_t> sym = drawSymbols(alphabet, 20000, Skewed, 3);
        const std::vector<uint32_t> counts = countSymbols(sym, alphabet);
        std::vector<uint8_t> bytes;
        serializeProbTable(buildProbTable(counts.data(), alphabet), bytes);
        for (size_t n = 0; n < bytes.size(); ++n) {
            const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
            const uint8_t* p = cut.data();
            ProbTable t;
            std::string why;
            if (parseProbTable(&p, cut.data() + cut.size(), alphabet, &t, &why))
                QFAIL(qPrintable(QString("alphabet %1: prefix of %2/%3 bytes parsed").arg(alphabet).arg(n).arg(bytes.size())));
            QVERIFY2(why.find("truncated") != std::string::npos, why.c_str());
            auto c = std::make_unique<CodingTable>();
            std::string whyCoding;
            QVERIFY(!parseCodingTable(&p, cut.data() + cut.size(), alphabet, c.get(), &whyCoding));
            QVERIFY2(whyCoding.find("truncated") != std::string::npos, whyCoding.c_str());
        }
    }
}

// The encoder divides states by frequencies with a multiply and a shift: exact for every state it
// can hold (below 2^31) and every frequency, including the extremes of each.
void TestRans::freqDividerIsExact()
{
    const rans::FreqDivider& div = rans::freqDivider();
    std::mt19937 rng(7);
    for (uint32_t f = 1; f <= rans::kProbScale; ++f) {
        const uint32_t edge[] = {0u, 1u, f - 1, f, f + 1, 0x7fffffffu, 0x7fffffffu - f, (0x7fffffffu / f) * f,
                                 (0x7fffffffu / f) * f - 1};
        for (uint32_t x : edge)
            if (div.div(x, f) != x / f) QFAIL(qPrintable(QString("%1 / %2").arg(x).arg(f)));
        for (int k = 0; k < 2000; ++k) {
            const uint32_t x = rng() & 0x7fffffffu;
            if (div.div(x, f) != x / f) QFAIL(qPrintable(QString("%1 / %2").arg(x).arg(f)));
        }
    }
}

KVSCOPE_TEST_MAIN(TestRans)
#include "tst_rans.moc"
