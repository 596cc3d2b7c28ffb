// Chunk codecs (core/codec/chunk_codec.h) on synthetic KV: every built-in codec round-trips within
// its named tolerance, CacheGen's decoder matches the scalar quantizer exactly, any mix of levels
// decodes, in-band and shared tables agree, and the sizes users compare are what they should be.
#include "testmain.h"

#include "codec/chunk_codec.h"
#include "codec/container.h"
#include "codec/quantize.h"
#include "common/error.h"
#include "common/half.h"
#include "kv/kv_compare.h"

#include <QTemporaryDir>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <tuple>
#include <vector>

using namespace kvscope;

Q_DECLARE_METATYPE(kvscope::CodecId)
Q_DECLARE_METATYPE(kvscope::DType)

namespace {

constexpr KvKind kKinds[2] = {KvKind::Key, KvKind::Value};

// Small enough to run in well under a second per codec; 290 tokens leave a short last chunk for
// chunk sizes 16 (2 tokens, shorter than a delta group), 100 (90) and 256 (34).
KvSet makeKv(DType dtype, uint64_t seed = 7, int tokens = 290)
{
    SyntheticSpec s;
    s.shape = KvShape{3, 2, 32, tokens};
    s.dtype = dtype;
    s.seed = seed;
    return makeSyntheticKv(s);
}

CodecParams makeParams(CodecId codec, const KvSet& kv, int chunkTokens)
{
    CodecParams p;
    p.codec = codec;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    p.profile = defaultProfile(kv.shape().numLayers);
    p.profile.chunkTokens = chunkTokens;
    p.profile.deltaGroup = std::min(p.profile.deltaGroup, chunkTokens);
    return p;
}

// Encodes and decodes every chunk at `level` in memory; *bytes gets the payload total.
KvSet codecRoundTrip(const CodecParams& p, const KvSet& kv, int level, const LevelTables* shared, size_t* bytes = nullptr)
{
    KvSet out(p.shape, p.dtype);
    size_t total = 0;
    for (int c = 0; c < p.numChunks(); ++c) {
        const std::vector<uint8_t> payload = encodeChunk(p, kv, c, level, shared);
        total += payload.size();
        decodeChunk(p, payload.data(), payload.size(), c, level, shared, out, "test chunk " + std::to_string(c));
    }
    if (bytes) *bytes = total;
    return out;
}

// First differing value, for failure messages.
QString firstDifference(const KvSet& a, const KvSet& b)
{
    const KvShape& s = a.shape();
    for (int l = 0; l < s.numLayers; ++l)
        for (KvKind k : kKinds)
            for (int h = 0; h < s.numKvHeads; ++h)
                for (int t = 0; t < s.numTokens; ++t)
                    for (int d = 0; d < s.headDim; ++d) {
                        const float x = a.at(k, l, h, t, d), y = b.at(k, l, h, t, d);
                        if (std::memcmp(&x, &y, 4) != 0)
                            return QString("%1 layer %2 (%3,%4,%5): %6 vs %7").arg(kindName(k)).arg(l).arg(h).arg(t).arg(d)
                                .arg(double(x), 0, 'g', 9).arg(double(y), 0, 'g', 9);
                    }
    return "none";
}

// Largest error rounding a value of magnitude |v| to the output dtype adds.
double outputRounding(DType t, double v)
{
    const double a = std::fabs(v);
    switch (t) {
    case DType::F16: return std::max(a * std::ldexp(1.0, -11), std::ldexp(1.0, -25));
    case DType::BF16: return a * std::ldexp(1.0, -8) + 1e-38;
    case DType::F32: return a * std::ldexp(1.0, -24);
    }
    return 0;
}

// One fp16 step at |v| (the spacing of fp16 values there).
double fp16Step(double v)
{
    const double a = std::max(std::fabs(v), std::ldexp(1.0, -14));
    return std::ldexp(1.0, int(std::floor(std::log2(a))) - 10);
}

// Checks |out - kv| <= bound(kind, layer, head, token, d) for every value; reports the worst.
template <typename Bound>
void verifyBound(const KvSet& kv, const KvSet& out, const char* what, Bound bound)
{
    const KvShape& s = kv.shape();
    for (int l = 0; l < s.numLayers; ++l)
        for (KvKind k : kKinds)
            for (int h = 0; h < s.numKvHeads; ++h)
                for (int t = 0; t < s.numTokens; ++t)
                    for (int d = 0; d < s.headDim; ++d) {
                        const double x = kv.at(k, l, h, t, d), y = out.at(k, l, h, t, d);
                        const double b = bound(k, l, h, t, d, y);
                        if (!(std::fabs(x - y) <= b))
                            QFAIL(qPrintable(QString("%1: %2 layer %3 (%4,%5,%6): source %7 decoded %8, error %9 > bound %10")
                                                 .arg(what).arg(kindName(k)).arg(l).arg(h).arg(t).arg(d)
                                                 .arg(x, 0, 'g', 9).arg(y, 0, 'g', 9).arg(std::fabs(x - y), 0, 'g', 5).arg(b, 0, 'g', 5)));
                    }
}

// absmax over every channel of (kind, layer, token): the int8 and CacheGen per-token range.
std::vector<double> tokenAbsMax(const KvSet& kv, KvKind k, int l)
{
    const KvShape& s = kv.shape();
    std::vector<double> m(size_t(s.numTokens), 0.0);
    for (int h = 0; h < s.numKvHeads; ++h)
        for (int t = 0; t < s.numTokens; ++t)
            for (int d = 0; d < s.headDim; ++d) m[size_t(t)] = std::max(m[size_t(t)], double(std::fabs(kv.at(k, l, h, t, d))));
    return m;
}


// What a CacheGen decoder must produce: the scalar quantizer's reconstruction of every block,
// rounded to the output dtype.
KvSet cachegenReference(const CodecParams& p, const KvSet& kv, int level)
{
    KvSet out(p.shape, p.dtype);
    const KvShape& s = p.shape;
    for (int c = 0; c < p.numChunks(); ++c) {
        const int t0 = p.chunkStart(c), n = p.chunkLength(c);
        for (int l = 0; l < s.numLayers; ++l)
            for (KvKind k : kKinds) {
                const quant::BlockSpec b = cachegenBlockSpec(p, k, l, level, n);
                std::vector<float> x(size_t(s.numKvHeads) * n * s.headDim);
                for (int h = 0; h < s.numKvHeads; ++h) kv.readRows(k, l, h, t0, n, x.data() + size_t(h) * n * s.headDim);
                std::vector<uint8_t> sym(x.size());
                std::vector<uint16_t> scales(size_t(b.numScales()));
                quant::quantizeBlock(b, x.data(), sym.data(), scales.data());
                std::vector<float> y(x.size());
                quant::dequantizeBlock(b, sym.data(), scales.data(), y.data());
                for (int h = 0; h < s.numKvHeads; ++h) out.writeRows(k, l, h, t0, n, y.data() + size_t(h) * n * s.headDim);
            }
    }
    return out;
}

// Per-token CacheGen bound from the data alone: without delta the scale is absmax_t / MAX; with
// delta it is at most (absmax_t + |reconstructed anchor|) / MAX, the anchor itself within half
// its own step of absmax_anchor. Scales round up by at most one fp16 step (2^-10 relative).
double cachegenBound(const CodecParams& p, int level, KvKind k, int l, int t, const std::vector<double>& absmax, double y)
{
    const int bins = p.binsFor(k, l, level), anchorBins = p.profile.anchorBinsFor(bins);
    const int local = t - p.chunkStart(t / p.profile.chunkTokens);
    const bool delta = p.profile.deltaEnabled();
    const bool anchor = delta && local % p.profile.deltaGroup == 0;
    const double up = 1.0 + std::ldexp(1.0, -10);
    const int maxL = quant::maxLevel(anchor ? anchorBins : bins);
    double range = absmax[size_t(t)];
    if (delta && !anchor) {
        const int a = t - local % p.profile.deltaGroup;
        range += absmax[size_t(a)] * (1.0 + up / quant::maxLevel(anchorBins));
    }
    return range / maxL * up * 0.5 * (1.0 + 1e-5) + outputRounding(p.dtype, y) + 1e-6;
}

}  // namespace

