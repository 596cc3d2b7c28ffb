#include "eval/sensitivity.h"

#include "common/error.h"
#include "eval/codec_trial.h"

#include <cstring>

namespace kvscope {

std::vector<LayerSensitivity> measureLayerSensitivity(const QualityReference& ref, const KvSet& original,
                                                      const CodecParams& params, int bins,
                                                      const std::function<bool(int, int)>& progress)
{
    if (ref.task().continuation.empty()) throw Error("layer sensitivity needs a continuation to score");
    const int L = original.shape().numLayers;
    CodecParams p = params;
    p.codec = CodecId::CacheGen;
    p.profile.tables = TableMode::InBand;  // tables calibrated for other bins would not fit
    p.profile.levelTables.clear();
    CodecLevel uniform;
    uniform.name = "uniform " + std::to_string(bins);
    uniform.keyBins.assign(size_t(L), bins);
    uniform.valueBins.assign(size_t(L), bins);
    p.profile.levels = {uniform};
    p.profile.defaultLevel = 1;
    validateProfile(p.profile, "sensitivity");
    const KvSet quantized = runCodecTrial(original, p, 1).decoded;
    const KvError err = compareKv(original, quantized);

    std::vector<LayerSensitivity> out(static_cast<size_t>(L));
    KvSet candidate = original;
    int done = 0;
    for (int l = 0; l < L; ++l) {
        LayerSensitivity& s = out[size_t(l)];
        s.layer = l;
        s.keyRms = err.layers[size_t(l)].key.rms;
        s.valueRms = err.layers[size_t(l)].value.rms;
        for (KvKind kind : {KvKind::Key, KvKind::Value}) {
            std::memcpy(candidate.data(kind, l), quantized.data(kind, l), candidate.tensorBytes());
            const Quality q = ref.measure(candidate, false);
            std::memcpy(candidate.data(kind, l), original.data(kind, l), candidate.tensorBytes());
            (kind == KvKind::Key ? s.keyDeltaPplPct : s.valueDeltaPplPct) = q.deltaPplPct;
            (kind == KvKind::Key ? s.keyKl : s.valueKl) = q.kl;
            if (progress && !progress(++done, 2 * L)) throw Error("cancelled");
        }
    }
    return out;
}

}  // namespace kvscope
