// Codec cases shared by the GPU decoder's tests (tst_cuda_core: host emulation; tst_cuda: the
// device): caches, parameters over every codec option, and exact output comparison.
#pragma once

#include "codec/chunk_codec.h"
#include "codec/transform.h"
#include "common/half.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace kvscope_test {

using namespace kvscope;

struct Case {
    KvShape shape;
    DType dtype = DType::F16;
    int chunkTokens = 64;
    int deltaGroup = 10;
    int anchorBins = 0;
    Quantizer keyQ = Quantizer::PerToken, valueQ = Quantizer::PerToken;
    TableMode tables = TableMode::InBand;
    TableScope scope = TableScope::Channel;
    bool random = false;  // i.i.d. normal values instead of the structured synthetic cache
    uint64_t seed = 1;
};

inline KvSet makeKv(const Case& c)
{
    if (!c.random) {
        SyntheticSpec s;
        s.shape = c.shape;
        s.dtype = c.dtype;
        s.seed = c.seed;
        return makeSyntheticKv(s);
    }
    KvSet kv(c.shape, c.dtype);
    std::mt19937 rng(uint32_t(c.seed));
    std::normal_distribution<float> n(0.0f, 1.5f);
    for (int k = 0; k < 2; ++k)
        for (int l = 0; l < c.shape.numLayers; ++l)
            for (int h = 0; h < c.shape.numKvHeads; ++h)
                for (int t = 0; t < c.shape.numTokens; ++t)
                    for (int d = 0; d < c.shape.headDim; ++d) kv.set(KvKind(k), l, h, t, d, n(rng));
    return kv;
}

// The default three levels plus one with the extreme bins (256 for keys, 4 for values).
inline CodecParams makeParams(const Case& c, const KvSet& kv)
{
    CodecParams p;
    p.codec = CodecId::CacheGen;
    p.shape = c.shape;
    p.dtype = c.dtype;
    p.profile = defaultProfile(c.shape.numLayers);
    p.profile.chunkTokens = c.chunkTokens;
    p.profile.deltaGroup = c.deltaGroup;
    p.profile.anchorBins = c.anchorBins;
    p.profile.keyQuantizer = c.keyQ;
    p.profile.valueQuantizer = c.valueQ;
    CodecLevel extreme;
    extreme.name = "extreme";
    extreme.keyBins.assign(size_t(c.shape.numLayers), 256);
    extreme.valueBins.assign(size_t(c.shape.numLayers), 4);
    p.profile.levels.push_back(extreme);
    p.profile.tables = TableMode::InBand;
    p.profile.tableScope = c.scope;
    if (c.tables == TableMode::Shared) calibrateProfile(p, {&kv});
    return p;
}

// The whole-cache output layout of the GPU decoder from a KvSet: (kind, layer) tensors in order.
inline std::vector<uint8_t> flatten(const KvSet& kv)
{
    std::vector<uint8_t> out;
    for (int k = 0; k < 2; ++k)
        for (int l = 0; l < kv.shape().numLayers; ++l) {
            const uint8_t* d = kv.data(KvKind(k), l);
            out.insert(out.end(), d, d + kv.tensorBytes());
        }
    return out;
}

// Equal bytes, except that two NaNs of the output dtype count as equal (a corrupt scale can make
// NaNs, and the CPU's F16C conversion keeps NaN payload bits the scalar rounding does not).
inline bool sameOutput(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType dt, size_t* firstDiff)
{
    if (a.size() != b.size()) return false;
    const size_t w = dtypeSize(dt);
    for (size_t i = 0; i < a.size(); i += w) {
        if (std::memcmp(&a[i], &b[i], w) == 0) continue;
        bool nanA, nanB;
        if (dt == DType::F32) {
            float x, y;
            std::memcpy(&x, &a[i], 4);
            std::memcpy(&y, &b[i], 4);
            nanA = std::isnan(x), nanB = std::isnan(y);
        } else {
            uint16_t x, y;
            std::memcpy(&x, &a[i], 2);
            std::memcpy(&y, &b[i], 2);
            const float fx = dt == DType::F16 ? halfToFloat(x) : bf16ToFloat(x);
            const float fy = dt == DType::F16 ? halfToFloat(y) : bf16ToFloat(y);
            nanA = std::isnan(fx), nanB = std::isnan(fy);
        }
        if (nanA && nanB) continue;
        *firstDiff = i / w;
        return false;
    }
    return true;
}