class TestCodec : public QObject {
    Q_OBJECT
private slots:
    void roundTrip_data();
    void roundTrip();
    void cachegenMatchesScalarReference_data();
    void cachegenMatchesScalarReference();
    void moreBinsLessError();
    void anyLevelMixDecodes();
    void inBandAndSharedTablesAgree();
    void tablesCalibratedElsewhere();
    void deltaOnAndOff();
    void int8SizeIsExact_data();
    void int8SizeIsExact();
    void baselineSizes();
    void cachegenBitsWellBelowInt8();
    void nonFiniteInputRefused();
    void damagedPayloadsThrow_data();
    void damagedPayloadsThrow();
    void batchDecodeMatchesChunkByChunk_data();
    void batchDecodeMatchesChunkByChunk();
    void codecNames();
};

void TestCodec::roundTrip_data()
{
    QTest::addColumn<CodecId>("codec");
    QTest::addColumn<int>("chunk");
    QTest::addColumn<DType>("dtype");
    for (CodecId c : {CodecId::CacheGen, CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4, CodecId::Zstd})
        for (int chunk : {16, 100, 256})
            QTest::addRow("%s chunk %d", codecName(c), chunk) << c << chunk << DType::F16;
    for (CodecId c : {CodecId::CacheGen, CodecId::Fp16, CodecId::Int8, CodecId::Kivi4, CodecId::Zstd}) {
        QTest::addRow("%s bf16 source", codecName(c)) << c << 100 << DType::BF16;
        QTest::addRow("%s f32 source", codecName(c)) << c << 100 << DType::F32;
    }
}

