// Statistics of a KV cache (core/kv/kv_stats.h) against hand-computed figures.
#include "testmain.h"

#include "common/error.h"
#include "kv/kv_stats.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

using namespace kvscope;

Q_DECLARE_METATYPE(kvscope::DType)
Q_DECLARE_METATYPE(std::function<void()>)

namespace {

// 1 layer, 2 heads, head_dim 2, 4 tokens; values per channel (head * 2 + d) along tokens.
// Every value is exact in fp16 and bf16.
const float kChannels[4][4] = {
    {1, 2, 3, 4},    // channel 0: mean 2.5, population variance 1.25
    {-8, 0, 2, 2},   // channel 1: mean -1, variance 17
    {5, 5, 5, 5},    // channel 2: constant
    {-1, 1, -1, 1},  // channel 3: mean 0, variance 1
};

KvSet smallSet(DType dtype)
{
    KvSet kv(KvShape{1, 2, 2, 4}, dtype);
    for (int c = 0; c < 4; ++c)
        for (int t = 0; t < 4; ++t) {
            kv.set(KvKind::Key, 0, c / 2, t, c % 2, kChannels[c][t]);
            kv.set(KvKind::Value, 0, c / 2, t, c % 2, -kChannels[c][t]);
        }
    return kv;
}

// One head, channel values given as columns along tokens.
KvSet setFromColumns(const std::vector<std::vector<float>>& columns)
{
    const int D = int(columns.size()), T = int(columns[0].size());
    KvSet kv(KvShape{1, 1, D, T}, DType::F32);
    for (int d = 0; d < D; ++d)
        for (int t = 0; t < T; ++t) kv.set(KvKind::Key, 0, 0, t, d, columns[size_t(d)][size_t(t)]);
    return kv;
}

double entropyOfCounts(const std::vector<int>& counts)
{
    double n = 0, h = 0;
    for (int c : counts) n += c;
    for (int c : counts)
        if (c) h -= c / n * std::log2(c / n);
    return h;
}

bool closeTo(double a, double b, double tol = 1e-9) { return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b)); }

}  // namespace

class TestStats : public QObject {
    Q_OBJECT
private slots:
    void knownChannelStats_data();
    void knownChannelStats();
    void varianceDeltaByGroup_data();
    void varianceDeltaByGroup();
    void rampVariance();
    void entropyOfKnownSymbols();
    void deltaUsesReconstructedAnchor();
    void allZeroTensor();
    void histogram_data();
    void histogram();
    void histogramSkipsNaN();
    void outliersOnSyntheticKv();
    void localityMatchesAr1Theory();
    void allStatsMatchPerTensor();
    void sharedFigures();
    void refusesBadArguments_data();
    void refusesBadArguments();
};

void TestStats::knownChannelStats_data()
{
    QTest::addColumn<DType>("dtype");
    QTest::newRow("float32") << DType::F32;
    QTest::newRow("float16") << DType::F16;
    QTest::newRow("bfloat16") << DType::BF16;
}

void TestStats::knownChannelStats()
{
    QFETCH(DType, dtype);
    const KvSet kv = smallSet(dtype);
    const TensorStats s = computeTensorStats(kv, KvKind::Key, 0);
    QCOMPARE(s.kind, KvKind::Key);
    QCOMPARE(s.layer, 0);
    QCOMPARE(int(s.channels.size()), 4);
    struct Want {
        float min, max, mean, std, absmax;
    };
    const Want want[4] = {{1, 4, 2.5f, std::sqrt(1.25f), 4},
                          {-8, 2, -1, std::sqrt(17.0f), 8},
                          {5, 5, 5, 0, 5},
                          {-1, 1, 0, 1, 1}};
    for (int c = 0; c < 4; ++c) {
        const ChannelStats& cs = s.channels[size_t(c)];
        QCOMPARE(cs.min, want[c].min);
        QCOMPARE(cs.max, want[c].max);
        QCOMPARE(cs.mean, want[c].mean);
        QVERIFY2(std::fabs(cs.std - want[c].std) < 1e-6f, qPrintable(QString::number(cs.std)));
        QCOMPARE(cs.absmax, want[c].absmax);
    }
    // all 16 values: sum 26, sum of squares 206 -> mean 1.625, variance 206/16 - 1.625^2
    QCOMPARE(s.all.min, -8.0f);
    QCOMPARE(s.all.max, 5.0f);
    QCOMPARE(s.all.mean, 1.625f);
    QVERIFY(std::fabs(s.all.std - float(std::sqrt(206.0 / 16 - 1.625 * 1.625))) < 1e-6f);
    QCOMPARE(s.all.absmax, 8.0f);
    // mean over channels of the variances: (1.25 + 17 + 0 + 1) / 4
    QVERIFY(closeTo(s.varianceRaw, 4.8125));

    // values are the negated keys: min/max swap, absmax stays
    const TensorStats v = computeTensorStats(kv, KvKind::Value, 0);
    QCOMPARE(v.kind, KvKind::Value);
    QCOMPARE(v.all.min, -5.0f);
    QCOMPARE(v.all.max, 8.0f);
    QCOMPARE(v.all.absmax, 8.0f);
    QCOMPARE(v.channels[1].mean, 1.0f);
}

