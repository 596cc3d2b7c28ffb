// One table of codecs against one reference: every level of a profile and the baselines, each
// with its size (bits per value, ratios vs fp16 and int8) and its quality (quality.h). Used by
// `kvscope-cli eval`, `demo` and the GUI's codec tuner.
#pragma once

#include "codec/chunk_codec.h"
#include "eval/quality.h"
#include "kv/kv_compare.h"

#include <functional>
#include <string>
#include <vector>

namespace kvscope {

struct EvalRow {
    std::string codec;   // "cachegen", "fp16", "int8", "kivi2", "kivi4", "zstd", "text"
    int level = 1;       // 1-based level of the profile (1 for baselines)
    std::string levelName;
    uint64_t bytes = 0;
    double bitsPerValue = 0.0;
    double ratioVsFp16 = 0.0;
    double ratioVsInt8 = 0.0;
    double encodeSeconds = 0.0, decodeSeconds = 0.0;
    Quality quality;
    KvError error;       // reconstruction error per layer, K and V
    bool exact = false;  // decoded == original, bit for bit
};

struct EvalPlan {
    CodecParams cachegen;  // profile whose levels are evaluated (codec CacheGen)
    bool levels = true;    // every level of the profile
    std::vector<CodecId> baselines = {CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4, CodecId::Zstd};
    bool textRecompute = true;  // prefill the context again: must reproduce the original exactly
    // Transform codecs (rows "transform"), every level of each, evaluated after the CacheGen
    // levels; transformNames[i] (when given) prefixes the level names of transforms[i].
    std::vector<CodecParams> transforms;
    std::vector<std::string> transformNames;
};

// Called after each row with (rows done, rows planned); returning false cancels (throws Error).
using EvalProgress = std::function<bool(int, int)>;

// Rows in order: text (when planned), the baselines, then the levels, then the transform levels.
std::vector<EvalRow> evaluateCodecs(const LlamaRuntime& runtime, const QualityReference& ref, const KvSet& original,
                                    const EvalPlan& plan, const EvalProgress& progress = {});

}  // namespace kvscope
