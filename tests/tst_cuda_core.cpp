// The GPU decoder's per-thread code (cuda/decode_core.h), run on the host in the kernels' own
// decomposition (cuda/decode_plan.h emulateDecodeChunk: one "thread" per block for the table
// scan, per table for the build, per (block, head) for the streams), against kvscope::decodeChunk:
// exact bytes on random and structured KV over every level, chunk size (short last chunks
// included), quantizer, delta setting, table mode, table scope (per channel or per KV head) and
// output dtype; corrupt payloads and tables
// must fail exactly when the CPU decoder fails, never crash. Needs no GPU and no nvcc: this is
// the evidence for the kernels' logic on machines without a device (tst_cuda checks the device).
#include "testmain.h"

#include "codec/chunk_codec.h"
#include "codec/container.h"
#include "codec/gpu_decode.h"
#include "codec/simd_path.h"
#include "codec/symbol_stream.h"
#include "codec/transform.h"
#include "common/half.h"
#include "decode_plan.h"
#include "kvio/kv_h5.h"
#include "codec_cases.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

using namespace kvscope;

namespace {

using namespace kvscope_test;

struct Emu {
    gpu::Codec codec;
    std::vector<std::vector<uint16_t>> shared;  // table store per level
};

// Builds the emulator's codec from params through the same C description the CLI uses.
bool makeEmu(const CodecParams& p, const std::vector<LevelTables>* tables, Emu* e, std::string* why)
{
    const auto g = gpuCodec(p, tables);
    if (!gpu::makeCodec(g->c, &e->codec, why)) return false;
    e->shared.clear();
    if (e->codec.tableMode == 1)
        for (int l = 1; l <= e->codec.levels; ++l) {
            e->shared.emplace_back();
            const auto& blob = e->codec.sharedBlobs[size_t(l - 1)];
            if (!gpu::buildSharedStore(e->codec, l, blob.data(), blob.size(), &e->shared.back(), why)) return false;
        }
    return true;
}

}  // namespace

class TestCudaCore : public QObject {
    Q_OBJECT

