#include "codec/profile.h"

#include "common/error.h"
#include "common/file_io.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>

namespace kvscope {

using json = nlohmann::json;

const char* quantizerName(Quantizer q) { return q == Quantizer::PerToken ? "token" : "channel"; }
const char* tableModeName(TableMode m) { return m == TableMode::InBand ? "inband" : "shared"; }
const char* tableScopeName(TableScope s) { return s == TableScope::Channel ? "channel" : "head"; }

namespace {

// Layer where a CacheGen Mistral-7B group boundary (b of 32 layers) falls for numLayers layers.
int scaledBoundary(int b, int numLayers) { return int(std::lround(double(b) * numLayers / 32.0)); }

const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string toBase64(const std::vector<uint8_t>& in)
{
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    for (size_t i = 0; i < in.size(); i += 3) {
        const uint32_t v = uint32_t(in[i]) << 16 | (i + 1 < in.size() ? uint32_t(in[i + 1]) << 8 : 0) |
                           (i + 2 < in.size() ? in[i + 2] : 0);
        out += kBase64[v >> 18];
        out += kBase64[(v >> 12) & 63];
        out += i + 1 < in.size() ? kBase64[(v >> 6) & 63] : '=';
        out += i + 2 < in.size() ? kBase64[v & 63] : '=';
    }
    return out;
}

bool fromBase64(const std::string& in, std::vector<uint8_t>* out)
{
    if (in.size() % 4) return false;
    out->clear();
    out->reserve(in.size() / 4 * 3);
    for (size_t i = 0; i < in.size(); i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int k = 0; k < 4; ++k) {
            const char c = in[i + size_t(k)];
            const char* pos = c ? std::strchr(kBase64, c) : nullptr;
            if (c == '=' && i + 4 == in.size() && k >= 2) {
                ++pad;
                v <<= 6;
                continue;
            }
            if (!pos || pad) return false;
            v = v << 6 | uint32_t(pos - kBase64);
        }
        out->push_back(uint8_t(v >> 16));
        if (pad < 2) out->push_back(uint8_t(v >> 8));
        if (pad < 1) out->push_back(uint8_t(v));
    }
    return true;
}

}  // namespace

std::vector<int> cachegenGroupBins(bool keys, const std::vector<int>& groups, int numLayers)
{
    const std::vector<int> starts32 = keys ? std::vector<int>{0, 10, 20} : std::vector<int>{0, 2};
    if (groups.size() != 1 && groups.size() != starts32.size())
        throw Error(std::string(keys ? "key" : "value") + " bins: expected 1 or " + std::to_string(starts32.size()) +
                    " layer groups, got " + std::to_string(groups.size()));
    std::vector<int> bins(size_t(numLayers), groups.front());
    for (size_t g = 1; g < groups.size(); ++g)
        for (int l = scaledBoundary(starts32[g], numLayers); l < numLayers; ++l) bins[size_t(l)] = groups[g];
    return bins;
}

CodecProfile defaultProfile(int numLayers)
{
    CodecProfile p;
    p.numLayers = numLayers;
    p.defaultLevel = 2;
    p.tableScope = TableScope::Head;
    auto level = [numLayers](const char* name, std::vector<int> k, std::vector<int> v) {
        return CodecLevel{name, cachegenGroupBins(true, k, numLayers), cachegenGroupBins(false, v, numLayers), ""};
    };
    p.levels.push_back(level("level 1", {16, 16, 12}, {16, 12}));
    p.levels.push_back(level("level 2", {32, 16, 16}, {32, 16}));
    p.levels.push_back(level("level 3", {32}, {32}));
    return p;
}

void checkProfileModel(const CodecProfile& p, const std::string& fingerprint, const std::string& source, bool force)
{
    if (force || p.modelFingerprint.empty() || fingerprint.empty() || p.modelFingerprint == fingerprint) return;
    throw inputError(source, "model_fingerprint",
                     "the profile was tuned for model " + p.modelFingerprint + ", this cache comes from " + fingerprint +
                         ": its bins and tables may not suit it (force to use it anyway)");
}

