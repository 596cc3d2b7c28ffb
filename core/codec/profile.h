// Codec profiles: the tunable settings of the CacheGen codec, as a versioned JSON file.
//
// Bins follow CacheGen's convention: "bins = 32" quantizes symmetrically to MAX = bins/2 - 1 = 15
// steps each side of zero, i.e. 2*MAX + 1 = 31 levels (symbols 0..30, 15 is zero). Bins are even
// numbers in [4, 256].
//
// JSON (see FORMAT.md for every field):
// {
//   "format": "kvscope-profile", "version": 1,
//   "model_fingerprint": "", "num_layers": 30,
//   "chunk_tokens": 256, "delta_group": 10, "anchor_bins": 0,
//   "key_quantizer": "token", "value_quantizer": "token", "tables": "inband",
//   "table_scope": "head",            ("channel" when absent: profiles written before it existed)
//   "default_level": 2,
//   "levels": [ { "name": "level 1",
//                 "key_bins": [ {"start": 0, "end": 10, "bins": 16}, ... ]   or [16, 16, ...],
//                 "value_bins": ...,
//                 "measured": { ... free-form figures ... } }, ... ],
//   "calibrated_tables": { "channels": 192, "levels": ["<base64>", ...] }       (optional)
//   "transform": { "rope_undo": true, "basis": "pca", "across_heads": true,      (version 2, optional:
//                  "weighting": "attention", "allocation": "waterfill",            the transform codec)
//                  "entropy": "rans", "sink_tokens": 4, "recent_tokens": 0,
//                  "token_importance": false, "importance_quantile": 0.75,
//                  "importance_power": 0.5,        (token importance: written only when on)
//                  "default_level": 1,
//                  "levels": [ {"name": "t 0.01", "key_theta": 0.01, "value_theta": 0.01,
//                               "key_layer_scale": [...], "value_layer_scale": [...], "measured": {...}} ],
//                  "model": "<base64 of the transform section, FORMAT.md>" }        (calibrated, optional)
// }
#pragma once

#include "codec/transform.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

enum class Quantizer : uint8_t {
    PerToken = 0,    // CacheGen: one scale per (layer, token) over all channels
    PerChannel = 1,  // KIVI's insight for keys: one scale per (layer, channel) over the chunk
};
enum class TableMode : uint8_t {
    InBand = 0,  // each chunk ships its own probability tables (what CacheGen's code does)
    Shared = 1,  // one set of tables per level, calibrated once and stored once per file/profile
};

// What one probability table covers within a (kind, layer, role): one channel (CacheGen's
// per-channel tables) or all head_dim channels of one KV head. Per head, a row of a stream has
// one table, which the SIMD decoders hold in registers (FORMAT.md, "Probability tables").
enum class TableScope : uint8_t {
    Channel = 0,
    Head = 1,
};

const char* quantizerName(Quantizer q);  // "token" | "channel"
const char* tableScopeName(TableScope s);  // "channel" | "head"
const char* tableModeName(TableMode m);  // "inband" | "shared"

struct CodecLevel {
    std::string name;
    std::vector<int> keyBins;    // (num_layers)
    std::vector<int> valueBins;  // (num_layers)
    std::string measuredJson;    // opaque JSON object text ("" when none), kept on round trips
};

struct CodecProfile {
    static constexpr int kVersion = 2;  // 2 added "transform"; version 1 files still load
    std::string modelFingerprint;
    int numLayers = 0;
    int chunkTokens = 256;   // 16..8192
    int deltaGroup = 10;     // tokens per anchor group; 0 turns delta coding off
    int anchorBins = 0;      // bins for anchor tokens; 0 = the layer's own bins
    Quantizer keyQuantizer = Quantizer::PerToken;
    Quantizer valueQuantizer = Quantizer::PerToken;
    TableMode tables = TableMode::InBand;
    TableScope tableScope = TableScope::Channel;  // defaultProfile() uses Head
    int defaultLevel = 1;    // 1-based
    std::vector<CodecLevel> levels;  // ordered from smallest (level 1) to highest quality

    // Probability tables calibrated offline (`kvscope-cli calibrate`), one blob per level in the
    // serialised form of FORMAT.md ("Table order"), for caches with `tableChannels` channels per
    // layer. Empty when the profile carries none. Used when tables == Shared.
    int tableChannels = 0;
    std::vector<std::vector<uint8_t>> levelTables;
    bool hasCalibratedTables() const { return !levelTables.empty(); }

    // The transform codec (transform.h): its switches, levels and calibrated model (serialised
    // transform section, empty when not calibrated). transformLevels empty = no transform settings.
    TransformSettings transform;
    std::vector<TransformLevel> transformLevels;
    int transformDefaultLevel = 1;
    std::vector<uint8_t> transformModel;
    bool hasTransform() const { return !transformLevels.empty(); }

    int anchorBinsFor(int layerBins) const { return anchorBins > 0 ? anchorBins : layerBins; }
    bool deltaEnabled() const { return deltaGroup >= 2; }
};

// CacheGen's three levels, with its Mistral-7B layer groups (K split at 10/32 and 20/32 of the
// depth, V at 2/32) scaled to `numLayers`:
//   level 1: K 16/16/12, V 16/12;  level 2 (default): K 32/16/16, V 32/16;  level 3: all 32.
CodecProfile defaultProfile(int numLayers);
// Bins per layer from bins per CacheGen layer group, the groups scaled to `numLayers`: keys in
// three groups (split at 10/32 and 20/32 of the depth), values in two (split at 2/32). One value
// sets every layer. Throws kvscope::Error for another number of groups.
std::vector<int> cachegenGroupBins(bool keys, const std::vector<int>& groupBins, int numLayers);

// A profile tuned for one model (a non-empty model_fingerprint) refuses caches of another:
// throws kvscope::Error "source: model_fingerprint: ..." naming both, unless `force`. An empty
// fingerprint on either side matches anything.
void checkProfileModel(const CodecProfile& p, const std::string& fingerprint, const std::string& source, bool force);

// Throws kvscope::Error "source: place: reason" for any invalid field.
void validateProfile(const CodecProfile& p, const std::string& source);
CodecProfile profileFromJson(const std::string& text, const std::string& source);
std::string profileToJson(const CodecProfile& p);
CodecProfile loadProfile(const std::string& path);
void saveProfile(const CodecProfile& p, const std::string& path);  // temp file + rename

// LMCache's CacheGen configuration form: layer ranges with bins, per K and V.
struct LayerRange {
    int start = 0, end = 0, bins = 0;  // [start, end)
};
std::vector<LayerRange> toLayerRanges(const std::vector<int>& binsPerLayer);
// One level as LMCache Python: "CacheGenConfig(nlayers=N, kspecs=[QuantizationSpec(start_layer=0,
// end_layer=10, bins=32), ...], vspecs=[...])" (end_layer exclusive). `kvscope-cli profile` and the
// GUI's codec tuner print this text.
std::string lmcacheSpecsPython(const std::vector<int>& binsPerLayer);  // "[QuantizationSpec(...), ...]"
std::string lmcacheConfigPython(const CodecLevel& level);

}  // namespace kvscope
