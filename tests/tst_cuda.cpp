// GPU parity: the CUDA kernels against the CPU reference decoder (kvscope::decodeChunk) and
// quantizer, exact bytes; corrupt payloads must come back as KVSCOPE_CUDA_EDATA and leave the
// device usable. Skips with a reason on machines without a CUDA device. The same per-thread code
// is checked on the host, without a device, by tst_cuda_core.
#include "testmain.h"

#include "codec/container.h"
#include "codec/gpu_decode.h"
#include "codec/simd_path.h"
#include "codec/quantize.h"
#include "codec_cases.h"
#include "common/half.h"
#include "kvio/kv_h5.h"
#include "kvscope_cuda.h"

#include <algorithm>
#include <random>
#include <vector>

using namespace kvscope_test;

namespace {

struct Decoder {
    kvscope_cuda_decoder* d = nullptr;
    ~Decoder() { kvscope_cuda_decoder_destroy(d); }
};

struct Pinned {
    void* p = nullptr;
    ~Pinned() { kvscope_cuda_host_free(p); }
};

std::vector<uint8_t> deviceOutput(kvscope_cuda_decoder* d)
{
    void* ptr = nullptr;
    uint64_t bytes = 0;
    kvscope_cuda_decoder_output(d, &ptr, &bytes);
    std::vector<uint8_t> out(bytes);
    if (kvscope_cuda_decoder_copy_output(d, 0, out.data(), bytes) != 0) out.clear();
    return out;
}

}  // namespace

class TestCuda : public QObject {
    Q_OBJECT
private slots:
    // The CPU decoder's reference is its scalar path: the kernels round each term as it does
    // (__fmul_rn, __fadd_rn) and give its bytes; the CPU's fused and AMX paths are only within
    // FORMAT.md's tolerance of them (tst_transform checks that).
    void initTestCase()
    {
        setSimdPath(SimdPath::Scalar);
        if (kvscope_cuda_device_count() == 0) QSKIP("no CUDA device on this machine: GPU parity not checked");
        char name[256];
        int major = 0, minor = 0;
        QCOMPARE(kvscope_cuda_device_name(0, name, sizeof name, &major, &minor), 0);
        qInfo("CUDA device 0: %s (sm_%d%d)", name, major, minor);
    }

    void dequantizeMatchesCpu_data()
    {
        QTest::addColumn<int>("bins");
        QTest::addColumn<int>("tokens");
        QTest::newRow("32 bins, 256 tokens") << 32 << 256;
        QTest::newRow("16 bins, 17 tokens") << 16 << 17;
        QTest::newRow("256 bins, 1000 tokens") << 256 << 1000;
    }

    void dequantizeMatchesCpu()
    {
        QFETCH(int, bins);
        QFETCH(int, tokens);
        kvscope::quant::BlockSpec b;
        b.heads = 4;
        b.headDim = 64;
        b.tokens = tokens;
        b.bins = b.anchorBins = bins;
        std::mt19937 rng(42);
        std::normal_distribution<float> n(0.0f, 2.0f);
        std::vector<float> x(size_t(b.heads) * tokens * b.headDim);
        for (float& v : x) v = n(rng);
        std::vector<uint8_t> sym(x.size());
        std::vector<uint16_t> scales(size_t(b.numScales()));
        kvscope::quant::quantizeBlock(b, x.data(), sym.data(), scales.data());
        std::vector<float> ref(x.size());
        kvscope::quant::dequantizeBlock(b, sym.data(), scales.data(), ref.data());
        std::vector<uint16_t> gpu(x.size());
        QCOMPARE(kvscope_cuda_dequantize_per_token(sym.data(), scales.data(), b.heads, tokens, b.headDim,
                                                   kvscope::quant::maxLevel(bins), gpu.data()),
                 0);
        for (size_t i = 0; i < x.size(); ++i)
            if (gpu[i] != kvscope::floatToHalf(ref[i]))
                QFAIL(qPrintable(QString("value %1: GPU %2, CPU %3").arg(i).arg(gpu[i]).arg(kvscope::floatToHalf(ref[i]))));
    }

