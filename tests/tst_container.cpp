// The .kvc container (core/codec/container.h, FORMAT.md): golden files pin the format and the
// decoders byte for byte, the encoder is deterministic, and every damaged or hostile file in
// tests/data/golden-errors/ gives a kvscope::Error that starts with the file's name and says why.
//
// Regenerate the golden files (only when the format or a codec changes on purpose, and say so in
// the commit): KVSCOPE_REGEN_GOLDEN=1 ./tst_container   (see tests/data/golden/README.md)
#include "testmain.h"

#include "codec/container.h"
#include "common/crc32.h"
#include "common/error.h"
#include "common/half.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace kvscope;

namespace {

using Bytes = std::vector<uint8_t>;

const QString kGoldenDir = QStringLiteral(KVSCOPE_TEST_DATA "/golden");
const QString kErrorsDir = QStringLiteral(KVSCOPE_TEST_DATA "/golden-errors");
constexpr uint64_t kFuzzMaxOutput = uint64_t(64) << 20;  // the limit the fuzzer runs with

// ---------------------------------------------------------------------------------------------
// Golden inputs: integer arithmetic only, so every machine and compiler builds the same cache.

uint64_t splitmix(uint64_t& s)
{
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Per channel an offset and an integer random walk along tokens (correlated like real KV), keys
// with one loud channel per head; values are multiples of 1/64 (exact in float), then fp16.
KvSet goldenKv(const KvShape& shape, uint64_t seed)
{
    KvSet kv(shape, DType::F16);
    uint64_t s = seed;
    for (int l = 0; l < shape.numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            for (int h = 0; h < shape.numKvHeads; ++h)
                for (int d = 0; d < shape.headDim; ++d) {
                    int64_t offset = int64_t(splitmix(s) % 257) - 128;  // +-2.0
                    if (k == KvKind::Key && d == 1) offset += 64 * (12 + l);
                    int64_t walk = 0;
                    for (int t = 0; t < shape.numTokens; ++t) {
                        walk = walk * 7 / 8 + (int64_t(splitmix(s) % 65) - 32);
                        kv.set(k, l, h, t, d, float(offset + walk) / 64.0f);
                    }
                }
    kv.modelName = "golden";
    kv.modelFingerprint = "golden-v1";
    kv.context = "Golden context, UTF-8: caf\u00e9 \u2192 KV";
    for (int t = 0; t < shape.numTokens; ++t) kv.tokens.push_back(int32_t(1000 + 37 * t - (t % 3 == 0 ? 5000 : 0)));
    return kv;
}

struct Golden {
    const char* name;
    CodecId codec;
    bool shared;
    bool channelKeys;
    std::vector<int> levels;  // the level of each chunk in the expected decode (.bin)
    EntropyLayout entropy;    // Rans4x8: a version-1 file (the v1 decoder stays pinned)
    KvShape shape;
    bool perHead = false;     // table_scope head (format 2.2); the others are per-channel (2.0, 1.0)
};

// 2 layers, 2 heads of 2 dims, 40 tokens in chunks of 16 (the last one of 8), CacheGen's 3 default
// levels: multi-layer, multi-head and a short chunk pinned, and the whole set stays small (in-band
// tables are the bulk of a tiny cachegen file: one per channel, role and block in every chunk).
// cachegen-d16 has head_dim 16, so its streams go through the SIMD row kernels where the CPU has them.
const KvShape kGoldenShape{2, 2, 2, 40};
constexpr EntropyLayout kV1 = EntropyLayout::Rans4x8, kV2 = EntropyLayout::Rans32x16;
const Golden kGoldens[] = {
    {"cachegen-inband", CodecId::CacheGen, false, false, {1, 2, 3}, kV2, kGoldenShape},
    {"cachegen-shared", CodecId::CacheGen, true, true, {3, 1, 2}, kV2, kGoldenShape},
    {"int8", CodecId::Int8, false, false, {1}, kV2, kGoldenShape},
    {"cachegen-d16", CodecId::CacheGen, false, true, {2, 3, 1}, kV2, KvShape{1, 1, 16, 40}},
    {"v1-cachegen-inband", CodecId::CacheGen, false, false, {1, 2, 3}, kV1, kGoldenShape},
    {"v1-cachegen-shared", CodecId::CacheGen, true, true, {3, 1, 2}, kV1, kGoldenShape},
    {"v1-int8", CodecId::Int8, false, false, {1}, kV1, kGoldenShape},
    {"cachegen-head-inband", CodecId::CacheGen, false, false, {1, 2, 3}, kV2, kGoldenShape, true},
    {"cachegen-head-shared", CodecId::CacheGen, true, true, {3, 1, 2}, kV2, kGoldenShape, true},
    {"cachegen-head-d16", CodecId::CacheGen, false, true, {2, 3, 1}, kV2, KvShape{1, 1, 16, 40}, true},
};

CodecParams goldenParams(const Golden& g, const KvShape& shape)
{
    CodecParams p;
    p.codec = g.codec;
    p.shape = shape;
    p.dtype = DType::F16;
    p.profile = defaultProfile(shape.numLayers);
    p.profile.chunkTokens = 16;
    if (g.shared) p.profile.tables = TableMode::Shared;
    if (g.channelKeys) p.profile.keyQuantizer = Quantizer::PerChannel;
    p.profile.tableScope = g.perHead ? TableScope::Head : TableScope::Channel;
    p.entropy = g.entropy;
    return p;
}

// Expected decode: for each layer, keys then values, (heads, tokens, head_dim) little-endian fp16.
Bytes rawFp16(const KvSet& kv)
{
    Bytes out;
    const KvShape& s = kv.shape();
    for (int l = 0; l < s.numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            for (int h = 0; h < s.numKvHeads; ++h)
                for (int t = 0; t < s.numTokens; ++t)
                    for (int d = 0; d < s.headDim; ++d) {
                        const uint16_t b = floatToHalf(kv.at(k, l, h, t, d));
                        out.push_back(uint8_t(b));
                        out.push_back(uint8_t(b >> 8));
                    }
    return out;
}

Bytes readAll(const QString& path)
{
    QFile f(path);
    if (!f.open(QIODevice::ReadOnly)) return {};
    const QByteArray a = f.readAll();
    return Bytes(a.begin(), a.end());
}

void writeAll(const QString& path, const Bytes& b)
{
    QFile f(path);
    QVERIFY2(f.open(QIODevice::WriteOnly | QIODevice::Truncate), qPrintable(path));
    QCOMPARE(f.write(reinterpret_cast<const char*>(b.data()), qint64(b.size())), qint64(b.size()));
}

QString firstByteDifference(const Bytes& a, const Bytes& b)
{
    const size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; ++i)
        if (a[i] != b[i]) return QString("first difference at byte %1 (0x%2 vs 0x%3)").arg(i).arg(a[i], 2, 16, QChar('0')).arg(b[i], 2, 16, QChar('0'));
    return QString("sizes %1 vs %2").arg(a.size()).arg(b.size());
}

// ---------------------------------------------------------------------------------------------
// Surgery on .kvc bytes, following FORMAT.md.

uint32_t getU32(const Bytes& b, size_t at) { return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24; }
uint64_t getU64(const Bytes& b, size_t at) { return uint64_t(getU32(b, at)) | uint64_t(getU32(b, at + 4)) << 32; }
void putU16(Bytes& b, size_t at, uint16_t v) { b[at] = uint8_t(v); b[at + 1] = uint8_t(v >> 8); }
void putU32(Bytes& b, size_t at, uint32_t v) { for (int i = 0; i < 4; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i)); }
void putU64(Bytes& b, size_t at, uint64_t v) { for (int i = 0; i < 8; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i)); }

enum Section { kLevels = 0, kMeta = 1, kTables = 2, kIndex = 3 };
constexpr size_t kHeaderCrcAt = 156;
size_t sectionRef(int s) { return 72 + 16 * size_t(s); }
uint64_t sectionOffset(const Bytes& b, int s) { return getU64(b, sectionRef(s)); }
uint32_t sectionSize(const Bytes& b, int s) { return getU32(b, sectionRef(s) + 8); }

void fixHeaderCrc(Bytes& b) { putU32(b, kHeaderCrcAt, crc32(b.data(), kHeaderCrcAt)); }
void fixSectionCrc(Bytes& b, int s)
{
    putU32(b, sectionRef(s) + 12, crc32(b.data() + sectionOffset(b, s), sectionSize(b, s)));
    fixHeaderCrc(b);
}
size_t indexEntry(const Bytes& b, int chunk, int level /* 1-based */)
{
    const uint32_t levels = getU32(b, 48);
    return size_t(sectionOffset(b, kIndex)) + 16 * (size_t(chunk) * levels + size_t(level - 1));
}
// Re-CRCs chunk (chunk, level) after its payload changed, then the index and the header.
void fixChunkCrc(Bytes& b, int chunk, int level)
{
    const size_t e = indexEntry(b, chunk, level);
    putU32(b, e + 12, crc32(b.data() + getU64(b, e), getU32(b, e + 8)));
    fixSectionCrc(b, kIndex);
}
void setHeaderU32(Bytes& b, size_t at, uint32_t v)
{
    putU32(b, at, v);
    fixHeaderCrc(b);
}

// The bases the bad files are cut from: tiny files (1 layer, 1 head of 2 dims, 17 tokens = chunks
// of 16 and 1, two cachegen levels) so that the dozens of variants stay a few hundred bytes each.
Bytes tinyBase(CodecId codec, bool shared)
{
    const KvShape shape{1, 1, 2, 17};
    KvSet kv = goldenKv(shape, 99);
    kv.context.clear();  // no token list either: huge-output.kvc changes num_tokens
    kv.tokens.clear();
    kv.modelFingerprint.clear();
    CodecParams p;
    p.codec = codec;
    p.shape = shape;
    p.dtype = DType::F16;
    p.profile.numLayers = 1;
    p.profile.chunkTokens = 16;
    p.profile.deltaGroup = 4;
    p.profile.defaultLevel = 1;
    p.profile.keyQuantizer = Quantizer::PerChannel;
    p.profile.tables = shared ? TableMode::Shared : TableMode::InBand;
    p.profile.levels = {CodecLevel{"low", {4}, {4}, ""}, CodecLevel{"high", {8}, {6}, ""}};  // small alphabets, small tables
    QTemporaryDir dir;
    const QString path = dir.filePath("base.kvc");
    writeKvc(kv, p, path.toStdString());
    return readAll(path);
}

struct BadFile {
    const char* file;    // in tests/data/golden-errors/
    const char* base;    // "shared", "inband", "int8" or "" (built from nothing)
    const char* expect;  // a substring the error message must contain
    std::function<void(Bytes&)> damage;  // empty: a fuzzer reproducer, committed as found
};

// Every entry is one way a file goes wrong in the field; the message must say which.
const std::vector<BadFile>& badFileList()
{
    static const std::vector<BadFile> list = {
        {"empty.kvc", "", "shorter than the 160-byte header", [](Bytes& b) { b.clear(); }},
        {"random-bytes.kvc", "", "bad magic",
         [](Bytes& b) {
             uint64_t s = 12345;
             b.resize(256);
             for (uint8_t& v : b) v = uint8_t(splitmix(s));
         }},
        {"not-kvc-hdf5-magic.kvc", "", "bad magic",
         [](Bytes& b) {
             b.assign(200, 0);
             const uint8_t hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
             std::memcpy(b.data(), hdf5, 8);
         }},
        {"truncated-in-header.kvc", "int8", "shorter than the 160-byte header", [](Bytes& b) { b.resize(100); }},
        {"truncated-after-header.kvc", "int8", "truncated or padded", [](Bytes& b) { b.resize(160); }},
        {"truncated-in-payload.kvc", "int8", "truncated or padded", [](Bytes& b) { b.resize(200); }},
        {"truncated-in-index.kvc", "int8", "truncated or padded", [](Bytes& b) { b.resize(b.size() - 5); }},
        {"truncated-int8.kvc", "int8", "truncated or padded", [](Bytes& b) { b.resize(b.size() / 2); }},
        {"padded.kvc", "int8", "truncated or padded", [](Bytes& b) { b.push_back(0); }},
        {"header-bitflip.kvc", "int8", "CRC mismatch (corrupt header)", [](Bytes& b) { b[36] ^= 0x04; }},
        {"header-crc-bitflip.kvc", "inband", "CRC mismatch (corrupt header)", [](Bytes& b) { b[157] ^= 0x80; }},
        {"version-3.kvc", "int8", "format version 3 is not supported",
         [](Bytes& b) { putU16(b, 8, 3); fixHeaderCrc(b); }},
        {"header-size-wrong.kvc", "int8", "unexpected header size", [](Bytes& b) { setHeaderU32(b, 12, 128); }},
        {"unknown-codec.kvc", "int8", "unknown codec id 9", [](Bytes& b) { b[16] = 9; fixHeaderCrc(b); }},
        {"unknown-dtype.kvc", "int8", "unknown dtype id 3", [](Bytes& b) { b[17] = 3; fixHeaderCrc(b); }},
        {"unknown-table-mode.kvc", "int8", "unknown table mode 2", [](Bytes& b) { b[20] = 2; fixHeaderCrc(b); }},
        {"dims-zero-head-dim.kvc", "int8", "head_dim is 0, must be positive", [](Bytes& b) { setHeaderU32(b, 32, 0); }},
        {"dims-absurd-layers.kvc", "int8", "num_layers is 100000, above the limit", [](Bytes& b) { setHeaderU32(b, 24, 100000); }},
        {"dims-implausible.kvc", "int8", "implausible", [](Bytes& b) { setHeaderU32(b, 36, 0xfffffff0u); }},
        {"dims-total-too-large.kvc", "int8", "above the limit",
         [](Bytes& b) {  // every dimension within its own limit, the product not
             putU32(b, 24, 1024);
             putU32(b, 28, 1024);
             putU32(b, 32, 1024);
             putU32(b, 36, 1u << 21);
             fixHeaderCrc(b);
         }},
        {"chunk-tokens-8.kvc", "int8", "outside 16..8192", [](Bytes& b) { setHeaderU32(b, 40, 8); }},
        {"num-chunks-wrong.kvc", "int8", "does not match", [](Bytes& b) { setHeaderU32(b, 44, 3); }},
        {"num-levels-0.kvc", "int8", "num_levels 0 is invalid", [](Bytes& b) { setHeaderU32(b, 48, 0); }},
        {"num-levels-2-int8.kvc", "int8", "num_levels 2 is invalid", [](Bytes& b) { setHeaderU32(b, 48, 2); }},
        {"delta-group-1.kvc", "shared", "delta_group", [](Bytes& b) { setHeaderU32(b, 52, 1); }},
        {"default-level-3-of-2.kvc", "shared", "default_level", [](Bytes& b) { setHeaderU32(b, 60, 3); }},
        {"file-size-field-wrong.kvc", "int8", "truncated or padded",
         [](Bytes& b) { putU64(b, 64, b.size() + 1); fixHeaderCrc(b); }},
        {"section-outside-file.kvc", "int8", "metadata section: lies outside the file",
         [](Bytes& b) { putU64(b, sectionRef(kMeta), b.size() + 16); fixHeaderCrc(b); }},
        {"section-size-outside-file.kvc", "int8", "chunk index: lies outside the file",
         [](Bytes& b) { putU32(b, sectionRef(kIndex) + 8, sectionSize(b, kIndex) + 1); fixHeaderCrc(b); }},
        {"section-overlaps-header.kvc", "int8", "levels section: lies outside the file",
         [](Bytes& b) { putU64(b, sectionRef(kLevels), 100); fixHeaderCrc(b); }},
        {"levels-bitflip.kvc", "int8", "levels section: CRC mismatch",
         [](Bytes& b) { b[sectionOffset(b, kLevels)] ^= 0x01; }},
        {"levels-odd-bins.kvc", "shared", "bins must be even",
         [](Bytes& b) { putU16(b, sectionOffset(b, kLevels), 7); fixSectionCrc(b, kLevels); }},
        {"metadata-bitflip.kvc", "int8", "metadata section: CRC mismatch",
         [](Bytes& b) { b[sectionOffset(b, kMeta) + 2] ^= 0x10; }},
        {"metadata-string-too-long.kvc", "int8", "metadata section: truncated",
         [](Bytes& b) { putU32(b, sectionOffset(b, kMeta), 1000); fixSectionCrc(b, kMeta); }},
        {"metadata-string-implausible.kvc", "int8", "implausible",
         [](Bytes& b) { putU32(b, sectionOffset(b, kMeta), 0xfffffff0u); fixSectionCrc(b, kMeta); }},
        {"tables-bitflip.kvc", "shared", "tables section: CRC mismatch",
         [](Bytes& b) { b[sectionOffset(b, kTables) + 9] ^= 0x20; }},
        {"tables-symbol-out-of-range.kvc", "shared", "probability table names symbol 250",
         [](Bytes& b) {  // the first table of level 1: u32 sizes[2] precede the blobs
             const size_t t = size_t(sectionOffset(b, kTables)) + 8;
             b[t] = 0;
             b[t + 1] = 250;
             fixSectionCrc(b, kTables);
         }},
        {"tables-size-wrong.kvc", "shared", "tables section",
         [](Bytes& b) {
             const size_t t = size_t(sectionOffset(b, kTables));
             putU32(b, t, getU32(b, t) - 1);
             fixSectionCrc(b, kTables);
         }},
        {"tables-present-in-band.kvc", "inband", "present although the file uses in-band tables",
         [](Bytes& b) {  // the (empty) tables section now claims the first 4 bytes of the index
             putU64(b, sectionRef(kTables), sectionOffset(b, kIndex));
             putU32(b, sectionRef(kTables) + 8, 4);
             fixSectionCrc(b, kTables);
         }},
        {"index-bitflip.kvc", "int8", "chunk index: CRC mismatch",
         [](Bytes& b) { b[sectionOffset(b, kIndex) + 3] ^= 0x01; }},
        {"index-size-wrong.kvc", "int8", "chunk index: holds",
         [](Bytes& b) { putU32(b, sectionRef(kIndex) + 8, sectionSize(b, kIndex) - 16); fixSectionCrc(b, kIndex); }},
        {"index-offset-past-end.kvc", "int8", "points outside the payload area",
         [](Bytes& b) { putU64(b, indexEntry(b, 1, 1), b.size() + 1000); fixSectionCrc(b, kIndex); }},
        {"index-size-past-end.kvc", "int8", "points outside the payload area",
         [](Bytes& b) { putU32(b, indexEntry(b, 0, 1) + 8, 0xffffff00u); fixSectionCrc(b, kIndex); }},
        {"index-into-sections.kvc", "inband", "points outside the payload area",
         [](Bytes& b) {  // a chunk may not reach into the sections after the payloads
             const size_t e = indexEntry(b, 1, 2);
             putU32(b, e + 8, getU32(b, e + 8) + 1);
             fixSectionCrc(b, kIndex);
         }},
        {"index-offset-in-header.kvc", "int8", "points outside the payload area",
         [](Bytes& b) { putU64(b, indexEntry(b, 0, 1), 8); fixSectionCrc(b, kIndex); }},
        {"payload-bitflip.kvc", "shared", "chunk 0 level 1: CRC mismatch (corrupt chunk)",
         [](Bytes& b) { b[getU64(b, indexEntry(b, 0, 1)) + 10] ^= 0x40; }},
        {"payload-bitflip-level-2.kvc", "inband", "chunk 1 level 2: CRC mismatch (corrupt chunk)",
         [](Bytes& b) { b[getU64(b, indexEntry(b, 1, 2)) + 3] ^= 0x01; }},
        {"stream-corrupt-crc-fixed.kvc", "shared", "entropy-coded stream is corrupt",
         [](Bytes& b) {  // the last byte of the last stream of chunk 0 level 1
             const size_t e = indexEntry(b, 0, 1);
             b[getU64(b, e) + getU32(b, e + 8) - 1] ^= 0x55;
             fixChunkCrc(b, 0, 1);
         }},
        {"stream-all-zero-crc-fixed.kvc", "inband", "entropy-coded stream is corrupt",
         [](Bytes& b) {  // a stream of zero bytes: states 0 (valid ones are >= 2^23) that
                         // renormalisation can never lift once the bytes run out
             const size_t at = size_t(getU64(b, indexEntry(b, 0, 1)));
             const size_t tables = getU32(b, at) + getU32(b, at + 4);
             const size_t firstStream = at + 4 * 2 + 4 * 2 + tables + 2 * 4 /* key scales */ + 2 * 16 /* value scales */;
             std::fill(b.begin() + long(firstStream), b.begin() + long(firstStream + getU32(b, at + 8)), 0);
             fixChunkCrc(b, 0, 1);
         }},
        {"stream-size-corrupt-crc-fixed.kvc", "shared", "chunk 0 level 2",
         [](Bytes& b) {  // stream size list entry 0 grows by one: the sections no longer add up
             const size_t at = size_t(getU64(b, indexEntry(b, 0, 2)));
             putU32(b, at, getU32(b, at) + 1);
             fixChunkCrc(b, 0, 2);
         }},
        {"inband-table-corrupt-crc-fixed.kvc", "inband", "probability table",
         [](Bytes& b) {  // the first in-band table: after u32 table sizes[2] and stream sizes[2]
             const size_t at = size_t(getU64(b, indexEntry(b, 0, 1))) + 4 * 2 + 4 * 2;
             b[at + 1] = 200;  // hi of a 3-symbol alphabet
             fixChunkCrc(b, 0, 1);
         }},
        {"chunk-size-short-crc-fixed.kvc", "inband", "chunk 1 level 1",
         [](Bytes& b) {  // the index says one byte less (CRC over the shorter payload)
             const size_t e = indexEntry(b, 1, 1);
             putU32(b, e + 8, getU32(b, e + 8) - 1);
             fixChunkCrc(b, 1, 1);
         }},
        {"int8-scales-chunk-swapped.kvc", "int8", "chunk 0 level 1",
         [](Bytes& b) {  // chunk 0 (16 tokens) points at chunk 1's payload (4 tokens)
             const size_t e0 = indexEntry(b, 0, 1), e1 = indexEntry(b, 1, 1);
             for (size_t i = 0; i < 16; ++i) b[e0 + i] = b[e1 + i];
             fixSectionCrc(b, kIndex);
         }},
        // Found by tests/fuzz (a mutated tiny shared file, CRCs fixed up): decAdvance in rans.h
        // renormalises a zero state forever once the stream is exhausted.
        {"fuzz-hang-rans-zero-state.kvc", "", "entropy-coded stream is corrupt", {}},
        {"huge-output.kvc", "int8", "over the limit",
         [](Bytes& b) {  // a consistent header declaring 272 MB of output, over the fuzzer's 64 MiB
             putU32(b, 28, 64);           // heads
             putU32(b, 32, 128);          // head_dim
             putU32(b, 36, 8192 + 100);   // tokens
             putU32(b, 40, 8192);         // chunk_tokens: still 2 chunks, so the index fits
             fixHeaderCrc(b);
         }},
    };
    return list;
}

Bytes baseBytes(const char* base)
{
    const std::string b = base;
    if (b == "shared") return tinyBase(CodecId::CacheGen, true);
    if (b == "inband") return tinyBase(CodecId::CacheGen, false);
    if (b == "int8") return tinyBase(CodecId::Int8, false);
    return {};
}

// Opens the file (or bytes) and decodes every level and a mix, as a user's tool would; returns
// the error message, or "" when everything succeeded. Anything but kvscope::Error escapes.
std::string firstError(const std::function<std::unique_ptr<KvcReader>()>& open)
{
    try {
        const std::unique_ptr<KvcReader> r = open();
        r->setMaxOutputBytes(kFuzzMaxOutput);
        const int levels = r->params().numLevels(), chunks = r->params().numChunks();
        for (int l = 1; l <= levels; ++l) r->decodeAll({l});
        std::vector<int> mix(static_cast<size_t>(chunks));
        for (int c = 0; c < chunks; ++c) mix[size_t(c)] = levels - c % levels;
        r->decodeAll(mix);
        return "";
    } catch (const Error& e) {
        return e.what();
    }
}

// firstError on a worker thread: a reader that never returns (a hang on bad input is a bug like a
// crash) fails the row after `seconds` instead of stalling the whole suite. The stuck thread is
// left behind, detached, and ends with the process.
std::string firstErrorWithin(std::function<std::unique_ptr<KvcReader>()> open, int seconds, bool* hung)
{
    auto task = std::make_shared<std::packaged_task<std::string()>>([open] { return firstError(open); });
    std::future<std::string> result = task->get_future();
    std::thread([task] { (*task)(); }).detach();
    *hung = result.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready;
    return *hung ? std::string() : result.get();  // get() rethrows anything but kvscope::Error
}

void regenerate()
{
    QVERIFY(QDir().mkpath(kGoldenDir));
    QVERIFY(QDir().mkpath(kErrorsDir));
    for (const Golden& g : kGoldens) {
        const KvSet kv = goldenKv(g.shape, 2024);
        const QString kvc = kGoldenDir + "/" + g.name + ".kvc";
        writeKvc(kv, goldenParams(g, g.shape), kvc.toStdString());
        const auto r = KvcReader::openFile(kvc.toStdString());
        writeAll(kGoldenDir + "/" + g.name + ".decoded.f16.bin", rawFp16(r->decodeAll(g.levels)));
    }
    for (const BadFile& bf : badFileList()) {
        if (!bf.damage) continue;  // fuzzer reproducers stay as they were found
        Bytes b = baseBytes(bf.base);
        bf.damage(b);
        writeAll(kErrorsDir + "/" + bf.file, b);
    }
    qInfo("golden files rewritten in %s and %s", qPrintable(kGoldenDir), qPrintable(kErrorsDir));
}

}  // namespace