void TestStats::varianceDeltaByGroup_data()
{
    QTest::addColumn<int>("group");
    QTest::addColumn<double>("expected");
    // group 2: deltas t1-t0, t3-t2 per channel: {1,1}, {8,0}, {0,0}, {2,2} -> variances 0,16,0,0
    // group 4: deltas against t0: {1,2,3}, {8,10,10}, {0,0,0}, {2,0,2} -> 2/3, 8/9, 0, 8/9
    QTest::newRow("group 1: every token an anchor, no deltas") << 1 << 0.0;
    QTest::newRow("group 2") << 2 << 4.0;
    QTest::newRow("group 4") << 4 << (2.0 / 3 + 8.0 / 9 + 8.0 / 9) / 4;
    QTest::newRow("group 10 longer than the tensor") << 10 << (2.0 / 3 + 8.0 / 9 + 8.0 / 9) / 4;
}

void TestStats::varianceDeltaByGroup()
{
    QFETCH(int, group);
    QFETCH(double, expected);
    StatsOptions opt;
    opt.deltaGroup = group;
    const TensorStats s = computeTensorStats(smallSet(DType::F32), KvKind::Key, 0, opt);
    QVERIFY2(closeTo(s.varianceDelta, expected), qPrintable(QString::number(s.varianceDelta, 'g', 17)));
    QVERIFY(closeTo(s.varianceRaw, 4.8125));
}

// x[t] = a + b t over 25 tokens, groups of 10: raw variance b^2 (T^2 - 1) / 12 = 52 b^2; the
// deltas are b * {1..9, 1..9, 1..4}: 22 values, sum 100 b, sum of squares 600 b^2.
void TestStats::rampVariance()
{
    const int T = 25;
    const double slopes[4] = {0.5, -1.0, 2.0, 0.25};
    const double offsets[4] = {3.0, -7.0, 0.0, 100.0};
    std::vector<std::vector<float>> cols(4, std::vector<float>(T));
    double meanB2 = 0;
    for (int c = 0; c < 4; ++c) {
        for (int t = 0; t < T; ++t) cols[size_t(c)][size_t(t)] = float(offsets[c] + slopes[c] * t);
        meanB2 += slopes[c] * slopes[c] / 4;
    }
    const TensorStats s = computeTensorStats(setFromColumns(cols), KvKind::Key, 0);
    const double rawPerB2 = (T * T - 1) / 12.0;
    const double deltaPerB2 = 600.0 / 22 - (100.0 / 22) * (100.0 / 22);
    QVERIFY2(closeTo(s.varianceRaw, meanB2 * rawPerB2), qPrintable(QString::number(s.varianceRaw)));
    QVERIFY2(closeTo(s.varianceDelta, meanB2 * deltaPerB2),
             qPrintable(QString::number(s.varianceDelta)));
    QVERIFY(s.varianceDelta < s.varianceRaw / 7);
}

