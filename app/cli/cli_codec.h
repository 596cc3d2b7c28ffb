// Codec options shared by the commands that encode (encode, bench, eval, demo).
#pragma once

#include "cli_common.h"
#include "cli_grammar.h"

#include "codec/chunk_codec.h"
#include "codec/profile.h"
#include "kv/kv_compare.h"
#include "kv/kv_set.h"

#include <cstdio>
#include <memory>
#include <string>

namespace kvscope {
class Model;
}

namespace kvscope::cli {

// Profile settings a user can override on the command line, on top of --profile or the default.
struct ProfileOptions {
    std::string profilePath;
    std::string codec = "cachegen";
    int chunkTokens = 0;
    int deltaGroup = -1;
    int anchorBins = -1;
    std::string tables, tableScope, keyQuantizer, valueQuantizer;
    bool forceProfile = false;
    bool recalibrate = false;  // calibrate: the profile's calibrated tables are replaced, so any option may change

    // The codec group; quantizers false leaves --key-quantizer/--value-quantizer to the command.
    void add(CLI::App* sub, bool quantizers = true)
    {
        const std::string& g = kCodecGroup;
        sub->add_option("--profile", profilePath, "codec profile (JSON); default: CacheGen's three levels")->group(g);
        sub->add_option("--codec", codec, "cachegen, fp16, int8, kivi2, kivi4, zstd or transform")->capture_default_str()->group(g);
        sub->add_option("--chunk-tokens", chunkTokens, "tokens per chunk (16..8192), overrides the profile")->group(g);
        sub->add_option("--delta-group", deltaGroup, "tokens per anchor group, 0 = no delta coding")->group(g);
        sub->add_option("--anchor-bins", anchorBins, "bins for anchor tokens, 0 = the layer's bins")->group(g);
        sub->add_option("--tables", tables, "inband (per chunk) or shared (calibrated once per file)")->group(g);
        sub->add_option("--table-scope", tableScope, "head (one table per KV head, the default) or channel (CacheGen's one per channel)")
            ->group(g);
        if (quantizers) {
            sub->add_option("--key-quantizer", keyQuantizer, "token (CacheGen) or channel (KIVI-style)")->group(g);
            sub->add_option("--value-quantizer", valueQuantizer, "token or channel")->group(g);
        }
        sub->add_flag("--force-profile", forceProfile, "use a profile tuned for another model")->group(g);
    }

    std::string source() const { return profilePath.empty() ? "default profile" : profilePath; }

    // The profile as loaded (or the default for kv's layers), before any override or preparation.
    std::unique_ptr<CodecProfile> loadedProfile(const KvSet& kv) const
    {
        auto p = std::make_unique<CodecProfile>(profilePath.empty() ? defaultProfile(kv.shape().numLayers)
                                                                    : loadProfile(profilePath));
        checkProfileModel(*p, kv.modelFingerprint, source(), forceProfile);
        return p;
    }

    CodecParams params(const KvSet& kv) const
    {
        CodecParams p;
        if (!parseCodecName(codec, &p.codec)) throw Error("--codec: unknown codec '" + codec + "'");
        p.shape = kv.shape();
        p.dtype = kv.dtype();
        p.profile = profilePath.empty() ? defaultProfile(kv.shape().numLayers) : loadProfile(profilePath);
        CodecProfile& pr = p.profile;
        if (chunkTokens) pr.chunkTokens = chunkTokens;
        if (deltaGroup >= 0) pr.deltaGroup = deltaGroup;
        if (anchorBins >= 0) pr.anchorBins = anchorBins;
        if (tables == "inband") pr.tables = TableMode::InBand;
        else if (tables == "shared") pr.tables = TableMode::Shared;
        else if (!tables.empty()) throw Error("--tables: expected inband or shared, got '" + tables + "'");
        if (tableScope == "head") pr.tableScope = TableScope::Head;
        else if (tableScope == "channel") pr.tableScope = TableScope::Channel;
        else if (!tableScope.empty()) throw Error("--table-scope: expected head or channel, got '" + tableScope + "'");
        auto quantizer = [](const std::string& s, Quantizer* q, const char* opt) {
            if (s == "token") *q = Quantizer::PerToken;
            else if (s == "channel") *q = Quantizer::PerChannel;
            else if (!s.empty()) throw Error(std::string(opt) + ": expected token or channel, got '" + s + "'");
        };
        quantizer(keyQuantizer, &pr.keyQuantizer, "--key-quantizer");
        quantizer(valueQuantizer, &pr.valueQuantizer, "--value-quantizer");
        const std::string src = source();
        if (recalibrate) {
            pr.levelTables.clear();
            pr.tableChannels = 0;
        }
        checkProfileModel(pr, kv.modelFingerprint, src, forceProfile);
        if (pr.hasCalibratedTables() && (deltaGroup >= 0 || anchorBins >= 0 || !keyQuantizer.empty() || !valueQuantizer.empty() ||
                                         !tableScope.empty()))
            throw inputError(src, "calibrated_tables", "--delta-group, --anchor-bins, --table-scope and the quantizer options change what "
                                                       "the calibrated tables describe: recalibrate instead");
        if (p.codec == CodecId::Transform && !pr.hasTransform()) pr.transformLevels = defaultTransformLevels();
        validateProfile(pr, src);
        if (int(pr.levels.front().keyBins.size()) != kv.shape().numLayers)
            throw inputError(src, "levels", "bins cover " + std::to_string(pr.levels.front().keyBins.size()) +
                                                " layers, the KV cache has " + std::to_string(kv.shape().numLayers));
        if (p.codec == CodecId::Transform && pr.transform.ropeUndo && int(kv.ropeInvFreq.size()) != kv.shape().headDim / 2) {
            // A KV file written by another stack (h5py) carries no RoPE table: its keys are coded
            // as they are. A calibrated model expects keys with RoPE undone, so it is set aside.
            std::fprintf(stderr, "note: the KV cache carries no RoPE parameters: keys are coded as they are (rope_undo off)%s\n",
                         pr.transformModel.empty() ? "" : ", with the transform fitted on this cache");
            pr.transform.ropeUndo = false;
            pr.transformModel.clear();
        }
        if (p.codec == CodecId::Transform) prepareTransform(p, kv, src);
        return p;
    }
};

// --codec transform without --profile: the calibrated default profile of the cache's model
// (eval/transform_default.h). With a model it is calibrated now when the cache lacks it; without
// one (encode, bench: a KV file only) the cached profile is used when it exists, otherwise po is
// returned unchanged (the transform fitted on the cache itself) with a note on stderr. Other
// codecs and an explicit --profile pass through.
ProfileOptions withDefaultTransform(ProfileOptions po, const Model* model, const std::string& fingerprint);

// bytes, bits_per_value, ratio_vs_fp16, ratio_vs_int8 of `bytes` for a cache of shape s.
json sizeJson(uint64_t bytes, const KvShape& s);
// max_abs_error and rms_error, plus a per-layer list when perLayer.
json errorJson(const KvError& e, bool perLayer);

}  // namespace kvscope::cli
