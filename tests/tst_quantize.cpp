// CacheGen quantizers (core/codec/quantize.h): per-token and per-channel scales, delta coding
// against the reconstructed anchor, fp16 scales rounded up, zero blocks and non-finite input.
#include "testmain.h"

#include "codec/quantize.h"
#include "codec/simd_path.h"
#include "common/error.h"
#include "common/half.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace kvscope;
using quant::BlockSpec;

namespace {

constexpr int kHeads = 2, kTokens = 37, kHeadDim = 16;  // 37: the last delta group is short

// A block shaped like KV: smooth along tokens, per-channel offsets, one loud channel per head,
// token magnitudes spread over two decades, and some exact zeros:
//  - token 20 (an anchor when the group is 10 or 4 or 2) and token 23 (never an anchor) are zero;
//  - channel 3 of head 1 is zero at every token.
std::vector<float> makeBlock(uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> x(size_t(kHeads) * kTokens * kHeadDim);
    for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kHeadDim; ++d) {
            const float offset = n01(rng) * 0.5f + (d == 5 ? 15.0f : 0.0f);
            float s = n01(rng);
            for (int t = 0; t < kTokens; ++t) {
                s = 0.9f * s + 0.43f * n01(rng);
                const float gain = t % 7 == 3 ? 20.0f : (t % 5 == 1 ? 0.1f : 1.0f);
                x[(size_t(h) * kTokens + t) * kHeadDim + d] = (offset + s) * gain;
            }
        }
    for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kHeadDim; ++d) {
            x[(size_t(h) * kTokens + 20) * kHeadDim + d] = 0.0f;
            x[(size_t(h) * kTokens + 23) * kHeadDim + d] = 0.0f;
        }
    for (int t = 0; t < kTokens; ++t) x[(size_t(1) * kTokens + t) * kHeadDim + 3] = 0.0f;
    return x;
}

BlockSpec spec(Quantizer q, int bins, int anchorBins, int deltaGroup)
{
    BlockSpec b;
    b.heads = kHeads;
    b.tokens = kTokens;
    b.headDim = kHeadDim;
    b.quantizer = q;
    b.bins = bins;
    b.anchorBins = anchorBins;
    b.deltaGroup = deltaGroup;
    return b;
}

// The scale that governs value (h, t, d) under the header's layout of scales.
float scaleOf(const BlockSpec& b, const std::vector<uint16_t>& scales, int h, int t, int d)
{
    if (b.quantizer == Quantizer::PerToken) return halfToFloat(scales[size_t(t)]);
    const int c = h * b.headDim + d;
    return halfToFloat(scales[size_t((b.isAnchor(t) ? b.channels() : 0) + c)]);
}

}  // namespace

class TestQuantize : public QObject {
    Q_OBJECT
private slots:
    void errorWithinHalfAStep_data();
    void errorWithinHalfAStep();
    void zeroBlockDecodesToZeros_data();
    void zeroBlockDecodesToZeros();
    void scaleForRoundsUp_data();
    void scaleForRoundsUp();
    void scaleForRefusesHugeValues();
    void nonFiniteInputThrows_data();
    void nonFiniteInputThrows();
    void blockSpecLayout();
    void simdPathsAgree_data();
    void simdPathsAgree();
    void simdPathsRefuseNonFinite();
};

void TestQuantize::errorWithinHalfAStep_data()
{
    QTest::addColumn<int>("quantizer");
    QTest::addColumn<int>("bins");
    QTest::addColumn<int>("anchorBins");
    QTest::addColumn<int>("deltaGroup");

    for (int q : {0, 1}) {
        const char* qn = q == 0 ? "token" : "channel";
        for (int bins : {4, 6, 8, 12, 16, 32, 64, 128, 256}) {
            QTest::addRow("%s bins %d no delta", qn, bins) << q << bins << bins << 0;
            QTest::addRow("%s bins %d delta 10", qn, bins) << q << bins << bins << 10;
        }
        QTest::addRow("%s bins 16 anchor 64 delta 10", qn) << q << 16 << 64 << 10;
        QTest::addRow("%s bins 32 anchor 8 delta 4", qn) << q << 32 << 8 << 4;
        QTest::addRow("%s bins 12 delta 2", qn) << q << 12 << 12 << 2;
        QTest::addRow("%s bins 32 one group over the block", qn) << q << 32 << 32 << kTokens;
    }
}

