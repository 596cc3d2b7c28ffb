// The v2 entropy layout (FORMAT.md "Entropy coding", 32 states x 16-bit words) through the public
// chunk codec: a decoder written here from FORMAT.md alone must agree with decodeChunk, and every
// decoder path this CPU has (scalar reference, AVX2, AVX-512; simd_path.h) must give the same
// bytes as the scalar one, for every dtype, head_dim (SIMD widths and not), quantizer, delta
// setting, table mode and level; corrupt streams must be refused by every path alike.
#include "testmain.h"

#include "codec/chunk_codec.h"
#include "codec/simd_path.h"
#include "codec_cases.h"

#include <cstring>
#include <random>

using namespace kvscope;
using namespace kvscope_test;

namespace {

uint32_t u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
uint16_t u16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

// Decodes a cachegen chunk payload of v2 from the words of FORMAT.md, into float values in
// KvSet order (kind, layer, head, token, d) of this chunk. In-band tables only, one per channel or
// (table_scope 1) one per head.
std::vector<float> formatDecode(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level)
{
    const bool perHead = p.profile.tableScope == TableScope::Head;
    const int L = p.shape.numLayers, H = p.shape.numKvHeads, D = p.shape.headDim, C = perHead ? H : H * D;
    const int n = p.chunkLength(chunk), G = p.profile.deltaGroup, roles = G >= 2 ? 2 : 1;
    const size_t B = size_t(2) * L;
    size_t pos = 0;
    std::vector<uint32_t> tableSize(B), streamSize(B * H);
    for (size_t u = 0; u < B; ++u, pos += 4) tableSize[u] = u32(data + pos);
    for (size_t i = 0; i < B * H; ++i, pos += 4) streamSize[i] = u32(data + pos);
    std::vector<std::vector<ProbTable>> tables(B);
    for (size_t u = 0; u < B; ++u) {
        const int bins = p.binsFor(KvKind(u / L), int(u % L), level);
        const uint8_t* tp = data + pos;
        for (int role = 0; role < roles; ++role)
            for (int c = 0; c < C; ++c) {
                ProbTable t;
                std::string why;
                const int A = quant::alphabetSize(role ? p.profile.anchorBinsFor(bins) : bins);
                if (!parseProbTable(&tp, data + pos + tableSize[u], A, &t, &why)) throw Error(why);
                tables[u].push_back(t);
            }
        pos += tableSize[u];
    }
    std::vector<const uint8_t*> scales(B);
    std::vector<quant::BlockSpec> spec(B);
    for (size_t u = 0; u < B; ++u) {
        spec[u] = cachegenBlockSpec(p, KvKind(u / L), int(u % L), level, n);
        scales[u] = data + pos;
        pos += 2 * size_t(spec[u].numScales());
    }
    std::vector<float> out(B * H * n * D);
    for (size_t u = 0; u < B; ++u) {
        std::vector<uint8_t> sym(size_t(H) * n * D);
        std::vector<uint16_t> sc(size_t(spec[u].numScales()));
        for (size_t i = 0; i < sc.size(); ++i) sc[i] = u16(scales[u] + 2 * i);
        for (int h = 0; h < H; ++h) {
            const uint8_t* s = data + pos;
            const uint8_t* end = s + streamSize[u * H + h];
            pos += streamSize[u * H + h];
            uint32_t x[32];
            for (int j = 0; j < 32; ++j) x[j] = u32(s + 4 * j);
            s += 128;
            for (int t = 0; t < n; ++t)
                for (int d = 0; d < D; ++d) {
                    const int role = (G >= 2 && t % G == 0) ? 1 : 0;
                    const ProbTable& tab = tables[u][size_t(role) * C + (perHead ? h : h * D + d)];
                    uint32_t& st = x[(size_t(t) * D + d) % 32];
                    const uint32_t slot = st & 4095;
                    int sy = 0;
                    while (tab.start[size_t(sy) + 1] <= slot) ++sy;
                    st = tab.freq[size_t(sy)] * (st >> 12) + slot - tab.start[size_t(sy)];
                    if (st < (1u << 16)) {
                        if (end - s < 2) throw Error("overrun");
                        st = st << 16 | u16(s);
                        s += 2;
                    }
                    sym[(size_t(h) * n + t) * D + d] = uint8_t(sy);
                }
            for (uint32_t v : x)
                if (v != (1u << 16)) throw Error("final state");
            if (s != end) throw Error("trailing bytes");
        }
        quant::dequantizeBlock(spec[u], sym.data(), sc.data(), out.data() + u * H * n * D);
    }
    return out;
}

std::vector<SimdPath> supportedPaths()
{
    std::vector<SimdPath> v;
    for (SimdPath p : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512})
        if (simdPathSupported(p)) v.push_back(p);
    return v;
}