// Every codec, every chunk size: the decoded cache is within the codec's named tolerance of the
// source, value by value.
void TestCodec::roundTrip()
{
    QFETCH(CodecId, codec);
    QFETCH(int, chunk);
    QFETCH(DType, dtype);
    const KvSet kv = makeKv(dtype);
    const CodecParams p = makeParams(codec, kv, chunk);
    const int level = codec == CodecId::CacheGen ? p.profile.defaultLevel : 1;
    const KvSet out = codecRoundTrip(p, kv, level, nullptr);
    QCOMPARE(out.dtype(), dtype);
    const KvShape& s = kv.shape();

    switch (codec) {
    case CodecId::Fp16:
    case CodecId::Zstd:
        if (dtype == DType::F16) {
            QVERIFY2(sameBytes(kv, out), qPrintable(firstDifference(kv, out)));
        } else {
            // Through fp16 and back into the source dtype.
            verifyBound(kv, out, codecName(codec), [&](KvKind, int, int, int, int, double y) {
                return 0.5 * fp16Step(y) + outputRounding(dtype, y);
            });
        }
        break;
    case CodecId::Int8:
        for (int l = 0; l < s.numLayers; ++l)
            for (KvKind k : kKinds) {
                const std::vector<double> m = tokenAbsMax(kv, k, l);
                verifyBound(kv, out, "int8", [&](KvKind kk, int ll, int, int t, int, double y) {
                    if (kk != k || ll != l) return 1e30;
                    return m[size_t(t)] / 127.0 / 2.0 * (1.0 + std::ldexp(1.0, -10)) + outputRounding(dtype, y) + 1e-7;
                });
            }
        break;
    case CodecId::Kivi2:
    case CodecId::Kivi4: {
        // Groups of kKiviGroup: keys per channel along the chunk's tokens, values per token along
        // channels; the last kKiviResidual tokens of the context stay fp16.
        const int levels = codec == CodecId::Kivi2 ? 4 : 16;
        const int residualStart = std::max(0, s.numTokens - kKiviResidual);
        using Key = std::tuple<int, int, int, int, int>;  // kind, layer, a, b, c
        auto groupOf = [&](KvKind k, int l, int h, int t, int d) {
            const int ch = h * s.headDim + d;
            if (k == KvKind::Key) {
                const int c = t / chunk, t0 = c * chunk;
                return Key{0, l, c, ch, (t - t0) / kKiviGroup};
            }
            return Key{1, l, t, ch / kKiviGroup, 0};
        };
        std::map<Key, std::pair<double, double>> range;
        for (int l = 0; l < s.numLayers; ++l)
            for (KvKind k : kKinds)
                for (int h = 0; h < s.numKvHeads; ++h)
                    for (int t = 0; t < residualStart; ++t)
                        for (int d = 0; d < s.headDim; ++d) {
                            const double x = kv.at(k, l, h, t, d);
                            auto it = range.emplace(groupOf(k, l, h, t, d), std::make_pair(x, x)).first;
                            it->second.first = std::min(it->second.first, x);
                            it->second.second = std::max(it->second.second, x);
                        }
        verifyBound(kv, out, codecName(codec), [&](KvKind k, int l, int h, int t, int d, double y) {
            if (t >= residualStart)  // fp16 residual
                return dtype == DType::F16 ? 0.0 : 0.5 * fp16Step(y) + outputRounding(dtype, y);
            const auto [lo, hi] = range.at(groupOf(k, l, h, t, d));
            // min rounds down to fp16 (at most one step), the scale rounds up (2^-10 relative)
            const double step = (hi - lo + fp16Step(lo)) / (levels - 1) * (1.0 + std::ldexp(1.0, -10)) + std::ldexp(1.0, -24);
            return 0.5 * step * (1.0 + 1e-5) + outputRounding(dtype, y) + 1e-6;
        });
        break;
    }
    case CodecId::CacheGen:
        for (int l = 0; l < s.numLayers; ++l)
            for (KvKind k : kKinds) {
                const std::vector<double> m = tokenAbsMax(kv, k, l);
                verifyBound(kv, out, "cachegen", [&](KvKind kk, int ll, int, int t, int, double y) {
                    if (kk != k || ll != l) return 1e30;
                    return cachegenBound(p, level, k, l, t, m, y);
                });
            }
        break;
    }
}

void TestCodec::cachegenMatchesScalarReference_data()
{
    QTest::addColumn<int>("chunk");
    QTest::addColumn<int>("deltaGroup");
    QTest::addColumn<bool>("channelKeys");
    QTest::addColumn<int>("anchorBins");
    QTest::addColumn<bool>("shared");
    QTest::addColumn<DType>("dtype");
    QTest::newRow("default") << 256 << 10 << false << 0 << false << DType::F16;
    QTest::newRow("chunk 16") << 16 << 10 << false << 0 << false << DType::F16;
    QTest::newRow("chunk 100 delta 4") << 100 << 4 << false << 0 << false << DType::F16;
    QTest::newRow("delta off") << 100 << 0 << false << 0 << false << DType::F16;
    QTest::newRow("per-channel keys") << 100 << 10 << true << 0 << false << DType::F16;
    QTest::newRow("per-channel keys, delta off") << 100 << 0 << true << 0 << false << DType::F16;
    QTest::newRow("anchor bins 64") << 100 << 10 << false << 64 << false << DType::F16;
    QTest::newRow("shared tables") << 100 << 10 << false << 0 << true << DType::F16;
    QTest::newRow("shared, per-channel keys") << 16 << 10 << true << 0 << true << DType::F16;
    QTest::newRow("bf16 source") << 100 << 10 << false << 0 << false << DType::BF16;
    QTest::newRow("f32 source") << 100 << 10 << true << 0 << false << DType::F32;
}