// Channel 0 is 15 at every token, so with 32 bins (MAX 15) every token's scale is 1 and the
// symbols are the values themselves.
void TestStats::entropyOfKnownSymbols()
{
    const KvSet kv = setFromColumns({{15, 15, 15, 15, 15, 15, 15, 15}, {0, 0, 0, 0, 1, 1, 2, 3}});
    StatsOptions opt;
    opt.bins = 32;
    opt.deltaGroup = 1;  // no deltas: the delta figure equals the raw one
    TensorStats s = computeTensorStats(kv, KvKind::Key, 0, opt);
    // channel 0: one symbol (0 bits); channel 1: p = 1/2, 1/4, 1/8, 1/8 (1.75 bits)
    QVERIFY2(closeTo(s.entropyBits, (0.0 + 1.75) / 2), qPrintable(QString::number(s.entropyBits)));
    QVERIFY(closeTo(s.entropyBitsDelta, s.entropyBits));

    // Groups of 2: anchors t0, t2, t4, t6 keep their symbols (ch0 15, ch1 0 0 1 2); the other
    // tokens code x - anchor: t1, t3, t5 are all-zero tokens (symbols 0), t7 is (0, 1), which its
    // own scale maps to (0, 15). Channel 0: {15, 0} x 4 -> 1 bit; channel 1: {0 x5, 1, 2, 15}.
    opt.deltaGroup = 2;
    s = computeTensorStats(kv, KvKind::Key, 0, opt);
    QVERIFY(closeTo(s.entropyBits, 0.875));
    const double expected = (1.0 + entropyOfCounts({5, 1, 1, 1})) / 2;
    QVERIFY2(closeTo(s.entropyBitsDelta, expected), qPrintable(QString::number(s.entropyBitsDelta)));

    // 4 bins (MAX 1): ch1 / 15 rounds to 0 everywhere, ch0 is always 1 -> 0 bits in both
    opt.bins = 4;
    opt.deltaGroup = 1;
    s = computeTensorStats(kv, KvKind::Key, 0, opt);
    QVERIFY(closeTo(s.entropyBits, 0.0));
}

// Deltas are taken against the anchor as the decoder will see it (quantized, then dequantized);
// against the raw anchor the second token would be all zeros.
void TestStats::deltaUsesReconstructedAnchor()
{
    const KvSet kv = setFromColumns({{1.0f, 1.0f}, {0.4f, 0.4f}});
    StatsOptions opt;
    opt.bins = 4;  // MAX 1: the anchor's 0.4 reconstructs as 0
    opt.deltaGroup = 2;
    const TensorStats s = computeTensorStats(kv, KvKind::Key, 0, opt);
    // raw symbols: ch0 {1, 1}, ch1 {0, 0} -> 0 bits each
    QVERIFY(closeTo(s.entropyBits, 0.0));
    // t1 codes (0, 0.4) with its own scale -> (0, 1): ch0 {1, 0}, ch1 {0, 1} -> 1 bit each
    QVERIFY2(closeTo(s.entropyBitsDelta, 1.0), qPrintable(QString::number(s.entropyBitsDelta)));
    QVERIFY(closeTo(s.varianceDelta, 0.0));  // the variance figure uses raw values
}

void TestStats::allZeroTensor()
{
    const KvSet kv(KvShape{2, 2, 4, 16}, DType::F16);
    for (const TensorStats& s : computeAllStats(kv)) {
        QCOMPARE(s.all.min, 0.0f);
        QCOMPARE(s.all.max, 0.0f);
        QCOMPARE(s.all.std, 0.0f);
        QCOMPARE(s.varianceRaw, 0.0);
        QCOMPARE(s.varianceDelta, 0.0);
        QCOMPARE(s.entropyBits, 0.0);  // all-zero tokens quantize to symbol 0, no NaN
        QCOMPARE(s.entropyBitsDelta, 0.0);
        QVERIFY(s.outlierChannels.empty());
    }
    const Histogram h = computeHistogram(kv, KvKind::Value, 1, -1, 5);
    QCOMPARE(h.lo, -0.5);
    QCOMPARE(h.hi, 0.5);
    QCOMPARE(h.counts, (std::vector<uint64_t>{0, 0, 128, 0, 0}));
}

