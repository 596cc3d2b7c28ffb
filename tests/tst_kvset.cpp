// KvSet storage, shape validation and the synthetic generator (core/kv/kv_set.h).
#include "testmain.h"

#include "common/error.h"
#include "common/half.h"
#include "kv/kv_set.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

using namespace kvscope;

Q_DECLARE_METATYPE(kvscope::DType)
Q_DECLARE_METATYPE(kvscope::KvShape)

namespace {

// Relative spacing of the dtype's values: half an ulp is the largest rounding error.
float relativeTolerance(DType t)
{
    switch (t) {
    case DType::F16: return std::ldexp(1.0f, -11);
    case DType::BF16: return std::ldexp(1.0f, -8);
    case DType::F32: return 0.0f;
    }
    return 0.0f;
}

float roundTo(DType t, float v)
{
    switch (t) {
    case DType::F16: return halfToFloat(floatToHalf(v));
    case DType::BF16: return bf16ToFloat(floatToBf16(v));
    case DType::F32: return v;
    }
    return v;
}

// Lag-1 autocorrelation along tokens of one channel, about the channel's own mean.
double lag1Correlation(const KvSet& kv, KvKind kind, int layer, int head, int d)
{
    const int T = kv.shape().numTokens;
    double mean = 0;
    for (int t = 0; t < T; ++t) mean += kv.at(kind, layer, head, t, d);
    mean /= T;
    double num = 0, den = 0;
    for (int t = 0; t < T; ++t) {
        const double a = kv.at(kind, layer, head, t, d) - mean;
        den += a * a;
        if (t > 0) num += a * (kv.at(kind, layer, head, t - 1, d) - mean);
    }
    return num / den;
}

// Absolute maximum of every channel of one tensor, channel = head * head_dim + d.
std::vector<float> channelAbsmax(const KvSet& kv, KvKind kind, int layer)
{
    const KvShape& s = kv.shape();
    std::vector<float> out(size_t(s.channels()), 0.0f);
    for (int h = 0; h < s.numKvHeads; ++h)
        for (int t = 0; t < s.numTokens; ++t)
            for (int d = 0; d < s.headDim; ++d) {
                float& m = out[size_t(h) * size_t(s.headDim) + size_t(d)];
                m = std::max(m, std::fabs(kv.at(kind, layer, h, t, d)));
            }
    return out;
}

float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

// Fraction of |values| of one tensor below `bound`, optionally skipping some channels.
double fractionBelow(const KvSet& kv, KvKind kind, int layer, float bound,
                     const std::vector<bool>& skipChannel = {})
{
    const KvShape& s = kv.shape();
    size_t below = 0, n = 0;
    for (int h = 0; h < s.numKvHeads; ++h)
        for (int d = 0; d < s.headDim; ++d) {
            const size_t c = size_t(h) * size_t(s.headDim) + size_t(d);
            if (!skipChannel.empty() && skipChannel[c]) continue;
            for (int t = 0; t < s.numTokens; ++t) {
                ++n;
                if (std::fabs(kv.at(kind, layer, h, t, d)) < bound) ++below;
            }
        }
    return double(below) / double(n);
}

}  // namespace

class TestKvSet : public QObject {
    Q_OBJECT
private slots:
    void shapeMath_data();
    void shapeMath();
    void dtypeNames();
    void layoutIsHeadTokenDim();
    void setAtRoundTrip_data();
    void setAtRoundTrip();
    void readWriteRows_data();
    void readWriteRows();
    void validateShapeRefuses_data();
    void validateShapeRefuses();
    void validateShapeAcceptsLimits();
    void syntheticIsDeterministic();
    void syntheticCorrelation_data();
    void syntheticCorrelation();
    void syntheticOutlierKeyChannels();
    void syntheticMagnitudes();
    void syntheticRefusesBadSpec_data();
    void syntheticRefusesBadSpec();
};

void TestKvSet::shapeMath_data()
{
    QTest::addColumn<int>("layers");
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("headDim");
    QTest::addColumn<int>("tokens");
    QTest::addColumn<qulonglong>("layerValues");
    QTest::newRow("tiny") << 1 << 1 << 1 << 1 << 1ull;
    QTest::newRow("llama-7b 4k") << 32 << 32 << 128 << 4096 << 16777216ull;
    QTest::newRow("smollm2 odd tokens") << 30 << 3 << 64 << 777 << 149184ull;
    QTest::newRow("beyond 32 bits") << 2 << 64 << 256 << 524288 << 8589934592ull;
}