// |x - dequantize(quantize(x))| <= scale / 2 for every value, anchor or not, at every position of
// a delta group: the delta is taken against the anchor as the decoder will see it, so the error
// does not grow along the group.
void TestQuantize::errorWithinHalfAStep()
{
    QFETCH(int, quantizer);
    QFETCH(int, bins);
    QFETCH(int, anchorBins);
    QFETCH(int, deltaGroup);
    const BlockSpec b = spec(Quantizer(quantizer), bins, anchorBins, deltaGroup);
    const std::vector<float> x = makeBlock(uint64_t(bins * 7 + deltaGroup));

    std::vector<uint8_t> sym(x.size(), 0xee);
    std::vector<uint16_t> scales(size_t(b.numScales()), 0xdead);
    quant::quantizeBlock(b, x.data(), sym.data(), scales.data());
    std::vector<float> out(x.size(), std::numeric_limits<float>::quiet_NaN());
    quant::dequantizeBlock(b, sym.data(), scales.data(), out.data());

    const int group = deltaGroup >= 2 ? deltaGroup : 1;
    std::vector<double> worstRatio(size_t(group), 0.0);  // max error / (scale / 2) per group position
    for (int h = 0; h < kHeads; ++h)
        for (int t = 0; t < kTokens; ++t)
            for (int d = 0; d < kHeadDim; ++d) {
                const size_t i = (size_t(h) * kTokens + t) * kHeadDim + d;
                const int maxL = quant::maxLevel(b.binsFor(t));
                QVERIFY2(int(sym[i]) <= 2 * maxL,
                         qPrintable(QString("symbol %1 outside 0..%2 at (%3,%4,%5)").arg(sym[i]).arg(2 * maxL).arg(h).arg(t).arg(d)));
                const float s = scaleOf(b, scales, h, t, d);
                QVERIFY(std::isfinite(s) && s >= 0.0f);
                const double err = std::fabs(double(out[i]) - double(x[i]));
                // Float rounding of the delta, the product and the sum: a few ulps of the magnitudes.
                double anchorMag = 0;
                if (deltaGroup >= 2 && !b.isAnchor(t))
                    anchorMag = std::fabs(out[(size_t(h) * kTokens + (t - t % deltaGroup)) * kHeadDim + d]);
                const double slack = 4.0 * std::numeric_limits<float>::epsilon() *
                                     (std::fabs(x[i]) + anchorMag + double(s) * maxL);
                if (err > 0.5 * double(s) + slack)
                    QFAIL(qPrintable(QString("(%1,%2,%3)%4: x %5 decoded %6, error %7 > scale/2 = %8")
                                         .arg(h).arg(t).arg(d)
                                         .arg(b.isAnchor(t) ? " anchor" : "")
                                         .arg(double(x[i]), 0, 'g', 9)
                                         .arg(double(out[i]), 0, 'g', 9)
                                         .arg(err, 0, 'g', 6)
                                         .arg(0.5 * double(s), 0, 'g', 6)));
                if (s > 0) {
                    double& w = worstRatio[size_t(t % group)];
                    w = std::max(w, err / (0.5 * double(s)));
                }
            }
    // Every position in the group, the last as well as the first after the anchor, stays within
    // half a step of its own scale.
    for (int k = 0; k < group; ++k)
        QVERIFY2(worstRatio[size_t(k)] <= 1.0 + 1e-4,
                 qPrintable(QString("group position %1: worst error %2 x scale/2").arg(k).arg(worstRatio[size_t(k)])));

    // The zero tokens of the block: a zero token with no delta (or as an anchor) has scale 0 and
    // decodes to exact zeros; so does the channel that is zero everywhere, with or without delta.
    for (int t : {20, 23}) {
        const bool exact = deltaGroup < 2 || b.isAnchor(t);
        if (!exact) continue;
        if (quantizer == int(Quantizer::PerToken)) QCOMPARE(scales[size_t(t)], uint16_t(0));
        for (int h = 0; h < kHeads; ++h)
            for (int d = 0; d < kHeadDim; ++d) {
                const float v = out[(size_t(h) * kTokens + t) * kHeadDim + d];
                QVERIFY2(v == 0.0f,
                         qPrintable(QString("token %1 (%2,%3) decoded %4").arg(t).arg(h).arg(d).arg(double(v))));
            }
    }
    if (quantizer == int(Quantizer::PerChannel)) {
        const int c = 1 * kHeadDim + 3;
        QCOMPARE(scales[size_t(c)], uint16_t(0));
        if (deltaGroup >= 2) QCOMPARE(scales[size_t(b.channels() + c)], uint16_t(0));
        for (int t = 0; t < kTokens; ++t) QCOMPARE(out[(size_t(1) * kTokens + t) * kHeadDim + 3], 0.0f);
    }
}