class TestContainer : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void goldenDecodes_data();
    void goldenDecodes();
    void encoderIsDeterministic_data();
    void encoderIsDeterministic();
    void goldenFilesAreSmall();
    void badFiles_data();
    void badFiles();
    void errorMessagesAreDeterministic();
    void everyBadFileIsListed();
    void outputLimit();
    void readerArguments();
    void missingFile();
    void cancelledWriteLeavesNothing();
    void metadataRoundTrip();
};

void TestContainer::initTestCase()
{
    if (qEnvironmentVariable("KVSCOPE_REGEN_GOLDEN") == "1") regenerate();
    QVERIFY2(QFileInfo::exists(kGoldenDir + "/int8.kvc"),
             qPrintable("golden files missing in " + kGoldenDir + "; run with KVSCOPE_REGEN_GOLDEN=1 once"));
}

void TestContainer::goldenDecodes_data()
{
    QTest::addColumn<int>("index");
    for (size_t i = 0; i < std::size(kGoldens); ++i) QTest::newRow(kGoldens[i].name) << int(i);
}

// The committed .kvc decodes to the committed values, byte for byte, from a file and from memory:
// any change to the format or to a decoder's arithmetic shows up here.
void TestContainer::goldenDecodes()
{
    QFETCH(int, index);
    const Golden& g = kGoldens[index];
    const QString path = kGoldenDir + "/" + g.name + ".kvc";
    const Bytes expect = readAll(kGoldenDir + "/" + g.name + ".decoded.f16.bin");
    QCOMPARE(expect.size(), 2 * g.shape.totalValues());

    const auto r = KvcReader::openFile(path.toStdString());
    const CodecParams& p = r->params();
    QCOMPARE(int(p.codec), int(g.codec));
    QVERIFY(p.shape == g.shape);
    QCOMPARE(int(p.entropy), int(g.entropy));
    QCOMPARE(int(p.dtype), int(DType::F16));
    QCOMPARE(p.numChunks(), 3);
    QCOMPARE(p.numLevels(), g.codec == CodecId::CacheGen ? 3 : 1);
    QCOMPARE(int(p.profile.tables), int(g.shared ? TableMode::Shared : TableMode::InBand));
    QCOMPARE(int(p.profile.keyQuantizer), int(g.channelKeys ? Quantizer::PerChannel : Quantizer::PerToken));
    if (g.codec == CodecId::CacheGen) {
        const CodecProfile def = defaultProfile(g.shape.numLayers);
        QCOMPARE(p.profile.defaultLevel, 2);
        QCOMPARE(p.profile.deltaGroup, 10);
        for (size_t l = 0; l < 3; ++l) {
            QVERIFY(p.profile.levels[l].keyBins == def.levels[l].keyBins);
            QVERIFY(p.profile.levels[l].valueBins == def.levels[l].valueBins);
        }
    }
    QCOMPARE(r->fileBytes(), uint64_t(QFileInfo(path).size()));

    const Bytes got = rawFp16(r->decodeAll(g.levels));
    QVERIFY2(got == expect, qPrintable(firstByteDifference(got, expect)));

    const auto m = KvcReader::fromMemory(readAll(path), "memory");
    const Bytes gotMem = rawFp16(m->decodeAll(g.levels));
    QVERIFY2(gotMem == expect, qPrintable(firstByteDifference(gotMem, expect)));
    for (int c = 0; c < p.numChunks(); ++c)
        for (int l = 1; l <= p.numLevels(); ++l) QVERIFY(r->readChunk(c, l) == m->readChunk(c, l));

    const Bytes file = readAll(path);  // a caller's buffer, not copied
    const auto b = KvcReader::fromBuffer(file.data(), file.size(), "buffer");
    const Bytes gotBuf = rawFp16(b->decodeAll(g.levels));
    QVERIFY2(gotBuf == expect, qPrintable(firstByteDifference(gotBuf, expect)));
}

