// fp16 and bf16 conversions (core/common/half.h): every bit pattern, every rounding midpoint.
#include "testmain.h"

#include "common/half.h"

#include <cmath>
#include <limits>
#include <vector>

using namespace kvscope;

namespace {

// Value of an fp16 bit pattern computed independently of halfToFloat: (-1)^s * m * 2^(e-25).
double referenceHalf(uint16_t h)
{
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0)
        v = std::ldexp(double(man), -24);
    else if (exp == 31)
        v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else
        v = std::ldexp(double(1024 + man), exp - 25);
    return sign ? -v : v;
}

bool isHalfNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool isBf16Nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

}  // namespace

class TestHalf : public QObject {
    Q_OBJECT
private slots:
    void halfEveryPatternRoundTrips();
    void halfMidpointsRoundToEven();
    void halfRounding_data();
    void halfRounding();
    void bf16EveryPatternRoundTrips();
    void bf16MidpointsRoundToEven();
    void bf16Rounding_data();
    void bf16Rounding();
    void bulkMatchesScalar_data();
    void bulkMatchesScalar();
};

void TestHalf::halfEveryPatternRoundTrips()
{
    int nans = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t h = uint16_t(i);
        const float f = halfToFloat(h);
        const double ref = referenceHalf(h);
        if (isHalfNan(h)) {
            ++nans;
            QVERIFY2(std::isnan(f), qPrintable(QString("0x%1 should be NaN").arg(i, 4, 16)));
            const uint16_t back = floatToHalf(f);
            QVERIFY2(isHalfNan(back), qPrintable(QString("0x%1 lost its NaN").arg(i, 4, 16)));
            QCOMPARE(back & 0x8000u, h & 0x8000u);
            continue;
        }
        if (double(f) != ref)
            QFAIL(qPrintable(QString("halfToFloat(0x%1) = %2, expected %3")
                                 .arg(i, 4, 16, QChar('0'))
                                 .arg(double(f), 0, 'g', 17)
                                 .arg(ref, 0, 'g', 17)));
        const uint16_t back = floatToHalf(f);
        if (back != h)
            QFAIL(qPrintable(QString("floatToHalf(halfToFloat(0x%1)) = 0x%2")
                                 .arg(i, 4, 16, QChar('0'))
                                 .arg(back, 4, 16, QChar('0'))));
    }
    QCOMPARE(nans, 2 * 1023);
}

// Between every pair of neighbouring finite fp16 values (and 65504 -> infinity) the exact midpoint
// goes to the even neighbour, and one float ulp either side goes to the nearer one.
void TestHalf::halfMidpointsRoundToEven()
{
    for (uint16_t h = 0; h < 0x7c00u; ++h) {
        const double lo = referenceHalf(h);
        const double hi = h + 1 == 0x7c00u ? 65536.0 : referenceHalf(uint16_t(h + 1));
        const float mid = float(0.5 * (lo + hi));
        QCOMPARE(double(mid), 0.5 * (lo + hi));  // midpoints need 12 bits: exact in float
        const uint16_t even = (h & 1u) ? uint16_t(h + 1) : h;
        for (float sign : {1.0f, -1.0f}) {
            const uint16_t s = sign < 0 ? 0x8000u : 0u;
            if (floatToHalf(sign * mid) != uint16_t(even | s))
                QFAIL(qPrintable(QString("midpoint above 0x%1 (sign %2) rounded to 0x%3")
                                     .arg(h, 4, 16, QChar('0'))
                                     .arg(sign)
                                     .arg(floatToHalf(sign * mid), 4, 16, QChar('0'))));
            const float below = std::nextafter(mid, 0.0f);
            const float above = std::nextafter(mid, 1e30f);
            if (floatToHalf(sign * below) != uint16_t(h | s) ||
                floatToHalf(sign * above) != uint16_t((h + 1) | s))
                QFAIL(qPrintable(QString("neighbours of the midpoint above 0x%1 rounded wrongly")
                                     .arg(h, 4, 16, QChar('0'))));
        }
    }
}