void TestStats::histogram_data()
{
    // The small set's keys: {1,2,3,4}, {-8,0,2,2}, {5,5,5,5}, {-1,1,-1,1}.
    QTest::addColumn<int>("channel");
    QTest::addColumn<int>("bins");
    QTest::addColumn<double>("lo");
    QTest::addColumn<double>("hi");
    QTest::addColumn<double>("wantLo");
    QTest::addColumn<double>("wantHi");
    QTest::addColumn<QList<int>>("counts");
    QTest::addColumn<int>("below");
    QTest::addColumn<int>("above");
    // width 1 from -8; 5 == hi lands in the last bin with the 4
    QTest::newRow("whole tensor, data range")
        << -1 << 13 << 0.0 << 0.0 << -8.0 << 5.0
        << QList<int>{1, 0, 0, 0, 0, 0, 0, 2, 1, 3, 3, 1, 5} << 0 << 0;
    QTest::newRow("whole tensor, given range [0, 4]")
        << -1 << 4 << 0.0 << 4.0 << 0.0 << 4.0 << QList<int>{1, 3, 3, 2} << 3 << 4;
    QTest::newRow("channel 1, data range") << 1 << 2 << 0.0 << 0.0 << -8.0 << 2.0
                                           << QList<int>{1, 3} << 0 << 0;
    QTest::newRow("channel 2, constant") << 2 << 1 << 0.0 << 0.0 << 4.5 << 5.5 << QList<int>{4}
                                         << 0 << 0;
    QTest::newRow("channel 3, range excludes all") << 3 << 3 << 10.0 << 20.0 << 10.0 << 20.0
                                                   << QList<int>{0, 0, 0} << 4 << 0;
}

void TestStats::histogram()
{
    QFETCH(int, channel);
    QFETCH(int, bins);
    QFETCH(double, lo);
    QFETCH(double, hi);
    QFETCH(double, wantLo);
    QFETCH(double, wantHi);
    QFETCH(QList<int>, counts);
    QFETCH(int, below);
    QFETCH(int, above);
    const Histogram h = computeHistogram(smallSet(DType::F16), KvKind::Key, 0, channel, bins, lo, hi);
    QCOMPARE(h.lo, wantLo);
    QCOMPARE(h.hi, wantHi);
    QList<int> got;
    for (uint64_t c : h.counts) got << int(c);
    QCOMPARE(got, counts);
    QCOMPARE(int(h.below), below);
    QCOMPARE(int(h.above), above);
}

void TestStats::histogramSkipsNaN()
{
    KvSet kv = setFromColumns({{1.0f, std::nanf(""), 3.0f, INFINITY, -INFINITY, 2.0f}});
    const Histogram h = computeHistogram(kv, KvKind::Key, 0, 0, 2);
    QCOMPARE(h.lo, 1.0);  // finite values only
    QCOMPARE(h.hi, 3.0);
    QCOMPARE(h.counts, (std::vector<uint64_t>{1, 2}));
    QCOMPARE(h.below, uint64_t(1));
    QCOMPARE(h.above, uint64_t(1));
}

void TestStats::outliersOnSyntheticKv()
{
    SyntheticSpec spec;
    spec.shape = KvShape{3, 4, 64, 256};
    spec.outlierChannelsPerHead = 2;
    const KvSet kv = makeSyntheticKv(spec);
    for (int l = 0; l < 3; ++l) {
        const TensorStats k = computeTensorStats(kv, KvKind::Key, l);
        QCOMPARE(int(k.outlierChannels.size()), 4 * 2);
        std::vector<float> absmax;
        for (const ChannelStats& c : k.channels) absmax.push_back(c.absmax);
        std::vector<float> sorted = absmax;
        std::sort(sorted.begin(), sorted.end());
        const float median = 0.5f * (sorted[127] + sorted[128]);
        int perHead[4] = {0, 0, 0, 0};
        for (size_t i = 0; i < k.outlierChannels.size(); ++i) {
            const int c = k.outlierChannels[i];
            QVERIFY(absmax[size_t(c)] > 6.0f * median);
            if (i > 0) QVERIFY(absmax[size_t(c)] <= absmax[size_t(k.outlierChannels[i - 1])]);
            ++perHead[c / 64];
        }
        for (int h = 0; h < 4; ++h) QCOMPARE(perHead[h], 2);
        QCOMPARE(k.outlierChannels.front(),
                 int(std::max_element(absmax.begin(), absmax.end()) - absmax.begin()));
        QVERIFY(computeTensorStats(kv, KvKind::Value, l).outlierChannels.empty());
        // a stricter factor finds fewer, a lax one more
        StatsOptions opt;
        opt.outlierFactor = 1.0f;
        QVERIFY(computeTensorStats(kv, KvKind::Key, l, opt).outlierChannels.size() > 8);
    }
}

