// CRC-32 of the container (core/common/crc32.h): the carry-less-multiply path against a bitwise
// reference at every length up to 1 KiB, every alignment, chained calls and known check values.
#include "testmain.h"

#include "common/crc32.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <random>
#include <vector>

using namespace kvscope;

namespace {

// The CRC-32 of ISO-HDLC bit by bit (reflected polynomial 0xEDB88320), independent of crc32().
uint32_t referenceCrc(const uint8_t* p, size_t n, uint32_t seed)
{
    uint32_t r = ~seed;
    for (size_t i = 0; i < n; ++i) {
        r ^= p[i];
        for (int b = 0; b < 8; ++b) r = (r >> 1) ^ (0xEDB88320u & (0u - (r & 1u)));
    }
    return ~r;
}

std::vector<uint8_t> randomBytes(size_t n, uint32_t seed)
{
    std::mt19937 rng(seed);
    std::vector<uint8_t> b(n);
    for (uint8_t& x : b) x = uint8_t(rng());
    return b;
}

}  // namespace

class TestCrc32 : public QObject {
    Q_OBJECT
private slots:
    void checkValues();
    void everyLengthAndAlignment();
    void chainedEqualsWhole();
    void largeBuffer();
    void speed();
};

void TestCrc32::checkValues()
{
    const char* s = "123456789";
    QCOMPARE(crc32(s, 9), 0xCBF43926u);  // the polynomial's published check value
    QCOMPARE(crc32(nullptr, 0), 0u);
    const std::vector<uint8_t> zeros(4096, 0), ones(4096, 0xff);
    QCOMPARE(crc32(zeros.data(), zeros.size()), referenceCrc(zeros.data(), zeros.size(), 0));
    QCOMPARE(crc32(ones.data(), ones.size()), referenceCrc(ones.data(), ones.size(), 0));
}

void TestCrc32::everyLengthAndAlignment()
{
    const std::vector<uint8_t> b = randomBytes(1024 + 64, 7);
    for (size_t offset = 0; offset < 16; ++offset)
        for (size_t n = 0; n + offset <= 1024 + 16; ++n) {
            const uint32_t seed = uint32_t(n * 2654435761u);
            const uint32_t got = crc32(b.data() + offset, n, seed), want = referenceCrc(b.data() + offset, n, seed);
            if (got != want) QFAIL(qPrintable(QString("offset %1 length %2: %3, reference %4").arg(offset).arg(n).arg(got, 8, 16).arg(want, 8, 16)));
        }
}

void TestCrc32::chainedEqualsWhole()
{
    const std::vector<uint8_t> b = randomBytes(10000, 3);
    const uint32_t whole = crc32(b.data(), b.size());
    QCOMPARE(whole, referenceCrc(b.data(), b.size(), 0));
    for (size_t cut : {1, 15, 16, 63, 64, 65, 1000, 9999}) {
        const uint32_t first = crc32(b.data(), cut);
        QCOMPARE(crc32(b.data() + cut, b.size() - cut, first), whole);
    }
}

void TestCrc32::largeBuffer()
{
    const std::vector<uint8_t> b = randomBytes(size_t(3) << 20, 11);  // a payload's size, 3 MiB
    QCOMPARE(crc32(b.data() + 1, b.size() - 1), referenceCrc(b.data() + 1, b.size() - 1, 0));
}

// Prints GB/s of crc32() and of zlib's on 16 MiB, one thread (its CPU time, best of 7): the
// figures of docs/codecs.md ("Speed"). Asserts only that both agree.
void TestCrc32::speed()
{
    const std::vector<uint8_t> b = randomBytes(size_t(16) << 20, 5);
    auto cpu = [] {
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
    };
    double ours = 1e9, theirs = 1e9;
    uint32_t a = 0, z = 0;
    for (int r = 0; r < 7; ++r) {
        double t = cpu();
        a = crc32(b.data(), b.size());
        ours = std::min(ours, cpu() - t);
        t = cpu();
        z = uint32_t(::crc32(0, b.data(), uInt(b.size())));
        theirs = std::min(theirs, cpu() - t);
    }
    QCOMPARE(a, z);
    qInfo("crc32 on 16 MiB, one thread: kvscope %.2f GB/s, zlib %.2f GB/s", double(b.size()) / ours / 1e9,
          double(b.size()) / theirs / 1e9);
}

KVSCOPE_TEST_MAIN(TestCrc32)
#include "tst_crc32.moc"