void TestQuantize::zeroBlockDecodesToZeros_data()
{
    QTest::addColumn<int>("quantizer");
    QTest::addColumn<int>("deltaGroup");
    QTest::newRow("token") << 0 << 0;
    QTest::newRow("token delta") << 0 << 10;
    QTest::newRow("channel") << 1 << 0;
    QTest::newRow("channel delta") << 1 << 10;
}

// CacheGen computes x * MAX / absmax: an all-zero token gives 0/0 = NaN there. Ours: zeros.
void TestQuantize::zeroBlockDecodesToZeros()
{
    QFETCH(int, quantizer);
    QFETCH(int, deltaGroup);
    const BlockSpec b = spec(Quantizer(quantizer), 32, 32, deltaGroup);
    const std::vector<float> x(size_t(kHeads) * kTokens * kHeadDim, 0.0f);
    std::vector<uint8_t> sym(x.size());
    std::vector<uint16_t> scales(size_t(b.numScales()), 0xffff);
    quant::quantizeBlock(b, x.data(), sym.data(), scales.data());
    for (uint16_t s : scales) QCOMPARE(s, uint16_t(0));
    for (uint8_t s : sym) QCOMPARE(int(s), quant::maxLevel(32));  // the zero symbol
    std::vector<float> out(x.size(), 1.0f);
    quant::dequantizeBlock(b, sym.data(), scales.data(), out.data());
    for (float v : out) QCOMPARE(v, 0.0f);
}

void TestQuantize::scaleForRoundsUp_data()
{
    QTest::addColumn<int>("bins");
    for (int bins : {4, 8, 12, 16, 32, 64, 128, 256}) QTest::addRow("bins %d", bins) << bins;
}

// The stored fp16 scale is the smallest fp16 s with absmax / s <= MAX, so the largest value
// never clamps; 0 for an all-zero block.
void TestQuantize::scaleForRoundsUp()
{
    QFETCH(int, bins);
    const int maxL = quant::maxLevel(bins);
    QCOMPARE(quant::scaleFor(0.0f, maxL), uint16_t(0));
    QCOMPARE(quant::scaleFor(-0.0f, maxL), uint16_t(0));

    std::mt19937_64 rng{uint64_t(bins)};
    std::vector<float> values = {1.0f, float(maxL), 0.5f, 3.14159f, 1e-6f, 6e-8f, 1e-3f, 65504.0f, 1000.0f * maxL};
    for (int i = 0; i < 2000; ++i) values.push_back(std::ldexp(float(rng() % 100000 + 1) / 100000.0f, int(rng() % 30) - 20));
    // Exactly representable products: absmax = fp16 value * MAX must give that fp16 value back.
    for (uint16_t h : {uint16_t(0x3c00), uint16_t(0x3555), uint16_t(0x0001), uint16_t(0x0400), uint16_t(0x5000)})
        values.push_back(halfToFloat(h) * float(maxL));

    for (float absmax : values) {
        const uint16_t h = quant::scaleFor(absmax, maxL);
        const double s = double(halfToFloat(h));
        QVERIFY2((h & 0x8000u) == 0 && (h & 0x7c00u) != 0x7c00u, qPrintable(QString("0x%1").arg(h, 4, 16)));
        QVERIFY2(s * maxL >= double(absmax),
                 qPrintable(QString("absmax %1 / scale %2 = %3 > MAX %4: the largest value would clamp")
                                .arg(double(absmax), 0, 'g', 9).arg(s, 0, 'g', 9).arg(double(absmax) / s, 0, 'g', 9).arg(maxL)));
        // The next fp16 down would not hold absmax: rounded up by at most one fp16 step.
        if (h > 1) {
            const double below = double(halfToFloat(uint16_t(h - 1)));
            QVERIFY2(below * maxL < double(absmax),
                     qPrintable(QString("absmax %1: scale %2 is not the smallest (%3 fits)").arg(double(absmax), 0, 'g', 9).arg(s).arg(below)));
        }
    }
    QCOMPARE(quant::scaleFor(halfToFloat(0x3c00) * float(maxL), maxL), uint16_t(0x3c00));
}

