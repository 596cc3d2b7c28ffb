// ensureDefaultTransform: the default transform ladder fitted with a model (prefills on libtorch).
// The lookups that need no model are in transform_default.cpp, which the Python module compiles.
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

double monotonicSeconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string ensureDefaultTransform(const Model& model, const std::function<void(const std::string&)>& log,
                                   const std::function<bool(int done, int total)>& prefill)
{
    const std::string fp = model.runtime().fingerprint();
    const DefaultTransform d = findDefaultTransform(fp);
    if (std::string cached = usableDefaultTransform(d, fp); !cached.empty()) return cached;
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