// The entropy coder is lossless and the decoder's fused dequantization is the scalar reference:
// every level's output equals quantizeBlock + dequantizeBlock, bit for bit.
void TestCodec::cachegenMatchesScalarReference()
{
    QFETCH(int, chunk);
    QFETCH(int, deltaGroup);
    QFETCH(bool, channelKeys);
    QFETCH(int, anchorBins);
    QFETCH(bool, shared);
    QFETCH(DType, dtype);
    const KvSet kv = makeKv(dtype, 11);
    CodecParams p = makeParams(CodecId::CacheGen, kv, chunk);
    p.profile.deltaGroup = deltaGroup;
    p.profile.anchorBins = anchorBins;
    if (channelKeys) p.profile.keyQuantizer = Quantizer::PerChannel;
    if (shared) p.profile.tables = TableMode::Shared;
    for (int level = 1; level <= p.numLevels(); ++level) {
        LevelTables tables;
        if (shared) {
            LevelCounts counts;
            for (int c = 0; c < p.numChunks(); ++c) countChunkSymbols(p, kv, c, level, counts);
            tables = tablesFromCounts(p, level, counts);
        }
        const KvSet out = codecRoundTrip(p, kv, level, shared ? &tables : nullptr);
        const KvSet ref = cachegenReference(p, kv, level);
        QVERIFY2(sameBytes(out, ref), qPrintable(QString("level %1: %2").arg(level).arg(firstDifference(out, ref))));
    }
}

// Level 3 (32 bins everywhere) is closer to the source than level 1 (12-16 bins), in every layer.
void TestCodec::moreBinsLessError()
{
    const KvSet kv = makeKv(DType::F16, 3);
    const CodecParams p = makeParams(CodecId::CacheGen, kv, 256);
    const KvError e1 = compareKv(kv, codecRoundTrip(p, kv, 1, nullptr));
    const KvError e3 = compareKv(kv, codecRoundTrip(p, kv, 3, nullptr));
    QVERIFY2(e3.rms < e1.rms * 0.75, qPrintable(QString("rms level 3 %1, level 1 %2").arg(e3.rms).arg(e1.rms)));
    for (size_t l = 0; l < e1.layers.size(); ++l) {
        QVERIFY(e3.layers[l].key.rms < e1.layers[l].key.rms);
        QVERIFY(e3.layers[l].value.rms < e1.layers[l].value.rms);
        QVERIFY(e3.layers[l].key.snrDb > 20.0);
    }
}

// A streamer picks a level per chunk; any mix decodes to exactly what each chunk gives alone.
void TestCodec::anyLevelMixDecodes()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const KvSet kv = makeKv(DType::F16, 5, 250);  // 16 chunks of 16 tokens, the last of 10
    for (bool shared : {false, true}) {
        CodecParams p = makeParams(CodecId::CacheGen, kv, 16);
        if (shared) p.profile.tables = TableMode::Shared;
        const std::string path = dir.filePath(shared ? "shared.kvc" : "inband.kvc").toStdString();
        writeKvc(kv, p, path);
        const std::unique_ptr<KvcReader> r = KvcReader::openFile(path);
        const int chunks = r->params().numChunks(), levels = r->params().numLevels();
        QCOMPARE(chunks, 16);
        QCOMPARE(levels, 3);

        std::vector<KvSet> whole;  // whole[l - 1]: every chunk at level l
        for (int l = 1; l <= levels; ++l) {
            whole.push_back(r->decodeAll({l}));
            // The file decodes exactly like the in-memory chunk codec.
            LevelTables tables;
            if (shared) {
                LevelCounts counts;
                for (int c = 0; c < p.numChunks(); ++c) countChunkSymbols(p, kv, c, l, counts);
                tables = tablesFromCounts(p, l, counts);
            }
            const KvSet mem = codecRoundTrip(p, kv, l, shared ? &tables : nullptr);
            QVERIFY2(sameBytes(whole.back(), mem), qPrintable(firstDifference(whole.back(), mem)));
        }
        std::mt19937 rng(42);
        std::vector<std::vector<int>> mixes = {
            {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1},
            {3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
            {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3},
        };
        for (int i = 0; i < 5; ++i) {
            std::vector<int> m(static_cast<size_t>(chunks));
            for (int& v : m) v = int(rng() % 3) + 1;
            mixes.push_back(m);
        }
        for (const std::vector<int>& mix : mixes) {
            const KvSet got = r->decodeAll(mix);
            KvSet expect(kv.shape(), kv.dtype());
            const KvShape& s = kv.shape();
            for (int c = 0; c < chunks; ++c) {
                const int t0 = c * 16, n = std::min(16, s.numTokens - t0);
                std::vector<float> rows(size_t(n) * s.headDim);
                for (int l = 0; l < s.numLayers; ++l)
                    for (KvKind k : kKinds)
                        for (int h = 0; h < s.numKvHeads; ++h) {
                            whole[size_t(mix[size_t(c)] - 1)].readRows(k, l, h, t0, n, rows.data());
                            expect.writeRows(k, l, h, t0, n, rows.data());
                        }
            }
            QVERIFY2(sameBytes(got, expect), qPrintable(firstDifference(got, expect)));
        }
    }
}