// Synthetic channels are AR(1) with coefficient rho: a delta j tokens after its anchor has
// variance 2 sigma^2 (1 - rho^j), so with groups of g the delta/raw variance ratio is
// 2 (1 - mean_{j=1..g-1} rho^j).
void TestStats::localityMatchesAr1Theory()
{
    SyntheticSpec spec;
    spec.shape = KvShape{2, 4, 64, 8000};
    spec.dtype = DType::F32;
    spec.keyCorrelation = 0.95f;
    spec.valueCorrelation = 0.6f;
    const KvSet kv = makeSyntheticKv(spec);
    const int g = 10;
    for (KvKind kind : {KvKind::Key, KvKind::Value}) {
        const double rho = kind == KvKind::Key ? 0.95 : 0.6;
        double meanPow = 0;
        for (int j = 1; j < g; ++j) meanPow += std::pow(rho, j) / (g - 1);
        const double theory = 2 * (1 - meanPow);
        for (int l = 0; l < 2; ++l) {
            const TensorStats s = computeTensorStats(kv, kind, l);
            const double ratio = s.varianceDelta / s.varianceRaw;
            QVERIFY2(std::fabs(ratio / theory - 1) < 0.08,
                     qPrintable(QString("%1: ratio %2, theory %3").arg(kindName(kind)).arg(ratio).arg(theory)));
        }
    }
}

void TestStats::allStatsMatchPerTensor()
{
    SyntheticSpec spec;
    spec.shape = KvShape{5, 2, 32, 100};
    const KvSet kv = makeSyntheticKv(spec);
    const std::vector<TensorStats> all = computeAllStats(kv);
    QCOMPARE(int(all.size()), 10);
    for (int l = 0; l < 5; ++l)
        for (KvKind kind : {KvKind::Key, KvKind::Value}) {
            const TensorStats& a = all[2 * size_t(l) + size_t(kind)];
            const TensorStats b = computeTensorStats(kv, kind, l);
            QCOMPARE(a.kind, kind);
            QCOMPARE(a.layer, l);
            QCOMPARE(a.all.mean, b.all.mean);
            QCOMPARE(a.all.std, b.all.std);
            QCOMPARE(a.varianceRaw, b.varianceRaw);
            QCOMPARE(a.varianceDelta, b.varianceDelta);
            QCOMPARE(a.entropyBits, b.entropyBits);
            QCOMPARE(a.entropyBitsDelta, b.entropyBitsDelta);
            QCOMPARE(a.outlierChannels, b.outlierChannels);
            QCOMPARE(a.channels.size(), b.channels.size());
            for (size_t c = 0; c < a.channels.size(); ++c) QCOMPARE(a.channels[c].std, b.channels[c].std);
        }
    QVERIFY(computeAllStats(KvSet()).empty());
}

