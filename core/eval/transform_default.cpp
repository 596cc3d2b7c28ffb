#include "eval/transform_default.h"

#include "codec/transform.h"
#include "common/error.h"
#include "common/file_io.h"
#include "eval/samples.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

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
// adapt_mean replaces the means when a cache is encoded), and with rans32 read as rans (both code
// with the same calibrated tables; only the symbol streams' layout differs).
std::string ladderDigest(const CodecProfile& p)
{
    CodecProfile bare = p;
    bare.transformModel.clear();
    bare.modelFingerprint.clear();
    for (TransformLevel& l : bare.transformLevels) l.measuredJson.clear();
    json j = json::parse(profileToJson(bare));
    j["transform"].erase("default_level");  // which level is the default does not change the fit
    j["transform"].erase("adapt_mean");
    if (j["transform"].value("entropy", std::string()) == "rans32") j["transform"]["entropy"] = "rans";
    const std::string text = j["transform"].dump() + j["chunk_tokens"].dump();
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    return hex64(h);
}

constexpr const char* kGenericLadder = "generic.transform.json";

// Every shipped ladder in `dir`: the models' own (<name>.transform.json, by name), then the
// generic one, so that a model's own ladder wins whatever it is called.
std::vector<std::string> ladderNames(const std::string& dir)
{
    static const std::string suffix = ".transform.json";
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n != kGenericLadder && n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
            names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    names.push_back(kGenericLadder);
    return names;
}

}  // namespace

DefaultTransform findDefaultTransform(const std::string& fingerprint)
{
    const std::string dir = samplesDir() + "/profiles";
    DefaultTransform d;
    for (const std::string& name : ladderNames(dir)) {
        const std::string path = dir + "/" + name;
        if (!isRegularFile(path)) continue;
        const std::string text = readSmallFile(path, 64u << 20);
        const CodecProfile p = profileFromJson(text, path);
        const bool generic = name == kGenericLadder;
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

// Read once; a damaged entry counts as absent.
std::string usableDefaultTransform(const DefaultTransform& d, const std::string& fingerprint)
{
    if (!isRegularFile(d.cachePath)) return "";
    try {
        const std::string text = readSmallFile(d.cachePath, 256u << 20);
        CodecProfile p = profileFromJson(text, d.cachePath);
        if (p.transformModel.empty() || p.modelFingerprint != fingerprint) return "";
        const json j = json::parse(text);
        if (j.value("/calibration/ladder_digest"_json_pointer, std::string()) != d.ladderDigest) return "";
        // The same fit; the shipped ladder's default level, measured figures, adapt_mean and entropy
        // coder (rans or rans32) may be newer.
        const CodecProfile& ladder = d.ladder;
        bool stale = p.transformDefaultLevel != ladder.transformDefaultLevel ||
                     p.transform.adaptMean != ladder.transform.adaptMean ||
                     p.transform.entropy != ladder.transform.entropy;
        for (size_t l = 0; l < p.transformLevels.size(); ++l)
            stale = stale || p.transformLevels[l].measuredJson != ladder.transformLevels[l].measuredJson;
        if (stale) {
            p.transformDefaultLevel = ladder.transformDefaultLevel;
            p.transform.adaptMean = ladder.transform.adaptMean;
            p.transform.entropy = ladder.transform.entropy;
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

std::string cachedDefaultTransform(const std::string& fingerprint)
{
    return usableDefaultTransform(findDefaultTransform(fingerprint), fingerprint);
}

}  // namespace kvscope
