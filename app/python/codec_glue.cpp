#include "codec_glue.h"

#include "bench/bench.h"
#include "cli_codec.h"
#include "cli_stats.h"
#include "codec/transform.h"
#include "eval/transform_default.h"
#include "kv/kv_compare.h"
#include "kv/kv_stats.h"

#include <cmath>

namespace kvscope::python {

using json = nlohmann::json;

namespace {

// Keeps level `level` of a CacheGen profile (and its calibrated tables) as the only level.
void keepOneLevel(CodecParams& p, int level, const std::string& source)
{
    if (p.codec != CodecId::CacheGen) {
        if (level == 1 && p.numLevels() == 1) return;
        throw Error(std::string("level: ") + codecName(p.codec) + (p.numLevels() == 1 ? " has one level" :
                    " writes all its levels; encode without level= and decode the one you want"));
    }
    if (level < 1 || level > p.numLevels())
        throw Error(source + ": level " + std::to_string(level) + " does not exist (the profile has " +
                    std::to_string(p.numLevels()) + ")");
    CodecProfile& pr = p.profile;
    pr.levels = {pr.levels[size_t(level - 1)]};
    if (pr.hasCalibratedTables()) pr.levelTables = {pr.levelTables[size_t(level - 1)]};
    pr.defaultLevel = 1;
}

// The CLI's option handling for o, with the default transform ladder as `encode` picks it.
cli::ProfileOptions profileOptions(const KvSet& kv, const EncodeOptions& o)
{
    cli::ProfileOptions po;
    po.codec = o.codec;
    po.profilePath = o.profilePath;
    po.chunkTokens = o.chunkTokens;
    po.deltaGroup = o.deltaGroup;
    po.anchorBins = o.anchorBins;
    po.tables = o.tables;
    po.tableScope = o.tableScope;
    po.keyQuantizer = o.keyQuantizer;
    po.valueQuantizer = o.valueQuantizer;
    po.forceProfile = o.forceProfile;
    if (po.codec == "transform" && po.profilePath.empty()) {
        // As cli::withDefaultTransform without a model (`encode`): the default ladder's calibrated
        // profile from the user's cache when it is there, else the transform fitted on this cache.
        try {
            po.profilePath = cachedDefaultTransform(kv.modelFingerprint);
        } catch (const Error&) {
            // no shipped ladder: the CLI notes it and fits on the cache; so does this
        }
    }
    return po;
}

}  // namespace

EncodeReport encodeTo(const KvSet& kv, const EncodeOptions& o, const KvcPut& put)
{
    const cli::ProfileOptions po = profileOptions(kv, o);
    CodecParams p = po.params(kv);
    if (o.level) keepOneLevel(p, o.level, po.source());
    // As `encode` (cmd_codec.cpp): shared tables from the profile when it carries them, otherwise
    // calibrated on this cache and stored in the file.
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    const bool fromProfile = shared && p.profile.hasCalibratedTables();
    std::vector<LevelTables> calibrated;
    if (fromProfile) calibrated = profileTables(p, po.source());
    const KvcWriteReport w = writeKvc(kv, p, put, "<bytes>", fromProfile ? &calibrated : nullptr);
    EncodeReport r;
    r.fileBytes = w.fileBytes;
    r.levelBytes = w.levelBytes;
    r.levelTableBytes = w.levelTableBytes;
    r.tablesFromProfile = fromProfile;
    r.defaultLevel = p.defaultLevel();
    if (p.codec == CodecId::Transform) {
        r.sideBytes = transformSideBytes(*p.transform);
        r.modelFrom = p.transform->fittedOnCache ? "cache" : "profile";
    }
    return r;
}

std::pair<double, double> benchCodecSeconds(const KvSet& kv, const EncodeOptions& o, int level, int repeats)
{
    const CodecParams p = profileOptions(kv, o).params(kv);
    if (level < 1 || level > p.numLevels())
        throw Error("level: " + std::to_string(level) + " does not exist (the profile has " + std::to_string(p.numLevels()) + ")");
    BenchOptions b;
    b.repeats = repeats;
    b.threads = 1;
    const CodecBenchResult r = benchCodec(kv, p, level, b);
    const double mb = double(kv.shape().totalValues()) * 2 / 1e6;  // the MB of fp16 every throughput counts
    return {mb / r.encodeMBps, mb / r.decodeMBps};
}

std::vector<int> checkedLevels(const KvcReader& r, const std::vector<int>& levels)
{
    const std::vector<int> out = levels.empty() ? std::vector<int>{r.params().profile.defaultLevel} : levels;
    for (int l : out)
        if (l < 1 || l > r.params().numLevels())
            throw Error(r.name() + ": level " + std::to_string(l) + " does not exist (the file has " +
                        std::to_string(r.params().numLevels()) + ")");
    return out;
}

json statsJson(const KvSet& kv, int deltaGroup, int bins, bool perChannel)
{
    if (deltaGroup < 2) throw Error("delta_group must be at least 2");
    if (bins < 4 || bins > 256 || bins % 2) throw Error("bins must be an even number in 4..256");
    StatsOptions opt;
    opt.deltaGroup = deltaGroup;
    opt.bins = bins;
    return cli::kvStatsJson(kv, opt, perChannel);
}

json compareJson(const KvSet& reference, const KvSet& decoded)
{
    const KvError e = compareKv(reference, decoded);
    json layers = json::array();
    for (const LayerError& l : e.layers)
        layers.push_back({{"layer", l.layer},
                          {"key_max_abs", l.key.maxAbs}, {"key_rms", l.key.rms}, {"key_snr_db", cli::number(l.key.snrDb)},
                          {"value_max_abs", l.value.maxAbs}, {"value_rms", l.value.rms},
                          {"value_snr_db", cli::number(l.value.snrDb)}});
    return {{"max_abs_error", e.maxAbs}, {"rms_error", e.rms}, {"layers", layers}};
}

}  // namespace kvscope::python
