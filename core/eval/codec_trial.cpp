#include "eval/codec_trial.h"

#include "codec/transform.h"
#include "codec/transform_adapt.h"
#include "common/error.h"

#include <chrono>
#include <cstring>

namespace kvscope {

namespace {

uint32_t readU32(const uint8_t* p)
{
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;  // the format is little-endian, as is every host kvscope builds for
}

// Adds each block's bytes of one cachegen payload to `blocks` (FORMAT.md "Chunk payloads": the
// size arrays, then tables, scales and streams block by block).
void addBlockBytes(const CodecParams& p, const std::vector<uint8_t>& payload, int chunk, std::vector<uint64_t>& blocks)
{
    const int L = p.shape.numLayers, H = p.shape.numKvHeads, B = 2 * L;
    const size_t channels = size_t(p.shape.channels());
    const size_t n = size_t(p.chunkLength(chunk));
    const bool inBand = p.profile.tables == TableMode::InBand;
    const size_t header = 4 * (size_t(inBand ? B : 0) + size_t(B) * size_t(H));
    if (payload.size() < header) throw Error("chunk " + std::to_string(chunk) + ": payload shorter than its size arrays");
    blocks.resize(size_t(B), 0);
    const uint8_t* sizes = payload.data();
    uint64_t total = 0;
    for (int b = 0; b < B; ++b) {
        uint64_t bytes = inBand ? readU32(sizes + 4 * size_t(b)) : 0;
        for (int h = 0; h < H; ++h) bytes += readU32(sizes + 4 * (size_t(inBand ? B : 0) + size_t(b) * size_t(H) + size_t(h)));
        const Quantizer q = b < L ? p.profile.keyQuantizer : p.profile.valueQuantizer;
        bytes += q == Quantizer::PerToken ? 2 * n : 2 * channels * (p.profile.deltaEnabled() ? 2 : 1);
        bytes += 4 * (size_t(inBand ? 1 : 0) + size_t(H));  // its share of the size arrays
        blocks[size_t(b)] += bytes;
        total += bytes;
    }
    if (total != payload.size())
        throw Error("chunk " + std::to_string(chunk) + ": block sizes add up to " + std::to_string(total) + " bytes, the payload has " +
                    std::to_string(payload.size()));
}

}  // namespace

SizeFigures sizeFigures(uint64_t bytes, const KvShape& shape)
{
    const double values = double(shape.totalValues());
    return {8.0 * double(bytes) / values, 2.0 * values / double(bytes), double(int8Bytes(shape)) / double(bytes)};
}

CodecTrial runCodecTrial(const KvSet& kv, const CodecParams& paramsIn, int level)
{
    using Clock = std::chrono::steady_clock;
    CodecTrial t;
    CodecParams prepared;
    if (paramsIn.codec == CodecId::Transform && !paramsIn.transform) {
        prepared = paramsIn;
        prepareTransform(prepared, kv, "profile");
    }
    const CodecParams& params = prepared.transform ? prepared : paramsIn;
    // A transform model fitted on this cache travels with it: its statistics count.
    if (params.codec == CodecId::Transform) t.tableBytes = transformSideBytes(*params.transform);
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
    const bool adaptive = params.chainsChunks();  // adapt_basis: the level coded as its chain
    const AdaptiveSettings as = adaptive ? chainSettings(params) : AdaptiveSettings{};
    if (adaptive) {
        payloads = encodeAdaptiveChunks(params, kv, level, as);
        for (const auto& pl : payloads) t.bytes += pl.size();
    } else {
        for (int c = 0; c < params.numChunks(); ++c) {
            payloads.push_back(encodeChunk(params, kv, c, level, shared ? &tables : nullptr));
            t.bytes += payloads.back().size();
            if (params.codec == CodecId::CacheGen) addBlockBytes(params, payloads.back(), c, t.blockBytes);
        }
    }
    t.bytes += t.tableBytes;
    t.encodeSeconds = std::chrono::duration<double>(Clock::now() - t0).count();

    t0 = Clock::now();
    t.decoded = KvSet(kv.shape(), kv.dtype());
    if (adaptive)
        decodeAdaptiveChunks(params, payloads, level, as, t.decoded);
    else
        for (int c = 0; c < params.numChunks(); ++c)
            decodeChunk(params, payloads[size_t(c)].data(), payloads[size_t(c)].size(), c, level,
                        shared ? &tables : nullptr, t.decoded, "chunk " + std::to_string(c));
    t.decodeSeconds = std::chrono::duration<double>(Clock::now() - t0).count();
    t.decoded.tokens = kv.tokens;
    t.decoded.context = kv.context;
    t.decoded.modelName = kv.modelName;
    t.decoded.modelFingerprint = kv.modelFingerprint;
    t.bitsPerValue = sizeFigures(t.bytes, kv.shape()).bitsPerValue;
    return t;
}

}  // namespace kvscope