// Decodes one payload with path `sp`; returns false when it is refused.
bool decodeWith(SimdPath sp, const CodecParams& p, const std::vector<uint8_t>& pl, int chunk, int level,
                const LevelTables* shared, std::vector<uint8_t>* bytes)
{
    setSimdPath(sp);
    KvSet out(p.shape, p.dtype);
    try {
        decodeChunk(p, pl.data(), pl.size(), chunk, level, shared, out, "test");
    } catch (const Error&) {
        return false;
    }
    *bytes = flatten(out);
    return true;
}

}  // namespace

class TestEntropyV2 : public QObject {
    Q_OBJECT

private slots:
    void initTestCase() { qInfo("SIMD paths on this CPU: %zu (best %s)", supportedPaths().size(), simdPathName(bestSimdPath())); }
    void cleanupTestCase() { setSimdPath(bestSimdPath()); }

    void pathsAgree_data()
    {
        QTest::addColumn<int>("headDim");
        QTest::addColumn<int>("dtype");
        QTest::addColumn<int>("delta");
        QTest::addColumn<bool>("perChannel");
        QTest::addColumn<bool>("shared");
        QTest::addColumn<bool>("random");
        QTest::addColumn<bool>("perHead");
        QTest::newRow("d64 f16 delta10 per-token") << 64 << int(DType::F16) << 10 << false << false << false << false;
        QTest::newRow("d64 bf16 delta10 per-channel") << 64 << int(DType::BF16) << 10 << true << false << false << false;
        QTest::newRow("d128 f32 no delta") << 128 << int(DType::F32) << 0 << false << false << true << false;
        QTest::newRow("d16 f16 shared tables") << 16 << int(DType::F16) << 4 << true << true << false << false;
        QTest::newRow("d80 f16 (rows start at lane 16)") << 80 << int(DType::F16) << 10 << false << false << true << false;
        QTest::newRow("d24 bf16 (AVX2 only)") << 24 << int(DType::BF16) << 3 << true << false << true << false;
        QTest::newRow("d8 f32 (AVX2 only)") << 8 << int(DType::F32) << 2 << false << false << false << false;
        QTest::newRow("d5 f16 (scalar rows)") << 5 << int(DType::F16) << 10 << false << false << true << false;
        // One table per head: the AVX-512 rows look it up in registers.
        QTest::newRow("per-head d64 f16 delta10") << 64 << int(DType::F16) << 10 << false << false << false << true;
        QTest::newRow("per-head d64 bf16 per-channel random") << 64 << int(DType::BF16) << 10 << true << false << true << true;
        QTest::newRow("per-head d128 f32 no delta") << 128 << int(DType::F32) << 0 << false << false << true << true;
        QTest::newRow("per-head d16 f16 shared") << 16 << int(DType::F16) << 4 << true << true << false << true;
        QTest::newRow("per-head d80 f16 (lane 16)") << 80 << int(DType::F16) << 10 << false << false << true << true;
        QTest::newRow("per-head d32 f16 delta 3 random") << 32 << int(DType::F16) << 3 << false << false << true << true;
        QTest::newRow("per-head d8 f32 (AVX2 only)") << 8 << int(DType::F32) << 2 << false << false << false << true;
        QTest::newRow("per-head d5 f16 (scalar rows)") << 5 << int(DType::F16) << 10 << false << false << true << true;
    }

