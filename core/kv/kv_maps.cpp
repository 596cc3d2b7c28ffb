#include "kv/kv_maps.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kvscope {

namespace {

void checkLayer(const KvSet& kv, int layer, const char* what)
{
    if (layer < 0 || layer >= kv.shape().numLayers)
        throw Error(std::string(what) + ": layer " + std::to_string(layer) + " is outside 0.." +
                    std::to_string(kv.shape().numLayers - 1));
}

}  // namespace

std::vector<double> channelEntropies(const KvSet& kv, KvKind kind, int layer, int bins)
{
    checkLayer(kv, layer, "channelEntropies");
    if (bins < 4 || bins > 65536) throw Error("channelEntropies: bins " + std::to_string(bins) + " outside [4, 65536]");
    const KvShape& sh = kv.shape();
    const int H = sh.numKvHeads, T = sh.numTokens, D = sh.headDim, C = sh.channels();
    const int maxLevel = bins / 2 - 1;
    const size_t alphabet = size_t(2 * maxLevel + 1);

    std::vector<float> row(static_cast<size_t>(C));                          // one token, every channel
    std::vector<uint32_t> counts(size_t(C) * alphabet, 0);     // (channels, alphabet)
    std::vector<float> head(static_cast<size_t>(D));
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
            kv.readRows(kind, layer, h, t, 1, head.data());
            std::copy(head.begin(), head.end(), row.begin() + size_t(h) * size_t(D));
        }
        float absmax = 0;
        for (float x : row) absmax = std::max(absmax, std::fabs(x));
        const float inv = absmax > 0 ? float(maxLevel) / absmax : 0.0f;  // all-zero token: zeros
        for (int c = 0; c < C; ++c) {
            const int q = std::clamp(int(std::lrint(row[size_t(c)] * inv)), -maxLevel, maxLevel);
            ++counts[size_t(c) * alphabet + size_t(q + maxLevel)];
        }
    }
    std::vector<double> out(static_cast<size_t>(C), 0.0);
    for (int c = 0; c < C; ++c) {
        double h = 0;
        for (size_t s = 0; s < alphabet; ++s) {
            const uint32_t n = counts[size_t(c) * alphabet + s];
            if (!n) continue;
            const double p = double(n) / double(T);
            h -= p * std::log2(p);
        }
        out[size_t(c)] = h;
    }
    return out;
}

TokenChannelValues tokenChannelValues(const KvSet& kv, KvKind kind, int layer, int maxTokens)
{
    checkLayer(kv, layer, "tokenChannelValues");
    if (maxTokens < 1) throw Error("tokenChannelValues: maxTokens must be at least 1");
    const KvShape& sh = kv.shape();
    TokenChannelValues out;
    out.stride = std::max(1, (sh.numTokens + maxTokens - 1) / maxTokens);
    out.tokens = (sh.numTokens + out.stride - 1) / out.stride;
    out.channels = sh.channels();
    out.values.resize(size_t(out.tokens) * size_t(out.channels));
    std::vector<float> head(size_t(sh.headDim));
    for (int r = 0; r < out.tokens; ++r)
        for (int h = 0; h < sh.numKvHeads; ++h) {
            kv.readRows(kind, layer, h, r * out.stride, 1, head.data());
            std::copy(head.begin(), head.end(),
                      out.values.begin() + ptrdiff_t(size_t(r) * size_t(out.channels) + size_t(h) * size_t(sh.headDim)));
        }
    return out;
}

}  // namespace kvscope