// Shared tables change the bytes, not the values: both modes quantize identically.
void TestCodec::inBandAndSharedTablesAgree()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const KvSet kv = makeKv(DType::F16, 9);
    CodecParams inband = makeParams(CodecId::CacheGen, kv, 100);
    CodecParams shared = inband;
    shared.profile.tables = TableMode::Shared;
    const KvcWriteReport ri = writeKvc(kv, inband, dir.filePath("i.kvc").toStdString());
    const KvcWriteReport rs = writeKvc(kv, shared, dir.filePath("s.kvc").toStdString());
    const auto a = KvcReader::openFile(dir.filePath("i.kvc").toStdString());
    const auto b = KvcReader::openFile(dir.filePath("s.kvc").toStdString());
    for (int l = 1; l <= 3; ++l) {
        const KvSet da = a->decodeAll({l}), db = b->decodeAll({l});
        QVERIFY2(sameBytes(da, db), qPrintable(QString("level %1: %2").arg(l).arg(firstDifference(da, db))));
        // Shared: chunks carry no tables, the file carries them once per level.
        QVERIFY2(rs.levelBytes[size_t(l - 1)] < ri.levelBytes[size_t(l - 1)],
                 qPrintable(QString("level %1: shared %2 vs in-band %3").arg(l).arg(rs.levelBytes[size_t(l - 1)]).arg(ri.levelBytes[size_t(l - 1)])));
        QVERIFY(rs.levelTableBytes[size_t(l - 1)] > 0);
        QCOMPARE(ri.levelTableBytes[size_t(l - 1)], uint64_t(0));
        QCOMPARE(b->levelTableBytes(l), rs.levelTableBytes[size_t(l - 1)]);
        QCOMPARE(b->levelBytes(l), rs.levelBytes[size_t(l - 1)]);
        QCOMPARE(a->levelBytes(l), ri.levelBytes[size_t(l - 1)]);
    }
    QVERIFY(ri.fileBytes != rs.fileBytes);
    QCOMPARE(a->fileBytes(), ri.fileBytes);
}

// Tables calibrated on another context still code this one, symbol for symbol (every frequency
// is at least 1), only less compactly than its own tables.
void TestCodec::tablesCalibratedElsewhere()
{
    const KvSet kv = makeKv(DType::F16, 21);
    SyntheticSpec other;
    other.shape = kv.shape();
    other.seed = 999;
    other.outlierChannelsPerHead = 0;  // a different distribution altogether
    other.keyCorrelation = 0.2f;
    const KvSet calib = makeSyntheticKv(other);
    CodecParams p = makeParams(CodecId::CacheGen, kv, 100);
    p.profile.tables = TableMode::Shared;
    const int level = 2;
    LevelCounts ownCounts, otherCounts;
    for (int c = 0; c < p.numChunks(); ++c) {
        countChunkSymbols(p, kv, c, level, ownCounts);
        countChunkSymbols(p, calib, c, level, otherCounts);
    }
    const LevelTables own = tablesFromCounts(p, level, ownCounts);
    const LevelTables foreign = tablesFromCounts(p, level, otherCounts);

    // The tables survive serialisation exactly.
    std::vector<uint8_t> blob;
    serializeLevelTables(p, level, foreign, blob);
    const LevelTables parsed = parseLevelTables(p, level, blob.data(), blob.size(), "tables");
    std::vector<uint8_t> again;
    serializeLevelTables(p, level, parsed, again);
    QVERIFY(blob == again);

    size_t ownBytes = 0, foreignBytes = 0;
    const KvSet a = codecRoundTrip(p, kv, level, &own, &ownBytes);
    const KvSet b = codecRoundTrip(p, kv, level, &parsed, &foreignBytes);
    QVERIFY2(sameBytes(a, b), qPrintable(firstDifference(a, b)));
    QVERIFY2(foreignBytes > ownBytes, qPrintable(QString("%1 vs %2").arg(foreignBytes).arg(ownBytes)));

    // Truncated or padded table blobs are refused with the place named.
    for (size_t cut : {size_t(0), size_t(1), blob.size() / 2, blob.size() - 1}) {
        try {
            parseLevelTables(p, level, blob.data(), cut, "calib.json: tables");
            QFAIL(qPrintable(QString("accepted %1 of %2 bytes").arg(cut).arg(blob.size())));
        } catch (const Error& e) {
            QVERIFY2(QString(e.what()).startsWith("calib.json: tables: "), e.what());
        }
    }
    std::vector<uint8_t> padded = blob;
    padded.push_back(0);
    QVERIFY_THROWS_EXCEPTION(Error, parseLevelTables(p, level, padded.data(), padded.size(), "t"));
}