std::vector<LayerRange> toLayerRanges(const std::vector<int>& bins)
{
    std::vector<LayerRange> r;
    for (int l = 0; l < int(bins.size()); ++l) {
        if (!r.empty() && r.back().bins == bins[size_t(l)] && r.back().end == l)
            r.back().end = l + 1;
        else
            r.push_back({l, l + 1, bins[size_t(l)]});
    }
    return r;
}

std::string lmcacheSpecsPython(const std::vector<int>& bins)
{
    std::string out = "[";
    for (const LayerRange& r : toLayerRanges(bins)) {
        if (out.size() > 1) out += ", ";
        out += "QuantizationSpec(start_layer=" + std::to_string(r.start) + ", end_layer=" + std::to_string(r.end) +
               ", bins=" + std::to_string(r.bins) + ")";
    }
    return out + "]";
}

std::string lmcacheConfigPython(const CodecLevel& level)
{
    return "CacheGenConfig(nlayers=" + std::to_string(level.keyBins.size()) + ", kspecs=" +
           lmcacheSpecsPython(level.keyBins) + ", vspecs=" + lmcacheSpecsPython(level.valueBins) + ")";
}

static bool validBins(int b) { return b >= 4 && b <= 256 && b % 2 == 0; }

void validateProfile(const CodecProfile& p, const std::string& src)
{
    if (p.chunkTokens < 16 || p.chunkTokens > 8192)
        throw inputError(src, "chunk_tokens", std::to_string(p.chunkTokens) + " is outside 16..8192");
    if (p.deltaGroup < 0 || p.deltaGroup == 1 || p.deltaGroup > p.chunkTokens)
        throw inputError(src, "delta_group", std::to_string(p.deltaGroup) + " must be 0 (off) or 2..chunk_tokens");
    if (p.anchorBins != 0 && !validBins(p.anchorBins))
        throw inputError(src, "anchor_bins", std::to_string(p.anchorBins) + " must be 0 or an even number in 4..256");
    if (p.levels.empty() || p.levels.size() > 64)
        throw inputError(src, "levels", "need 1 to 64 levels, got " + std::to_string(p.levels.size()));
    if (p.defaultLevel < 1 || p.defaultLevel > int(p.levels.size()))
        throw inputError(src, "default_level", std::to_string(p.defaultLevel) + " names no level");
    if (p.hasCalibratedTables() && (p.levelTables.size() != p.levels.size() || p.tableChannels < 1))
        throw inputError(src, "calibrated_tables", "need one table blob per level and a channel count");
    if (p.hasTransform()) {
        const TransformSettings& s = p.transform;
        if (s.sinkTokens < 0 || s.sinkTokens > 4096)
            throw inputError(src, "transform.sink_tokens", std::to_string(s.sinkTokens) + " is outside 0..4096");
        if (s.recentTokens < 0 || s.recentTokens > 65536)
            throw inputError(src, "transform.recent_tokens", std::to_string(s.recentTokens) + " is outside 0..65536");
        if (!(s.importanceQuantile >= 0 && s.importanceQuantile <= 1))
            throw inputError(src, "transform.importance_quantile", "is outside 0..1");
        if (!(s.importancePower >= 0 && s.importancePower <= 8))
            throw inputError(src, "transform.importance_power", "is outside 0..8");
        if (!(s.rdoLambda >= 0 && s.rdoLambda <= 16)) throw inputError(src, "transform.rdo_lambda", "is outside 0..16");
        if (s.layerGroup < 1 || s.layerGroup > 64)
            throw inputError(src, "transform.layer_group", std::to_string(s.layerGroup) + " is outside 1..64");
        if (p.transformLevels.size() > 64) throw inputError(src, "transform.levels", "more than 64 levels");
        if (p.transformDefaultLevel < 1 || p.transformDefaultLevel > int(p.transformLevels.size()))
            throw inputError(src, "transform.default_level", std::to_string(p.transformDefaultLevel) + " names no level");
        for (size_t i = 0; i < p.transformLevels.size(); ++i) {
            const TransformLevel& l = p.transformLevels[i];
            const std::string place = "transform.levels[" + std::to_string(i) + "]";
            if (!(l.keyTheta > 0) || !(l.valueTheta > 0) || !std::isfinite(l.keyTheta) || !std::isfinite(l.valueTheta))
                throw inputError(src, place, "key_theta and value_theta must be positive");
            for (const auto* sc : {&l.keyLayerScale, &l.valueLayerScale})
                if (!sc->empty() && p.numLayers > 0 && int(sc->size()) != p.numLayers)
                    throw inputError(src, place, "layer scales cover " + std::to_string(sc->size()) +
                                                     " layers, profile has " + std::to_string(p.numLayers));
        }
    }
    for (size_t i = 0; i < p.levels.size(); ++i) {
        const CodecLevel& l = p.levels[i];
        const std::string place = "levels[" + std::to_string(i) + "]";
        if (p.numLayers > 0 && (int(l.keyBins.size()) != p.numLayers || int(l.valueBins.size()) != p.numLayers))
            throw inputError(src, place, "bins cover " + std::to_string(l.keyBins.size()) + "/" +
                                             std::to_string(l.valueBins.size()) + " layers (key/value), profile has " +
                                             std::to_string(p.numLayers));
        if (l.keyBins.size() != l.valueBins.size() || l.keyBins.empty())
            throw inputError(src, place, "key_bins and value_bins must cover the same, non-zero number of layers");
        for (size_t j = 0; j < l.keyBins.size(); ++j)
            if (!validBins(l.keyBins[j]) || !validBins(l.valueBins[j]))
                throw inputError(src, place + " layer " + std::to_string(j),
                                 "bins must be even numbers in 4..256 (got key " + std::to_string(l.keyBins[j]) +
                                     ", value " + std::to_string(l.valueBins[j]) + ")");
    }
}

