#include "eval/transform_default.h"

#include "codec/transform.h"
#include "common/error.h"
#include "common/file_io.h"
#include "eval/samples.h"
#include "model/generate.h"
#include "model/model.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

namespace kvscope {

namespace {

using json = nlohmann::json;

std::string hex64(uint64_t v)
{
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return b;
}

// FNV-1a of the ladder's canonical JSON: its switches and levels, without the calibrated model,
// the measured figures, the default level and adapt_mean (none of which changes what is fitted:
// adapt_mean replaces the means when a cache is encoded).
std::string ladderDigest(const CodecProfile& p)
{
    CodecProfile bare = p;
    bare.transformModel.clear();
    bare.modelFingerprint.clear();
    for (TransformLevel& l : bare.transformLevels) l.measuredJson.clear();
    json j = json::parse(profileToJson(bare));
    j["transform"].erase("default_level");  // which level is the default does not change the fit
    j["transform"].erase("adapt_mean");
    const std::string text = j["transform"].dump() + j["chunk_tokens"].dump();
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    return hex64(h);
}

double monotonicSeconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DefaultTransform findDefaultTransform(const std::string& fingerprint)
{
    const std::string dir = samplesDir() + "/profiles";
    DefaultTransform d;
    for (const char* name : {"smollm2-135m-instruct.transform.json", "generic.transform.json"}) {
        const std::string path = dir + "/" + name;
        if (!isRegularFile(path)) continue;
        const std::string text = readSmallFile(path, 64u << 20);
        const CodecProfile p = profileFromJson(text, path);
        const bool generic = std::string(name) == "generic.transform.json";
        if (!generic && p.modelFingerprint != fingerprint) continue;
        if (!p.hasTransform()) throw inputError(path, "transform.levels", "a shipped transform ladder needs its levels");
        const json j = json::parse(text);
        if (!j.contains("calibration") || !j["calibration"].contains("contexts") || !j["calibration"]["contexts"].is_array() ||
            j["calibration"]["contexts"].empty())
            throw inputError(path, "calibration.contexts", "a shipped transform ladder names the sample contexts it is calibrated on");
        for (const json& c : j["calibration"]["contexts"]) {
            if (!c.is_string()) throw inputError(path, "calibration.contexts", "expected sample ids (strings)");
            d.contexts.push_back(c.get<std::string>());
        }
        d.ladderPath = path;
        d.ladderDigest = ladderDigest(p);
        d.ladder = p;
        d.cachePath = userCacheDir("profiles") + "/" + (fingerprint.empty() ? std::string("unknown") : fingerprint) +
                      ".transform.json";
        return d;
    }
    throw inputError(dir, "", "no shipped transform ladder (generic.transform.json is missing)");
}

namespace {

// d.cachePath when it holds a fit of d's ladder for this fingerprint, else "" (read once; the
// ladder's default level, adapt_mean and measured figures are copied in when they changed).
std::string usableCache(const DefaultTransform& d, const std::string& fingerprint)
{
    if (!isRegularFile(d.cachePath)) return "";
    try {
        const std::string text = readSmallFile(d.cachePath, 256u << 20);
        CodecProfile p = profileFromJson(text, d.cachePath);
        if (p.transformModel.empty() || p.modelFingerprint != fingerprint) return "";
        const json j = json::parse(text);
        if (j.value("/calibration/ladder_digest"_json_pointer, std::string()) != d.ladderDigest) return "";
        // The same fit; the shipped ladder's default level and measured figures may be newer.
        const CodecProfile& ladder = d.ladder;
        bool stale = p.transformDefaultLevel != ladder.transformDefaultLevel ||
                     p.transform.adaptMean != ladder.transform.adaptMean;
        for (size_t l = 0; l < p.transformLevels.size(); ++l)
            stale = stale || p.transformLevels[l].measuredJson != ladder.transformLevels[l].measuredJson;
        if (stale) {
            p.transformDefaultLevel = ladder.transformDefaultLevel;
            p.transform.adaptMean = ladder.transform.adaptMean;
            for (size_t l = 0; l < p.transformLevels.size(); ++l) p.transformLevels[l].measuredJson = ladder.transformLevels[l].measuredJson;
            json k = json::parse(profileToJson(p));
            k["calibration"] = j["calibration"];
            writeFileAtomic(d.cachePath, k.dump(1) + "\n");
        }
    } catch (const std::exception&) {
        return "";  // a damaged cache entry is refitted, never trusted
    }
    return d.cachePath;
}

}  // namespace

std::string cachedDefaultTransform(const std::string& fingerprint)
{
    return usableCache(findDefaultTransform(fingerprint), fingerprint);
}

std::string ensureDefaultTransform(const Model& model, const std::function<void(const std::string&)>& log,
                                   const std::function<bool(int done, int total)>& prefill)
{
    const std::string fp = model.runtime().fingerprint();
    const DefaultTransform d = findDefaultTransform(fp);
    if (std::string cached = usableCache(d, fp); !cached.empty()) return cached;
    auto say = [&](const std::string& s) {
        if (log) log(s);
    };
    say("calibrating the transform codec for " + model.spec().name + " on " + std::to_string(d.contexts.size()) +
        " sample contexts (once; cached in " + d.cachePath + ")");
    const double t0 = monotonicSeconds();
    std::vector<KvSet> caches;
    for (const std::string& id : d.contexts) {
        const SampleContext s = loadSampleContext(id);
        InferenceSession session(model.runtime());
        const std::vector<int32_t> tokens = model.contextTokens(s.text);
        session.append(tokens, nullptr, nullptr, prefill);
        caches.push_back(session.exportKv());
        say("  captured " + id + " (" + std::to_string(tokens.size()) + " tokens)");
    }
    std::vector<const KvSet*> ptrs;
    for (const KvSet& kv : caches) ptrs.push_back(&kv);
    CodecProfile p = d.ladder;
    const TransformModel m = fitTransform(p.transform, p.transformLevels, ptrs);
    p.transformModel.clear();
    serializeTransformModel(m, p.transformModel);
    p.modelFingerprint = fp;
    if (const int layers = caches.front().shape().numLayers; layers != p.numLayers) {
        // The generic ladder's CacheGen levels are for its own depth: CacheGen's default, scaled
        // to this model's, keeps the profile valid (the transform's levels have no per-layer list).
        const CodecProfile cachegen = defaultProfile(layers);
        p.numLayers = layers;
        p.levels = cachegen.levels;
        p.defaultLevel = cachegen.defaultLevel;
    }
    json j = json::parse(profileToJson(p));
    j["calibration"] = {{"contexts", d.contexts}, {"ladder", d.ladderPath}, {"ladder_digest", d.ladderDigest},
                        {"model", model.spec().name}, {"seconds", monotonicSeconds() - t0}};
    makeDirs(userCacheDir("profiles"), "profile cache");
    writeFileAtomic(d.cachePath, j.dump(1) + "\n");
    char buf[96];
    std::snprintf(buf, sizeof buf, "  calibrated in %.1f s (%zu bytes of transform model)", monotonicSeconds() - t0,
                  p.transformModel.size());
    say(buf);
    return d.cachePath;
}

}  // namespace kvscope
