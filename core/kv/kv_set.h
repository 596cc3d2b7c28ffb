// A captured KV cache in memory: per layer, keys and values of shape (kv_heads, tokens, head_dim)
// in the dtype the model produced (fp16, bf16 or fp32), plus the tokens, the context text and the
// model it came from.
//
// READ ME FIRST: keys are stored after RoPE in the Hugging Face `rotate_half` layout, where channel
// d pairs with d + head_dim/2. Loaders of interleaved-RoPE checkpoints (llama2.c, Meta) permute
// wq/wk so every model's keys share that layout. A "channel" is head * head_dim + d.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

enum class DType : uint8_t { F16 = 0, BF16 = 1, F32 = 2 };

const char* dtypeName(DType t);                 // "float16", "bfloat16", "float32"
// Accepts the names above and the aliases fp16/f16/half, bf16, fp32/f32/float. Returns false for
// anything else and then leaves *out untouched.
bool parseDType(const std::string& s, DType* out);
inline size_t dtypeSize(DType t) { return t == DType::F32 ? 4 : 2; }

enum class KvKind : uint8_t { Key = 0, Value = 1 };
inline const char* kindName(KvKind k) { return k == KvKind::Key ? "key" : "value"; }

struct KvShape {
    int numLayers = 0;
    int numKvHeads = 0;
    int headDim = 0;
    int numTokens = 0;

    int channels() const { return numKvHeads * headDim; }
    // values in one K (or V) tensor of one layer
    size_t layerValues() const { return size_t(numKvHeads) * size_t(numTokens) * size_t(headDim); }
    // values in the whole cache, K and V of every layer
    size_t totalValues() const { return 2 * size_t(numLayers) * layerValues(); }
    bool operator==(const KvShape& o) const
    {
        return numLayers == o.numLayers && numKvHeads == o.numKvHeads && headDim == o.headDim &&
               numTokens == o.numTokens;
    }
};

// Largest dimensions any reader accepts before allocating; beyond them a file is refused.
struct KvLimits {
    static constexpr int maxLayers = 1024;
    static constexpr int maxKvHeads = 1024;
    static constexpr int maxHeadDim = 1024;
    static constexpr int maxTokens = 1 << 21;
    static constexpr size_t maxTotalValues = size_t(1) << 36;  // 128 GiB of fp16
};

// Throws kvscope::Error "what: reason" when a dimension is not positive or the shape is beyond
// KvLimits (each dimension, and totalValues()).
void validateShape(const KvShape& s, const std::string& what);

class KvSet {
public:
    KvSet() = default;
    // Zero-filled. Throws kvscope::Error for a shape validateShape refuses, std::bad_alloc when
    // memory runs out.
    KvSet(const KvShape& shape, DType dtype);

    const KvShape& shape() const { return m_shape; }
    DType dtype() const { return m_dtype; }

    // Raw storage of one tensor: (kv_heads, tokens, head_dim) in dtype(), row-major, host byte
    // order. Here and in the accessors below, an index out of range is a bug and aborts
    // (KVSCOPE_ASSERT).
    const uint8_t* data(KvKind kind, int layer) const;
    uint8_t* data(KvKind kind, int layer);
    size_t tensorBytes() const { return m_shape.layerValues() * dtypeSize(m_dtype); }

    // Value access by (head, token, d), converted to/from float.
    float at(KvKind kind, int layer, int head, int token, int d) const;
    void set(KvKind kind, int layer, int head, int token, int d, float v);

    // Copies tokens [t0, t0 + n) of one head as floats into out: (n, head_dim).
    void readRows(KvKind kind, int layer, int head, int t0, int n, float* out) const;
    // Writes (n, head_dim) floats into tokens [t0, t0 + n) of one head, rounding to dtype().
    void writeRows(KvKind kind, int layer, int head, int t0, int n, const float* in);

    // Metadata that travels with the cache.
    std::string modelName;
    std::string modelFingerprint;
    std::vector<int32_t> tokens;  // (num_tokens), may be empty for synthetic caches
    std::string context;          // UTF-8

    // RoPE the keys carry, for codecs that undo it (empty when unknown, e.g. synthetic caches or
    // files written before it was recorded): key pair (i, i + head_dim/2) of token t is rotated by
    // the angle (ropePosition0 + t) * ropeInvFreq[i], scaling (linear, llama3, ...) already applied.
    std::vector<float> ropeInvFreq;  // (head_dim / 2)
    int ropePosition0 = 0;           // position of token 0

    // Attention statistics a codec can weight its errors by (empty when not captured).
    // querySq[l][h * head_dim + d]: mean over the prefill's queries of sum over the query heads of
    // KV group h of q[d]^2 (after RoPE), so E[(q.(k - k^))^2] = sum_d querySq * (k - k^)_d^2 when
    // errors are uncorrelated across d.
    std::vector<std::vector<float>> querySq;      // per layer (kv_heads * head_dim)
    // valueWeight[l][(h * head_dim + i) * head_dim + j]: M_h = sum over the query heads of group h
    // of W_o,head^T W_o,head (head_dim x head_dim), so the o_proj output error of a value error e
    // is e^T M_h e (summed with the attention weights).
    std::vector<std::vector<float>> valueWeight;  // per layer (kv_heads, head_dim, head_dim)
    // attnMass[l][h * tokens + t]: attention token t received during the prefill, summed over the
    // query heads of KV group h and over the queries that see it, divided by the number of those
    // queries and by the group size (the mean softmax probability it gets). Empty when not captured.
    std::vector<std::vector<float>> attnMass;     // per layer (kv_heads * tokens)
    bool hasRope() const { return !ropeInvFreq.empty(); }

private:
    size_t offset(int head, int token, int d) const
    {
        return (size_t(head) * size_t(m_shape.numTokens) + size_t(token)) * size_t(m_shape.headDim) +
               size_t(d);
    }
    KvShape m_shape;
    DType m_dtype = DType::F16;
    std::vector<std::vector<uint8_t>> m_keys;    // per layer
    std::vector<std::vector<uint8_t>> m_values;  // per layer
};

// True when a and b have the same shape, dtype and stored bytes (metadata is not compared): a
// decoded cache that is bit-exact with its original.
bool sameBytes(const KvSet& a, const KvSet& b);

// A synthetic cache with the structure real ones show (see synthetic.cpp): tokens correlated
// along the sequence, per-channel offsets, and a few key channels with large magnitude.
// Deterministic for a given seed. For tests and demos only until a model runtime captures real KV.
struct SyntheticSpec {
    KvShape shape{8, 4, 64, 1024};
    DType dtype = DType::F16;
    uint64_t seed = 1;
    int outlierChannelsPerHead = 2;   // key channels with ~10-20x magnitude
    float keyCorrelation = 0.95f;     // AR(1) coefficient between neighbouring tokens
    float valueCorrelation = 0.8f;
};
// Throws kvscope::Error for a shape validateShape refuses, outlierChannelsPerHead outside
// [0, head_dim] or a correlation outside [-1, 1]. The result has empty tokens and context,
// modelName "synthetic" and a fingerprint that records the spec.
KvSet makeSyntheticKv(const SyntheticSpec& spec);

}  // namespace kvscope