namespace {

int getInt(const json& j, const char* key, int fallback, const std::string& src)
{
    if (!j.contains(key)) return fallback;
    const json& v = j.at(key);
    if (!v.is_number_integer()) throw inputError(src, key, "must be an integer");
    const long long x = v.get<long long>();
    if (x < -1000000 || x > 1000000) throw inputError(src, key, "out of range");
    return int(x);
}

std::string getString(const json& j, const char* key, const std::string& fallback, const std::string& src)
{
    if (!j.contains(key)) return fallback;
    if (!j.at(key).is_string()) throw inputError(src, key, "must be a string");
    return j.at(key).get<std::string>();
}

Quantizer getQuantizer(const json& j, const char* key, const std::string& src)
{
    const std::string s = getString(j, key, "token", src);
    if (s == "token") return Quantizer::PerToken;
    if (s == "channel") return Quantizer::PerChannel;
    throw inputError(src, key, "unknown quantizer '" + s + "' (token or channel)");
}

// Bins as a per-layer list [16, 16, ...] or as ranges [{"start":0,"end":10,"bins":16}, ...].
std::vector<int> getBins(const json& j, const char* key, int numLayers, const std::string& src,
                         const std::string& place)
{
    const std::string where = place + "." + key;
    if (!j.contains(key) || !j.at(key).is_array()) throw inputError(src, where, "missing or not an array");
    const json& a = j.at(key);
    if (a.size() > 4096) throw inputError(src, where, "too many entries");
    std::vector<int> bins;
    if (!a.empty() && a.front().is_object()) {
        if (numLayers <= 0) throw inputError(src, where, "layer ranges need num_layers in the profile");
        bins.assign(size_t(numLayers), 0);
        for (size_t i = 0; i < a.size(); ++i) {
            const std::string w = where + "[" + std::to_string(i) + "]";
            const int s = getInt(a[i], "start", -1, src), e = getInt(a[i], "end", -1, src),
                      b = getInt(a[i], "bins", -1, src);
            if (s < 0 || e <= s || e > numLayers) throw inputError(src, w, "range [start, end) outside the layers");
            for (int l = s; l < e; ++l) bins[size_t(l)] = b;
        }
        for (int l = 0; l < numLayers; ++l)
            if (bins[size_t(l)] == 0) throw inputError(src, where, "layer " + std::to_string(l) + " has no bins");
        return bins;
    }
    for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].is_number_integer()) throw inputError(src, where + "[" + std::to_string(i) + "]", "must be an integer");
        bins.push_back(int(std::max<long long>(-1, std::min<long long>(a[i].get<long long>(), 1 << 20))));
    }
    return bins;
}

