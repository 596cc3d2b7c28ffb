// Rate-distortion sweeps: a grid of CacheGen configurations (bins per layer group for K and V,
// chunk size, delta coding, quantizer) measured against one quality reference, with the baselines
// placed on the same axes. `kvscope-cli sweep` writes the points as CSV and JSON for plotting.
//
// Every point costs one in-memory codec trial and one scoring pass of the continuation (plus a
// short generation when answers are asked for): the original forward state lives in the
// QualityReference, so no point prefills the context again.
#pragma once

#include "codec/chunk_codec.h"
#include "eval/quality.h"

#include <functional>
#include <string>
#include <vector>

namespace kvscope {

struct SweepGrid {
    CodecProfile base;                         // anchor bins, table mode; the axes below override the rest
    std::vector<std::vector<int>> keyBins;     // per point: 1 value (all layers) or CacheGen's 3 key groups
    std::vector<std::vector<int>> valueBins;   // 1 value or CacheGen's 2 value groups
    std::vector<int> chunkTokens = {256};
    std::vector<int> deltaGroups = {10};       // 0 = delta coding off
    std::vector<Quantizer> keyQuantizers = {Quantizer::PerToken};
    std::vector<Quantizer> valueQuantizers = {Quantizer::PerToken};
    std::vector<CodecId> baselines = {CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4, CodecId::Zstd};
    bool answers = false;                      // also generate the answer (token agreement)

    size_t points() const;                     // cachegen points (baselines not counted)
};

struct SweepPoint {
    std::string codec;  // "cachegen" or a baseline name
    std::vector<int> keyGroups, valueGroups;  // as given on the grid (cachegen)
    int chunkTokens = 0, deltaGroup = 0;
    Quantizer keyQuantizer = Quantizer::PerToken, valueQuantizer = Quantizer::PerToken;
    uint64_t bytes = 0;
    double bitsPerValue = 0, ratioVsFp16 = 0, ratioVsInt8 = 0;
    double keyRms = 0, valueRms = 0;  // reconstruction RMS error over all layers
    Quality quality;
    bool pareto = false;  // no other point is both smaller (or equal) and better in KL (or equal)
};

// Cachegen points in grid order (key bins slowest, then value bins, chunk, delta, quantizers),
// then the baselines. Progress: (points done, points planned); false cancels.
std::vector<SweepPoint> runSweep(const QualityReference& ref, const KvSet& original, const SweepGrid& grid,
                                 const std::function<bool(int, int)>& progress = {});

// The CacheGen parameters of one grid point: base (shape, dtype and the profile's other settings)
// with these axes and one level of these per-group bins; validated (throws kvscope::Error).
CodecParams sweepPointParams(CodecParams base, int chunk, int delta, Quantizer keyQuantizer, Quantizer valueQuantizer,
                             const std::vector<int>& keyGroups, const std::vector<int>& valueGroups);

// "16" or "32/16/16": one value or one per layer group, '/'-separated. Throws on bad text.
std::vector<int> parseGroupBins(const std::string& text);
std::string groupBinsText(const std::vector<int>& groups);

}  // namespace kvscope
