// encodeChunk / decodeChunk: the dispatch by codec. Each codec's payload lives in a stage file of
// its own (codec_detail.h lists them).
#include "codec/chunk_codec.h"

#include "codec/codec_detail.h"
#include "codec/transform_adapt.h"
#include "common/error.h"

namespace kvscope {

std::string chainedChunkReason(const CodecParams& p, int chunk, int level)
{
    const int g = p.profile.transform.adaptResetChunks, first = g > 0 ? chunk - chunk % g : 0;
    return "chunk " + std::to_string(chunk) + " of an adaptive-basis file (transform.adapt_basis) decodes only after chunks " +
           std::to_string(first) + ".." + std::to_string(chunk - 1) + " at level " + std::to_string(level) +
           " (its basis derives from their symbols): decode the level in order";
}

namespace {

// Whether chunk `chunk` of p decodes on its own: always, unless p chains its chunks and the chunk
// does not start a chain (chunk 0 or a reset point).
bool decodesAlone(const CodecParams& p, int chunk) { return !p.chainsChunks() || chainStartsAt(chainSettings(p), chunk); }

}  // namespace

std::vector<uint8_t> encodeChunk(const CodecParams& p, const KvSet& kv, int chunk, int level,
                                 const LevelTables* shared)
{
    KVSCOPE_ASSERT(kv.shape() == p.shape);
    KVSCOPE_ASSERT(chunk >= 0 && chunk < p.numChunks() && level >= 1 && level <= p.numLevels());
    if (p.chainsChunks())
        throw Error("transform.adapt_basis: chunk " + std::to_string(chunk) +
                    " is coded in a basis derived from the chunks before it at its level; encode whole levels "
                    "(writeKvc, encodeAdaptiveChunks)");
    if (p.codec == CodecId::Transform) return detail::encodeTransformChunk(p, kv, chunk, level);
    if (p.codec != CodecId::CacheGen) return detail::encodeBaselineChunk(p, kv, chunk);
    return detail::encodeCacheGenChunk(p, kv, chunk, level, shared);
}

std::vector<std::vector<uint8_t>> encodeChunks(const CodecParams& p, const KvSet& kv, const std::vector<ChunkRequest>& which,
                                               const std::vector<LevelTables>* sharedPerLevel)
{
    KVSCOPE_ASSERT(kv.shape() == p.shape);
    for (const ChunkRequest& r : which)
        KVSCOPE_ASSERT(r.chunk >= 0 && r.chunk < p.numChunks() && r.level >= 1 && r.level <= p.numLevels());
    if (p.codec == CodecId::Transform) return detail::encodeTransformChunks(p, kv, which);
    std::vector<std::vector<uint8_t>> out;
    for (const ChunkRequest& r : which)
        out.push_back(encodeChunk(p, kv, r.chunk, r.level, sharedPerLevel ? &(*sharedPerLevel)[size_t(r.level - 1)] : nullptr));
    return out;
}

void decodeChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                 const LevelTables* shared, KvSet& out, const std::string& where)
{
    KVSCOPE_ASSERT(out.shape() == p.shape);
    KVSCOPE_ASSERT(chunk >= 0 && chunk < p.numChunks() && level >= 1 && level <= p.numLevels());
    if (!decodesAlone(p, chunk)) throw Error(where + ": " + chainedChunkReason(p, chunk, level));
    if (p.codec == CodecId::Transform) return detail::decodeTransformChunk(p, data, size, chunk, level, out, where);
    if (p.codec != CodecId::CacheGen) return detail::decodeBaselineChunk(p, data, size, chunk, out, where);
    detail::decodeCacheGenChunk(p, data, size, chunk, level, shared, out, where);
}

void decodeChunks(const CodecParams& p, const std::vector<ChunkPayload>& chunks,
                  const std::vector<LevelTables>* sharedPerLevel, KvSet& out)
{
    KVSCOPE_ASSERT(out.shape() == p.shape);
    for (const ChunkPayload& c : chunks)
        KVSCOPE_ASSERT(c.chunk >= 0 && c.chunk < p.numChunks() && c.level >= 1 && c.level <= p.numLevels());
    for (const ChunkPayload& c : chunks)
        if (!decodesAlone(p, c.chunk)) throw Error(c.where + ": " + chainedChunkReason(p, c.chunk, c.level));
    if (p.codec == CodecId::CacheGen) return detail::decodeCacheGenChunks(p, chunks, sharedPerLevel, out);
    if (p.codec == CodecId::Transform) return detail::decodeTransformChunks(p, chunks, out);
    for (const ChunkPayload& c : chunks) decodeChunk(p, c.data, c.size, c.chunk, c.level, nullptr, out, c.where);
}

}  // namespace kvscope
