// The JSON of `kvscope-cli stats` (per layer, K and V: range, spread, delta variance, entropy,
// outlier channels), shared with the Python module's kvscope.stats so the two cannot drift.
#pragma once

#include "cli_common.h"

#include "kv/kv_set.h"
#include "kv/kv_stats.h"

#include <vector>

namespace kvscope::cli {

inline json channelStatsJson(const ChannelStats& c)
{
    return {{"min", c.min}, {"max", c.max}, {"mean", c.mean}, {"std", c.std}, {"absmax", c.absmax}};
}

inline json tensorStatsJson(const TensorStats& t, bool perChannel)
{
    json j = channelStatsJson(t.all);
    j["variance_raw"] = t.varianceRaw;
    j["variance_delta"] = t.varianceDelta;
    j["delta_variance_ratio"] = number(localityRatio(t));
    j["median_channel_absmax"] = medianChannelAbsmax(t);
    j["entropy_bits"] = t.entropyBits;
    j["entropy_bits_delta"] = t.entropyBitsDelta;
    j["outlier_channels"] = t.outlierChannels;
    if (perChannel) {
        json ch = json::array();
        for (const ChannelStats& c : t.channels) ch.push_back(channelStatsJson(c));
        j["channels"] = ch;
    }
    return j;
}

// Every key of `stats --json` but "file". The caller validates the options first.
inline json kvStatsJson(const KvSet& kv, const StatsOptions& options, bool perChannel)
{
    const std::vector<TensorStats> all = computeAllStats(kv, options);
    const KvShape& s = kv.shape();
    json j = {{"model_name", kv.modelName},   {"num_layers", s.numLayers}, {"num_kv_heads", s.numKvHeads},
              {"head_dim", s.headDim},        {"num_tokens", s.numTokens}, {"dtype", dtypeName(kv.dtype())},
              {"delta_group", options.deltaGroup}, {"bins", options.bins}};
    json layers = json::array();
    for (int l = 0; l < s.numLayers; ++l)
        layers.push_back({{"layer", l},
                          {"key", tensorStatsJson(all[size_t(2 * l)], perChannel)},
                          {"value", tensorStatsJson(all[size_t(2 * l + 1)], perChannel)}});
    j["layers"] = layers;
    j["delta_variance_ratio"] = number(localityRatio(all));
    j["key_delta_variance_ratio"] = number(localityRatio(all, KvKind::Key));
    j["value_delta_variance_ratio"] = number(localityRatio(all, KvKind::Value));
    return j;
}

}  // namespace kvscope::cli