void TestContainer::encoderIsDeterministic_data() { goldenDecodes_data(); }

// Encoding the same input again gives the committed file exactly: the encoder is deterministic
// (threads included) and the writer's layout has not drifted.
void TestContainer::encoderIsDeterministic()
{
    QFETCH(int, index);
    const Golden& g = kGoldens[index];
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString path = dir.filePath("again.kvc");
    const KvcWriteReport rep = writeKvc(goldenKv(g.shape, 2024), goldenParams(g, g.shape), path.toStdString());
    const Bytes again = readAll(path), golden = readAll(kGoldenDir + "/" + g.name + ".kvc");
    QCOMPARE(rep.fileBytes, uint64_t(again.size()));
    QVERIFY2(again == golden, qPrintable(firstByteDifference(again, golden)));

    // The in-memory writer (kvscope.encode's) is the same writer: the same bytes and figures.
    Bytes mem = {1, 2, 3};
    const KvcWriteReport memRep = writeKvc(goldenKv(g.shape, 2024), goldenParams(g, g.shape), mem);
    QVERIFY2(mem == golden, qPrintable(firstByteDifference(mem, golden)));
    QCOMPARE(memRep.fileBytes, rep.fileBytes);
    QVERIFY(memRep.levelBytes == rep.levelBytes);
    QVERIFY(memRep.levelTableBytes == rep.levelTableBytes);
}