// Delta coding against anchors (paper §5.2): with the same bins, coding x - anchor instead of x
// shrinks each token's range, so the step and the error shrink (the bits go up: same bins, finer
// steps). Both settings decode to the scalar reference.
void TestCodec::deltaOnAndOff()
{
    SyntheticSpec spec;
    spec.shape = KvShape{3, 2, 32, 512};
    spec.keyCorrelation = 0.99f;
    spec.valueCorrelation = 0.95f;
    const KvSet kv = makeSyntheticKv(spec);
    CodecParams on = makeParams(CodecId::CacheGen, kv, 256);
    CodecParams off = on;
    off.profile.deltaGroup = 0;
    for (int level = 1; level <= 3; ++level) {
        size_t bytesOn = 0, bytesOff = 0;
        const KvSet a = codecRoundTrip(on, kv, level, nullptr, &bytesOn);
        const KvSet b = codecRoundTrip(off, kv, level, nullptr, &bytesOff);
        QVERIFY2(sameBytes(a, cachegenReference(on, kv, level)), "delta on");
        QVERIFY2(sameBytes(b, cachegenReference(off, kv, level)), "delta off");
        const KvError ea = compareKv(kv, a), eb = compareKv(kv, b);
        const double values = double(kv.shape().totalValues());
        qInfo("level %d: delta on %.3f bits/value rms %.4f, off %.3f bits/value rms %.4f", level,
              double(bytesOn) * 8 / values, ea.rms, double(bytesOff) * 8 / values, eb.rms);
        QVERIFY2(ea.rms < 0.7 * eb.rms, qPrintable(QString("level %1: rms with delta %2, without %3").arg(level).arg(ea.rms).arg(eb.rms)));
        for (size_t l = 0; l < ea.layers.size(); ++l) QVERIFY(ea.layers[l].key.rms < eb.layers[l].key.rms);
    }
}

void TestCodec::int8SizeIsExact_data()
{
    QTest::addColumn<int>("chunk");
    QTest::addColumn<int>("tokens");
    QTest::newRow("chunk 16") << 16 << 290;
    QTest::newRow("chunk 100") << 100 << 290;
    QTest::newRow("chunk 256") << 256 << 290;
    QTest::newRow("one token") << 16 << 1;
}

// The reference every ratio_vs_int8 uses is the real int8 payload, to the byte.
void TestCodec::int8SizeIsExact()
{
    QFETCH(int, chunk);
    QFETCH(int, tokens);
    const KvSet kv = makeKv(DType::F16, 1, tokens);
    const CodecParams p = makeParams(CodecId::Int8, kv, chunk);
    size_t bytes = 0;
    codecRoundTrip(p, kv, 1, nullptr, &bytes);
    QCOMPARE(bytes, int8Bytes(kv.shape()));
    // 8 bits per value plus one fp16 scale per (kind, layer, token).
    const double bpv = double(bytes) * 8.0 / double(kv.shape().totalValues());
    QCOMPARE(bpv, 8.0 + 16.0 / kv.shape().channels());
}

// fp16 is 2 bytes a value; KIVI packs 2 or 4 bits plus fp16 min/scale per group of 32 and keeps
// the last 128 tokens in fp16.
void TestCodec::baselineSizes()
{
    const KvSet kv = makeKv(DType::F16, 2);
    const KvShape& s = kv.shape();
    const size_t values = s.totalValues();
    size_t bytes = 0;
    codecRoundTrip(makeParams(CodecId::Fp16, kv, 100), kv, 1, nullptr, &bytes);
    QCOMPARE(bytes, 2 * values);
    for (CodecId c : {CodecId::Kivi2, CodecId::Kivi4}) {
        const int bits = c == CodecId::Kivi2 ? 2 : 4;
        const int chunk = 100;
        size_t expect = 0;
        const int residualStart = s.numTokens - kKiviResidual;
        for (int t0 = 0; t0 < s.numTokens; t0 += chunk) {
            const int n = std::min(chunk, s.numTokens - t0);
            const int nq = std::clamp(residualStart - t0, 0, n);
            const size_t keyGroups = nq ? size_t(s.channels()) * ((nq + kKiviGroup - 1) / kKiviGroup) : 0;
            const size_t valueGroups = size_t(nq) * ((s.channels() + kKiviGroup - 1) / kKiviGroup);
            const size_t packed = (size_t(s.channels()) * nq * bits + 7) / 8;
            const size_t residual = 2 * size_t(s.channels()) * (n - nq);
            expect += size_t(s.numLayers) * (4 * keyGroups + 4 * valueGroups + 2 * packed + 2 * residual);
        }
        codecRoundTrip(makeParams(c, kv, chunk), kv, 1, nullptr, &bytes);
        QCOMPARE(bytes, expect);
    }
    // zstd is lossless on fp16 bytes and not larger than them by more than its frame overhead.
    codecRoundTrip(makeParams(CodecId::Zstd, kv, 100), kv, 1, nullptr, &bytes);
    QVERIFY2(bytes < 2 * values + 64 * 3, qPrintable(QString::number(bytes)));
}

