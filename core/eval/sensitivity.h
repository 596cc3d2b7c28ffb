// How much quantizing one layer alone hurts: the input to per-layer bin choices (CacheGen §5.1
// sets bins per layer group by this kind of measurement; eval/tune.h builds its distortion model on it).
//
// Method: quantize the whole cache once with `bins` bins in every layer (the profile's other
// settings: quantizer, delta coding, chunking), then for each layer and for K and V separately
// put back only that tensor's quantized values into the original and score the continuation.
// Cost: one codec trial and 2 x layers scoring passes (no generation).
#pragma once

#include "codec/chunk_codec.h"
#include "eval/layer_sensitivity.h"
#include "eval/quality.h"

#include <functional>
#include <vector>

namespace kvscope {

// `ref` must have a continuation. Progress: (passes done, passes planned); false cancels.
std::vector<LayerSensitivity> measureLayerSensitivity(const QualityReference& ref, const KvSet& original,
                                                      const CodecParams& params, int bins,
                                                      const std::function<bool(int, int)>& progress = {});

}  // namespace kvscope
