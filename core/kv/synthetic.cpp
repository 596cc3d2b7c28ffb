// Synthetic KV caches shaped like real fp16 ones (Llama-family magnitudes):
//  - every channel is its own AR(1) process along tokens, x[t] = mean + s[t] with
//    s[t] = rho * s[t-1] + sqrt(1 - rho^2) * sigma * N(0, 1), so the lag-1 correlation is rho and
//    the stationary standard deviation is sigma at every token (s[0] starts stationary);
//  - per-channel means and sigmas are drawn per layer and grow with depth;
//  - keys carry `outlierChannelsPerHead` channels per head with a large mean offset (14-26), the
//    massive key channels real models show; ordinary key channels stay mostly within |x| < 5,
//    values within |x| < 1.5 and without outliers.
// Each (layer, K/V) draws from its own stream derived from the seed, so the result does not depend
// on how many threads generate it.
#include "kv/kv_set.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace kvscope {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): one add and a mixing function per draw; plenty for test data.
struct Rng {
    uint64_t state;

    explicit Rng(uint64_t seed) : state(seed) {}

    uint64_t next()
    {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }

    // [0, 1) with 53 random bits.
    double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }

    // Standard normal by Marsaglia's polar method: no trigonometry, one log and one sqrt per pair.
    float normal()
    {
        if (m_haveSpare) {
            m_haveSpare = false;
            return m_spare;
        }
        for (;;) {
            const uint64_t r = next();
            // two 24-bit uniforms in (-1, 1) from one draw
            const float u = float(int32_t(uint32_t(r >> 40)) - (1 << 23)) * (1.0f / 8388608.0f);
            const float v =
                float(int32_t(uint32_t((r >> 8) & 0xffffffu)) - (1 << 23)) * (1.0f / 8388608.0f);
            const float s = u * u + v * v;
            if (s >= 1.0f || s == 0.0f) continue;
            const float m = std::sqrt(-2.0f * std::log(s) / s);
            m_spare = v * m;
            m_haveSpare = true;
            return u * m;
        }
    }

private:
    float m_spare = 0;
    bool m_haveSpare = false;
};

uint64_t streamSeed(uint64_t seed, int layer, KvKind kind)
{
    Rng r(seed ^ (0x5851f42d4c957f2dull * (2 * uint64_t(layer) + uint64_t(kind) + 1)));
    r.next();
    return r.next();
}

struct ChannelModel {
    float mean = 0;
    float sigma = 0;
};

// Per-channel means and sigmas of one (layer, kind), channel = head * head_dim + d.
std::vector<ChannelModel> drawChannels(Rng& rng, const SyntheticSpec& spec, KvKind kind, int layer)
{
    const KvShape& sh = spec.shape;
    const float depth = sh.numLayers > 1 ? float(layer) / float(sh.numLayers - 1) : 0.0f;
    std::vector<ChannelModel> ch(size_t(sh.channels()));
    if (kind == KvKind::Key) {
        const float scale = 0.4f + 0.5f * depth;
        for (auto& c : ch) {
            c.mean = scale * 0.7f * rng.normal();
            c.sigma = scale * float(0.3 + 0.7 * rng.uniform());
        }
        // Outliers sit in the slow-rotating half of each rotate_half pair block (d mod head_dim/2
        // in the upper half), where real models keep their massive key channels.
        const int d = sh.headDim;
        const int half = d / 2;
        for (int h = 0; h < sh.numKvHeads; ++h) {
            std::vector<int> candidates;
            for (int i = 0; i < d; ++i)
                if (half < 2 || i % half >= half / 2) candidates.push_back(i);
            if (int(candidates.size()) < spec.outlierChannelsPerHead) {
                candidates.clear();
                for (int i = 0; i < d; ++i) candidates.push_back(i);
            }
            for (int k = 0; k < spec.outlierChannelsPerHead; ++k) {
                // partial Fisher-Yates: the first k entries end up a uniform random subset
                const size_t j = size_t(k) + size_t(rng.uniform() * double(candidates.size() - k));
                std::swap(candidates[size_t(k)], candidates[j]);
                ChannelModel& c = ch[size_t(h) * size_t(d) + size_t(candidates[size_t(k)])];
                const float sign = rng.uniform() < 0.5 ? -1.0f : 1.0f;
                c.mean = sign * float(14.0 + 12.0 * rng.uniform());
                c.sigma = float(1.0 + 1.5 * rng.uniform());
            }
        }
    } else {
        const float scale = 0.3f + 0.5f * depth;
        for (auto& c : ch) {
            c.mean = 0.05f * rng.normal();
            c.sigma = scale * float(0.15 + 0.25 * rng.uniform());
        }
    }
    return ch;
}