bool getBool(const json& j, const char* key, bool fallback, const std::string& src, const std::string& place)
{
    if (!j.contains(key)) return fallback;
    if (!j.at(key).is_boolean()) throw inputError(src, place + "." + key, "must be true or false");
    return j.at(key).get<bool>();
}

double getPositive(const json& j, const char* key, const std::string& src, const std::string& place)
{
    if (!j.contains(key) || !j.at(key).is_number()) throw inputError(src, place + "." + key, "missing or not a number");
    const double v = j.at(key).get<double>();
    if (!(v > 0) || !std::isfinite(v) || v > 1e6) throw inputError(src, place + "." + key, "must be a positive number up to 1e6");
    return v;
}

std::vector<double> getScales(const json& j, const char* key, const std::string& src, const std::string& place)
{
    std::vector<double> out;
    if (!j.contains(key)) return out;
    const json& a = j.at(key);
    const std::string w = place + "." + key;
    if (!a.is_array() || a.size() > 4096) throw inputError(src, w, "must be an array of numbers (one per layer)");
    for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].is_number()) throw inputError(src, w + "[" + std::to_string(i) + "]", "must be a number");
        const double v = a[i].get<double>();
        if (!(v > 0) || !std::isfinite(v) || v > 1e6)
            throw inputError(src, w + "[" + std::to_string(i) + "]", "must be a positive number up to 1e6");
        out.push_back(v);
    }
    return out;
}