void TestKvSet::shapeMath()
{
    QFETCH(int, layers);
    QFETCH(int, heads);
    QFETCH(int, headDim);
    QFETCH(int, tokens);
    QFETCH(qulonglong, layerValues);
    const KvShape s{layers, heads, headDim, tokens};
    QCOMPARE(s.channels(), heads * headDim);
    QCOMPARE(qulonglong(s.layerValues()), layerValues);
    QCOMPARE(qulonglong(s.totalValues()), 2 * qulonglong(layers) * layerValues);
    QCOMPARE(dtypeSize(DType::F16), size_t(2));
    QCOMPARE(dtypeSize(DType::BF16), size_t(2));
    QCOMPARE(dtypeSize(DType::F32), size_t(4));
    QVERIFY(s == (KvShape{layers, heads, headDim, tokens}));
    QVERIFY(!(s == (KvShape{layers, heads, headDim, tokens + 1})));
}

void TestKvSet::dtypeNames()
{
    for (DType t : {DType::F16, DType::BF16, DType::F32}) {
        DType parsed = DType::F32 == t ? DType::F16 : DType::F32;
        QVERIFY(parseDType(dtypeName(t), &parsed));
        QCOMPARE(parsed, t);
    }
    QCOMPARE(QString(dtypeName(DType::F16)), QString("float16"));
    QCOMPARE(QString(dtypeName(DType::BF16)), QString("bfloat16"));
    QCOMPARE(QString(dtypeName(DType::F32)), QString("float32"));
    DType t = DType::BF16;
    QVERIFY(parseDType("fp16", &t));
    QCOMPARE(t, DType::F16);
    QVERIFY(!parseDType("float64", &t));
    QVERIFY(!parseDType("", &t));
    QCOMPARE(t, DType::F16);  // untouched on failure
}

// Element (h, t, d) lives at ((h * tokens) + t) * head_dim + d in the raw bytes.
void TestKvSet::layoutIsHeadTokenDim()
{
    KvSet kv(KvShape{2, 3, 5, 7}, DType::F32);
    QCOMPARE(kv.tensorBytes(), size_t(3 * 7 * 5 * 4));
    kv.set(KvKind::Value, 1, 2, 4, 3, 42.5f);
    const size_t expected = (size_t(2) * 7 + 4) * 5 + 3;
    const uint8_t* raw = kv.data(KvKind::Value, 1);
    float v;
    std::memcpy(&v, raw + 4 * expected, 4);
    QCOMPARE(v, 42.5f);
    size_t nonzero = 0;
    for (size_t i = 0; i < kv.tensorBytes(); ++i) nonzero += raw[i] != 0;
    QVERIFY(nonzero > 0 && nonzero <= 4);
    // other tensors stay zero
    for (KvKind k : {KvKind::Key, KvKind::Value})
        for (int l = 0; l < 2; ++l) {
            if (k == KvKind::Value && l == 1) continue;
            const uint8_t* p = kv.data(k, l);
            QVERIFY(std::all_of(p, p + kv.tensorBytes(), [](uint8_t b) { return b == 0; }));
        }

    KvSet h(KvShape{1, 2, 4, 3}, DType::F16);
    h.set(KvKind::Key, 0, 1, 2, 3, 1.0f);
    uint16_t bits;
    std::memcpy(&bits, h.data(KvKind::Key, 0) + 2 * ((size_t(1) * 3 + 2) * 4 + 3), 2);
    QCOMPARE(bits, uint16_t(0x3c00));
}

void TestKvSet::setAtRoundTrip_data()
{
    QTest::addColumn<DType>("dtype");
    QTest::newRow("float16") << DType::F16;
    QTest::newRow("bfloat16") << DType::BF16;
    QTest::newRow("float32") << DType::F32;
}

