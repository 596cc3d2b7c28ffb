// What the Python module needs from the codec that core does not offer as one call: encoding a
// KvSet into .kvc bytes with the CLI's own option handling (so `kvscope.encode` and `kvscope-cli
// encode` cannot disagree), and the statistics and errors as the JSON the CLI prints.
#pragma once

#include "codec/container.h"
#include "kv/kv_set.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvscope::python {

// The options of `kvscope-cli encode`; empty strings and negative numbers mean "not given".
struct EncodeOptions {
    std::string codec = "cachegen";
    std::string profilePath;  // "" = the default profile
    int level = 0;            // 0 = every level of the profile; N = a container of level N only
    int chunkTokens = 0;
    int deltaGroup = -1;
    int anchorBins = -1;
    std::string tables, tableScope, keyQuantizer, valueQuantizer;
    bool forceProfile = false;
};

// The sizes `kvscope-cli encode --json` reports for a container (cmd_codec.cpp, writeAndReport).
struct EncodeReport {
    uint64_t fileBytes = 0;
    std::vector<uint64_t> levelBytes, levelTableBytes;  // (levels) chunk payloads, shared tables
    bool tablesFromProfile = false;                     // the tables are the profile's, not the file's
    uint64_t sideBytes = 0;  // transform: what travels with every level besides its chunks (transformSideBytes)
    std::string modelFrom;   // transform: "profile" (calibrated) or "cache" (fitted on this cache)
    int defaultLevel = 1;
};

// The bytes `kvscope-cli encode KV --out X.kvc` writes to X.kvc with the same options (level = 0).
// With a level, the container holds that CacheGen level alone, as if the profile listed only it.
// Every byte goes to put (writeKvc's KvcPut: kvscope.encode writes them into its bytes object);
// returns the container's sizes. Throws kvscope::Error with the CLI's message on bad options or a
// profile that does not fit.
EncodeReport encodeTo(const KvSet& kv, const EncodeOptions& o, const KvcPut& put);

// benchCodec, what `kvscope-cli bench codec --threads 1` times, on kv with o's profile at `level`
// (1-based): (encode, decode) seconds of the calling thread's CPU time, best of `repeats`. For
// samples/python/bench_overhead.py, which sets the Python calls beside it in the same process.
std::pair<double, double> benchCodecSeconds(const KvSet& kv, const EncodeOptions& o, int level, int repeats);

// The levels `kvscope-cli decode --level` accepts: none = the file's default, one for every chunk,
// or one per chunk. Throws kvscope::Error "name: level N does not exist (the file has M)".
std::vector<int> checkedLevels(const KvcReader& r, const std::vector<int>& levels);

// `kvscope-cli stats --json` without "file".
nlohmann::json statsJson(const KvSet& kv, int deltaGroup, int bins, bool perChannel);
// max_abs_error, rms_error and per-layer errors, as `decode --source` reports them.
nlohmann::json compareJson(const KvSet& reference, const KvSet& decoded);

}  // namespace kvscope::python