    // Encodes every chunk at every level and decodes chunk c at level (c + shift) % levels + 1 with
    // both decoders, for every shift: any mix of levels; whole-cache bytes must be equal.
    void checkParity(const Case& c)
    {
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        std::vector<LevelTables> tables;
        if (c.tables == TableMode::Shared) tables = profileTables(p, "test profile");
        const std::vector<LevelTables>* shared = c.tables == TableMode::Shared ? &tables : nullptr;
        Emu emu;
        std::string why;
        QVERIFY2(makeEmu(p, shared, &emu, &why), why.c_str());
        std::vector<std::vector<std::vector<uint8_t>>> payloads(size_t(p.numChunks()));
        for (int ch = 0; ch < p.numChunks(); ++ch)
            for (int l = 1; l <= p.numLevels(); ++l)
                payloads[size_t(ch)].push_back(encodeChunk(p, kv, ch, l, shared ? &tables[size_t(l - 1)] : nullptr));
        for (int shift = 0; shift < p.numLevels(); ++shift) {
            KvSet cpu(p.shape, p.dtype);
            std::vector<uint8_t> gpuOut(emu.codec.outputElems() * emu.codec.dtypeBytes(), 0xAB);
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                const int level = (ch + shift) % p.numLevels() + 1;
                const auto& pl = payloads[size_t(ch)][size_t(level - 1)];
                decodeChunk(p, pl.data(), pl.size(), ch, level, shared ? &tables[size_t(level - 1)] : nullptr, cpu, "cpu");
                QVERIFY2(gpu::emulateDecodeChunk(emu.codec, ch, level, pl.data(), pl.size(), emu.shared, gpuOut.data(), &why),
                         why.c_str());
            }
            const std::vector<uint8_t> ref = flatten(cpu);
            QCOMPARE(gpuOut.size(), ref.size());
            if (std::memcmp(gpuOut.data(), ref.data(), ref.size()) != 0) {
                size_t i = 0;
                while (gpuOut[i] == ref[i]) ++i;
                QFAIL(qPrintable(QString("shift %1: first differing byte %2 of %3").arg(shift).arg(i).arg(ref.size())));
            }
            ++m_parityChecks;
            m_valuesChecked += p.shape.totalValues();
        }
    }

    // Decodes `bad` with both decoders: either both refuse, or both accept with equal output.
    void checkSame(const CodecParams& p, const std::vector<LevelTables>* shared, const Emu& emu, int chunk, int level,
                   const std::vector<uint8_t>& bad, const QString& what)
    {
        KvSet cpu(p.shape, p.dtype);
        bool cpuOk = true;
        try {
            decodeChunk(p, bad.data(), bad.size(), chunk, level, shared ? &(*shared)[size_t(level - 1)] : nullptr, cpu, "cpu");
        } catch (const Error&) {
            cpuOk = false;
        }
        std::vector<uint8_t> gpuOut(emu.codec.outputElems() * emu.codec.dtypeBytes(), 0);
        std::string why;
        const bool gpuOk = gpu::emulateDecodeChunk(emu.codec, chunk, level, bad.data(), bad.size(), emu.shared, gpuOut.data(), &why);
        if (cpuOk != gpuOk)
            QFAIL(qPrintable(what + QString(": CPU %1, GPU code %2 (%3)")
                                        .arg(cpuOk ? "accepts" : "refuses", gpuOk ? "accepts" : "refuses", why.c_str())));
        if (!gpuOk) {
            QVERIFY2(!why.empty(), "an error without a reason");
            ++m_refused;
            return;
        }
        // only this chunk's rows were written by either decoder: compare the whole buffers after
        // zero-initialising both (cpu KvSet starts zeroed, gpuOut too)
        size_t diff = 0;
        if (!sameOutput(gpuOut, flatten(cpu), p.dtype, &diff))
            QFAIL(qPrintable(what + QString(": both accept, outputs differ at value %1").arg(diff)));
        ++m_acceptedSame;
    }

    // In-band tables: a symbol outside the alphabet in the second table of value layer 1 is
    // refused by both decoders, both naming that table: channel 1, or head 1 with per-head tables.
    void checkTableNamed(const CodecParams& p, const Emu& emu, int chunk, int level, const std::vector<uint8_t>& good)
    {
        gpu::ChunkPlan plan;
        std::string why;
        QVERIFY2(gpu::planChunk(emu.codec, chunk, level, good.data(), good.size(), &plan, &why), why.c_str());
        const int u = 2 * p.shape.numLayers - 1, n = emu.codec.tablesPerRole();
        QCOMPARE(n, p.profile.tableScope == TableScope::Head ? p.shape.numKvHeads : p.shape.channels());
        const gpu::BlockPlan& b = plan.blocks[size_t(u)];
        std::vector<uint32_t> off(size_t(emu.codec.roles()) * n);
        uint32_t end = 0;
        int32_t badIndex = 0;
        QCOMPARE(gpu::scanBlockTables(good.data(), b.tableBegin, b.tableEnd, n, emu.codec.roles(), b.alphabet, off.data(), &end,
                                      &badIndex),
                 int32_t(gpu::kOk));
        QCOMPARE(end, b.tableEnd);
        std::vector<uint8_t> bad = good;
        bad[off[1]] = 0;
        bad[off[1] + 1] = 255;  // hi: outside every alphabet but the 256-bin one
        QVERIFY(b.alphabet[0] <= 255);
        std::string cpuWhy;
        try {
            KvSet cpu(p.shape, p.dtype);
            decodeChunk(p, bad.data(), bad.size(), chunk, level, nullptr, cpu, "cpu");
        } catch (const Error& e) {
            cpuWhy = e.what();
        }
        std::vector<uint8_t> out(emu.codec.outputElems() * emu.codec.dtypeBytes());
        QVERIFY(!gpu::emulateDecodeChunk(emu.codec, chunk, level, bad.data(), bad.size(), emu.shared, out.data(), &why));
        const std::string table = p.profile.tableScope == TableScope::Head ? "head 1" : "channel 1";
        QVERIFY2(cpuWhy.find(table + ": ") != std::string::npos, cpuWhy.c_str());
        QVERIFY2(why == "value layer " + std::to_string(p.shape.numLayers - 1) + ": " + table +
                            ": probability table names a symbol outside the alphabet",
                 why.c_str());
    }

    // Encodes kv with p (prepared) at every level, decodes every chunk with the CPU decoder and
    // the emulated kernels, and compares the whole cache byte for byte. Also checks the entropy
    // stage alone: for streams without token classes, the emulated symbol decoder against
    // kvscope::decodeSymbolMatrix on the same stream and tables.
    // Returns (through *visited) the share of GEMM terms the unit tiles visit (tileRanges).
    void checkTransform(const CodecParams& p, const KvSet& kv, double* visited = nullptr)
    {
        Emu emu;
        std::string why;
        QVERIFY2(makeEmu(p, nullptr, &emu, &why), why.c_str());
        if (visited) {
            double seen = 0, all = 0;
            for (const gpu::TfLevel& lv : emu.codec.tf.levels)
                for (size_t b = 0; b < lv.K.size(); ++b) {
                    const size_t tiles = (lv.tileOffset.size() > b + 1 ? lv.tileOffset[b + 1] : lv.tileK.size()) / 2 - lv.tileOffset[b] / 2;
                    for (size_t t = 0; t < tiles; ++t) {
                        seen += lv.tileK[lv.tileOffset[b] + 2 * t + 1] - lv.tileK[lv.tileOffset[b] + 2 * t];
                        all += lv.K[b];
                    }
                }
            *visited = all > 0 ? seen / all : 1.0;
        }
        const TransformModel& m = *p.transform;
        for (int level = 1; level <= p.numLevels(); ++level) {
            KvSet cpu(p.shape, p.dtype);
            std::vector<uint8_t> out(emu.codec.outputElems() * emu.codec.dtypeBytes(), 0xAB);
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                const auto pl = encodeChunk(p, kv, ch, level, nullptr);
                decodeChunk(p, pl.data(), pl.size(), ch, level, nullptr, cpu, "cpu");
                QVERIFY2(gpu::emulateDecodeChunk(emu.codec, ch, level, pl.data(), pl.size(), emu.shared, out.data(), &why),
                         why.c_str());
                if (entropyUsesTables(m.settings.entropy) && !m.settings.tokenImportance) checkEntropyStage(p, emu, ch, level, pl);
            }
            const std::vector<uint8_t> ref = flatten(cpu);
            QCOMPARE(out.size(), ref.size());
            if (std::memcmp(out.data(), ref.data(), ref.size()) != 0) {
                size_t i = 0;
                while (out[i] == ref[i]) ++i;
                QFAIL(qPrintable(QString("level %1: first differing byte %2 of %3").arg(level).arg(i).arg(ref.size())));
            }
            ++m_transformDecodes;
            m_valuesChecked += p.shape.totalValues();
        }
    }

    void checkEntropyStage(const CodecParams& p, const Emu& emu, int ch, int level, const std::vector<uint8_t>& pl)
    {
        gpu::TfChunkPlan plan;
        std::string why;
        QVERIFY2(gpu::planTransform(emu.codec, ch, level, pl.data(), pl.size(), &plan, &why), why.c_str());
        const TransformModel& m = *p.transform;
        const gpu::TfLevel& lv = emu.codec.tf.levels[size_t(level - 1)];
        for (int b = 0; b < 2 * p.shape.numLayers; ++b) {
            const gpu::TfBlockPlan& bp = plan.blocks[size_t(b)];
            const TransformLevelBlock& lb = m.levelBlock(level, KvKind(b / p.shape.numLayers), b % p.shape.numLayers);
            std::vector<CodingTable> tables(lb.freq.size());
            for (size_t k = 0; k < lb.freq.size(); ++k) {
                ProbTable t;
                t.alphabet = int(lb.freq[k].size());
                t.freq = lb.freq[k];
                toCodingTable(t, &tables[k], true);
            }
            QCOMPARE(int(tables.size()), bp.K);
            const int R = plan.geom.R;
            std::vector<uint8_t> sym(size_t(R) * bp.K);
            const bool w32 = m.settings.entropy == TransformEntropy::Rans32;
            (w32 ? decodeSymbolMatrixW32 : decodeSymbolMatrix)(pl.data() + bp.strOffset, bp.strSize, R, bp.K, tables.data(),
                                                              sym.data(), "cpu");
            std::vector<float> z(sym.size(), -1.0f);
            QCOMPARE((w32 ? gpu::tfDecodeMatrixW32 : gpu::tfDecodeMatrix)(pl.data() + bp.strOffset, bp.strSize, R, bp.K,
                                                                          lv.comps.data() + bp.comps, lv.tables.data(), 0,
                                                                          nullptr, R, z.data()),
                     int32_t(gpu::kOk));
            for (size_t i = 0; i < sym.size(); ++i)
                if (z[i] != float(sym[i])) QFAIL(qPrintable(QString("block %1: symbol %2 differs").arg(b).arg(i)));
            m_entropySymbols += sym.size();
        }
    }

    int m_transformDecodes = 0;
    size_t m_entropySymbols = 0;
    int m_parityChecks = 0, m_refused = 0, m_acceptedSame = 0;
    size_t m_valuesChecked = 0;