void parseTransformJson(const json& t, CodecProfile& p, const std::string& src)
{
    if (!t.is_object()) throw inputError(src, "transform", "must be an object");
    TransformSettings& s = p.transform;
    auto choice = [&](const char* key, const char* fallback, std::initializer_list<const char*> names) {
        const std::string v = getString(t, key, fallback, src);
        int i = 0;
        std::string all;
        for (const char* n : names) {
            if (v == n) return i;
            all += (i ? ", " : "") + std::string(n);
            ++i;
        }
        throw inputError(src, std::string("transform.") + key, "unknown value '" + v + "' (" + all + ")");
    };
    s.ropeUndo = getBool(t, "rope_undo", true, src, "transform");
    s.basis = TransformBasis(choice("basis", "pca", {"none", "hadamard", "pca"}));
    s.acrossHeads = getBool(t, "across_heads", true, src, "transform");
    s.weighting = TransformWeighting(choice("weighting", "attention", {"mse", "attention"}));
    s.allocation = TransformAllocation(choice("allocation", "waterfill", {"uniform", "waterfill"}));
    s.entropy = TransformEntropy(choice("entropy", "rans", {"fixed", "rans", "rans32"}));
    s.sinkTokens = getInt(t, "sink_tokens", 4, src);
    s.recentTokens = getInt(t, "recent_tokens", 0, src);
    s.tokenImportance = getBool(t, "token_importance", false, src, "transform");
    if (t.contains("importance_quantile")) {
        if (!t.at("importance_quantile").is_number()) throw inputError(src, "transform.importance_quantile", "must be a number");
        s.importanceQuantile = t.at("importance_quantile").get<double>();
    }
    if (t.contains("importance_power")) {
        if (!t.at("importance_power").is_number()) throw inputError(src, "transform.importance_power", "must be a number");
        s.importancePower = t.at("importance_power").get<double>();
    }
    if (t.contains("rdo_lambda")) {
        if (!t.at("rdo_lambda").is_number()) throw inputError(src, "transform.rdo_lambda", "must be a number");
        s.rdoLambda = t.at("rdo_lambda").get<double>();
    }
    s.adaptMean = getBool(t, "adapt_mean", false, src, "transform");
    if (t.contains("adapt_basis")) {
        const json& a = t.at("adapt_basis");
        if (!a.is_object() || !a.contains("prior_tokens") || !a.at("prior_tokens").is_number())
            throw inputError(src, "transform.adapt_basis", "must be an object with a number prior_tokens");
        s.adaptPriorTokens = a.at("prior_tokens").get<double>();
        s.adaptSweeps = getInt(a, "sweeps", 3, src);
        if (!(s.adaptPriorTokens > 0 && s.adaptPriorTokens <= 1e7))
            throw inputError(src, "transform.adapt_basis.prior_tokens", "is outside (0, 1e7]");
        if (s.adaptSweeps < 1 || s.adaptSweeps > 50) throw inputError(src, "transform.adapt_basis.sweeps", "is outside 1..50");
        s.adaptResetChunks = getInt(a, "reset_chunks", 0, src);
        if (s.adaptResetChunks < 0 || s.adaptResetChunks > kMaxAdaptResetChunks)
            throw inputError(src, "transform.adapt_basis.reset_chunks", "is outside 0.." + std::to_string(kMaxAdaptResetChunks));
    }
    s.layerGroup = getInt(t, "layer_group", 1, src);
    p.transformDefaultLevel = getInt(t, "default_level", 1, src);
    if (!t.contains("levels") || !t.at("levels").is_array() || t.at("levels").empty() || t.at("levels").size() > 64)
        throw inputError(src, "transform.levels", "must be an array of 1 to 64 levels");
    const json& levels = t.at("levels");
    for (size_t i = 0; i < levels.size(); ++i) {
        const std::string place = "transform.levels[" + std::to_string(i) + "]";
        if (!levels[i].is_object()) throw inputError(src, place, "must be an object");
        TransformLevel l;
        l.name = getString(levels[i], "name", "level " + std::to_string(i + 1), src);
        l.keyTheta = getPositive(levels[i], "key_theta", src, place);
        l.valueTheta = getPositive(levels[i], "value_theta", src, place);
        l.keyLayerScale = getScales(levels[i], "key_layer_scale", src, place);
        l.valueLayerScale = getScales(levels[i], "value_layer_scale", src, place);
        if (levels[i].contains("measured")) {
            if (!levels[i].at("measured").is_object()) throw inputError(src, place + ".measured", "must be an object");
            l.measuredJson = levels[i].at("measured").dump();
        }
        p.transformLevels.push_back(std::move(l));
    }
    if (t.contains("model")) {
        if (!t.at("model").is_string() || !fromBase64(t.at("model").get<std::string>(), &p.transformModel))
            throw inputError(src, "transform.model", "not valid base64");
    }
}

}  // namespace

