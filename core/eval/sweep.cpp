#include "eval/sweep.h"

#include "common/error.h"
#include "eval/codec_trial.h"
#include "kv/kv_compare.h"

#include <cmath>

namespace kvscope {

namespace {

// RMS error over all layers of one kind, from the per-layer RMS errors (equal-sized tensors).
double overallRms(const KvError& e, KvKind kind)
{
    double sum = 0;
    for (const LayerError& l : e.layers) {
        const double r = kind == KvKind::Key ? l.key.rms : l.value.rms;
        sum += r * r;
    }
    return e.layers.empty() ? 0.0 : std::sqrt(sum / double(e.layers.size()));
}

SweepPoint measurePoint(const QualityReference& ref, const KvSet& original, const CodecParams& p, bool answers)
{
    const CodecTrial t = runCodecTrial(original, p, 1);
    const KvError e = compareKv(original, t.decoded);
    SweepPoint s;
    s.codec = codecName(p.codec);
    s.bytes = t.bytes;
    const SizeFigures size = sizeFigures(t.bytes, original.shape());
    s.bitsPerValue = size.bitsPerValue;
    s.ratioVsFp16 = size.ratioVsFp16;
    s.ratioVsInt8 = size.ratioVsInt8;
    s.keyRms = overallRms(e, KvKind::Key);
    s.valueRms = overallRms(e, KvKind::Value);
    s.quality = ref.measure(t.decoded, answers);
    return s;
}

}  // namespace

size_t SweepGrid::points() const
{
    return keyBins.size() * valueBins.size() * chunkTokens.size() * deltaGroups.size() * keyQuantizers.size() *
           valueQuantizers.size();
}

std::vector<int> parseGroupBins(const std::string& text)
{
    std::vector<int> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        const size_t end = std::min(text.find('/', pos), text.size());
        const std::string item = text.substr(pos, end - pos);
        size_t used = 0;
        int v = 0;
        try {
            v = std::stoi(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (item.empty() || used != item.size()) throw Error("bins '" + text + "': '" + item + "' is not a number");
        if (v < 4 || v > 256 || v % 2 != 0) throw Error("bins '" + text + "': " + item + " is outside 4..256 or odd");
        out.push_back(v);
        pos = end + 1;
    }
    return out;
}

std::string groupBinsText(const std::vector<int>& groups)
{
    std::string s;
    for (size_t i = 0; i < groups.size(); ++i) s += (i ? "/" : "") + std::to_string(groups[i]);
    return s;
}

CodecParams sweepPointParams(CodecParams base, int chunk, int delta, Quantizer keyQuantizer, Quantizer valueQuantizer,
                             const std::vector<int>& keyGroups, const std::vector<int>& valueGroups)
{
    const int L = base.shape.numLayers;
    base.codec = CodecId::CacheGen;
    CodecProfile& pr = base.profile;
    pr.numLayers = L;
    pr.chunkTokens = chunk;
    pr.deltaGroup = delta;
    pr.keyQuantizer = keyQuantizer;
    pr.valueQuantizer = valueQuantizer;
    pr.levelTables.clear();
    pr.tableChannels = 0;
    pr.levels = {CodecLevel{"sweep", cachegenGroupBins(true, keyGroups, L), cachegenGroupBins(false, valueGroups, L), ""}};
    pr.defaultLevel = 1;
    validateProfile(pr, "sweep point K " + groupBinsText(keyGroups) + " V " + groupBinsText(valueGroups));
    return base;
}

std::vector<SweepPoint> runSweep(const QualityReference& ref, const KvSet& original, const SweepGrid& grid,
                                 const std::function<bool(int, int)>& progress)
{
    const KvShape& shape = original.shape();
    const int L = shape.numLayers;
    if (grid.points() == 0 && grid.baselines.empty()) throw Error("sweep: the grid is empty");
    if (ref.task().continuation.empty()) throw Error("sweep: the context has no continuation to score");
    for (int chunk : grid.chunkTokens)
        if (chunk > shape.numTokens)
            throw Error("sweep: chunk of " + std::to_string(chunk) + " tokens is longer than the context (" +
                        std::to_string(shape.numTokens) + " tokens)");
    const int total = int(grid.points() + grid.baselines.size());
    int done = 0;
    auto tick = [&] {
        if (progress && !progress(++done, total)) throw Error("cancelled");
    };

    std::vector<SweepPoint> points;
    for (const std::vector<int>& kb : grid.keyBins)
        for (const std::vector<int>& vb : grid.valueBins)
            for (int chunk : grid.chunkTokens)
                for (int delta : grid.deltaGroups)
                    for (Quantizer kq : grid.keyQuantizers)
                        for (Quantizer vq : grid.valueQuantizers) {
                            CodecParams base;
                            base.shape = shape;
                            base.dtype = original.dtype();
                            base.profile = grid.base;
                            const CodecParams p = sweepPointParams(base, chunk, delta, kq, vq, kb, vb);
                            SweepPoint s = measurePoint(ref, original, p, grid.answers);
                            s.keyGroups = kb;
                            s.valueGroups = vb;
                            s.chunkTokens = chunk;
                            s.deltaGroup = delta;
                            s.keyQuantizer = kq;
                            s.valueQuantizer = vq;
                            points.push_back(std::move(s));
                            tick();
                        }
    for (CodecId id : grid.baselines) {
        CodecParams p;
        p.codec = id;
        p.shape = shape;
        p.dtype = original.dtype();
        p.profile = defaultProfile(L);
        p.profile.chunkTokens = grid.chunkTokens.empty() ? 256 : grid.chunkTokens.front();
        SweepPoint s = measurePoint(ref, original, p, grid.answers);
        s.chunkTokens = p.profile.chunkTokens;
        points.push_back(std::move(s));
        tick();
    }
    for (SweepPoint& a : points) {
        a.pareto = true;
        for (const SweepPoint& b : points) {
            const bool noWorse = b.bytes <= a.bytes && b.quality.kl <= a.quality.kl;
            const bool better = b.bytes < a.bytes || b.quality.kl < a.quality.kl;
            if (&a != &b && noWorse && better) {
                a.pareto = false;
                break;
            }
        }
    }
    return points;
}

}  // namespace kvscope
