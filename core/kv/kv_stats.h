// Statistics for the inspector: what the values of a KV cache look like per layer and channel.
// All functions read a KvSet and return plain value structs (the GUI draws them, the CLI prints them).
#pragma once

#include "kv/kv_set.h"

#include <vector>

namespace kvscope {

// std is the population standard deviation (divides by the count), accumulated in double.
struct ChannelStats {
    float min = 0, max = 0, mean = 0, std = 0, absmax = 0;
};

struct TensorStats {              // one kind (K or V) of one layer
    KvKind kind = KvKind::Key;
    int layer = 0;
    ChannelStats all;             // over every value of the tensor
    std::vector<ChannelStats> channels;  // (channels) = head * head_dim + d
    // Token locality (CacheGen insight 1): mean over channels of the variance along tokens of the
    // raw values, and of the deltas x[t] - x[anchor(t)] within groups of `deltaGroup` tokens
    // (anchor = first token of each group; anchors themselves excluded).
    double varianceRaw = 0;
    double varianceDelta = 0;
    // Empirical entropy (bits per value) of symbols from CacheGen's per-token symmetric quantizer
    // at `bins`, measured per channel and averaged: what a per-channel entropy coder approaches.
    // Symbols: MAX = bins/2 - 1, scale = absmax over the token's channels / MAX,
    // q = clamp(round(x / scale), -MAX, MAX) with ties to even; an all-zero token gives zeros.
    double entropyBits = 0;
    // Same for delta coding in groups of `deltaGroup` tokens: anchors keep their own symbols,
    // other tokens code x - (the anchor's quantized-dequantized value) with their own per-token
    // scale; both kinds of symbol share each channel's distribution. Because every token is
    // rescaled to its own absmax, this can exceed entropyBits even when varianceDelta is smaller.
    double entropyBitsDelta = 0;
    // Channels whose absmax exceeds `outlierFactor` x the median channel absmax, largest first
    // (median of an even count: mean of the two middle values).
    std::vector<int> outlierChannels;
};

// The figures the GUI and the CLI both print, defined once so they cannot disagree.
// Median of the per-channel absmax (an even count takes the mean of the two middle values), the
// reference of the outlier rule; 0 for a tensor without channels.
double medianChannelAbsmax(const TensorStats& t);
// Token locality of one tensor: varianceRaw / varianceDelta (+inf when varianceDelta is 0 and
// varianceRaw is not; 0 when both are 0).
double localityRatio(const TensorStats& t);
// Token locality of a whole cache, or of one kind when kind is given: the sum of varianceRaw over
// the tensors divided by the sum of varianceDelta (a variance-weighted mean, so near-constant
// layers do not dominate), with the same conventions for zero sums.
double localityRatio(const std::vector<TensorStats>& stats);
double localityRatio(const std::vector<TensorStats>& stats, KvKind kind);

struct StatsOptions {
    int deltaGroup = 10;
    int bins = 32;                // CacheGen's "bins": 2*(bins/2-1)+1 levels
    float outlierFactor = 6.0f;
};

// Throws kvscope::Error for a layer outside the set, deltaGroup < 1, bins outside [4, 65536]
// or outlierFactor <= 0.
TensorStats computeTensorStats(const KvSet& kv, KvKind kind, int layer, const StatsOptions& opt = {});
// Every layer, keys then values per layer (index 2 * layer + kind); runs layers in parallel.
// Throws like computeTensorStats; an empty set gives an empty vector.
std::vector<TensorStats> computeAllStats(const KvSet& kv, const StatsOptions& opt = {});

struct Histogram {
    double lo = 0, hi = 0;        // range covered by the bins
    std::vector<uint64_t> counts; // equal-width bins over [lo, hi]
    uint64_t below = 0, above = 0;
};
// Histogram of one tensor, or of one channel when channel >= 0. When lo == hi the range is the
// data's finite [min, max] (widened by 0.5 each side when all values are equal). A value equal to
// hi lands in the last bin; NaNs are not counted, infinities go to below/above.
// Throws kvscope::Error for a layer or channel (other than -1) out of range, numBins outside
// [1, 2^24], or lo > hi / non-finite bounds.
Histogram computeHistogram(const KvSet& kv, KvKind kind, int layer, int channel, int numBins,
                           double lo = 0, double hi = 0);

}  // namespace kvscope