void TestContainer::goldenFilesAreSmall()
{
    qint64 total = 0;
    for (const QString& d : {kGoldenDir, kErrorsDir})
        for (const QFileInfo& f : QDir(d).entryInfoList(QDir::Files)) total += f.size();
    QVERIFY2(total < 160 * 1024, qPrintable(QString("%1 bytes of golden files").arg(total)));
}

void TestContainer::badFiles_data()
{
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("expect");
    for (const BadFile& b : badFileList()) QTest::newRow(b.file) << QString(b.file) << QString(b.expect);
}

// A damaged file is refused with "path: place: reason", from disk and from memory alike; nothing
// but kvscope::Error is thrown (anything else fails the test), nothing crashes.
void TestContainer::badFiles()
{
    QFETCH(QString, file);
    QFETCH(QString, expect);
    const QString path = kErrorsDir + "/" + file;
    QVERIFY2(QFileInfo::exists(path), qPrintable(path + " missing: run with KVSCOPE_REGEN_GOLDEN=1"));

    bool hung = false;
    const std::string p = path.toStdString();
    const QString msg = QString::fromStdString(firstErrorWithin([p] { return KvcReader::openFile(p); }, 30, &hung));
    QVERIFY2(!hung, qPrintable(file + ": reading or decoding did not finish within 30 s (hang)"));
    QVERIFY2(!msg.isEmpty(), qPrintable(file + " was accepted"));
    QVERIFY2(msg.startsWith(path + ": "), qPrintable(msg));
    QVERIFY2(msg.contains(expect), qPrintable(QString("'%1' does not say '%2'").arg(msg, expect)));
    QVERIFY2(!msg.contains('\n'), qPrintable(msg));

    const std::string name = "memory:" + file.toStdString();
    const Bytes bytes = readAll(path);
    const QString memMsg = QString::fromStdString(firstErrorWithin([bytes, name] { return KvcReader::fromMemory(bytes, name); }, 30, &hung));
    QVERIFY2(!hung, qPrintable(file + " from memory: hang"));
    QVERIFY2(memMsg.startsWith(QString::fromStdString(name) + ": "), qPrintable(memMsg));
    QVERIFY2(memMsg.contains(expect), qPrintable(memMsg));
}

