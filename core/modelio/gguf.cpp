// GGUF layout (all little-endian), as parsed below:
//   "GGUF" u32 version | u64 tensor_count | u64 kv_count
//   kv_count x { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//   padding to general.alignment | data section (each tensor at data + offset)
// string = u64 length + bytes (no terminator); array = u32 elem_type + u64 count + elements.
#include "modelio/gguf.h"

#include "common/error.h"
#include "modelio/mapped_source.h"
#include "common/half.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>


#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.cpp reads little-endian data with memcpy and assumes a little-endian host"
#endif

namespace kvscope {

namespace {

constexpr uint64_t kMaxTensors = 1000000;
constexpr uint64_t kMaxKvs = 100000;
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxAlignment = uint64_t(1) << 20;
constexpr uint64_t kDefaultAlignment = 32;

enum ValueType : uint32_t {
    TUint8 = 0, TInt8 = 1, TUint16 = 2, TInt16 = 3, TUint32 = 4, TInt32 = 5, TFloat32 = 6,
    TBool = 7, TString = 8, TArray = 9, TUint64 = 10, TInt64 = 11, TFloat64 = 12,
};

const char* valueTypeName(uint32_t t)
{
    static const char* names[] = {"uint8",  "int8",  "uint16", "int16", "uint32", "int32", "float32",
                                  "bool",   "string", "array", "uint64", "int64", "float64"};
    return t < sizeof(names) / sizeof(names[0]) ? names[t] : "unknown";
}

bool isIntType(uint32_t t)
{
    return t <= TInt32 || t == TUint64 || t == TInt64;
}
bool isFloatType(uint32_t t) { return t == TFloat32 || t == TFloat64; }

// Bytes of a scalar value type; 0 for string/array/unknown.
uint64_t scalarSize(uint32_t t)
{
    switch (t) {
    case TUint8: case TInt8: case TBool: return 1;
    case TUint16: case TInt16: return 2;
    case TUint32: case TInt32: case TFloat32: return 4;
    case TUint64: case TInt64: case TFloat64: return 8;
    default: return 0;
    }
}

// Smallest number of bytes one element of type t can occupy in the file.
uint64_t minEncodedSize(uint32_t t)
{
    if (t == TString) return 8;      // u64 length
    if (t == TArray) return 4 + 8;   // u32 type + u64 count
    return scalarSize(t);
}

struct TypeTraits {
    const char* name;
    uint32_t blockElems;  // 0: not a ggml type
    uint32_t blockBytes;
};

// ggml type table (ggml.h numbering); 31..33 were removed upstream.
TypeTraits ggmlTraits(uint32_t t)
{
    switch (t) {
    case 0: return {"F32", 1, 4};
    case 1: return {"F16", 1, 2};
    case 2: return {"Q4_0", 32, 18};
    case 3: return {"Q4_1", 32, 20};
    case 6: return {"Q5_0", 32, 22};
    case 7: return {"Q5_1", 32, 24};
    case 8: return {"Q8_0", 32, 34};
    case 9: return {"Q8_1", 32, 36};
    case 10: return {"Q2_K", 256, 84};
    case 11: return {"Q3_K", 256, 110};
    case 12: return {"Q4_K", 256, 144};
    case 13: return {"Q5_K", 256, 176};
    case 14: return {"Q6_K", 256, 210};
    case 15: return {"Q8_K", 256, 292};
    case 16: return {"IQ2_XXS", 256, 66};
    case 17: return {"IQ2_XS", 256, 74};
    case 18: return {"IQ3_XXS", 256, 98};
    case 19: return {"IQ1_S", 256, 50};
    case 20: return {"IQ4_NL", 32, 18};
    case 21: return {"IQ3_S", 256, 110};
    case 22: return {"IQ2_S", 256, 82};
    case 23: return {"IQ4_XS", 256, 136};
    case 24: return {"I8", 1, 1};
    case 25: return {"I16", 1, 2};
    case 26: return {"I32", 1, 4};
    case 27: return {"I64", 1, 8};
    case 28: return {"F64", 1, 8};
    case 29: return {"IQ1_M", 256, 56};
    case 30: return {"BF16", 1, 2};
    case 34: return {"TQ1_0", 256, 54};
    case 35: return {"TQ2_0", 256, 66};
    default: return {"unknown", 0, 0};
    }
}

// One parsed metadata value. Integers keep their sign: `i` for signed types and bool, `u` for
// unsigned; floats in `f`.
struct Value {
    uint32_t type = 0;
    uint32_t elemType = 0;  // arrays only
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    std::string s;
    std::vector<Value> items;  // arrays only
};

template <class T>
T loadLE(const uint8_t* p)
{
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// Bounds-checked reader over the mapped bytes. Every read states what it reads, so a truncated
// file reports the place it ended.
class Cursor {
public:
    Cursor(const uint8_t* base, uint64_t size, const std::string& path)
        : base_(base), size_(size), path_(path) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }

    [[noreturn]] void fail(const std::string& place, const std::string& reason) const
    {
        throw inputError(path_, place, reason + " (at byte " + std::to_string(pos_) + ")");
    }

    void need(uint64_t n, const std::string& place, const char* what) const
    {
        if (n > left())
            fail(place, std::string("truncated: ") + what + " needs " + std::to_string(n) +
                            " bytes, " + std::to_string(left()) + " left");
    }

    template <class T>
    T read(const std::string& place, const char* what)
    {
        need(sizeof(T), place, what);
        const T v = loadLE<T>(base_ + pos_);
        pos_ += sizeof(T);
        return v;
    }

    std::string readString(const std::string& place, const char* what)
    {
        const uint64_t len = read<uint64_t>(place, what);
        if (len > left())
            fail(place, std::string(what) + " length " + std::to_string(len) + " exceeds the " +
                            std::to_string(left()) + " bytes left in the file");
        std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(len));
        pos_ += len;
        return s;
    }