void TestQuantize::scaleForRefusesHugeValues()
{
    // 65504 * 1 is the largest absmax bins=4 can hold with a finite fp16 scale.
    QCOMPARE(quant::scaleFor(65504.0f, 1), uint16_t(0x7bff));
    QVERIFY_THROWS_EXCEPTION(Error, quant::scaleFor(65600.0f, 1));
    QVERIFY_THROWS_EXCEPTION(Error, quant::scaleFor(1e30f, 127));

    // The same through quantizeBlock: a value fp16 cannot scale is an Error, not garbage.
    const BlockSpec b = spec(Quantizer::PerToken, 4, 4, 0);
    std::vector<float> x(size_t(kHeads) * kTokens * kHeadDim, 1.0f);
    x[5] = 1e9f;
    std::vector<uint8_t> sym(x.size());
    std::vector<uint16_t> scales(size_t(b.numScales()));
    QVERIFY_THROWS_EXCEPTION(Error, quant::quantizeBlock(b, x.data(), sym.data(), scales.data()));
}

void TestQuantize::nonFiniteInputThrows_data()
{
    QTest::addColumn<int>("quantizer");
    QTest::addColumn<int>("deltaGroup");
    QTest::addColumn<int>("token");
    QTest::addColumn<float>("value");
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    QTest::newRow("token NaN") << 0 << 0 << 3 << nan;
    QTest::newRow("token NaN in an anchor") << 0 << 10 << 10 << nan;
    QTest::newRow("token NaN after an anchor") << 0 << 10 << 13 << nan;
    QTest::newRow("token +inf") << 0 << 0 << 36 << inf;
    QTest::newRow("token -inf delta") << 0 << 10 << 36 << -inf;
    QTest::newRow("channel NaN") << 1 << 0 << 3 << nan;
    QTest::newRow("channel NaN in an anchor") << 1 << 10 << 0 << nan;
    QTest::newRow("channel NaN after an anchor") << 1 << 10 << 21 << nan;
    QTest::newRow("channel inf") << 1 << 0 << 36 << inf;
}

void TestQuantize::nonFiniteInputThrows()
{
    QFETCH(int, quantizer);
    QFETCH(int, deltaGroup);
    QFETCH(int, token);
    QFETCH(float, value);
    const BlockSpec b = spec(Quantizer(quantizer), 32, 32, deltaGroup);
    std::vector<float> x = makeBlock(3);
    x[(size_t(1) * kTokens + token) * kHeadDim + 7] = value;
    std::vector<uint8_t> sym(x.size());
    std::vector<uint16_t> scales(size_t(b.numScales()));
    try {
        quant::quantizeBlock(b, x.data(), sym.data(), scales.data());
        QFAIL("a non-finite value was quantized without an error");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).contains("not finite"), e.what());
    }
}

// The scale counts and symbol ranges the container format relies on.
void TestQuantize::blockSpecLayout()
{
    QCOMPARE(quant::maxLevel(32), 15);
    QCOMPARE(quant::alphabetSize(32), 31);
    QCOMPARE(quant::alphabetSize(4), 3);
    QCOMPARE(quant::alphabetSize(256), 255);
    BlockSpec b = spec(Quantizer::PerToken, 16, 64, 10);
    QCOMPARE(b.numScales(), kTokens);
    QVERIFY(b.isAnchor(0) && b.isAnchor(10) && b.isAnchor(30) && !b.isAnchor(9) && !b.isAnchor(31));
    QCOMPARE(b.binsFor(10), 64);
    QCOMPARE(b.binsFor(11), 16);
    b.quantizer = Quantizer::PerChannel;
    QCOMPARE(b.numScales(), 2 * kHeads * kHeadDim);
    b.deltaGroup = 0;
    QCOMPARE(b.numScales(), kHeads * kHeadDim);
    QVERIFY(!b.isAnchor(0));
    QCOMPARE(b.binsFor(0), 16);
}


void TestQuantize::simdPathsAgree_data()
{
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("headDim");
    QTest::addColumn<int>("bins");
    QTest::addColumn<int>("delta");
    QTest::addColumn<bool>("ties");
    QTest::newRow("3x64 32 bins delta 10") << 3 << 64 << 32 << 10 << false;
    QTest::newRow("3x64 16 bins no delta") << 3 << 64 << 16 << 0 << false;
    QTest::newRow("2x5 256 bins delta 4 (tails only)") << 2 << 5 << 256 << 4 << false;
    QTest::newRow("3x21 4 bins delta 2 (16 + tail)") << 3 << 21 << 4 << 2 << false;
    QTest::newRow("2x16 32 bins, exact half-step ties") << 2 << 16 << 32 << 0 << true;
}