private slots:
    // The CPU decoder's reference is its scalar path: the kernels round each term as it does
    // (__fmul_rn, __fadd_rn) and give its bytes; the CPU's fused and AMX paths are only within
    // FORMAT.md's tolerance of them (tst_transform checks that).
    void initTestCase() { setSimdPath(SimdPath::Scalar); }
    void parity_data()
    {
        QTest::addColumn<int>("index");
        const auto cases = parityCases();
        for (size_t i = 0; i < cases.size(); ++i) QTest::newRow(cases[i].first) << int(i);
    }

    void parity()
    {
        QFETCH(int, index);
        checkParity(parityCases()[size_t(index)].second);
    }

    // The committed golden containers decode to their committed bytes through the emulated kernels.
    void goldenFiles_data()
    {
        QTest::addColumn<QString>("name");
        QTest::addColumn<QList<int>>("levels");
        QTest::newRow("cachegen-inband") << "cachegen-inband" << QList<int>{1, 2, 3};
        QTest::newRow("cachegen-shared") << "cachegen-shared" << QList<int>{3, 1, 2};
        QTest::newRow("int8") << "int8" << QList<int>{1};
        QTest::newRow("cachegen-d16") << "cachegen-d16" << QList<int>{2, 3, 1};
        QTest::newRow("v1-cachegen-inband (format 1.0)") << "v1-cachegen-inband" << QList<int>{1, 2, 3};
        QTest::newRow("v1-cachegen-shared (format 1.0)") << "v1-cachegen-shared" << QList<int>{3, 1, 2};
        QTest::newRow("cachegen-head-inband (format 2.2)") << "cachegen-head-inband" << QList<int>{1, 2, 3};
        QTest::newRow("cachegen-head-shared (format 2.2)") << "cachegen-head-shared" << QList<int>{3, 1, 2};
        QTest::newRow("cachegen-head-d16 (format 2.2)") << "cachegen-head-d16" << QList<int>{2, 3, 1};
    }

    void goldenFiles()
    {
        QFETCH(QString, name);
        QFETCH(QList<int>, levels);
        const std::string dir = std::string(KVSCOPE_TEST_DATA) + "/golden/";
        const auto reader = KvcReader::openFile(dir + name.toStdString() + ".kvc");
        const CodecParams& p = reader->params();
        Emu emu;
        std::string why;
        const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
        QVERIFY2(makeEmu(p, shared ? &reader->sharedTables() : nullptr, &emu, &why), why.c_str());
        std::vector<uint8_t> out(emu.codec.outputElems() * 2);
        for (int ch = 0; ch < p.numChunks(); ++ch) {
            const int level = levels[ch % levels.size()];
            const auto pl = reader->readChunk(ch, level);
            QVERIFY2(gpu::emulateDecodeChunk(emu.codec, ch, level, pl.data(), pl.size(), emu.shared, out.data(), &why), why.c_str());
        }
        // golden layout: per layer, keys then values; ours: all keys, then all values
        std::ifstream f(dir + name.toStdString() + ".decoded.f16.bin", std::ios::binary);
        std::vector<uint8_t> golden((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        QCOMPARE(golden.size(), out.size());
        const size_t tensor = out.size() / (2 * size_t(p.shape.numLayers));
        for (int l = 0; l < p.shape.numLayers; ++l)
            for (int k = 0; k < 2; ++k)
                QVERIFY(std::memcmp(out.data() + (size_t(k) * p.shape.numLayers + l) * tensor,
                                    golden.data() + (2 * size_t(l) + k) * tensor, tensor) == 0);
    }

    // fp16 and int8 baselines through the same path; kivi and zstd are refused with a reason.
    void baselines()
    {
        Case c;
        c.shape = {2, 2, 32, 150};
        const KvSet kv = makeKv(c);
        for (CodecId id : {CodecId::Fp16, CodecId::Int8}) {
            CodecParams p;
            p.codec = id;
            p.shape = c.shape;
            p.profile = defaultProfile(2);
            p.profile.chunkTokens = 64;
            Emu emu;
            std::string why;
            QVERIFY2(makeEmu(p, nullptr, &emu, &why), why.c_str());
            KvSet cpu(p.shape, p.dtype);
            std::vector<uint8_t> out(emu.codec.outputElems() * 2);
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                const auto pl = encodeChunk(p, kv, ch, 1, nullptr);
                decodeChunk(p, pl.data(), pl.size(), ch, 1, nullptr, cpu, "cpu");
                QVERIFY2(gpu::emulateDecodeChunk(emu.codec, ch, 1, pl.data(), pl.size(), emu.shared, out.data(), &why), why.c_str());
                std::vector<uint8_t> cut(pl.begin(), pl.end() - 1);
                QVERIFY(!gpu::emulateDecodeChunk(emu.codec, ch, 1, cut.data(), cut.size(), emu.shared, out.data(), &why));
                QVERIFY2(why.find("layout needs") != std::string::npos, why.c_str());
            }
            QVERIFY(out == flatten(cpu));
        }
        for (CodecId id : {CodecId::Kivi2, CodecId::Kivi4, CodecId::Zstd}) {
            CodecParams p;
            p.codec = id;
            p.shape = c.shape;
            p.profile = defaultProfile(2);
            Emu emu;
            std::string why;
            QVERIFY(!makeEmu(p, nullptr, &emu, &why));
            QVERIFY2(why.find("has no GPU decoder") != std::string::npos, why.c_str());
        }
    }

    // gpuCodec passes the table scope on; the decoder refuses an unknown scope, and per-head tables
    // with format 1.x streams (the CPU encoder refuses to write those, and the container reader
    // accepts per-head tables only in format 2.2).
    void tableScopeParameter()
    {
        Case c;
        c.shape = {2, 2, 16, 64};
        c.scope = TableScope::Head;
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        const auto g = gpuCodec(p, nullptr);
        QCOMPARE(g->c.table_scope, 1);
        gpu::Codec codec;
        std::string why;
        QVERIFY2(gpu::makeCodec(g->c, &codec, &why), why.c_str());
        QCOMPARE(codec.tablesPerRole(), 2);
        QCOMPARE(gpu::chunkGeom(codec, 0).perHead, 1);
        kvscope_cuda_codec bad = g->c;
        bad.table_scope = 2;
        QVERIFY(!gpu::makeCodec(bad, &codec, &why));
        QCOMPARE(why, std::string("decoder parameters: table_scope 2 unknown"));
        bad = g->c;
        bad.entropy_layout = 1;
        QVERIFY(!gpu::makeCodec(bad, &codec, &why));
        QVERIFY2(why.find("need format 2.x streams") != std::string::npos, why.c_str());
        CodecParams q = p;
        q.profile.tableScope = TableScope::Channel;
        QCOMPARE(gpuCodec(q, nullptr)->c.table_scope, 0);
        QVERIFY2(gpu::makeCodec(gpuCodec(q, nullptr)->c, &codec, &why), why.c_str());
        QCOMPARE(codec.tablesPerRole(), 32);
        QCOMPARE(gpu::chunkGeom(codec, 0).perHead, 0);
    }

    void corruptPayloads_data()
    {
        QTest::addColumn<int>("mode");
        QTest::newRow("in-band tables, per token, delta") << 0;
        QTest::newRow("shared tables, per-channel keys, delta") << 1;
        QTest::newRow("in-band tables, per channel, no delta") << 2;
        QTest::newRow("per-head tables, in-band, per token, delta") << 3;
        QTest::newRow("per-head tables, shared, per-channel keys, delta") << 4;
        QTest::newRow("per-head tables, in-band, per channel, no delta") << 5;
    }

    // Truncations, single flipped bytes all over the payload (size lists, tables, scales,
    // streams) and targeted table damage: the emulated kernels refuse exactly when the CPU
    // decoder does, and agree on the output when both accept. Run under ASan (asan preset).
    void corruptPayloads()
    {
        QFETCH(int, mode);
        Case c;
        c.shape = {2, 2, 16, 100};
        c.chunkTokens = 64;
        if (mode >= 3) c.scope = TableScope::Head;
        if (mode % 3 == 1) c.keyQ = Quantizer::PerChannel, c.tables = TableMode::Shared;
        if (mode % 3 == 2) c.keyQ = c.valueQ = Quantizer::PerChannel, c.deltaGroup = 0;
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        std::vector<LevelTables> tables;
        if (c.tables == TableMode::Shared) tables = profileTables(p, "test profile");
        const std::vector<LevelTables>* shared = c.tables == TableMode::Shared ? &tables : nullptr;
        Emu emu;
        std::string why;
        QVERIFY2(makeEmu(p, shared, &emu, &why), why.c_str());
        const int chunk = 1, level = 2;  // the short last chunk (36 tokens)
        const std::vector<uint8_t> good = encodeChunk(p, kv, chunk, level, shared ? &tables[size_t(level - 1)] : nullptr);
        m_refused = m_acceptedSame = 0;
        checkSame(p, shared, emu, chunk, level, good, "intact");
        QCOMPARE(m_acceptedSame, 1);
        for (size_t cut : {size_t(0), size_t(1), size_t(4), size_t(17), good.size() / 3, good.size() / 2, good.size() - 1}) {
            std::vector<uint8_t> bad(good.begin(), good.begin() + std::ptrdiff_t(cut));
            checkSame(p, shared, emu, chunk, level, bad, QString("truncated to %1").arg(cut));
        }
        std::vector<uint8_t> longer = good;
        longer.push_back(0);
        checkSame(p, shared, emu, chunk, level, longer, "one byte too many");
        std::mt19937 rng(7);
        for (int i = 0; i < 600; ++i) {
            std::vector<uint8_t> bad = good;
            const size_t at = i < 100 ? size_t(i) % good.size() : rng() % good.size();  // the head densely
            bad[at] ^= uint8_t(1u << (rng() % 8)) | (i % 3 == 0 ? 0x80 : 0);
            checkSame(p, shared, emu, chunk, level, bad, QString("byte %1 flipped").arg(at));
        }
        for (int i = 0; i < 100; ++i) {  // random garbage of the right size
            std::vector<uint8_t> bad = good;
            for (size_t k = 0; k < 8; ++k) bad[rng() % bad.size()] = uint8_t(rng());
            checkSame(p, shared, emu, chunk, level, bad, QString("garbage %1").arg(i));
        }
        if (!shared) checkTableNamed(p, emu, chunk, level, good);
        qInfo("mode %d: %d corrupt payloads refused by both, %d accepted by both with equal output", mode, m_refused,
              m_acceptedSame);
        QVERIFY(m_refused > 100);
    }

    // Damaged shared tables: the GPU decoder's table build refuses exactly the blobs the CPU
    // parser refuses (one table per channel, and per KV head).
    void corruptSharedTables_data()
    {
        QTest::addColumn<int>("scope");
        QTest::newRow("per-channel tables") << int(TableScope::Channel);
        QTest::newRow("per-head tables") << int(TableScope::Head);
    }

    void corruptSharedTables()
    {
        QFETCH(int, scope);
        Case c;
        c.shape = {2, 2, 16, 64};
        c.tables = TableMode::Shared;
        c.scope = TableScope(scope);
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        const std::vector<uint8_t> good = p.profile.levelTables[0];
        std::mt19937 rng(3);
        int refused = 0;
        for (int i = 0; i < 400; ++i) {
            std::vector<uint8_t> bad = good;
            if (i == 0) bad.pop_back();
            else if (i == 1) bad.push_back(0);
            else if (i == 2) bad[1] = 255;  // hi outside the alphabet
            else bad[rng() % bad.size()] ^= uint8_t(1u << (rng() % 8));
            bool cpuOk = true;
            try {
                parseLevelTables(p, 1, bad.data(), bad.size(), "blob");
            } catch (const Error&) {
                cpuOk = false;
            }
            CodecParams q = p;
            q.profile.tables = TableMode::InBand;  // gpuCodec serialises from LevelTables: feed the blob directly
            gpu::Codec codec;
            std::string why;
            const auto g = gpuCodec(q, nullptr);
            QVERIFY2(gpu::makeCodec(g->c, &codec, &why), why.c_str());
            codec.tableMode = 1;
            std::vector<uint16_t> store;
            const bool gpuOk = gpu::buildSharedStore(codec, 1, bad.data(), bad.size(), &store, &why);
            QVERIFY2(cpuOk == gpuOk, qPrintable(QString("case %1: CPU %2, GPU %3 (%4)").arg(i).arg(cpuOk).arg(gpuOk).arg(why.c_str())));
            if (!gpuOk) {
                QVERIFY(why.rfind("shared tables of level 1: ", 0) == 0);
                ++refused;
            }
        }
        QVERIFY(refused > 50);
    }

    // Optional: a real captured cache (KVSCOPE_REAL_KV=path.h5), first 600 tokens, every level:
    // the default profile and per-channel keys with shared tables, each with one table per KV
    // head and one per channel.
    void realKv()
    {
        const QByteArray path = qgetenv("KVSCOPE_REAL_KV");
        if (path.isEmpty()) QSKIP("set KVSCOPE_REAL_KV to a captured KV file (HDF5) to check parity on real KV");
        const KvSet full = readKvH5(path.toStdString());
        KvShape s = full.shape();
        s.numTokens = std::min(s.numTokens, 600);
        KvSet kv(s, full.dtype());
        std::vector<float> row(size_t(s.headDim) * s.numTokens);
        for (int k = 0; k < 2; ++k)
            for (int l = 0; l < s.numLayers; ++l)
                for (int h = 0; h < s.numKvHeads; ++h) {
                    full.readRows(KvKind(k), l, h, 0, s.numTokens, row.data());
                    kv.writeRows(KvKind(k), l, h, 0, s.numTokens, row.data());
                }
        for (int run = 0; run < 4; ++run) {
            const int mode = run % 2;
            CodecParams p;
            p.shape = s;
            p.dtype = kv.dtype();
            p.profile = defaultProfile(s.numLayers);
            p.profile.tableScope = run < 2 ? TableScope::Head : TableScope::Channel;
            if (mode == 1) p.profile.keyQuantizer = Quantizer::PerChannel, calibrateProfile(p, {&kv});
            std::vector<LevelTables> tables;
            if (mode == 1) tables = profileTables(p, "real");
            Emu emu;
            std::string why;
            QVERIFY2(makeEmu(p, mode == 1 ? &tables : nullptr, &emu, &why), why.c_str());
            for (int level = 1; level <= p.numLevels(); ++level) {
                KvSet cpu(s, kv.dtype());
                std::vector<uint8_t> out(emu.codec.outputElems() * emu.codec.dtypeBytes());
                for (int ch = 0; ch < p.numChunks(); ++ch) {
                    const auto pl = encodeChunk(p, kv, ch, level, mode == 1 ? &tables[size_t(level - 1)] : nullptr);
                    decodeChunk(p, pl.data(), pl.size(), ch, level, mode == 1 ? &tables[size_t(level - 1)] : nullptr, cpu, "cpu");
                    QVERIFY2(gpu::emulateDecodeChunk(emu.codec, ch, level, pl.data(), pl.size(), emu.shared, out.data(), &why),
                             why.c_str());
                }
                QVERIFY2(out == flatten(cpu), qPrintable(QString("run %1, level %2").arg(run).arg(level)));
                m_valuesChecked += s.totalValues();
            }
            qInfo("real KV, per-%s tables, %s: every level bit-exact", tableScopeName(p.profile.tableScope),
                  mode == 1 ? "per-channel keys, shared tables" : "default profile");
        }
    }

    // The transform codec (codec 6) over its stage switches: calibrated PCA across heads with
    // RoPE undone and attention weighting (the default), token importance, fixed-width symbols,
    // no RoPE undo, per-head bases, MSE weighting with uniform allocation, recent tokens, the
    // uncalibrated Hadamard fallback, bf16 and fp16 output, short last chunks, RD-optimised rounding.
    void transformParity_data()
    {
        QTest::addColumn<QString>("variant");
        for (const char* v : {"default", "importance", "importance-fixed", "fixed", "rope-off", "per-head", "mse-uniform",
                              "recent", "hadamard-uncalibrated", "f16-output", "bf16-output", "no-sinks", "rdo", "rans32",
                              "rans32-importance", "rans32-per-head", "rans32-uncalibrated"})
            QTest::newRow(v) << QString(v);
    }

    void transformParity()
    {
        QFETCH(QString, variant);
        const std::string v = variant.toStdString();
        const DType dt = v == "f16-output" ? DType::F16 : v == "bf16-output" ? DType::BF16 : DType::F32;
        // per-head bases on 4 heads x 32: two unit tiles, each of two heads, can skip the others
        const bool blocky = v == "per-head" || v == "hadamard-uncalibrated" || v == "rans32-per-head";
        const KvShape shape = blocky ? KvShape{2, 4, 32, 200} : KvShape{3, 2, 16, 300};
        const KvSet calib = transformCache(shape, 21, dt), kv = transformCache(shape, 22, dt);
        TransformSettings s;
        if (v == "importance" || v == "importance-fixed" || v == "rans32-importance") s.tokenImportance = true;
        if (v == "fixed" || v == "importance-fixed") s.entropy = TransformEntropy::Fixed;
        if (v.rfind("rans32", 0) == 0) s.entropy = TransformEntropy::Rans32;
        if (v == "rans32-per-head") s.acrossHeads = false;
        if (v == "rope-off") s.ropeUndo = false;
        if (v == "per-head") s.acrossHeads = false;
        if (v == "mse-uniform") s.weighting = TransformWeighting::Mse, s.allocation = TransformAllocation::Uniform;
        if (v == "recent") s.recentTokens = 40;
        if (v == "no-sinks") s.sinkTokens = 0;
        if (v == "rdo") s.rdoLambda = 1.0;  // encoder-side rounding: the payload format is unchanged
        if (v == "hadamard-uncalibrated") s.basis = TransformBasis::Hadamard;
        CodecParams p = transformParams(kv, s, v == "recent" ? 128 : 64);
        if (v == "hadamard-uncalibrated" || v == "rans32-uncalibrated") prepareTransform(p, kv, "test cache");
        else calibrateTransform(p, {&calib}, kv);
        double visited = 1;
        checkTransform(p, kv, &visited);
        qInfo("%s: the GEMM tiles visit %.0f%% of the components", v.c_str(), 100 * visited);
        if (blocky) QVERIFY2(visited < 0.75, "per-head decode matrices should let tiles skip other heads' components");
    }

    // The GEMM skips other heads' components only where that is exact: a -0 mean in a block, or
    // steps large enough for q * step to overflow, make the tiles visit every component again.
    void transformTileRanges()
    {
        const KvShape shape{2, 4, 32, 200};
        const KvSet calib = transformCache(shape, 61), kv = transformCache(shape, 62);
        TransformSettings s;
        s.acrossHeads = false;
        CodecParams p = transformParams(kv, s, 64);
        calibrateTransform(p, {&calib}, kv);
        Emu emu;
        std::string why;
        QVERIFY2(makeEmu(p, nullptr, &emu, &why), why.c_str());
        gpu::TfModel m = emu.codec.tf;
        auto full = [&](int level, int b) {
            const gpu::TfLevel& lv = m.levels[size_t(level - 1)];
            return lv.tileK[lv.tileOffset[size_t(b)]] == 0 && int(lv.tileK[lv.tileOffset[size_t(b)] + 1]) == lv.K[size_t(b)] &&
                   lv.tileK[lv.tileOffset[size_t(b)] + 2] == 0 && int(lv.tileK[lv.tileOffset[size_t(b)] + 3]) == lv.K[size_t(b)];
        };
        QVERIFY(!full(3, 0) && !full(3, 1));
        m.mean[5] = -0.0f;  // block 0
        gpu::tileRanges(m, shape.numLayers, shape.numKvHeads, shape.headDim);
        QVERIFY(full(3, 0) && !full(3, 1));
        m.levels[2].comps[0].step = 1e30f;
        gpu::tileRanges(m, shape.numLayers, shape.numKvHeads, shape.headDim);
        QVERIFY(full(3, 1) && !full(2, 1));
    }

    // The committed transform golden files (rans, rans32) decode to the CPU decoder's bytes through the kernels.
    void transformGolden_data()
    {
        QTest::addColumn<QString>("file");
        QTest::newRow("rans") << QString("transform_synthetic.kvc");
        QTest::newRow("rans32") << QString("transform_synthetic_rans32.kvc");
    }
    void transformGolden()
    {
        QFETCH(QString, file);
        const auto reader = KvcReader::openFile(std::string(KVSCOPE_TEST_DATA) + "/golden-transform/" + file.toStdString());
        const CodecParams& p = reader->params();
        QCOMPARE(int(p.codec), int(CodecId::Transform));
        Emu emu;
        std::string why;
        QVERIFY2(makeEmu(p, nullptr, &emu, &why), why.c_str());
        for (int level = 1; level <= p.numLevels(); ++level) {
            const KvSet cpu = reader->decodeAll({level});
            std::vector<uint8_t> out(emu.codec.outputElems() * emu.codec.dtypeBytes());
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                const auto pl = reader->readChunk(ch, level);
                QVERIFY2(gpu::emulateDecodeChunk(emu.codec, ch, level, pl.data(), pl.size(), emu.shared, out.data(), &why),
                         why.c_str());
            }
            QVERIFY(out == flatten(cpu));
        }
    }

    // Corrupt transform payloads: the emulated kernels refuse exactly when the CPU decoder does.
    void transformCorrupt_data()
    {
        QTest::addColumn<int>("mode");
        QTest::newRow("rans") << 0;
        QTest::newRow("rans, token importance") << 1;
        QTest::newRow("fixed, token importance") << 2;
        QTest::newRow("rans32") << 3;
        QTest::newRow("rans32, token importance") << 4;
    }

    void transformCorrupt()
    {
        QFETCH(int, mode);
        const KvShape shape{2, 2, 16, 100};
        const KvSet calib = transformCache(shape, 31), kv = transformCache(shape, 32);
        TransformSettings s;
        s.tokenImportance = mode == 1 || mode == 2 || mode == 4;
        if (mode == 2) s.entropy = TransformEntropy::Fixed;
        if (mode >= 3) s.entropy = TransformEntropy::Rans32;
        CodecParams p = transformParams(kv, s, 64);
        calibrateTransform(p, {&calib}, kv);
        Emu emu;
        std::string why;
        QVERIFY2(makeEmu(p, nullptr, &emu, &why), why.c_str());
        const int chunk = 1, level = 3;  // the short last chunk
        const std::vector<uint8_t> good = encodeChunk(p, kv, chunk, level, nullptr);
        m_refused = m_acceptedSame = 0;
        checkSame(p, nullptr, emu, chunk, level, good, "intact");
        QCOMPARE(m_acceptedSame, 1);
        for (size_t cut : {size_t(0), size_t(3), size_t(16), good.size() / 3, good.size() / 2, good.size() - 1}) {
            std::vector<uint8_t> bad(good.begin(), good.begin() + std::ptrdiff_t(cut));
            checkSame(p, nullptr, emu, chunk, level, bad, QString("truncated to %1").arg(cut));
        }
        std::mt19937 rng(5);
        for (int i = 0; i < 300; ++i) {
            std::vector<uint8_t> bad = good;
            const size_t at = i < 64 ? size_t(i) : rng() % good.size();
            bad[at] ^= uint8_t(1u << (rng() % 8));
            checkSame(p, nullptr, emu, chunk, level, bad, QString("byte %1 flipped").arg(at));
        }
        qInfo("transform mode %d: %d corrupt payloads refused by both, %d accepted by both with equal output", mode,
              m_refused, m_acceptedSame);
        QVERIFY(m_refused > 20);
    }

    // Optional: a real captured cache (KVSCOPE_REAL_KV=path.h5, with the capture's RoPE table,
    // query statistics, o_proj weights and attention mass): the transform model calibrated on
    // KVSCOPE_REAL_KV_CALIB (another capture of the same model; default: the file itself), every
    // level and chunk decoded by both decoders, with and without token importance. Stages the
    // capture has no data for are switched off (and reported).
    void transformRealKv()
    {
        const QByteArray path = qgetenv("KVSCOPE_REAL_KV");
        if (path.isEmpty()) QSKIP("set KVSCOPE_REAL_KV to a captured KV file (HDF5) to check transform parity on real KV");
        const KvSet kv = readKvH5(path.toStdString());
        const QByteArray calibPath = qgetenv("KVSCOPE_REAL_KV_CALIB");
        const KvSet calib = calibPath.isEmpty() ? KvSet(KvShape{1, 1, 1, 1}, DType::F16) : readKvH5(calibPath.toStdString());
        const KvSet& cal = calibPath.isEmpty() ? kv : calib;
        qInfo("real KV: %s, %d layers x %d heads x %d x %d tokens; rope %d, query_sq %d, value_weight %d, attn_mass %d",
              kv.modelName.c_str(), kv.shape().numLayers, kv.shape().numKvHeads, kv.shape().headDim, kv.shape().numTokens,
              int(kv.hasRope()), int(!kv.querySq.empty()), int(!kv.valueWeight.empty()), int(!kv.attnMass.empty()));
        TransformSettings s;
        if (kv.querySq.empty() || kv.valueWeight.empty() || cal.querySq.empty() || cal.valueWeight.empty())
            s.weighting = TransformWeighting::Mse;
        if (!kv.hasRope() || !cal.hasRope()) s.ropeUndo = false;
        CodecParams p = transformParams(kv, s, 256);
        calibrateTransform(p, {&cal}, kv);  // one fit: token importance is an encoder-side switch
        for (int imp = 0; imp < (kv.attnMass.empty() ? 1 : 2); ++imp) {
            CodecParams q = p;
            q.profile.transform.tokenImportance = imp == 1;
            q.transform.reset();
            prepareTransform(q, kv, "test cache");
            qInfo("calibrated on %s: rope_undo %d, weighting %s, token_importance %d", calibPath.isEmpty() ? "the file itself" : calibPath.constData(),
                  int(s.ropeUndo), weightingName(s.weighting), imp);
            checkTransform(q, kv);
        }
    }

    void cleanupTestCase()
    {
        qInfo("parity: %d whole-cache decodes (%d transform), %zu values, all bit-exact; %zu transform symbols checked "
              "against decodeSymbolMatrix", m_parityChecks + m_transformDecodes, m_transformDecodes, m_valuesChecked,
              m_entropySymbols);
    }
};

KVSCOPE_TEST_MAIN(TestCudaCore)
#include "tst_cuda_core.moc"