// o_proj-like weights of H heads of D dims: per head A^T A / D with A drawn from g (standard
// normal) through rng, head after head; symmetric positive semi-definite.
inline std::vector<float> randomGramWeights(std::mt19937& rng, std::normal_distribution<float>& g, int H, int D)
{
    std::vector<float> w(size_t(H) * D * D, 0.0f);
    for (int h = 0; h < H; ++h) {
        std::vector<float> a(size_t(D) * D);
        for (float& x : a) x = g(rng);
        for (int i = 0; i < D; ++i)
            for (int j = 0; j < D; ++j) {
                float s = 0;
                for (int k = 0; k < D; ++k) s += a[size_t(k) * D + i] * a[size_t(k) * D + j];
                w[(size_t(h) * D + i) * D + j] = s / D;
            }
    }
    return w;
}

// A float32 cache with what the transform codec's stages read: RoPE inverse frequencies (and a
// nonzero position0), query second moments, o_proj weights and attention mass, all deterministic.
inline KvSet transformCache(const KvShape& shape, uint64_t seed, DType dtype = DType::F32, int position0 = 5)
{
    SyntheticSpec spec;
    spec.shape = shape;
    spec.dtype = dtype;
    spec.seed = seed;
    KvSet kv = makeSyntheticKv(spec);
    const int L = shape.numLayers, H = shape.numKvHeads, D = shape.headDim, T = shape.numTokens;
    for (int i = 0; i < D / 2; ++i) kv.ropeInvFreq.push_back(float(std::pow(500000.0, -2.0 * i / D)));
    kv.ropePosition0 = position0;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(0.2f, 3.0f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int l = 0; l < L; ++l) {
        std::vector<float> q(size_t(H) * D), w(size_t(H) * D * D, 0.0f), mass(size_t(H) * T);
        for (float& x : q) x = u(rng);
        for (int h = 0; h < H; ++h) {  // M_h = B^T B / D: symmetric positive definite
            std::vector<float> b(size_t(D) * D);
            for (float& x : b) x = nd(rng);
            for (int i = 0; i < D; ++i)
                for (int j = 0; j < D; ++j) {
                    double acc = 0;
                    for (int k = 0; k < D; ++k) acc += double(b[size_t(k) * D + i]) * b[size_t(k) * D + j];
                    w[(size_t(h) * D + i) * D + j] = float(acc / D + (i == j ? 0.1 : 0.0));
                }
            for (int t = 0; t < T; ++t)
                mass[size_t(h) * T + t] = t % 37 == 0 ? 0.3f : 0.001f * std::exp(2.5f * std::sin(0.21f * float(t + 5 * l + h)));
        }
        kv.querySq.push_back(q);
        kv.valueWeight.push_back(w);
        kv.attnMass.push_back(mass);
    }
    return kv;
}

inline CodecParams transformParams(const KvSet& kv, const TransformSettings& s, int chunkTokens)
{
    CodecParams p;
    p.codec = CodecId::Transform;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    p.profile = defaultProfile(kv.shape().numLayers);
    p.profile.chunkTokens = chunkTokens;
    p.profile.transform = s;
    p.profile.transformLevels = defaultTransformLevels();
    return p;
}

// Calibrates the transform model on `calib` into the profile (what `calibrate --codec transform`
// stores), then prepares p for encoding `kv` with it.
// The same with one level per relative water level in `thetas` (keys and values alike), coarsest first.
inline CodecParams transformParams(const KvSet& kv, const TransformSettings& s, const std::vector<double>& thetas,
                                   int chunkTokens)
{
    CodecParams p = transformParams(kv, s, chunkTokens);
    p.profile.transformLevels.clear();
    for (double t : thetas) {
        TransformLevel l;
        l.name = "t " + std::to_string(t);
        l.keyTheta = l.valueTheta = t;
        p.profile.transformLevels.push_back(l);
    }
    return p;
}
inline void calibrateTransform(CodecParams& p, const std::vector<const KvSet*>& calib, const KvSet& kv)
{
    const TransformModel m = fitTransform(p.profile.transform, p.profile.transformLevels, calib);
    serializeTransformModel(m, p.profile.transformModel);
    prepareTransform(p, kv, "test cache");
}