    // Every chunk at every mix of levels, through the batched two-stream pipeline: with the
    // default batch size (one batch), one chunk per batch (batch_bytes 1), and from pinned memory.
    void decodeMatchesCpu_data()
    {
        QTest::addColumn<int>("index");
        const auto cases = parityCases();
        for (size_t i = 0; i < cases.size(); ++i) QTest::newRow(cases[i].first) << int(i);
    }

    void decodeMatchesCpu()
    {
        QFETCH(int, index);
        const Case c = parityCases()[size_t(index)].second;
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        std::vector<LevelTables> tables;
        if (c.tables == TableMode::Shared) tables = profileTables(p, "test profile");
        const std::vector<LevelTables>* shared = c.tables == TableMode::Shared ? &tables : nullptr;
        const auto codec = gpuCodec(p, shared);
        std::vector<std::vector<std::vector<uint8_t>>> payloads(size_t(p.numChunks()));
        for (int ch = 0; ch < p.numChunks(); ++ch)
            for (int l = 1; l <= p.numLevels(); ++l)
                payloads[size_t(ch)].push_back(encodeChunk(p, kv, ch, l, shared ? &tables[size_t(l - 1)] : nullptr));
        for (int shift = 0; shift < p.numLevels(); ++shift)
            for (int variant = 0; variant < 3; ++variant) {
                KvSet cpu(p.shape, p.dtype);
                Decoder dec;
                QCOMPARE(kvscope_cuda_decoder_create(&codec->c, 0, variant == 1 ? 1 : 0, &dec.d), 0);
                std::vector<kvscope_cuda_chunk> chunks;
                size_t total = 0;
                for (int ch = 0; ch < p.numChunks(); ++ch) total += payloads[size_t(ch)][size_t((ch + shift) % p.numLevels())].size();
                Pinned pinned;
                if (variant == 2) QVERIFY((pinned.p = kvscope_cuda_host_alloc(total)) != nullptr);
                size_t pos = 0;
                for (int ch = p.numChunks() - 1; ch >= 0; --ch) {  // any order
                    const int level = (ch + shift) % p.numLevels() + 1;
                    const auto& pl = payloads[size_t(ch)][size_t(level - 1)];
                    decodeChunk(p, pl.data(), pl.size(), ch, level, shared ? &tables[size_t(level - 1)] : nullptr, cpu, "cpu");
                    const uint8_t* src = pl.data();
                    if (variant == 2) {
                        std::memcpy(static_cast<uint8_t*>(pinned.p) + pos, pl.data(), pl.size());
                        src = static_cast<uint8_t*>(pinned.p) + pos;
                        pos += pl.size();
                    }
                    chunks.push_back({ch, level, src, pl.size()});
                }
                QVERIFY2(kvscope_cuda_decode(dec.d, chunks.data(), int(chunks.size())) == 0, kvscope_cuda_last_error());
                const std::vector<uint8_t> gpu = deviceOutput(dec.d), ref = flatten(cpu);
                QCOMPARE(gpu.size(), ref.size());
                if (gpu != ref) {
                    size_t i = 0;
                    while (gpu[i] == ref[i]) ++i;
                    QFAIL(qPrintable(QString("shift %1 variant %2: first differing byte %3").arg(shift).arg(variant).arg(i)));
                }
                kvscope_cuda_timing t{};
                QCOMPARE(kvscope_cuda_decoder_timing(dec.d, &t), 0);
                QCOMPARE(t.output_bytes, uint64_t(ref.size()));
                if (variant == 1) QCOMPARE(t.batches, p.numChunks());
            }
    }

