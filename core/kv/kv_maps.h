// Per-channel maps of one KV tensor for the GUI's distributions view: the entropy of each
// channel's quantized symbols (the heat map's third metric) and the raw (tokens, channels) values
// of one layer (its token x channel view). Plain value results; no Qt, no torch.
#pragma once

#include "kv/kv_set.h"

#include <vector>

namespace kvscope {

// Empirical entropy in bits per value of each channel's symbols under CacheGen's per-token
// symmetric quantizer at `bins` (the same symbols as TensorStats::entropyBits, which is the mean
// of this vector): MAX = bins/2 - 1, scale = absmax over the token's channels / MAX.
// Result: (channels). Throws kvscope::Error for a layer out of range or bins outside [4, 65536].
std::vector<double> channelEntropies(const KvSet& kv, KvKind kind, int layer, int bins);

struct TokenChannelValues {
    int tokens = 0;             // rows kept (every `stride`-th token from 0)
    int stride = 1;
    int channels = 0;
    std::vector<float> values;  // (tokens, channels), channel = head * head_dim + d
};
// One layer's values as a token x channel matrix, keeping at most maxTokens rows (a stride > 1
// skips tokens evenly). Throws kvscope::Error for a layer out of range or maxTokens < 1.
TokenChannelValues tokenChannelValues(const KvSet& kv, KvKind kind, int layer, int maxTokens);

}  // namespace kvscope