// The parity cases of both suites: (name, case).
inline std::vector<std::pair<const char*, Case>> parityCases()
{
    std::vector<std::pair<const char*, Case>> v;
    auto add = [&v](const char* name) -> Case& {
        v.emplace_back(name, Case{});
        return v.back().second;
    };
    add("structured, chunks of 64 (last 44), per token, delta 10, in-band").shape = {3, 2, 64, 300};
    {
        Case& c = add("random, chunks of 16 (last 12), per token, no delta, in-band");
        c.shape = {2, 2, 32, 300}, c.chunkTokens = 16, c.deltaGroup = 0, c.random = true;
    }
    {
        Case& c = add("random, chunks of 256 (one short chunk), per channel K and V, delta 10, in-band");
        c.shape = {2, 3, 16, 200}, c.chunkTokens = 256, c.random = true;
        c.keyQ = c.valueQ = Quantizer::PerChannel;
    }
    {
        Case& c = add("structured, chunks of 64, per-channel K, delta 8 with 64-bin anchors, shared");
        c.shape = {2, 2, 64, 200}, c.keyQ = Quantizer::PerChannel, c.deltaGroup = 8, c.anchorBins = 64;
        c.tables = TableMode::Shared;
    }
    {
        Case& c = add("structured, chunks of 128, per token, no delta, shared, bf16");
        c.shape = {2, 4, 32, 300}, c.chunkTokens = 128, c.deltaGroup = 0, c.tables = TableMode::Shared, c.dtype = DType::BF16;
    }
    {
        Case& c = add("random, chunks of 32, per-channel V, delta 2, in-band, f32");
        c.shape = {2, 2, 32, 100}, c.chunkTokens = 32, c.valueQ = Quantizer::PerChannel, c.deltaGroup = 2;
        c.random = true, c.dtype = DType::F32;
    }
    {
        Case& c = add("head_dim 20 (not a multiple of 4), chunks of 50, delta 7, shared");
        c.shape = {2, 3, 20, 130}, c.chunkTokens = 50, c.deltaGroup = 7, c.tables = TableMode::Shared;
    }
    {
        Case& c = add("real-shaped: 30 layers x 3 heads x 64 (SmolLM2), 300 tokens, chunks of 256");
        c.shape = {30, 3, 64, 300}, c.chunkTokens = 256;
    }
    {
        Case& c = add("real-shaped: 2 layers x 32 heads x 128 (Llama-2-7B), 520 tokens, chunks of 256");
        c.shape = {2, 32, 128, 520}, c.chunkTokens = 256;
    }
    // One probability table per KV head (table_scope head, format 2.2): the same options again.
    {
        Case& c = add("per-head tables: structured, chunks of 64 (last 44), per token, delta 10, in-band");
        c.shape = {3, 2, 64, 300}, c.scope = TableScope::Head;
    }
    {
        Case& c = add("per-head tables: random, chunks of 16 (last 12), per token, no delta, in-band");
        c.shape = {2, 2, 32, 300}, c.chunkTokens = 16, c.deltaGroup = 0, c.random = true, c.scope = TableScope::Head;
    }
    {
        Case& c = add("per-head tables: random, chunks of 256 (one short chunk), per channel K and V, delta 10, in-band");
        c.shape = {2, 3, 16, 200}, c.chunkTokens = 256, c.random = true, c.scope = TableScope::Head;
        c.keyQ = c.valueQ = Quantizer::PerChannel;
    }
    {
        Case& c = add("per-head tables: random, chunks of 32, per-channel K, no delta, in-band, f32");
        c.shape = {2, 4, 8, 100}, c.chunkTokens = 32, c.keyQ = Quantizer::PerChannel, c.deltaGroup = 0;
        c.random = true, c.dtype = DType::F32, c.scope = TableScope::Head;
    }
    {
        Case& c = add("per-head tables: structured, chunks of 64, per-channel K, delta 8 with 64-bin anchors, shared");
        c.shape = {2, 2, 64, 200}, c.keyQ = Quantizer::PerChannel, c.deltaGroup = 8, c.anchorBins = 64;
        c.tables = TableMode::Shared, c.scope = TableScope::Head;
    }
    {
        Case& c = add("per-head tables: structured, chunks of 128, per token, no delta, shared, bf16");
        c.shape = {2, 4, 32, 300}, c.chunkTokens = 128, c.deltaGroup = 0, c.tables = TableMode::Shared, c.dtype = DType::BF16;
        c.scope = TableScope::Head;
    }
    {
        Case& c = add("per-head tables: head_dim 20, chunks of 50, per-channel V, delta 7, shared");
        c.shape = {2, 3, 20, 130}, c.chunkTokens = 50, c.deltaGroup = 7, c.valueQ = Quantizer::PerChannel;
        c.tables = TableMode::Shared, c.scope = TableScope::Head;
    }
    {
        Case& c = add("per-head tables: real-shaped: 2 layers x 32 heads x 128 (Llama-2-7B), 520 tokens, chunks of 256, shared");
        c.shape = {2, 32, 128, 520}, c.chunkTokens = 256, c.tables = TableMode::Shared, c.scope = TableScope::Head;
    }
    return v;
}

}  // namespace kvscope_test