void TestHalf::halfRounding_data()
{
    QTest::addColumn<float>("input");
    QTest::addColumn<int>("expected");
    const float tiny = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
    QTest::newRow("zero") << 0.0f << 0x0000;
    QTest::newRow("negative zero") << -0.0f << 0x8000;
    QTest::newRow("one") << 1.0f << 0x3c00;
    QTest::newRow("minus two") << -2.0f << 0xc000;
    QTest::newRow("0.1 -> 0.0999755859375") << 0.1f << 0x2e66;
    QTest::newRow("pi -> 3.140625") << 3.14159265f << 0x4248;
    QTest::newRow("1 + 2^-11 tie -> 1 (even)") << 1.00048828125f << 0x3c00;
    QTest::newRow("1 + 3*2^-11 tie -> 1 + 2^-9 (even)") << 1.00146484375f << 0x3c02;
    QTest::newRow("largest finite 65504") << 65504.0f << 0x7bff;
    QTest::newRow("65519 rounds down to 65504") << 65519.0f << 0x7bff;
    QTest::newRow("65520 ties to infinity") << 65520.0f << 0x7c00;
    QTest::newRow("1e10 overflows") << 1e10f << 0x7c00;
    QTest::newRow("-1e10 overflows") << -1e10f << 0xfc00;
    QTest::newRow("infinity") << std::numeric_limits<float>::infinity() << 0x7c00;
    QTest::newRow("-infinity") << -std::numeric_limits<float>::infinity() << 0xfc00;
    QTest::newRow("smallest normal 2^-14") << std::ldexp(1.0f, -14) << 0x0400;
    QTest::newRow("smallest subnormal 2^-24") << tiny << 0x0001;
    QTest::newRow("largest subnormal") << 1023.0f * tiny << 0x03ff;
    QTest::newRow("2^-25 ties to zero") << 0.5f * tiny << 0x0000;
    QTest::newRow("just above 2^-25 -> 2^-24") << std::nextafter(0.5f * tiny, 1.0f) << 0x0001;
    QTest::newRow("-2^-25 ties to -0") << -0.5f * tiny << 0x8000;
    QTest::newRow("1.5*2^-24 ties to 2*2^-24") << 1.5f * tiny << 0x0002;
    QTest::newRow("2.5*2^-24 ties to 2*2^-24") << 2.5f * tiny << 0x0002;
    QTest::newRow("1023.5*2^-24 ties up to the smallest normal") << 1023.5f * tiny << 0x0400;
    QTest::newRow("float min normal underflows") << std::numeric_limits<float>::min() << 0x0000;
    QTest::newRow("float denormal underflows") << std::numeric_limits<float>::denorm_min() << 0x0000;
}

void TestHalf::halfRounding()
{
    QFETCH(float, input);
    QFETCH(int, expected);
    QCOMPARE(int(floatToHalf(input)), expected);
}

void TestHalf::bf16EveryPatternRoundTrips()
{
    for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t b = uint16_t(i);
        const float f = bf16ToFloat(b);
        QCOMPARE(floatToBits(f), uint32_t(b) << 16);  // bf16 is the top half of a float
        const uint16_t back = floatToBf16(f);
        if (isBf16Nan(b)) {
            if (!isBf16Nan(back) || (back & 0x8000u) != (b & 0x8000u))
                QFAIL(qPrintable(QString("bf16 NaN 0x%1 became 0x%2")
                                     .arg(i, 4, 16, QChar('0'))
                                     .arg(back, 4, 16, QChar('0'))));
        } else if (back != b) {
            QFAIL(qPrintable(QString("floatToBf16(bf16ToFloat(0x%1)) = 0x%2")
                                 .arg(i, 4, 16, QChar('0'))
                                 .arg(back, 4, 16, QChar('0'))));
        }
    }
}

void TestHalf::bf16MidpointsRoundToEven()
{
    for (uint32_t b = 0; b < 0x7f80u; ++b) {
        const uint32_t midBits = (b << 16) | 0x8000u;  // halfway to the next bf16
        const uint32_t even = (b & 1u) ? b + 1 : b;
        for (uint32_t s : {0u, 0x80000000u}) {
            const uint16_t sb = uint16_t(s >> 16);
            if (floatToBf16(bitsToFloat(midBits | s)) != uint16_t(even | sb) ||
                floatToBf16(bitsToFloat((midBits - 1) | s)) != uint16_t(b | sb) ||
                floatToBf16(bitsToFloat((midBits + 1) | s)) != uint16_t((b + 1) | sb))
                QFAIL(qPrintable(QString("bf16 rounding around 0x%1 is wrong").arg(b, 4, 16)));
        }
    }
}