void TestKvSet::setAtRoundTrip()
{
    QFETCH(DType, dtype);
    const KvShape shape{2, 2, 8, 16};
    KvSet kv(shape, dtype);
    QCOMPARE(kv.dtype(), dtype);
    QCOMPARE(kv.tensorBytes(), shape.layerValues() * dtypeSize(dtype));
    auto value = [](int l, int k, int h, int t, int d) {
        return float(std::sin(0.37 * (l * 1000 + k * 500 + h * 100 + t * 8 + d)) * 20.0);
    };
    for (int l = 0; l < 2; ++l)
        for (int k = 0; k < 2; ++k)
            for (int h = 0; h < 2; ++h)
                for (int t = 0; t < 16; ++t)
                    for (int d = 0; d < 8; ++d)
                        kv.set(KvKind(k), l, h, t, d, value(l, k, h, t, d));
    const float tol = relativeTolerance(dtype);
    for (int l = 0; l < 2; ++l)
        for (int k = 0; k < 2; ++k)
            for (int h = 0; h < 2; ++h)
                for (int t = 0; t < 16; ++t)
                    for (int d = 0; d < 8; ++d) {
                        const float want = value(l, k, h, t, d);
                        const float got = kv.at(KvKind(k), l, h, t, d);
                        QCOMPARE(got, roundTo(dtype, want));  // exactly the dtype's rounding
                        QVERIFY2(std::fabs(got - want) <= tol * std::fabs(want),
                                 qPrintable(QString("%1 stored as %2").arg(want).arg(got)));
                    }
}

void TestKvSet::readWriteRows_data()
{
    QTest::addColumn<DType>("dtype");
    QTest::newRow("float16") << DType::F16;
    QTest::newRow("bfloat16") << DType::BF16;
    QTest::newRow("float32") << DType::F32;
}

void TestKvSet::readWriteRows()
{
    QFETCH(DType, dtype);
    const int D = 6, T = 20;
    KvSet kv(KvShape{1, 3, D, T}, dtype);
    // fill everything with a sentinel so writes outside the block would show
    for (int h = 0; h < 3; ++h)
        for (int t = 0; t < T; ++t)
            for (int d = 0; d < D; ++d) kv.set(KvKind::Key, 0, h, t, d, -7.0f);
    const int t0 = 5, n = 9;
    std::vector<float> in(size_t(n) * D);
    for (size_t i = 0; i < in.size(); ++i) in[i] = 0.25f * float(i) - 3.1f;
    kv.writeRows(KvKind::Key, 0, 1, t0, n, in.data());

    std::vector<float> out(size_t(n) * D, 1e9f);
    kv.readRows(KvKind::Key, 0, 1, t0, n, out.data());
    for (int j = 0; j < n; ++j)
        for (int d = 0; d < D; ++d) {
            const size_t i = size_t(j) * D + size_t(d);
            QCOMPARE(out[i], roundTo(dtype, in[i]));
            QCOMPARE(kv.at(KvKind::Key, 0, 1, t0 + j, d), out[i]);
        }
    for (int h = 0; h < 3; ++h)
        for (int t = 0; t < T; ++t) {
            if (h == 1 && t >= t0 && t < t0 + n) continue;
            for (int d = 0; d < D; ++d) QCOMPARE(kv.at(KvKind::Key, 0, h, t, d), -7.0f);
        }
    // the value tensor was never touched
    for (int t = 0; t < T; ++t) QCOMPARE(kv.at(KvKind::Value, 0, 1, t, 0), 0.0f);
    // zero rows are a no-op
    kv.readRows(KvKind::Key, 0, 2, T, 0, nullptr);
    kv.writeRows(KvKind::Key, 0, 2, T, 0, nullptr);
}

void TestKvSet::validateShapeRefuses_data()
{
    QTest::addColumn<KvShape>("shape");
    QTest::addColumn<QString>("reason");
    QTest::newRow("default shape is empty") << KvShape{} << "num_layers is 0";
    QTest::newRow("negative heads") << KvShape{1, -2, 64, 8} << "num_kv_heads is -2";
    QTest::newRow("zero head_dim") << KvShape{1, 2, 0, 8} << "head_dim is 0";
    QTest::newRow("zero tokens") << KvShape{1, 2, 64, 0} << "num_tokens is 0";
    QTest::newRow("too many layers") << KvShape{KvLimits::maxLayers + 1, 1, 1, 1} << "limit";
    QTest::newRow("too many heads") << KvShape{1, KvLimits::maxKvHeads + 1, 1, 1} << "limit";
    QTest::newRow("head_dim too wide") << KvShape{1, 1, KvLimits::maxHeadDim + 1, 1} << "limit";
    QTest::newRow("too many tokens") << KvShape{1, 1, 1, KvLimits::maxTokens + 1} << "limit";
    QTest::newRow("total one token too large")
        << KvShape{64, 64, 128, (1 << 16) + 1} << "above the limit of 68719476736";
}

