// GPU parity: the CUDA dequantize kernel against the CPU reference (kvscope::quant). Skips with a
// reason on machines without a CUDA device.
#include "testmain.h"

#include "codec/quantize.h"
#include "common/half.h"
#include "kvscope_cuda.h"

#include <random>
#include <vector>

class TestCuda : public QObject {
    Q_OBJECT
private slots:
    void initTestCase()
    {
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