// The same bytes give the same message every time, even when several blocks of a chunk are bad
// and decode on different threads: a user comparing two runs (or a script matching the error)
// must not see the place change.
void TestContainer::errorMessagesAreDeterministic()
{
    for (const QString& file : QDir(kErrorsDir).entryList(QDir::Files)) {
        const Bytes bytes = readAll(kErrorsDir + "/" + file);
        std::set<std::string> seen;
        bool hung = false;
        seen.insert(firstErrorWithin([bytes] { return KvcReader::fromMemory(bytes, "m"); }, 30, &hung));
        QVERIFY2(!hung, qPrintable(file + ": hang"));
        for (int i = 0; i < 200; ++i) seen.insert(firstError([&bytes] { return KvcReader::fromMemory(bytes, "m"); }));
        QStringList all;
        for (const std::string& m : seen) all << QString::fromStdString(m);
        QVERIFY2(seen.size() == 1, qPrintable(file + " gave different messages:\n  " + all.join("\n  ")));
    }
}

// A reproducer dropped into golden-errors/ (by hand or from the fuzzer) must get a row above.
void TestContainer::everyBadFileIsListed()
{
    std::set<QString> listed;
    for (const BadFile& b : badFileList()) listed.insert(b.file);
    for (const QString& f : QDir(kErrorsDir).entryList(QDir::Files))
        QVERIFY2(listed.count(f), qPrintable(f + " in golden-errors/ has no row in badFileList()"));
}