    void skip(uint64_t n) { pos_ += n; }

private:
    const uint8_t* base_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& path_;
};

void readValue(Cursor& c, uint32_t type, Value& v, const std::string& place, int depth)
{
    v.type = type;
    switch (type) {
    case TUint8: v.u = c.read<uint8_t>(place, "uint8 value"); break;
    case TInt8: v.i = c.read<int8_t>(place, "int8 value"); break;
    case TUint16: v.u = c.read<uint16_t>(place, "uint16 value"); break;
    case TInt16: v.i = c.read<int16_t>(place, "int16 value"); break;
    case TUint32: v.u = c.read<uint32_t>(place, "uint32 value"); break;
    case TInt32: v.i = c.read<int32_t>(place, "int32 value"); break;
    case TUint64: v.u = c.read<uint64_t>(place, "uint64 value"); break;
    case TInt64: v.i = c.read<int64_t>(place, "int64 value"); break;
    case TFloat32: v.f = c.read<float>(place, "float32 value"); break;
    case TFloat64: v.f = c.read<double>(place, "float64 value"); break;
    case TBool: {
        const uint8_t b = c.read<uint8_t>(place, "bool value");
        if (b > 1) c.fail(place, "bool value " + std::to_string(b) + " is neither 0 nor 1");
        v.i = b;
        break;
    }
    case TString: v.s = c.readString(place, "string value"); break;
    case TArray: {
        if (depth >= kMaxArrayDepth)
            c.fail(place, "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
        v.elemType = c.read<uint32_t>(place, "array element type");
        const uint64_t minSize = minEncodedSize(v.elemType);
        if (minSize == 0)
            c.fail(place, "unknown array element type " + std::to_string(v.elemType));
        const uint64_t n = c.read<uint64_t>(place, "array length");
        if (n > c.left() / minSize)
            c.fail(place, "array length " + std::to_string(n) + " of " + valueTypeName(v.elemType) +
                              " cannot fit in the " + std::to_string(c.left()) + " bytes left");
        v.items.resize(size_t(n));
        for (uint64_t k = 0; k < n; ++k) readValue(c, v.elemType, v.items[k], place, depth + 1);
        break;
    }
    default:
        c.fail(place, "unknown value type " + std::to_string(type));
    }
}

std::string describeType(const Value& v)
{
    if (v.type != TArray) return valueTypeName(v.type);
    return std::string("array[") + valueTypeName(v.elemType) + "]";
}

bool mulOverflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

const char* ggmlTypeName(uint32_t type) { return ggmlTraits(type).name; }

uint64_t GgufTensorInfo::elements() const
{
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;  // open() proved this does not overflow
    return n;
}

struct GgufFile::Impl : MappedSource {
    uint32_t version = 0;
    uint64_t alignment = kDefaultAlignment;
    uint64_t dataOffset = 0;
    std::vector<std::string> keyOrder;
    std::unordered_map<std::string, Value> kv;
    std::vector<GgufTensorInfo> tensors;
    std::unordered_map<std::string, size_t> byName;


    const Value& get(const std::string& key) const
    {
        auto it = kv.find(key);
        if (it == kv.end()) throw inputError(path, "metadata '" + key + "'", "key not found");
        return it->second;
    }

    [[noreturn]] void wrongType(const std::string& key, const Value& v, const char* expected) const
    {
        throw inputError(path, "metadata '" + key + "'",
                         "holds " + describeType(v) + ", expected " + expected);
    }

    void parse();
};

void GgufFile::Impl::parse()
{
    Cursor c(map, size, path);
    const std::string header = "header";
    c.need(4, header, "magic");
    if (std::memcmp(map, "GGUF", 4) != 0) {
        char shown[5] = {};
        for (int k = 0; k < 4; ++k) shown[k] = (map[k] >= 32 && map[k] < 127) ? char(map[k]) : '?';
        c.fail(header, std::string("bad magic '") + shown + "', not a GGUF file");
    }
    c.skip(4);
    version = c.read<uint32_t>(header, "version");
    if (version == 1) c.fail(header, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (version != 2 && version != 3) {
        const uint32_t swapped = __builtin_bswap32(version);
        if (swapped >= 1 && swapped <= 3)
            c.fail(header, "big-endian GGUF (version " + std::to_string(swapped) +
                               ") is not supported");
        c.fail(header, "unsupported GGUF version " + std::to_string(version) +
                           " (only versions 2 and 3)");
    }
    const uint64_t nTensors = c.read<uint64_t>(header, "tensor count");
    const uint64_t nKv = c.read<uint64_t>(header, "metadata count");
    if (nTensors > kMaxTensors)
        c.fail(header, "tensor count " + std::to_string(nTensors) + " exceeds the limit of " +
                           std::to_string(kMaxTensors));
    if (nKv > kMaxKvs)
        c.fail(header, "metadata count " + std::to_string(nKv) + " exceeds the limit of " +
                           std::to_string(kMaxKvs));

    for (uint64_t k = 0; k < nKv; ++k) {
        const std::string keyPlace = "metadata #" + std::to_string(k);
        std::string key = c.readString(keyPlace, "key");
        if (key.empty()) c.fail(keyPlace, "empty key");
        const std::string place = "metadata '" + key + "'";
        if (kv.count(key)) c.fail(place, "duplicate key");
        const uint32_t type = c.read<uint32_t>(place, "value type");
        Value v;
        readValue(c, type, v, place, 0);
        keyOrder.push_back(key);
        kv.emplace(std::move(key), std::move(v));
    }

    auto ait = kv.find("general.alignment");
    if (ait != kv.end()) {
        const Value& a = ait->second;
        const std::string place = "metadata 'general.alignment'";
        if (!isIntType(a.type)) wrongType("general.alignment", a, "an integer");
        const bool neg = (a.type == TInt8 || a.type == TInt16 || a.type == TInt32 || a.type == TInt64);
        const uint64_t al = neg ? (a.i < 0 ? 0 : uint64_t(a.i)) : a.u;
        if (al == 0 || (al & (al - 1)) != 0 || al > kMaxAlignment)
            throw inputError(path, place,
                             "alignment " + (neg ? std::to_string(a.i) : std::to_string(a.u)) +
                                 " is not a power of two up to " + std::to_string(kMaxAlignment));
        alignment = al;
    }

    tensors.reserve(size_t(nTensors));
    for (uint64_t k = 0; k < nTensors; ++k) {
        const std::string idPlace = "tensor info #" + std::to_string(k);
        GgufTensorInfo t;
        t.name = c.readString(idPlace, "name");
        const std::string place = "tensor '" + t.name + "'";
        if (byName.count(t.name)) c.fail(place, "duplicate tensor name");
        const uint32_t nDims = c.read<uint32_t>(place, "dimension count");
        if (nDims < 1 || nDims > 4)
            c.fail(place, "dimension count " + std::to_string(nDims) + " is not in 1..4");
        uint64_t elems = 1;
        for (uint32_t j = 0; j < nDims; ++j) {
            const uint64_t d = c.read<uint64_t>(place, "dimension");
            if (d == 0) c.fail(place, "dimension " + std::to_string(j) + " is zero");
            if (mulOverflow(elems, d, &elems) || elems > (uint64_t(1) << 60))
                c.fail(place, "element count overflows (dimension " + std::to_string(j) + " = " +
                                  std::to_string(d) + ")");
            t.dims.push_back(d);
        }
        t.type = c.read<uint32_t>(place, "type");
        t.offset = c.read<uint64_t>(place, "offset");
        const TypeTraits tr = ggmlTraits(t.type);
        if (tr.blockElems == 0) c.fail(place, "unknown ggml type " + std::to_string(t.type));
        if (t.dims[0] % tr.blockElems != 0)
            c.fail(place, "first dimension " + std::to_string(t.dims[0]) + " is not a multiple of " +
                              tr.name + "'s block size " + std::to_string(tr.blockElems));
        t.nbytes = elems / tr.blockElems * tr.blockBytes;  // elems <= 2^60, blockBytes < 2^9 per 1+ elems
        byName.emplace(t.name, tensors.size());
        tensors.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment.
    const uint64_t headerEnd = c.pos();
    dataOffset = (headerEnd + alignment - 1) / alignment * alignment;
    const uint64_t dataSize = dataOffset <= size ? size - dataOffset : 0;

    std::vector<size_t> order(tensors.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    for (const GgufTensorInfo& t : tensors) {
        const std::string place = "tensor '" + t.name + "'";
        if (t.offset % alignment != 0)
            throw inputError(path, place,
                             "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                                 std::to_string(alignment));
        if (dataOffset > size || t.offset > dataSize || t.nbytes > dataSize - t.offset)
            throw inputError(path, place,
                             "data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                                 ") lies outside the " + std::to_string(dataSize) +
                                 "-byte data section at file offset " + std::to_string(dataOffset));
    }
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
        const GgufTensorInfo& prev = tensors[order[k - 1]];
        const GgufTensorInfo& cur = tensors[order[k]];
        if (prev.offset + prev.nbytes > cur.offset)
            throw inputError(path, "tensor '" + cur.name + "'",
                             "data at offset " + std::to_string(cur.offset) + " overlaps tensor '" +
                                 prev.name + "' [" + std::to_string(prev.offset) + ", +" +
                                 std::to_string(prev.nbytes) + ")");
    }
}

bool isGgufFile(const std::string& path)
{
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    char magic[4] = {0, 0, 0, 0};
    const bool ok = std::fread(magic, 1, 4, f) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
    std::fclose(f);
    return ok;
}

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : d_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path)
{
    auto impl = std::make_unique<Impl>();
    impl->mapFile(path);
    impl->parse();
    return GgufFile(std::move(impl));
}

const std::string& GgufFile::path() const { return d_->path; }
uint32_t GgufFile::version() const { return d_->version; }
uint64_t GgufFile::alignment() const { return d_->alignment; }
uint64_t GgufFile::dataOffset() const { return d_->dataOffset; }
const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return d_->tensors; }

const GgufTensorInfo* GgufFile::find(const std::string& name) const
{
    auto it = d_->byName.find(name);
    return it == d_->byName.end() ? nullptr : &d_->tensors[it->second];
}

std::vector<std::string> GgufFile::keys() const { return d_->keyOrder; }
bool GgufFile::has(const std::string& key) const { return d_->kv.count(key) != 0; }
std::string GgufFile::typeName(const std::string& key) const { return describeType(d_->get(key)); }

std::string GgufFile::getString(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (v.type != TString) d_->wrongType(key, v, "string");
    return v.s;
}

namespace {
// Integer value as int64; false if it does not fit.
bool asInt(const Value& v, int64_t* out)
{
    if (v.type == TUint8 || v.type == TUint16 || v.type == TUint32 || v.type == TUint64) {
        if (v.u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
        *out = int64_t(v.u);
    } else {
        *out = v.i;
    }
    return true;
}
}  // namespace

int64_t GgufFile::getInt(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (!isIntType(v.type)) d_->wrongType(key, v, "an integer");
    int64_t r;
    if (!asInt(v, &r))
        throw inputError(d_->path, "metadata '" + key + "'",
                         "uint64 value " + std::to_string(v.u) + " does not fit in int64");
    return r;
}

double GgufFile::getFloat(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (isFloatType(v.type)) return v.f;
    if (v.type == TUint8 || v.type == TUint16 || v.type == TUint32 || v.type == TUint64)
        return double(v.u);
    if (isIntType(v.type)) return double(v.i);
    d_->wrongType(key, v, "a number");
}

bool GgufFile::getBool(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (v.type != TBool) d_->wrongType(key, v, "bool");
    return v.i != 0;
}

std::vector<std::string> GgufFile::getStringArray(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (v.type != TArray || v.elemType != TString) d_->wrongType(key, v, "array[string]");
    std::vector<std::string> r;
    r.reserve(v.items.size());
    for (const Value& e : v.items) r.push_back(e.s);
    return r;
}

std::vector<int64_t> GgufFile::getIntArray(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (v.type != TArray || !isIntType(v.elemType)) d_->wrongType(key, v, "an array of integers");
    std::vector<int64_t> r(v.items.size());
    for (size_t k = 0; k < r.size(); ++k)
        if (!asInt(v.items[k], &r[k]))
            throw inputError(d_->path, "metadata '" + key + "'",
                             "element " + std::to_string(k) + " does not fit in int64");
    return r;
}

std::vector<float> GgufFile::getFloatArray(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (v.type != TArray || !isFloatType(v.elemType)) d_->wrongType(key, v, "an array of floats");
    std::vector<float> r(v.items.size());
    for (size_t k = 0; k < r.size(); ++k) r[k] = float(v.items[k].f);
    return r;
}

uint64_t GgufFile::arrayLength(const std::string& key) const
{
    const Value& v = d_->get(key);
    if (v.type != TArray) d_->wrongType(key, v, "an array");
    return v.items.size();
}

const uint8_t* GgufFile::tensorBytes(const GgufTensorInfo& t) const
{
    const std::string place = "tensor '" + t.name + "'";
    // Re-check the bounds: `t` may not come from tensors().
    const TypeTraits tr = ggmlTraits(t.type);
    const uint64_t dataSize = d_->size - d_->dataOffset;
    uint64_t n = 1;
    bool bad = tr.blockElems == 0 || t.dims.empty() || t.dims.size() > 4 || t.offset > dataSize ||
               t.nbytes > dataSize - t.offset;
    for (uint64_t d : t.dims) bad = bad || mulOverflow(n, d, &n);
    if (bad) throw inputError(d_->path, place, "tensor info does not describe data in this file");
    if (n % tr.blockElems != 0 || n / tr.blockElems * tr.blockBytes != t.nbytes)
        throw inputError(d_->path, place,
                         "byte size " + std::to_string(t.nbytes) + " does not match shape and type " + tr.name);
    return d_->map + d_->dataOffset + t.offset;
}

void GgufFile::releaseTensorPages(const GgufTensorInfo& t) const
{
    const uint8_t* p = tensorBytes(t);
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (uintptr_t(p) + page - 1) / page * page, end = (uintptr_t(p) + t.nbytes) / page * page;
    // Advice only: a failure leaves the pages resident, nothing else.
    if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::vector<float> GgufFile::readTensorF32(const GgufTensorInfo& t) const
{
    const std::string place = "tensor '" + t.name + "'";
    const uint8_t* src = tensorBytes(t);
    if (!canDequantize(t.type))
        throw inputError(d_->path, place,
                         std::string("cannot dequantize ggml type ") + std::to_string(t.type) + " (" +
                             ggmlTraits(t.type).name + "); supported: " + kSupportedTypes);
    std::vector<float> out(static_cast<size_t>(t.elements()));
    try {
        dequantizeGgml(t.type, src, t.nbytes, out.size(), out.data());
    } catch (const Error& e) {
        throw inputError(d_->path, place, e.what());
    }
    return out;
}

}  // namespace kvscope
