#include "kv/kv_set.h"

#include "common/error.h"
#include "common/half.h"

#include <cstring>

namespace kvscope {

const char* dtypeName(DType t)
{
    switch (t) {
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    }
    return "unknown";
}

bool parseDType(const std::string& s, DType* out)
{
    DType t;
    if (s == "float16" || s == "fp16" || s == "f16" || s == "half")
        t = DType::F16;
    else if (s == "bfloat16" || s == "bf16")
        t = DType::BF16;
    else if (s == "float32" || s == "fp32" || s == "f32" || s == "float")
        t = DType::F32;
    else
        return false;
    if (out) *out = t;
    return true;
}

void validateShape(const KvShape& s, const std::string& what)
{
    auto fail = [&](const std::string& reason) { throw inputError(what, "", reason); };
    auto check = [&](const char* name, int v, int limit) {
        if (v <= 0) fail(std::string(name) + " is " + std::to_string(v) + ", must be positive");
        if (v > limit)
            fail(std::string(name) + " is " + std::to_string(v) + ", above the limit of " +
                 std::to_string(limit));
    };
    check("num_layers", s.numLayers, KvLimits::maxLayers);
    check("num_kv_heads", s.numKvHeads, KvLimits::maxKvHeads);
    check("head_dim", s.headDim, KvLimits::maxHeadDim);
    check("num_tokens", s.numTokens, KvLimits::maxTokens);
    // layerValues() < 2^41 once the checks above passed; divide instead of multiplying further
    // so the comparison cannot overflow.
    const size_t perLayer = s.layerValues();
    if (perLayer > KvLimits::maxTotalValues / (2 * size_t(s.numLayers)))
        fail("cache of " + std::to_string(s.numLayers) + " x 2 x " + std::to_string(perLayer) +
             " values is above the limit of " + std::to_string(KvLimits::maxTotalValues));
}

KvSet::KvSet(const KvShape& shape, DType dtype) : m_shape(shape), m_dtype(dtype)
{
    validateShape(shape, "KV set");
    m_keys.assign(size_t(shape.numLayers), std::vector<uint8_t>(tensorBytes(), 0));
    m_values.assign(size_t(shape.numLayers), std::vector<uint8_t>(tensorBytes(), 0));
}

const uint8_t* KvSet::data(KvKind kind, int layer) const
{
    KVSCOPE_ASSERT(layer >= 0 && layer < m_shape.numLayers);
    return (kind == KvKind::Key ? m_keys : m_values)[size_t(layer)].data();
}

uint8_t* KvSet::data(KvKind kind, int layer)
{
    KVSCOPE_ASSERT(layer >= 0 && layer < m_shape.numLayers);
    return (kind == KvKind::Key ? m_keys : m_values)[size_t(layer)].data();
}

namespace {

inline float loadValue(const uint8_t* base, size_t i, DType t)
{
    if (t == DType::F32) {
        float f;
        std::memcpy(&f, base + 4 * i, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, base + 2 * i, 2);
    return t == DType::F16 ? halfToFloat(h) : bf16ToFloat(h);
}

inline void storeValue(uint8_t* base, size_t i, DType t, float v)
{
    if (t == DType::F32) {
        std::memcpy(base + 4 * i, &v, 4);
        return;
    }
    const uint16_t h = t == DType::F16 ? floatToHalf(v) : floatToBf16(v);
    std::memcpy(base + 2 * i, &h, 2);
}

}  // namespace

float KvSet::at(KvKind kind, int layer, int head, int token, int d) const
{
    KVSCOPE_ASSERT(head >= 0 && head < m_shape.numKvHeads && token >= 0 &&
                   token < m_shape.numTokens && d >= 0 && d < m_shape.headDim);
    return loadValue(data(kind, layer), offset(head, token, d), m_dtype);
}

void KvSet::set(KvKind kind, int layer, int head, int token, int d, float v)
{
    KVSCOPE_ASSERT(head >= 0 && head < m_shape.numKvHeads && token >= 0 &&
                   token < m_shape.numTokens && d >= 0 && d < m_shape.headDim);
    storeValue(data(kind, layer), offset(head, token, d), m_dtype, v);
}

void KvSet::readRows(KvKind kind, int layer, int head, int t0, int n, float* out) const
{
    KVSCOPE_ASSERT(head >= 0 && head < m_shape.numKvHeads && t0 >= 0 && n >= 0 &&
                   t0 <= m_shape.numTokens - n);
    // Tokens of one head are contiguous rows, so the block is one run of n * head_dim values.
    const uint8_t* base = data(kind, layer);
    const size_t first = offset(head, t0, 0);
    const size_t count = size_t(n) * size_t(m_shape.headDim);
    if (count == 0) return;
    switch (m_dtype) {
    case DType::F32:
        std::memcpy(out, base + 4 * first, 4 * count);
        break;
    case DType::F16:
        halfToFloatN(reinterpret_cast<const uint16_t*>(base) + first, out, count);
        break;
    case DType::BF16:
        for (size_t i = 0; i < count; ++i) out[i] = loadValue(base, first + i, DType::BF16);
        break;
    }
}

void KvSet::writeRows(KvKind kind, int layer, int head, int t0, int n, const float* in)
{
    KVSCOPE_ASSERT(head >= 0 && head < m_shape.numKvHeads && t0 >= 0 && n >= 0 &&
                   t0 <= m_shape.numTokens - n);
    uint8_t* base = data(kind, layer);
    const size_t first = offset(head, t0, 0);
    const size_t count = size_t(n) * size_t(m_shape.headDim);
    if (count == 0) return;
    switch (m_dtype) {
    case DType::F32:
        std::memcpy(base + 4 * first, in, 4 * count);
        break;
    case DType::F16:
        floatToHalfN(in, reinterpret_cast<uint16_t*>(base) + first, count);
        break;
    case DType::BF16:
        for (size_t i = 0; i < count; ++i) storeValue(base, first + i, DType::BF16, in[i]);
        break;
    }
}

bool sameBytes(const KvSet& a, const KvSet& b)
{
    if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
    for (int l = 0; l < a.shape().numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            if (std::memcmp(a.data(k, l), b.data(k, l), a.tensorBytes()) != 0) return false;
    return true;
}

}  // namespace kvscope