void TestHalf::bf16Rounding_data()
{
    QTest::addColumn<float>("input");
    QTest::addColumn<int>("expected");
    QTest::newRow("one") << 1.0f << 0x3f80;
    QTest::newRow("1 + 2^-8 tie -> 1 (even)") << 1.00390625f << 0x3f80;
    QTest::newRow("1 + 3*2^-8 tie -> 1 + 2^-6 (even)") << 1.01171875f << 0x3f82;
    QTest::newRow("pi -> 3.140625") << 3.14159265f << 0x4049;
    QTest::newRow("-0.1") << -0.1f << 0xbdcd;
    QTest::newRow("float max rounds to infinity") << std::numeric_limits<float>::max() << 0x7f80;
    QTest::newRow("infinity") << std::numeric_limits<float>::infinity() << 0x7f80;
    QTest::newRow("-infinity") << -std::numeric_limits<float>::infinity() << 0xff80;
    QTest::newRow("negative zero") << -0.0f << 0x8000;
    QTest::newRow("signalling NaN becomes quiet") << bitsToFloat(0x7f800001u) << 0x7fc0;
}

void TestHalf::bf16Rounding()
{
    QFETCH(float, input);
    QFETCH(int, expected);
    QCOMPARE(int(floatToBf16(input)), expected);
}

void TestHalf::bulkMatchesScalar_data()
{
    // Lengths around the 8-wide vector step, so both the vector body and the scalar tail run.
    QTest::addColumn<int>("offset");
    QTest::newRow("aligned") << 0;
    QTest::newRow("offset 3 (tail of 5)") << 3;
    QTest::newRow("offset 7 (tail of 1)") << 7;
}

// halfToFloatN / floatToHalfN (F16C when the CPU has it) give the scalar results for every fp16
// pattern and for every rounding midpoint and its neighbours; NaNs stay NaN.
void TestHalf::bulkMatchesScalar()
{
    QFETCH(int, offset);
    std::vector<uint16_t> halves(65536);
    for (uint32_t i = 0; i < 65536; ++i) halves[i] = uint16_t(i);
    const size_t n = halves.size() - size_t(offset);
    std::vector<float> floats(n);
    halfToFloatN(halves.data() + offset, floats.data(), n);
    for (size_t i = 0; i < n; ++i) {
        const uint16_t h = halves[i + size_t(offset)];
        if (isHalfNan(h)) {
            QVERIFY(std::isnan(floats[i]));
        } else if (floatToBits(floats[i]) != floatToBits(halfToFloat(h))) {
            QFAIL(qPrintable(QString("halfToFloatN differs at 0x%1").arg(h, 4, 16, QChar('0'))));
        }
    }

    std::vector<float> inputs;
    for (uint16_t h = 0; h < 0x7c00u; ++h) {
        const double lo = referenceHalf(h);
        const double hi = h + 1 == 0x7c00u ? 65536.0 : referenceHalf(uint16_t(h + 1));
        const float mid = float(0.5 * (lo + hi));
        for (float v : {float(lo), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
            inputs.push_back(v);
            inputs.push_back(-v);
        }
    }
    inputs.push_back(std::numeric_limits<float>::infinity());
    inputs.push_back(1e30f);
    inputs.push_back(std::numeric_limits<float>::quiet_NaN());
    std::vector<uint16_t> out(inputs.size() - size_t(offset));
    floatToHalfN(inputs.data() + offset, out.data(), out.size());
    for (size_t i = 0; i < out.size(); ++i) {
        const float v = inputs[i + size_t(offset)];
        if (std::isnan(v)) {
            QVERIFY(isHalfNan(out[i]));
        } else if (out[i] != floatToHalf(v)) {
            QFAIL(qPrintable(QString("floatToHalfN(%1) = 0x%2, scalar 0x%3")
                                 .arg(double(v), 0, 'g', 9)
                                 .arg(out[i], 4, 16, QChar('0'))
                                 .arg(floatToHalf(v), 4, 16, QChar('0'))));
        }
    }
}

KVSCOPE_TEST_MAIN(TestHalf)
#include "tst_half.moc"
