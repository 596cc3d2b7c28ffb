#include "eval/evaluate.h"

#include "common/error.h"
#include "eval/codec_trial.h"

#include <chrono>
#include <cstring>

namespace kvscope {

std::vector<EvalRow> evaluateCodecs(const LlamaRuntime& runtime, const QualityReference& ref, const KvSet& original,
                                    const EvalPlan& plan, const EvalProgress& progress)
{
    const KvShape& shape = original.shape();
    const int levels = plan.levels ? plan.cachegen.numLevels() : 0;
    int transformLevels = 0;
    for (const CodecParams& t : plan.transforms) transformLevels += t.numLevels();
    const int planned = (plan.textRecompute ? 1 : 0) + int(plan.baselines.size()) + levels + transformLevels;
    std::vector<EvalRow> rows;
    auto finish = [&](EvalRow r, const KvSet& decoded) {
        const SizeFigures size = sizeFigures(r.bytes, shape);
        r.bitsPerValue = size.bitsPerValue;
        r.ratioVsFp16 = size.ratioVsFp16;
        r.ratioVsInt8 = size.ratioVsInt8;
        r.quality = ref.measure(decoded);
        r.error = compareKv(original, decoded);
        r.exact = sameBytes(original, decoded);
        rows.push_back(std::move(r));
        if (progress && !progress(int(rows.size()), planned)) throw Error("cancelled");
    };

    if (plan.textRecompute) {
        // Text is what a sender ships instead of KV: the token ids (4 bytes each).
        EvalRow r;
        r.codec = "text";
        r.bytes = 4 * uint64_t(ref.task().context.size());
        const auto t0 = std::chrono::steady_clock::now();
        InferenceSession s(runtime);
        s.append(ref.task().context, nullptr);
        const KvSet recomputed = s.exportKv();
        r.decodeSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        finish(std::move(r), recomputed);
    }
    for (CodecId id : plan.baselines) {
        CodecParams p = plan.cachegen;
        p.codec = id;
        const CodecTrial t = runCodecTrial(original, p, 1);
        EvalRow r;
        r.codec = codecName(id);
        r.bytes = t.bytes;
        r.encodeSeconds = t.encodeSeconds;
        r.decodeSeconds = t.decodeSeconds;
        finish(std::move(r), t.decoded);
    }
    for (int l = 1; l <= levels; ++l) {
        const CodecTrial t = runCodecTrial(original, plan.cachegen, l);
        EvalRow r;
        r.codec = codecName(CodecId::CacheGen);
        r.level = l;
        r.levelName = plan.cachegen.profile.levels[size_t(l - 1)].name;
        r.bytes = t.bytes;
        r.encodeSeconds = t.encodeSeconds;
        r.decodeSeconds = t.decodeSeconds;
        finish(std::move(r), t.decoded);
    }
    for (size_t i = 0; i < plan.transforms.size(); ++i)
    for (int l = 1; l <= plan.transforms[i].numLevels(); ++l) {
        const CodecParams& tp = plan.transforms[i];
        const CodecTrial t = runCodecTrial(original, tp, l);
        EvalRow r;
        r.codec = codecName(CodecId::Transform);
        r.level = l;
        const auto& names = tp.profile.transformLevels;
        r.levelName = size_t(l) <= names.size() ? names[size_t(l - 1)].name : "level " + std::to_string(l);
        if (i < plan.transformNames.size() && !plan.transformNames[i].empty()) r.levelName = plan.transformNames[i] + ": " + r.levelName;
        r.bytes = t.bytes;
        r.encodeSeconds = t.encodeSeconds;
        r.decodeSeconds = t.decodeSeconds;
        finish(std::move(r), t.decoded);
    }
    return rows;
}

}  // namespace kvscope
