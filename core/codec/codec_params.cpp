// Codec names, CodecParams and the int8 reference size.
#include "codec/chunk_codec.h"

#include <algorithm>

namespace kvscope {

const char* codecName(CodecId c)
{
    switch (c) {
    case CodecId::CacheGen: return "cachegen";
    case CodecId::Fp16: return "fp16";
    case CodecId::Int8: return "int8";
    case CodecId::Kivi2: return "kivi2";
    case CodecId::Kivi4: return "kivi4";
    case CodecId::Zstd: return "zstd";
    case CodecId::Transform: return "transform";
    }
    return "unknown";
}

bool parseCodecName(const std::string& s, CodecId* out)
{
    for (CodecId c : {CodecId::CacheGen, CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4,
                      CodecId::Zstd, CodecId::Transform})
        if (s == codecName(c)) {
            *out = c;
            return true;
        }
    return false;
}

int CodecParams::chunkLength(int chunk) const
{
    return std::min(profile.chunkTokens, shape.numTokens - chunkStart(chunk));
}

quant::BlockSpec cachegenBlockSpec(const CodecParams& p, KvKind kind, int layer, int level, int tokens)
{
    quant::BlockSpec b;
    b.heads = p.shape.numKvHeads;
    b.headDim = p.shape.headDim;
    b.tokens = tokens;
    b.quantizer = kind == KvKind::Key ? p.profile.keyQuantizer : p.profile.valueQuantizer;
    b.bins = p.binsFor(kind, layer, level);
    b.anchorBins = p.profile.anchorBinsFor(b.bins);
    b.deltaGroup = p.profile.deltaEnabled() ? p.profile.deltaGroup : 0;
    return b;
}

int CodecParams::binsFor(KvKind kind, int layer, int level) const
{
    const CodecLevel& l = profile.levels[size_t(level - 1)];
    return kind == KvKind::Key ? l.keyBins[size_t(layer)] : l.valueBins[size_t(layer)];
}

size_t int8Bytes(const KvShape& s)
{
    // per (kind, layer, token): one fp16 scale and one byte per channel
    return 2 * size_t(s.numLayers) * size_t(s.numTokens) * (2 + size_t(s.channels()));
}

}  // namespace kvscope