// decodeAll refuses a cache over its output limit before allocating it, and allows one exactly at it.
void TestContainer::outputLimit()
{
    const QString path = kGoldenDir + "/int8.kvc";
    const auto r = KvcReader::openFile(path.toStdString());
    const uint64_t need = 2 * kGoldenShape.totalValues();
    QCOMPARE(r->maxOutputBytes(), uint64_t(64) << 30);
    r->setMaxOutputBytes(need);
    QCOMPARE(r->decodeAll({1}).shape().numTokens, 40);
    r->setMaxOutputBytes(need - 1);
    try {
        r->decodeAll({1});
        QFAIL("decoded over the limit");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(path + ": "), e.what());
        QVERIFY2(QString(e.what()).contains("over the limit"), e.what());
    }
    // The hostile header declares ~160 MB: refused at the fuzzer's 64 MiB before any allocation
    // (run under ASan/RSS limits this would show as a big allocation otherwise).
    const auto h = KvcReader::openFile((kErrorsDir + "/huge-output.kvc").toStdString());
    QVERIFY(uint64_t(h->params().shape.totalValues()) * 2 > kFuzzMaxOutput);
    h->setMaxOutputBytes(kFuzzMaxOutput);
    QVERIFY_THROWS_EXCEPTION(Error, h->decodeAll({1}));
}