    // A whole container through core's wrapper equals KvcReader::decodeAll, for the committed golden files.
    void goldenFiles()
    {
        for (const char* name : {"cachegen-inband", "cachegen-shared", "int8", "cachegen-head-inband", "cachegen-head-shared",
                                 "cachegen-head-d16"}) {
            const auto reader = KvcReader::openFile(std::string(KVSCOPE_TEST_DATA) + "/golden/" + name + ".kvc");
            const std::vector<int> levels{std::min(2, reader->params().numLevels())};
            const KvSet cpu = reader->decodeAll(levels);
            GpuDecodeStats st;
            const KvSet gpu = gpuDecodeAll(*reader, levels, 0, &st);
            QVERIFY2(flatten(cpu) == flatten(gpu), name);
        }
    }

    // Optional: a real captured cache (KVSCOPE_REAL_KV=path.h5), encoded at every level.
    void realKv()
    {
        const QByteArray path = qgetenv("KVSCOPE_REAL_KV");
        if (path.isEmpty()) QSKIP("set KVSCOPE_REAL_KV to a captured KV file (HDF5) to check parity on real KV");
        const KvSet kv = readKvH5(path.toStdString());
        CodecParams p;
        p.shape = kv.shape();
        p.dtype = kv.dtype();
        p.profile = defaultProfile(p.shape.numLayers);
        const auto codec = gpuCodec(p, nullptr);
        for (int level = 1; level <= p.numLevels(); ++level) {
            KvSet cpu(p.shape, p.dtype);
            std::vector<std::vector<uint8_t>> pls;
            std::vector<kvscope_cuda_chunk> chunks;
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                pls.push_back(encodeChunk(p, kv, ch, level, nullptr));
                decodeChunk(p, pls.back().data(), pls.back().size(), ch, level, nullptr, cpu, "cpu");
            }
            for (int ch = 0; ch < p.numChunks(); ++ch) chunks.push_back({ch, level, pls[size_t(ch)].data(), pls[size_t(ch)].size()});
            Decoder dec;
            QCOMPARE(kvscope_cuda_decoder_create(&codec->c, 0, 0, &dec.d), 0);
            QVERIFY2(kvscope_cuda_decode(dec.d, chunks.data(), int(chunks.size())) == 0, kvscope_cuda_last_error());
            QVERIFY(deviceOutput(dec.d) == flatten(cpu));
        }
    }

    // Corrupt payloads: EDATA exactly when the CPU decoder refuses, equal output when both accept,
    // and the device stays usable (a good decode after each bad one).
    void corruptInput_data()
    {
        QTest::addColumn<int>("scope");
        QTest::newRow("per-channel tables") << int(TableScope::Channel);
        QTest::newRow("per-head tables") << int(TableScope::Head);
    }

    void corruptInput()
    {
        QFETCH(int, scope);
        Case c;
        c.shape = {2, 2, 16, 100};
        c.scope = TableScope(scope);
        const KvSet kv = makeKv(c);
        const CodecParams p = makeParams(c, kv);
        const auto codec = gpuCodec(p, nullptr);
        const std::vector<uint8_t> good = encodeChunk(p, kv, 1, 2, nullptr);
        Decoder dec;
        QCOMPARE(kvscope_cuda_decoder_create(&codec->c, 0, 0, &dec.d), 0);
        std::mt19937 rng(5);
        int refused = 0;
        for (int i = 0; i < 300; ++i) {
            std::vector<uint8_t> bad = good;
            if (i < 5) bad.resize(bad.size() * size_t(i) / 5);
            else bad[rng() % bad.size()] ^= uint8_t(1u << (rng() % 8));
            KvSet cpu(p.shape, p.dtype);
            bool cpuOk = true;
            try {
                decodeChunk(p, bad.data(), bad.size(), 1, 2, nullptr, cpu, "cpu");
            } catch (const Error&) {
                cpuOk = false;
            }
            const kvscope_cuda_chunk ch{1, 2, bad.data(), bad.size()};
            const int rc = kvscope_cuda_decode(dec.d, &ch, 1);
            QVERIFY2(rc == 0 || rc == KVSCOPE_CUDA_EDATA, kvscope_cuda_last_error());
            QVERIFY2(cpuOk == (rc == 0), qPrintable(QString("case %1: CPU %2, GPU %3").arg(i).arg(cpuOk).arg(kvscope_cuda_last_error())));
            if (rc != 0) {
                QVERIFY(QString(kvscope_cuda_last_error()).startsWith("chunk 1 (level 2): "));
                ++refused;
                const kvscope_cuda_chunk ok{1, 2, good.data(), good.size()};
                QVERIFY2(kvscope_cuda_decode(dec.d, &ok, 1) == 0, kvscope_cuda_last_error());
            } else {
                size_t diff = 0;
                // the decoder's buffer holds chunk 0 as zeros, like the fresh KvSet
                QVERIFY(sameOutput(deviceOutput(dec.d), flatten(cpu), p.dtype, &diff));
            }
        }
        QVERIFY(refused > 50);
    }

    // The transform codec on the device: every level of a few stage settings (the default,
    // token importance, fixed-width symbols, no RoPE undo, recent tokens with bf16 output), all
    // chunks in one call and one chunk per call (small batches), against the CPU decoder's bytes.
    void transformMatchesCpu_data()
    {
        QTest::addColumn<QString>("variant");
        for (const char* v : {"default", "importance", "fixed", "rope-off", "recent-bf16"}) QTest::newRow(v) << QString(v);
    }

    void transformMatchesCpu()
    {
        QFETCH(QString, variant);
        const std::string v = variant.toStdString();
        const KvShape shape{3, 2, 64, 700};
        const DType dt = v == "recent-bf16" ? DType::BF16 : DType::F16;
        const KvSet calib = transformCache(shape, 41, dt), kv = transformCache(shape, 42, dt);
        TransformSettings s;
        s.tokenImportance = v == "importance";
        if (v == "fixed") s.entropy = TransformEntropy::Fixed;
        if (v == "rope-off") s.ropeUndo = false;
        if (v == "recent-bf16") s.recentTokens = 100;
        CodecParams p = transformParams(kv, s, 128);
        calibrateTransform(p, {&calib}, kv);
        const auto codec = gpuCodec(p, nullptr);
        for (int level = 1; level <= p.numLevels(); ++level) {
            KvSet cpu(p.shape, p.dtype);
            std::vector<std::vector<uint8_t>> payloads;
            std::vector<kvscope_cuda_chunk> chunks;
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                payloads.push_back(encodeChunk(p, kv, ch, level, nullptr));
                decodeChunk(p, payloads.back().data(), payloads.back().size(), ch, level, nullptr, cpu, "cpu");
            }
            for (int ch = 0; ch < p.numChunks(); ++ch) chunks.push_back({ch, level, payloads[size_t(ch)].data(), payloads[size_t(ch)].size()});
            for (int batch : {0, 1}) {
                Decoder dec;
                QCOMPARE(kvscope_cuda_decoder_create(&codec->c, 0, batch, &dec.d), 0);
                QVERIFY2(kvscope_cuda_decode(dec.d, chunks.data(), int(chunks.size())) == 0, kvscope_cuda_last_error());
                kvscope_cuda_timing t{};
                kvscope_cuda_decoder_timing(dec.d, &t);
                if (batch == 1) QCOMPARE(t.batches, p.numChunks());
                QVERIFY2(deviceOutput(dec.d) == flatten(cpu), qPrintable(QString("level %1, batch %2").arg(level).arg(batch)));
            }
        }
    }

    // Corrupt transform payloads come back as KVSCOPE_CUDA_EDATA exactly when the CPU refuses them.
    void transformCorruptInput()
    {
        const KvShape shape{2, 2, 16, 100};
        const KvSet calib = transformCache(shape, 51), kv = transformCache(shape, 52);
        TransformSettings s;
        s.tokenImportance = true;
        CodecParams p = transformParams(kv, s, 64);
        calibrateTransform(p, {&calib}, kv);
        const auto codec = gpuCodec(p, nullptr);
        const std::vector<uint8_t> good = encodeChunk(p, kv, 1, 3, nullptr);
        Decoder dec;
        QCOMPARE(kvscope_cuda_decoder_create(&codec->c, 0, 0, &dec.d), 0);
        std::mt19937 rng(9);
        int refused = 0;
        for (int i = 0; i < 200; ++i) {
            std::vector<uint8_t> bad = good;
            if (i < 5) bad.resize(bad.size() * size_t(i) / 5);
            else bad[rng() % bad.size()] ^= uint8_t(1u << (rng() % 8));
            KvSet cpu(p.shape, p.dtype);
            bool cpuOk = true;
            try {
                decodeChunk(p, bad.data(), bad.size(), 1, 3, nullptr, cpu, "cpu");
            } catch (const Error&) {
                cpuOk = false;
            }
            const kvscope_cuda_chunk ch{1, 3, bad.data(), bad.size()};
            const int rc = kvscope_cuda_decode(dec.d, &ch, 1);
            QVERIFY2(rc == 0 || rc == KVSCOPE_CUDA_EDATA, kvscope_cuda_last_error());
            QVERIFY2(cpuOk == (rc == 0), qPrintable(QString("case %1: CPU %2, GPU %3").arg(i).arg(cpuOk).arg(kvscope_cuda_last_error())));
            if (rc != 0) ++refused;
            else {
                size_t diff = 0;
                QVERIFY(sameOutput(deviceOutput(dec.d), flatten(cpu), p.dtype, &diff));
            }
        }
        QVERIFY(refused > 20);
    }

    void baselinesAndRefusals()
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
            const auto codec = gpuCodec(p, nullptr);
            Decoder dec;
            QCOMPARE(kvscope_cuda_decoder_create(&codec->c, 0, 0, &dec.d), 0);
            KvSet cpu(p.shape, p.dtype);
            std::vector<std::vector<uint8_t>> pls;
            std::vector<kvscope_cuda_chunk> chunks;
            for (int ch = 0; ch < p.numChunks(); ++ch) {
                pls.push_back(encodeChunk(p, kv, ch, 1, nullptr));
                decodeChunk(p, pls.back().data(), pls.back().size(), ch, 1, nullptr, cpu, "cpu");
            }
            for (int ch = 0; ch < p.numChunks(); ++ch) chunks.push_back({ch, 1, pls[size_t(ch)].data(), pls[size_t(ch)].size()});
            QVERIFY2(kvscope_cuda_decode(dec.d, chunks.data(), int(chunks.size())) == 0, kvscope_cuda_last_error());
            QVERIFY(deviceOutput(dec.d) == flatten(cpu));
        }
        CodecParams p;
        p.codec = CodecId::Kivi2;
        p.shape = c.shape;
        p.profile = defaultProfile(2);
        const auto codec = gpuCodec(p, nullptr);
        Decoder dec;
        QCOMPARE(kvscope_cuda_decoder_create(&codec->c, 0, 0, &dec.d), int(KVSCOPE_CUDA_EINVAL));
        QVERIFY(QString(kvscope_cuda_last_error()).contains("has no GPU decoder"));
    }

    void rejectsBadArguments()
    {
        uint8_t s = 0;
        uint16_t sc = 0, o = 0;
        QCOMPARE(kvscope_cuda_dequantize_per_token(&s, &sc, 0, 1, 1, 15, &o), int(KVSCOPE_CUDA_EINVAL));
        QVERIFY(QString(kvscope_cuda_last_error()).contains("invalid"));
    }
};

KVSCOPE_TEST_MAIN(TestCuda)
#include "tst_cuda.moc"