void fillTensor(KvSet& kv, const SyntheticSpec& spec, KvKind kind, int layer)
{
    const KvShape& sh = kv.shape();
    Rng rng(streamSeed(spec.seed, layer, kind));
    const std::vector<ChannelModel> ch = drawChannels(rng, spec, kind, layer);
    const float rho = kind == KvKind::Key ? spec.keyCorrelation : spec.valueCorrelation;
    const float innovation = std::sqrt(std::max(0.0f, 1.0f - rho * rho));
    const int d = sh.headDim;
    std::vector<float> rows(size_t(sh.numTokens) * size_t(d));  // (tokens, head_dim) of one head
    std::vector<float> state(static_cast<size_t>(d));
    for (int h = 0; h < sh.numKvHeads; ++h) {
        const ChannelModel* c = ch.data() + size_t(h) * size_t(d);
        for (int i = 0; i < d; ++i) state[size_t(i)] = c[i].sigma * rng.normal();
        for (int t = 0; t < sh.numTokens; ++t) {
            float* row = rows.data() + size_t(t) * size_t(d);
            if (t > 0)
                for (int i = 0; i < d; ++i)
                    state[size_t(i)] =
                        rho * state[size_t(i)] + innovation * c[i].sigma * rng.normal();
            for (int i = 0; i < d; ++i) row[i] = c[i].mean + state[size_t(i)];
        }
        kv.writeRows(kind, layer, h, 0, sh.numTokens, rows.data());
    }
}

}  // namespace

KvSet makeSyntheticKv(const SyntheticSpec& spec)
{
    validateShape(spec.shape, "synthetic KV");
    if (spec.outlierChannelsPerHead < 0 || spec.outlierChannelsPerHead > spec.shape.headDim)
        throw Error("synthetic KV: outlierChannelsPerHead " +
                    std::to_string(spec.outlierChannelsPerHead) + " is outside [0, head_dim " +
                    std::to_string(spec.shape.headDim) + "]");
    for (float rho : {spec.keyCorrelation, spec.valueCorrelation})
        if (!(rho >= -1.0f && rho <= 1.0f))
            throw Error("synthetic KV: correlation " + std::to_string(rho) +
                        " is outside [-1, 1]");

    KvSet kv(spec.shape, spec.dtype);
    const int layers = spec.shape.numLayers;
#pragma omp parallel for schedule(dynamic, 1)
    for (int l = 0; l < layers; ++l) {
        fillTensor(kv, spec, KvKind::Key, l);
        fillTensor(kv, spec, KvKind::Value, l);
    }

    // The generator and its statistics play the part of the model; the seed is like another
    // context of it, so caches of different seeds share a fingerprint (and a tuned profile).
    char fp[160];
    std::snprintf(fp, sizeof fp, "synthetic-v1 outliers=%d rho_k=%g rho_v=%g", spec.outlierChannelsPerHead,
                  double(spec.keyCorrelation), double(spec.valueCorrelation));
    kv.modelName = "synthetic";
    kv.modelFingerprint = fp;
    return kv;
}

}  // namespace kvscope