CodecProfile profileFromJson(const std::string& text, const std::string& src)
{
    json j;
    try {
        j = json::parse(text);
    } catch (const json::parse_error& e) {
        throw inputError(src, "byte " + std::to_string(e.byte), "not valid JSON");
    } catch (const json::exception& e) {
        // A number beyond double's range (1e309) is out_of_range, not a parse_error.
        throw inputError(src, "", std::string("not valid JSON (") + e.what() + ")");
    }
    if (!j.is_object()) throw inputError(src, "", "a profile must be a JSON object");
    if (getString(j, "format", "", src) != "kvscope-profile")
        throw inputError(src, "format", "not a kvscope profile (expected \"kvscope-profile\")");
    const int version = getInt(j, "version", -1, src);
    if (version < 1 || version > CodecProfile::kVersion)
        throw inputError(src, "version", "version " + std::to_string(version) + " is not supported (this build reads 1.." +
                                             std::to_string(CodecProfile::kVersion) + ")");
    CodecProfile p;
    p.modelFingerprint = getString(j, "model_fingerprint", "", src);
    p.numLayers = getInt(j, "num_layers", 0, src);
    if (p.numLayers < 0 || p.numLayers > 1024) throw inputError(src, "num_layers", "out of range");
    p.chunkTokens = getInt(j, "chunk_tokens", p.chunkTokens, src);
    p.deltaGroup = getInt(j, "delta_group", p.deltaGroup, src);
    p.anchorBins = getInt(j, "anchor_bins", p.anchorBins, src);
    p.keyQuantizer = getQuantizer(j, "key_quantizer", src);
    p.valueQuantizer = getQuantizer(j, "value_quantizer", src);
    const std::string tables = getString(j, "tables", "inband", src);
    if (tables == "inband") p.tables = TableMode::InBand;
    else if (tables == "shared") p.tables = TableMode::Shared;
    else throw inputError(src, "tables", "unknown table mode '" + tables + "' (inband or shared)");
    const std::string scope = getString(j, "table_scope", "channel", src);
    if (scope == "channel") p.tableScope = TableScope::Channel;
    else if (scope == "head") p.tableScope = TableScope::Head;
    else throw inputError(src, "table_scope", "unknown table scope '" + scope + "' (channel or head)");
    p.defaultLevel = getInt(j, "default_level", 1, src);
    if (!j.contains("levels") || !j.at("levels").is_array()) throw inputError(src, "levels", "missing or not an array");
    const json& levels = j.at("levels");
    if (levels.size() > 64) throw inputError(src, "levels", "more than 64 levels");
    for (size_t i = 0; i < levels.size(); ++i) {
        const std::string place = "levels[" + std::to_string(i) + "]";
        if (!levels[i].is_object()) throw inputError(src, place, "must be an object");
        CodecLevel l;
        l.name = getString(levels[i], "name", "level " + std::to_string(i + 1), src);
        l.keyBins = getBins(levels[i], "key_bins", p.numLayers, src, place);
        l.valueBins = getBins(levels[i], "value_bins", p.numLayers, src, place);
        if (levels[i].contains("measured")) {
            if (!levels[i].at("measured").is_object()) throw inputError(src, place + ".measured", "must be an object");
            l.measuredJson = levels[i].at("measured").dump();
        }
        p.levels.push_back(std::move(l));
    }
    if (j.contains("calibrated_tables")) {
        const json& t = j.at("calibrated_tables");
        if (!t.is_object()) throw inputError(src, "calibrated_tables", "must be an object");
        p.tableChannels = getInt(t, "channels", 0, src);
        if (p.tableChannels < 1) throw inputError(src, "calibrated_tables.channels", "must be a positive integer");
        if (!t.contains("levels") || !t.at("levels").is_array() || t.at("levels").size() != p.levels.size())
            throw inputError(src, "calibrated_tables.levels", "needs one entry per level");
        for (size_t i = 0; i < p.levels.size(); ++i) {
            const json& b = t.at("levels")[i];
            std::vector<uint8_t> blob;
            if (!b.is_string() || !fromBase64(b.get<std::string>(), &blob))
                throw inputError(src, "calibrated_tables.levels[" + std::to_string(i) + "]", "not valid base64");
            p.levelTables.push_back(std::move(blob));
        }
    }
    if (j.contains("transform")) {
        if (version < 2) throw inputError(src, "transform", "needs profile version 2");
        parseTransformJson(j.at("transform"), p, src);
    }
    validateProfile(p, src);
    return p;
}

