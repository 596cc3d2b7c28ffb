#include "eval/codec_trial.h"

#include <chrono>

namespace kvscope {

CodecTrial runCodecTrial(const KvSet& kv, const CodecParams& params, int level)
{
    using Clock = std::chrono::steady_clock;
    CodecTrial t;
    const bool shared = params.codec == CodecId::CacheGen && params.profile.tables == TableMode::Shared;
    LevelTables tables;
    auto t0 = Clock::now();
    if (shared && params.profile.hasCalibratedTables()) {
        tables = profileTables(params, "profile")[size_t(level - 1)];
    } else if (shared) {
        LevelCounts counts;
        for (int c = 0; c < params.numChunks(); ++c) countChunkSymbols(params, kv, c, level, counts);
        tables = tablesFromCounts(params, level, counts);
        std::vector<uint8_t> blob;
        serializeLevelTables(params, level, tables, blob);
        t.tableBytes = blob.size();
    }
    std::vector<std::vector<uint8_t>> payloads;
    for (int c = 0; c < params.numChunks(); ++c) {
        payloads.push_back(encodeChunk(params, kv, c, level, shared ? &tables : nullptr));
        t.bytes += payloads.back().size();
    }
    t.bytes += t.tableBytes;
    t.encodeSeconds = std::chrono::duration<double>(Clock::now() - t0).count();

    t0 = Clock::now();
    t.decoded = KvSet(kv.shape(), kv.dtype());
    for (int c = 0; c < params.numChunks(); ++c)
        decodeChunk(params, payloads[size_t(c)].data(), payloads[size_t(c)].size(), c, level, shared ? &tables : nullptr,
                    t.decoded, "chunk " + std::to_string(c));
    t.decodeSeconds = std::chrono::duration<double>(Clock::now() - t0).count();
    t.decoded.tokens = kv.tokens;
    t.decoded.context = kv.context;
    t.decoded.modelName = kv.modelName;
    t.decoded.modelFingerprint = kv.modelFingerprint;
    t.bitsPerValue = 8.0 * double(t.bytes) / double(kv.shape().totalValues());
    return t;
}

}  // namespace kvscope