void TestContainer::readerArguments()
{
    const QString path = kGoldenDir + "/cachegen-inband.kvc";
    const auto r = KvcReader::openFile(path.toStdString());
    auto message = [](const std::function<void()>& f) -> QString {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return QString();
    };
    QVERIFY(message([&] { r->readChunk(3, 1); }).contains("no such chunk"));
    QVERIFY(message([&] { r->readChunk(-1, 1); }).contains("no such chunk"));
    QVERIFY(message([&] { r->readChunk(0, 0); }).contains("no such level"));
    QVERIFY(message([&] { r->readChunk(0, 4); }).contains("no such level"));
    QVERIFY(message([&] { r->decodeAll({1, 2}); }).contains("one per chunk"));
    QVERIFY(message([&] { r->decodeAll({1, 2, 4}); }).contains("no such level"));
    QVERIFY(message([&] { r->decodeAll({}); }).contains("one per chunk"));
    QVERIFY(message([&] { r->decodeAll({1, 0, 1}); }).startsWith(path + ": "));
    // Sizes the index reports add up to the file.
    uint64_t payloads = 0;
    for (int l = 1; l <= 3; ++l) payloads += r->levelBytes(l);
    QVERIFY(payloads < r->fileBytes());
    QCOMPARE(r->levelTableBytes(1), uint64_t(0));
    QCOMPARE(uint64_t(r->chunkBytes(0, 1)), uint64_t(r->readChunk(0, 1).size()));
}