// CacheGen's point: far fewer bits than 8-bit quantization at its default level.
void TestCodec::cachegenBitsWellBelowInt8()
{
    SyntheticSpec spec;
    spec.shape = KvShape{4, 4, 64, 512};
    const KvSet kv = makeSyntheticKv(spec);
    const CodecParams p = makeParams(CodecId::CacheGen, kv, 256);
    size_t bytes = 0;
    codecRoundTrip(p, kv, p.profile.defaultLevel, nullptr, &bytes);
    const double values = double(kv.shape().totalValues());
    const double bpv = double(bytes) * 8.0 / values;
    const double int8Bpv = double(int8Bytes(kv.shape())) * 8.0 / values;
    QVERIFY(std::fabs(int8Bpv - (8.0 + 16.0 / 256.0)) < 1e-9);
    qInfo("cachegen level %d: %.3f bits/value, int8 %.3f (ratio %.2fx)", p.profile.defaultLevel, bpv, int8Bpv, int8Bpv / bpv);
    QVERIFY2(bpv < 0.5 * int8Bpv, qPrintable(QString("%1 bits per value vs int8 %2").arg(bpv).arg(int8Bpv)));
    size_t bytes1 = 0;
    codecRoundTrip(p, kv, 1, nullptr, &bytes1);
    QVERIFY2(bytes1 < bytes, "level 1 must be smaller than the default level");
}

// A NaN in the cache is an error the user sees, not a silently wrong chunk.
void TestCodec::nonFiniteInputRefused()
{
    for (CodecId c : {CodecId::CacheGen, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4}) {
        KvSet kv = makeKv(DType::F16, 4, 300);  // token 20 is outside KIVI's fp16 residual
        kv.set(KvKind::Value, 1, 1, 20, 5, std::numeric_limits<float>::quiet_NaN());
        const CodecParams p = makeParams(c, kv, 16);
        QVERIFY_THROWS_EXCEPTION(Error, encodeChunk(p, kv, 1, 1, nullptr));
        // Chunks without the NaN still encode.
        const std::vector<uint8_t> ok = encodeChunk(p, kv, 0, 1, nullptr);
        QVERIFY(!ok.empty());
    }
}

void TestCodec::damagedPayloadsThrow_data()
{
    QTest::addColumn<CodecId>("codec");
    QTest::addColumn<bool>("shared");
    for (CodecId c : {CodecId::CacheGen, CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4, CodecId::Zstd})
        QTest::addRow("%s", codecName(c)) << c << false;
    QTest::addRow("cachegen shared") << CodecId::CacheGen << true;
}