std::string profileToJson(const CodecProfile& p)
{
    json j;
    j["format"] = "kvscope-profile";
    j["version"] = p.hasTransform() ? CodecProfile::kVersion : 1;  // version-1 readers keep reading CacheGen-only profiles
    j["model_fingerprint"] = p.modelFingerprint;
    j["num_layers"] = p.numLayers;
    j["chunk_tokens"] = p.chunkTokens;
    j["delta_group"] = p.deltaGroup;
    j["anchor_bins"] = p.anchorBins;
    j["key_quantizer"] = quantizerName(p.keyQuantizer);
    j["value_quantizer"] = quantizerName(p.valueQuantizer);
    j["tables"] = tableModeName(p.tables);
    j["table_scope"] = tableScopeName(p.tableScope);
    j["default_level"] = p.defaultLevel;
    json levels = json::array();
    for (const CodecLevel& l : p.levels) {
        json jl;
        jl["name"] = l.name;
        auto ranges = [&](const std::vector<int>& bins) {
            json a = json::array();
            for (const LayerRange& r : toLayerRanges(bins)) a.push_back({{"start", r.start}, {"end", r.end}, {"bins", r.bins}});
            return a;
        };
        // Ranges need num_layers to be read back; without it keep the per-layer list.
        jl["key_bins"] = p.numLayers > 0 ? ranges(l.keyBins) : json(l.keyBins);
        jl["value_bins"] = p.numLayers > 0 ? ranges(l.valueBins) : json(l.valueBins);
        if (!l.measuredJson.empty()) jl["measured"] = json::parse(l.measuredJson);
        levels.push_back(jl);
    }
    j["levels"] = levels;
    if (p.hasTransform()) {
        const TransformSettings& s = p.transform;
        json t;
        t["rope_undo"] = s.ropeUndo;
        t["basis"] = basisName(s.basis);
        t["across_heads"] = s.acrossHeads;
        t["weighting"] = weightingName(s.weighting);
        t["allocation"] = allocationName(s.allocation);
        t["entropy"] = entropyName(s.entropy);
        t["sink_tokens"] = s.sinkTokens;
        t["recent_tokens"] = s.recentTokens;
        if (s.tokenImportance) {
            t["token_importance"] = true;
            t["importance_quantile"] = s.importanceQuantile;
            t["importance_power"] = s.importancePower;
        }
        if (s.rdoLambda != 0) t["rdo_lambda"] = s.rdoLambda;
        if (s.adaptMean) t["adapt_mean"] = true;
        if (s.adaptPriorTokens > 0) {
            t["adapt_basis"] = {{"prior_tokens", s.adaptPriorTokens}, {"sweeps", s.adaptSweeps}};
            if (s.adaptResetChunks > 0) t["adapt_basis"]["reset_chunks"] = s.adaptResetChunks;
        }
        if (s.layerGroup != 1) t["layer_group"] = s.layerGroup;
        t["default_level"] = p.transformDefaultLevel;
        json tl = json::array();
        for (const TransformLevel& l : p.transformLevels) {
            json jl = {{"name", l.name}, {"key_theta", l.keyTheta}, {"value_theta", l.valueTheta}};
            if (!l.keyLayerScale.empty()) jl["key_layer_scale"] = l.keyLayerScale;
            if (!l.valueLayerScale.empty()) jl["value_layer_scale"] = l.valueLayerScale;
            if (!l.measuredJson.empty()) jl["measured"] = json::parse(l.measuredJson);
            tl.push_back(jl);
        }
        t["levels"] = tl;
        if (!p.transformModel.empty()) t["model"] = toBase64(p.transformModel);
        j["transform"] = t;
    }
    if (p.hasCalibratedTables()) {
        json blobs = json::array();
        for (const auto& b : p.levelTables) blobs.push_back(toBase64(b));
        j["calibrated_tables"] = {{"channels", p.tableChannels}, {"levels", blobs}};
    }
    return j.dump(2) + "\n";
}

CodecProfile loadProfile(const std::string& path)
{
    // A calibrated transform model stores an fp16 C x C matrix per block in base64: 43 MB per
    // block of 4096 channels (a 7B-wide layer), so a 2-layer one is already past 64 MB.
    return profileFromJson(readSmallFile(path, uint64_t(1) << 30), path);
}

void saveProfile(const CodecProfile& p, const std::string& path)
{
    validateProfile(p, path);
    writeFileAtomic(path, profileToJson(p));
}

}  // namespace kvscope