void TestKvSet::validateShapeRefuses()
{
    QFETCH(KvShape, shape);
    QFETCH(QString, reason);
    try {
        validateShape(shape, "cache.h5");
        QFAIL("no exception");
    } catch (const Error& e) {
        const QString msg = e.what();
        QVERIFY2(msg.startsWith("cache.h5: "), qPrintable(msg));
        QVERIFY2(msg.contains(reason), qPrintable(msg));
    }
    QVERIFY_THROWS_EXCEPTION(Error, KvSet(shape, DType::F16));
}

void TestKvSet::validateShapeAcceptsLimits()
{
    validateShape(KvShape{1, 1, 1, 1}, "x");
    validateShape(KvShape{KvLimits::maxLayers, 1, 1, 1}, "x");
    validateShape(KvShape{1, KvLimits::maxKvHeads, KvLimits::maxHeadDim, 1}, "x");
    // exactly the total limit: 2 * 64 layers * 2^29 values = 2^36
    const KvShape atLimit{64, 64, 128, 1 << 16};
    QCOMPARE(atLimit.totalValues(), KvLimits::maxTotalValues);
    validateShape(atLimit, "x");
}

void TestKvSet::syntheticIsDeterministic()
{
    SyntheticSpec spec;
    spec.shape = KvShape{3, 2, 32, 100};
    const KvSet a = makeSyntheticKv(spec);
    const KvSet b = makeSyntheticKv(spec);
    spec.seed = 2;
    const KvSet c = makeSyntheticKv(spec);
    QCOMPARE(a.shape(), spec.shape);
    QCOMPARE(a.dtype(), DType::F16);
    bool anyDifferent = false;
    for (int l = 0; l < 3; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value}) {
            QVERIFY(std::memcmp(a.data(k, l), b.data(k, l), a.tensorBytes()) == 0);
            anyDifferent |= std::memcmp(a.data(k, l), c.data(k, l), a.tensorBytes()) != 0;
        }
    QVERIFY(anyDifferent);
    QVERIFY(a.tokens.empty());
    QCOMPARE(QString::fromStdString(a.modelName), QString("synthetic"));
    // The fingerprint names the generator (the "model"), not the seed (the "context"): caches of
    // other seeds share it, other statistics do not.
    QCOMPARE(a.modelFingerprint, c.modelFingerprint);
    spec.keyCorrelation = spec.keyCorrelation * 0.5f;
    QVERIFY(makeSyntheticKv(spec).modelFingerprint != c.modelFingerprint);
}

void TestKvSet::syntheticCorrelation_data()
{
    QTest::addColumn<float>("keyRho");
    QTest::addColumn<float>("valueRho");
    QTest::newRow("defaults") << 0.95f << 0.8f;
    QTest::newRow("weak") << 0.5f << 0.3f;
    QTest::newRow("none") << 0.0f << 0.0f;
    QTest::newRow("very strong") << 0.99f << 0.9f;
}

// The mean over channels of the measured lag-1 autocorrelation matches the requested AR(1)
// coefficient. Its estimator is biased by about -(1 + 4 rho) / T, far below the tolerance here.
void TestKvSet::syntheticCorrelation()
{
    QFETCH(float, keyRho);
    QFETCH(float, valueRho);
    SyntheticSpec spec;
    spec.shape = KvShape{2, 2, 32, 2048};
    spec.dtype = DType::F32;  // no rounding noise in the measurement
    spec.keyCorrelation = keyRho;
    spec.valueCorrelation = valueRho;
    const KvSet kv = makeSyntheticKv(spec);
    for (KvKind kind : {KvKind::Key, KvKind::Value}) {
        const double want = kind == KvKind::Key ? keyRho : valueRho;
        for (int l = 0; l < 2; ++l) {
            double sum = 0;
            for (int h = 0; h < 2; ++h)
                for (int d = 0; d < 32; ++d) sum += lag1Correlation(kv, kind, l, h, d);
            const double measured = sum / 64;
            QVERIFY2(std::fabs(measured - want) < 0.02,
                     qPrintable(QString("%1 layer %2: measured %3, requested %4")
                                    .arg(kindName(kind))
                                    .arg(l)
                                    .arg(measured)
                                    .arg(want)));
        }
    }
    // fp16 storage keeps the correlation too
    spec.dtype = DType::F16;
    const KvSet h = makeSyntheticKv(spec);
    double sum = 0;
    for (int d = 0; d < 32; ++d) sum += lag1Correlation(h, KvKind::Key, 1, 0, d);
    QVERIFY(std::fabs(sum / 32 - keyRho) < 0.03);
}