// decodeChunk validates sizes before it trusts them: a payload one byte short or long, or cut
// anywhere, is a kvscope::Error naming the place, never a read outside the buffer.
void TestCodec::damagedPayloadsThrow()
{
    QFETCH(CodecId, codec);
    QFETCH(bool, shared);
    const KvSet kv = makeKv(DType::F16, 6, 100);
    CodecParams p = makeParams(codec, kv, 64);
    LevelTables tables;
    if (shared) {
        p.profile.tables = TableMode::Shared;
        LevelCounts counts;
        for (int c = 0; c < p.numChunks(); ++c) countChunkSymbols(p, kv, c, 1, counts);
        tables = tablesFromCounts(p, 1, counts);
    }
    const LevelTables* t = shared ? &tables : nullptr;
    const std::vector<uint8_t> good = encodeChunk(p, kv, 1, 1, t);
    KvSet out(p.shape, p.dtype);
    decodeChunk(p, good.data(), good.size(), 1, 1, t, out, "x.kvc: chunk 1");

    std::vector<size_t> cuts = {0, 1, 4, good.size() / 3, good.size() / 2, good.size() - 1};
    for (size_t cut : cuts) {
        // A separate allocation of exactly `cut` bytes, so ASan sees any read past it.
        std::vector<uint8_t> b(good.begin(), good.begin() + long(cut));
        try {
            decodeChunk(p, b.data(), b.size(), 1, 1, t, out, "x.kvc: chunk 1");
            QFAIL(qPrintable(QString("decoded %1 of %2 bytes").arg(cut).arg(good.size())));
        } catch (const Error& e) {
            QVERIFY2(QString(e.what()).startsWith("x.kvc: chunk 1: "), e.what());
        }
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    QVERIFY_THROWS_EXCEPTION(Error, decodeChunk(p, longer.data(), longer.size(), 1, 1, t, out, "x"));
    // Chunk 1 holds the last 36 tokens: read as chunk 0 (64 tokens) its sizes cannot match.
    QVERIFY_THROWS_EXCEPTION(Error, decodeChunk(p, good.data(), good.size(), 0, 1, t, out, "x"));
}

void TestCodec::batchDecodeMatchesChunkByChunk_data()
{
    QTest::addColumn<bool>("shared");
    QTest::newRow("in-band") << false;
    QTest::newRow("shared") << true;
}

// decodeChunks (the whole-cache path, unit by unit across chunks) writes the same bytes as
// decodeChunk on each chunk in turn, at mixed levels, and with damaged payloads throws what
// chunk-by-chunk decoding meets first: the layout of a truncated chunk, a corrupt stream's unit.
void TestCodec::batchDecodeMatchesChunkByChunk()
{
    QFETCH(bool, shared);
    const KvSet kv = makeKv(DType::F16, 8, 200);  // 7 chunks of 32 tokens, the last of 8
    CodecParams p = makeParams(CodecId::CacheGen, kv, 32);
    std::vector<LevelTables> tables;
    if (shared) {
        p.profile.tables = TableMode::Shared;
        for (int l = 1; l <= p.numLevels(); ++l) {
            LevelCounts counts;
            for (int c = 0; c < p.numChunks(); ++c) countChunkSymbols(p, kv, c, l, counts);
            tables.push_back(tablesFromCounts(p, l, counts));
        }
    }
    const int chunks = p.numChunks();
    QCOMPARE(chunks, 7);
    const std::vector<int> levels = {1, 1, 3, 2, 2, 1, 3};
    std::vector<std::vector<uint8_t>> payloads;
    for (int c = 0; c < chunks; ++c)
        payloads.push_back(encodeChunk(p, kv, c, levels[size_t(c)], shared ? &tables[size_t(levels[size_t(c)] - 1)] : nullptr));
    auto batchOf = [&](const std::vector<std::vector<uint8_t>>& pl) {
        std::vector<ChunkPayload> b;
        for (int c = 0; c < chunks; ++c)
            b.push_back({c, levels[size_t(c)], pl[size_t(c)].data(), pl[size_t(c)].size(), "f: chunk " + std::to_string(c)});
        return b;
    };
    auto oneByOne = [&](const std::vector<std::vector<uint8_t>>& pl, KvSet& out) {
        for (int c = 0; c < chunks; ++c)
            decodeChunk(p, pl[size_t(c)].data(), pl[size_t(c)].size(), c, levels[size_t(c)],
                        shared ? &tables[size_t(levels[size_t(c)] - 1)] : nullptr, out, "f: chunk " + std::to_string(c));
    };
    KvSet a(p.shape, p.dtype), b(p.shape, p.dtype);
    decodeChunks(p, batchOf(payloads), shared ? &tables : nullptr, a);
    oneByOne(payloads, b);
    QVERIFY2(sameBytes(a, b), qPrintable(firstDifference(a, b)));

    auto message = [](auto f) -> QString {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return QString();
    };
    // Chunk 5 truncated (its layout fails), chunk 2's last stream damaged (a unit fails), chunk 4
    // damaged too: the first failure in chunk order is chunk 2's.
    std::vector<std::vector<uint8_t>> bad = payloads;
    bad[5].resize(bad[5].size() / 2);
    for (int c : {2, 4}) {
        std::vector<uint8_t>& pl = bad[size_t(c)];
        for (size_t i = pl.size() - 40; i < pl.size(); ++i) pl[i] = uint8_t(pl[i] ^ 0x5a);
    }
    KvSet c1(p.shape, p.dtype), c2(p.shape, p.dtype);
    const QString batchError = message([&] { decodeChunks(p, batchOf(bad), shared ? &tables : nullptr, c1); });
    const QString serialError = message([&] { oneByOne(bad, c2); });
    QVERIFY2(serialError.startsWith("f: chunk 2: "), qPrintable(serialError));
    QCOMPARE(batchError, serialError);
    // Only the truncated chunk left: its layout error, as chunk by chunk.
    bad[2] = payloads[2];
    bad[4] = payloads[4];
    const QString batchLayout = message([&] { decodeChunks(p, batchOf(bad), shared ? &tables : nullptr, c1); });
    const QString serialLayout = message([&] { oneByOne(bad, c2); });
    QVERIFY2(serialLayout.startsWith("f: chunk 5: "), qPrintable(serialLayout));
    QCOMPARE(batchLayout, serialLayout);
}

void TestCodec::codecNames()
{
    for (CodecId c : {CodecId::CacheGen, CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4, CodecId::Zstd}) {
        CodecId back = CodecId::Fp16;
        QVERIFY(parseCodecName(codecName(c), &back));
        QCOMPARE(int(back), int(c));
    }
    QCOMPARE(QString(codecName(CodecId::CacheGen)), QString("cachegen"));
    QCOMPARE(QString(codecName(CodecId::Kivi2)), QString("kivi2"));
    CodecId untouched = CodecId::Int8;
    QVERIFY(!parseCodecName("CacheGen", &untouched));
    QVERIFY(!parseCodecName("", &untouched));
    QCOMPARE(int(untouched), int(CodecId::Int8));
}

KVSCOPE_TEST_MAIN(TestCodec)
#include "tst_codec.moc"