// The AVX2 and AVX-512 quantiser rows (per-token scales) give the scalar reference's bytes.
void TestQuantize::simdPathsAgree()
{
    QFETCH(int, heads);
    QFETCH(int, headDim);
    QFETCH(int, bins);
    QFETCH(int, delta);
    QFETCH(bool, ties);
    BlockSpec b;
    b.heads = heads, b.tokens = 41, b.headDim = headDim, b.bins = bins, b.anchorBins = bins, b.deltaGroup = delta;
    b.quantizer = Quantizer::PerToken;
    std::mt19937_64 rng(uint64_t(heads * 1000 + headDim * 10 + bins));
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> x(size_t(heads) * b.tokens * headDim);
    const int maxL = quant::maxLevel(bins);
    for (size_t i = 0; i < x.size(); ++i) {
        // Ties: a token's absmax is maxL * 0.5 (fp16-exact scale 0.5), every other value an odd
        // multiple of 0.25, so x / scale lands exactly halfway between two levels.
        x[i] = ties ? (i % 7 == 0 ? float(maxL) * 0.5f : 0.25f * float(2 * int(rng() % size_t(maxL + 1)) - maxL))
                    : n01(rng) * (i % 11 == 0 ? 8.0f : 1.0f);
    }
    if (ties)
        for (int h = 0; h < heads; ++h)
            for (int t = 0; t < b.tokens; ++t) x[(size_t(h) * b.tokens + t) * headDim] = float(maxL) * 0.5f;
    const SimdPath saved = simdPath();
    setSimdPath(SimdPath::Scalar);
    std::vector<uint8_t> ref(x.size());
    std::vector<uint16_t> refScales(size_t(b.numScales()));
    quant::quantizeBlock(b, x.data(), ref.data(), refScales.data());
    int compared = 0;
    for (SimdPath p : {SimdPath::Avx2, SimdPath::Avx512}) {
        if (!simdPathSupported(p)) continue;
        setSimdPath(p);
        std::vector<uint8_t> sym(x.size());
        std::vector<uint16_t> scales(size_t(b.numScales()));
        quant::quantizeBlock(b, x.data(), sym.data(), scales.data());
        QVERIFY2(sym == ref, simdPathName(p));
        QVERIFY2(scales == refScales, simdPathName(p));
        ++compared;
    }
    setSimdPath(saved);
    if (ties) {  // x / scale = k + 1/2 rounds to the even level: 0.25 -> 0, 0.75 -> 2, -0.75 -> -2
        QCOMPARE(halfToFloat(refScales[0]), 0.5f);
        int seen = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            const int want = x[i] == 0.25f ? 0 : x[i] == 0.75f ? 2 : x[i] == -0.75f ? -2 : 99;
            if (want == 99) continue;
            QCOMPARE(int(ref[i]) - maxL, want);
            ++seen;
        }
        QVERIFY(seen > 10);
    }
    if (compared == 0) QSKIP("this CPU has no AVX2");
}

// A NaN or infinity in the vector part or in the tail of a row is refused on every path.
void TestQuantize::simdPathsRefuseNonFinite()
{
    BlockSpec b;
    b.heads = 1, b.tokens = 2, b.headDim = 37, b.bins = 32, b.anchorBins = 32, b.deltaGroup = 0;
    const SimdPath saved = simdPath();
    for (SimdPath p : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {
        if (!simdPathSupported(p)) continue;
        setSimdPath(p);
        for (int at : {3, 20, 36, 37 + 35})
            for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
                std::vector<float> x(size_t(b.tokens) * b.headDim, 0.5f);
                x[size_t(at)] = bad;
                std::vector<uint8_t> sym(x.size());
                std::vector<uint16_t> scales(size_t(b.numScales()));
                QVERIFY_THROWS_EXCEPTION(Error, quant::quantizeBlock(b, x.data(), sym.data(), scales.data()));
            }
    }
    setSimdPath(saved);
}

KVSCOPE_TEST_MAIN(TestQuantize)
#include "tst_quantize.moc"
