// encodeChunk / decodeChunk: the dispatch by codec. Each codec's payload lives in a stage file of
// its own (codec_detail.h lists them).
#include "codec/chunk_codec.h"

#include "codec/codec_detail.h"
#include "common/error.h"

namespace kvscope {

std::vector<uint8_t> encodeChunk(const CodecParams& p, const KvSet& kv, int chunk, int level,
                                 const LevelTables* shared)
{
    KVSCOPE_ASSERT(kv.shape() == p.shape);
    KVSCOPE_ASSERT(chunk >= 0 && chunk < p.numChunks() && level >= 1 && level <= p.numLevels());
    if (p.codec == CodecId::Transform) return detail::encodeTransformChunk(p, kv, chunk, level);
    if (p.codec != CodecId::CacheGen) return detail::encodeBaselineChunk(p, kv, chunk);
    return detail::encodeCacheGenChunk(p, kv, chunk, level, shared);
}

void decodeChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                 const LevelTables* shared, KvSet& out, const std::string& where)
{
    KVSCOPE_ASSERT(out.shape() == p.shape);
    KVSCOPE_ASSERT(chunk >= 0 && chunk < p.numChunks() && level >= 1 && level <= p.numLevels());
    if (p.codec == CodecId::Transform) return detail::decodeTransformChunk(p, data, size, chunk, level, out, where);
    if (p.codec != CodecId::CacheGen) return detail::decodeBaselineChunk(p, data, size, chunk, out, where);
    detail::decodeCacheGenChunk(p, data, size, chunk, level, shared, out, where);
}

}  // namespace kvscope