void TestContainer::missingFile()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("nope.kvc").toStdString();
    try {
        KvcReader::openFile(path);
        QFAIL("opened a missing file");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(QString::fromStdString(path) + ": "), e.what());
        QVERIFY2(QString(e.what()).contains("cannot open"), e.what());
    }
    QVERIFY_THROWS_EXCEPTION(Error, KvcReader::openFile(dir.path().toStdString()));  // a folder
}

// Cancelling a write throws Cancelled and leaves neither a partial file nor a temporary; a file
// already at the path stays as it was.
void TestContainer::cancelledWriteLeavesNothing()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const KvSet kv = goldenKv(kGoldenShape, 2024);
    const CodecParams p = goldenParams(kGoldens[0], kGoldenShape);
    const QString path = dir.filePath("c.kvc");
    auto cancelHalfway = [](double f) { return f < 0.5; };
    QVERIFY_THROWS_EXCEPTION(Cancelled, writeKvc(kv, p, path.toStdString(), nullptr, cancelHalfway));
    QVERIFY(!QFileInfo::exists(path));
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files | QDir::Hidden).size(), 0);

    writeAll(path, Bytes{1, 2, 3});
    QVERIFY_THROWS_EXCEPTION(Cancelled, writeKvc(kv, p, path.toStdString(), nullptr, cancelHalfway));
    QVERIFY(readAll(path) == (Bytes{1, 2, 3}));
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files | QDir::Hidden).size(), 1);
    Bytes mem{4, 5};
    QVERIFY_THROWS_EXCEPTION(Cancelled, writeKvc(kv, p, mem, nullptr, cancelHalfway));
    QVERIFY(mem == (Bytes{4, 5}));  // untouched

    // Progress is reported up to 1 and the write then succeeds.
    double last = 0;
    writeKvc(kv, p, path.toStdString(), nullptr, [&](double f) {
        last = f;
        return true;
    });
    QCOMPARE(last, 1.0);
    QCOMPARE(KvcReader::openFile(path.toStdString())->params().numChunks(), 3);
}

void TestContainer::metadataRoundTrip()
{
    for (const Golden& g : kGoldens) {
        const KvSet kv = goldenKv(g.shape, 2024);
        const auto r = KvcReader::openFile((kGoldenDir + "/" + g.name + ".kvc").toStdString());
        QCOMPARE(r->modelName(), kv.modelName);
        QCOMPARE(r->modelFingerprint(), kv.modelFingerprint);
        QCOMPARE(r->context(), kv.context);
        QVERIFY(r->tokens() == kv.tokens);
        const KvSet out = r->decodeAll({1});
        QCOMPARE(out.context, kv.context);
        QVERIFY(out.tokens == kv.tokens);
    }
}

KVSCOPE_TEST_MAIN(TestContainer)
#include "tst_container.moc"