void TestStats::refusesBadArguments_data()
{
    QTest::addColumn<std::function<void()>>("call");
    QTest::addColumn<QString>("reason");
    const auto kv = std::make_shared<KvSet>(smallSet(DType::F32));
    auto withOpt = [kv](int group, int bins, float factor) {
        return std::function<void()>([=] {
            StatsOptions o;
            o.deltaGroup = group;
            o.bins = bins;
            o.outlierFactor = factor;
            computeTensorStats(*kv, KvKind::Key, 0, o);
        });
    };
    QTest::newRow("deltaGroup 0") << withOpt(0, 32, 6) << "deltaGroup 0";
    QTest::newRow("bins 3") << withOpt(10, 3, 6) << "bins 3";
    QTest::newRow("bins 70000") << withOpt(10, 70000, 6) << "bins 70000";
    QTest::newRow("outlierFactor 0") << withOpt(10, 32, 0) << "outlierFactor";
    QTest::newRow("all stats, bad options")
        << std::function<void()>([kv] {
               StatsOptions o;
               o.bins = 2;
               computeAllStats(*kv, o);
           })
        << "bins 2";
    QTest::newRow("layer out of range")
        << std::function<void()>([kv] { computeTensorStats(*kv, KvKind::Key, 1); }) << "layer 1";
    QTest::newRow("negative layer")
        << std::function<void()>([kv] { computeTensorStats(*kv, KvKind::Value, -1); }) << "layer -1";
    QTest::newRow("histogram channel 4 of 4")
        << std::function<void()>([kv] { computeHistogram(*kv, KvKind::Key, 0, 4, 10); })
        << "channel 4";
    QTest::newRow("histogram channel -2")
        << std::function<void()>([kv] { computeHistogram(*kv, KvKind::Key, 0, -2, 10); })
        << "channel -2";
    QTest::newRow("histogram 0 bins")
        << std::function<void()>([kv] { computeHistogram(*kv, KvKind::Key, 0, -1, 0); })
        << "numBins 0";
    QTest::newRow("histogram lo > hi")
        << std::function<void()>([kv] { computeHistogram(*kv, KvKind::Key, 0, -1, 4, 2.0, 1.0); })
        << "not a finite interval";
    QTest::newRow("histogram NaN bound")
        << std::function<void()>([kv] { computeHistogram(*kv, KvKind::Key, 0, -1, 4, std::nan(""), 1.0); })
        << "not a finite interval";
    QTest::newRow("histogram layer 3")
        << std::function<void()>([kv] { computeHistogram(*kv, KvKind::Key, 3, -1, 4); }) << "layer 3";
}

void TestStats::refusesBadArguments()
{
    QFETCH(std::function<void()>, call);
    QFETCH(QString, reason);
    try {
        call();
        QFAIL("no exception");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).contains(reason), e.what());
    }
}

// The figures the GUI and the CLI both print: median channel absmax (mean of the middle two for
// an even count) and locality as summed raw variance over summed delta variance.
void TestStats::sharedFigures()
{
    kvscope::TensorStats t;
    for (float a : {4.0f, 1.0f, 3.0f, 2.0f}) {
        kvscope::ChannelStats c;
        c.absmax = a;
        t.channels.push_back(c);
    }
    QCOMPARE(kvscope::medianChannelAbsmax(t), 2.5);
    t.channels.pop_back();  // 4, 1, 3
    QCOMPARE(kvscope::medianChannelAbsmax(t), 3.0);
    QCOMPARE(kvscope::medianChannelAbsmax(kvscope::TensorStats{}), 0.0);

    kvscope::TensorStats k0, k1, v0;
    k0.kind = k1.kind = kvscope::KvKind::Key;
    v0.kind = kvscope::KvKind::Value;
    k0.varianceRaw = 6, k0.varianceDelta = 2;   // 3x
    k1.varianceRaw = 1, k1.varianceDelta = 1;   // 1x
    v0.varianceRaw = 1, v0.varianceDelta = 4;   // 0.25x
    QCOMPARE(kvscope::localityRatio(k0), 3.0);
    const std::vector<kvscope::TensorStats> all{k0, k1, v0};
    QCOMPARE(kvscope::localityRatio(all, kvscope::KvKind::Key), 7.0 / 3.0);  // not the mean of 3 and 1
    QCOMPARE(kvscope::localityRatio(all, kvscope::KvKind::Value), 0.25);
    QCOMPARE(kvscope::localityRatio(all), 8.0 / 7.0);
    kvscope::TensorStats flat;
    QCOMPARE(kvscope::localityRatio(flat), 0.0);
    flat.varianceRaw = 1;
    QVERIFY(std::isinf(kvscope::localityRatio(flat)));
}

KVSCOPE_TEST_MAIN(TestStats)
#include "tst_stats.moc"