    // Long blocks: the AVX2 symbol counter keeps byte counters and must flush them before one
    // passes 255 (every 127 rows of 64 symbols per role), in both roles, for rows of 64, 32 and
    // leftover symbols. The tables, and so the bytes, must be the scalar encoder's.
    void encodersAgreeOnLongBlocks_data()
    {
        QTest::addColumn<int>("headDim");
        QTest::addColumn<int>("delta");
        QTest::newRow("d64, delta 2 (both roles flush)") << 64 << 2;
        QTest::newRow("d96 (a 64 and a 32 piece), delta 10") << 96 << 10;
        QTest::newRow("d40 (a 32 piece and 8 left), delta 3") << 40 << 3;
    }

    void encodersAgreeOnLongBlocks()
    {
        QFETCH(int, headDim);
        QFETCH(int, delta);
        Case c;
        c.scope = TableScope::Head;
        c.shape = KvShape{1, 2, headDim, 1100};
        c.chunkTokens = 1024;
        c.deltaGroup = delta;
        c.random = true;
        c.seed = uint64_t(headDim + delta);
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        for (int level = 1; level <= p.numLevels(); ++level)
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                setSimdPath(SimdPath::Scalar);
                const std::vector<uint8_t> ref = encodeChunk(p, kv, ch, level, nullptr);
                for (SimdPath sp : supportedPaths()) {
                    setSimdPath(sp);
                    QVERIFY2(encodeChunk(p, kv, ch, level, nullptr) == ref,
                             qPrintable(QString("%1 encoder differs at level %2 chunk %3").arg(simdPathName(sp)).arg(level).arg(ch)));
                }
            }
    }

    // Every level (the extreme one: 256-bin keys, 4-bin values), every chunk (the last one short).
    void pathsAgree()
    {
        QFETCH(int, headDim);
        QFETCH(int, dtype);
        QFETCH(int, delta);
        QFETCH(bool, perChannel);
        QFETCH(bool, shared);
        QFETCH(bool, random);
        QFETCH(bool, perHead);
        Case c;
        c.scope = perHead ? TableScope::Head : TableScope::Channel;
        c.shape = KvShape{2, 2, headDim, 100};
        c.dtype = DType(dtype);
        c.chunkTokens = 64;
        c.deltaGroup = delta;
        c.keyQ = perChannel ? Quantizer::PerChannel : Quantizer::PerToken;
        c.tables = shared ? TableMode::Shared : TableMode::InBand;
        c.random = random;
        c.seed = uint64_t(headDim * 31 + dtype);
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        QCOMPARE(int(p.entropy), int(EntropyLayout::Rans32x16));
        std::vector<LevelTables> tables;
        if (shared) tables = profileTables(p, "test");
        const auto paths = supportedPaths();
        int compared = 0;
        for (int level = 1; level <= p.numLevels(); ++level)
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                const LevelTables* t = shared ? &tables[size_t(level - 1)] : nullptr;
                setSimdPath(SimdPath::Scalar);
                const std::vector<uint8_t> pl = encodeChunk(p, kv, ch, level, t);
                for (SimdPath sp : paths) {  // the encoders too: the same bytes on every path
                    setSimdPath(sp);
                    QVERIFY2(encodeChunk(p, kv, ch, level, t) == pl, qPrintable(QString("%1 encoder differs at level %2 chunk %3")
                                                                                   .arg(simdPathName(sp)).arg(level).arg(ch)));
                }
                std::vector<uint8_t> ref;
                QVERIFY(decodeWith(SimdPath::Scalar, p, pl, ch, level, t, &ref));
                for (SimdPath sp : paths) {
                    std::vector<uint8_t> got;
                    QVERIFY2(decodeWith(sp, p, pl, ch, level, t, &got), simdPathName(sp));
                    QVERIFY2(got == ref, qPrintable(QString("%1 differs from scalar at level %2 chunk %3")
                                                        .arg(simdPathName(sp)).arg(level).arg(ch)));
                    ++compared;
                }
                if (!shared) {  // the FORMAT.md decoder, values rounded like KvSet::writeRows
                    const std::vector<float> f = formatDecode(p, pl.data(), pl.size(), ch, level);
                    KvSet fromFormat(p.shape, p.dtype);
                    const int n = p.chunkLength(ch), H = p.shape.numKvHeads, D = p.shape.headDim;
                    for (int u = 0; u < 2 * p.shape.numLayers; ++u)
                        for (int h = 0; h < H; ++h)
                            fromFormat.writeRows(KvKind(u / p.shape.numLayers), u % p.shape.numLayers, h, p.chunkStart(ch), n,
                                                 f.data() + (size_t(u) * H + h) * n * D);
                    QVERIFY2(flatten(fromFormat) == ref, qPrintable(QString("FORMAT.md decoder differs at level %1 chunk %2")
                                                                       .arg(level).arg(ch)));
                }
            }
        QVERIFY(compared >= p.numLevels() * p.numChunks());
    }

    // Flipped stream bytes: every path refuses exactly when the scalar reference refuses, and
    // decodes to the same bytes when it accepts (a flip that only touches a value still decodes).
    void corruptStreamsAgree()
    {
        Case c;
        c.shape = KvShape{1, 2, 64, 64};
        c.deltaGroup = 10;
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        const std::vector<uint8_t> pl = encodeChunk(p, kv, 0, 2, nullptr);
        std::mt19937 rng(5);
        int refused = 0;
        for (int trial = 0; trial < 300; ++trial) {
            std::vector<uint8_t> bad = pl;
            const size_t at = pl.size() / 2 + rng() % (pl.size() / 2);  // the streams are at the end
            bad[at] ^= uint8_t(1 + rng() % 255);
            if (trial % 3 == 0) bad.resize(bad.size() - 1 - rng() % 8);
            std::vector<uint8_t> ref;
            const bool refOk = decodeWith(SimdPath::Scalar, p, bad, 0, 2, nullptr, &ref);
            refused += !refOk;
            for (SimdPath sp : supportedPaths()) {
                std::vector<uint8_t> got;
                const bool ok = decodeWith(sp, p, bad, 0, 2, nullptr, &got);
                QCOMPARE(ok, refOk);
                if (ok) QVERIFY(got == ref);
            }
        }
        QVERIFY(refused > 250);
    }

    // v2 costs at most the wider flush per stream over v1 at the same bins: 128 bytes of states
    // instead of 16, and 16-bit words lose little against bytes.
    void sizeAgainstV1()
    {
        Case c;
        c.shape = KvShape{2, 2, 64, 256};
        c.chunkTokens = 256;
        const KvSet kv = makeKv(c);
        CodecParams p = makeParams(c, kv);
        const size_t v2 = encodeChunk(p, kv, 0, 2, nullptr).size();
        p.entropy = EntropyLayout::Rans4x8;
        const size_t v1 = encodeChunk(p, kv, 0, 2, nullptr).size();
        const size_t streams = size_t(2) * 2 * 2;
        qInfo("chunk of 256 tokens: v1 %zu bytes, v2 %zu bytes (%+.2f%%, %+.1f bytes per stream)", v1, v2,
              100.0 * (double(v2) / double(v1) - 1), (double(v2) - double(v1)) / double(streams));
        QVERIFY(v2 <= v1 + streams * 128);
        QVERIFY(v2 + streams * 16 >= v1);
    }

    void parseAndForce()
    {
        SimdPath sp;
        QVERIFY(parseSimdPath("scalar", &sp) && sp == SimdPath::Scalar);
        QVERIFY(parseSimdPath("avx512", &sp) && sp == SimdPath::Avx512);
        QVERIFY(parseSimdPath("auto", &sp) && sp == bestSimdPath());
        QVERIFY(!parseSimdPath("sse9", &sp));
        for (SimdPath p : {SimdPath::Avx2, SimdPath::Avx512})
            if (!simdPathSupported(p)) QVERIFY_THROWS_EXCEPTION(Error, setSimdPath(p));
        setSimdPath(SimdPath::Scalar);
        QCOMPARE(int(simdPath()), int(SimdPath::Scalar));
    }
};

KVSCOPE_TEST_MAIN(TestEntropyV2)
#include "tst_entropy_v2.moc"