void TestKvSet::syntheticOutlierKeyChannels()
{
    SyntheticSpec spec;
    spec.shape = KvShape{4, 4, 64, 512};
    spec.outlierChannelsPerHead = 2;
    const KvSet kv = makeSyntheticKv(spec);
    for (int l = 0; l < 4; ++l) {
        const std::vector<float> keys = channelAbsmax(kv, KvKind::Key, l);
        const float med = median(keys);
        const float top = *std::max_element(keys.begin(), keys.end());
        QVERIFY2(top >= 6.0f * med, qPrintable(QString("layer %1: absmax %2 vs median %3")
                                                   .arg(l)
                                                   .arg(top)
                                                   .arg(med)));
        // exactly outlierChannelsPerHead such channels in every head
        for (int h = 0; h < 4; ++h) {
            int count = 0;
            for (int d = 0; d < 64; ++d) count += keys[size_t(h) * 64 + size_t(d)] >= 6.0f * med;
            QCOMPARE(count, 2);
        }
        // values have no outliers
        const std::vector<float> values = channelAbsmax(kv, KvKind::Value, l);
        const float vmed = median(values);
        for (float v : values) QVERIFY(v < 4.0f * vmed);
    }
    spec.outlierChannelsPerHead = 0;
    const KvSet plain = makeSyntheticKv(spec);
    const std::vector<float> keys = channelAbsmax(plain, KvKind::Key, 0);
    const float med = median(keys);
    for (float v : keys) QVERIFY(v < 6.0f * med);
}

// Real fp16 KV magnitudes: ordinary key channels mostly within 5, outliers 15-40, values mostly
// within 1.5.
void TestKvSet::syntheticMagnitudes()
{
    SyntheticSpec spec;
    spec.shape = KvShape{8, 2, 64, 1024};
    const KvSet kv = makeSyntheticKv(spec);
    for (int l = 0; l < 8; ++l) {
        const std::vector<float> keys = channelAbsmax(kv, KvKind::Key, l);
        const float med = median(keys);
        std::vector<bool> outlier(keys.size());
        for (size_t c = 0; c < keys.size(); ++c) {
            outlier[c] = keys[c] >= 6.0f * med;
            if (outlier[c]) {
                QVERIFY2(keys[c] >= 15.0f && keys[c] <= 40.0f, qPrintable(QString::number(keys[c])));
            }
        }
        QVERIFY(fractionBelow(kv, KvKind::Key, l, 5.0f, outlier) > 0.999);
        QVERIFY(fractionBelow(kv, KvKind::Value, l, 1.5f) > 0.999);
        QVERIFY(fractionBelow(kv, KvKind::Value, l, 0.02f) < 0.5);  // not degenerate
    }
}

void TestKvSet::syntheticRefusesBadSpec_data()
{
    QTest::addColumn<int>("outliers");
    QTest::addColumn<float>("keyRho");
    QTest::addColumn<int>("tokens");
    QTest::addColumn<QString>("reason");
    QTest::newRow("negative outliers") << -1 << 0.9f << 16 << "outlierChannelsPerHead";
    QTest::newRow("more outliers than head_dim") << 17 << 0.9f << 16 << "outlierChannelsPerHead";
    QTest::newRow("correlation above 1") << 2 << 1.5f << 16 << "correlation";
    QTest::newRow("correlation NaN") << 2 << std::nanf("") << 16 << "correlation";
    QTest::newRow("empty shape") << 2 << 0.9f << 0 << "num_tokens";
}

void TestKvSet::syntheticRefusesBadSpec()
{
    QFETCH(int, outliers);
    QFETCH(float, keyRho);
    QFETCH(int, tokens);
    QFETCH(QString, reason);
    SyntheticSpec spec;
    spec.shape = KvShape{1, 1, 16, tokens};
    spec.outlierChannelsPerHead = outliers;
    spec.keyCorrelation = keyRho;
    try {
        makeSyntheticKv(spec);
        QFAIL("no exception");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).contains(reason), e.what());
    }
}

KVSCOPE_TEST_MAIN(TestKvSet)
#include "tst_kvset.moc"
