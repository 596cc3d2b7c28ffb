// Encode -> decode of a whole cache in memory at one level, with its exact byte count: what eval,
// sweeps and tuning need (no file written). Byte counts are those of the chunk payloads plus any
// probability tables the stream must carry (tables calibrated into the profile travel with the
// profile, not with each cache, and are not counted).
#pragma once

#include "codec/chunk_codec.h"
#include "kv/kv_set.h"

#include <cstdint>
#include <vector>

namespace kvscope {

struct CodecTrial {
    uint64_t bytes = 0;        // payloads + per-stream tables
    uint64_t tableBytes = 0;   // of which tables
    double bitsPerValue = 0.0;
    // cachegen only: bytes of each block of the chunk layout (tables in band, scales, streams),
    // summed over chunks, in block order (key layers 0..L-1, then value layers); shared tables
    // are not in it. Empty for baselines.
    std::vector<uint64_t> blockBytes;
    double encodeSeconds = 0.0;
    double decodeSeconds = 0.0;
    KvSet decoded;             // same shape and dtype as the input, with its tokens and metadata
};

// What every size column reports for `bytes` of a cache of this shape: bits per value and the
// ratios against fp16 and against the int8 baseline (int8Bytes).
struct SizeFigures {
    double bitsPerValue = 0.0, ratioVsFp16 = 0.0, ratioVsInt8 = 0.0;
};
SizeFigures sizeFigures(uint64_t bytes, const KvShape& shape);

// `level` is 1-based (baselines have one level). Throws kvscope::Error from the codec. A transform
// codec without params.transform is prepared here (prepareTransform); a model fitted on kv itself
// adds its side bytes to tableBytes and bytes.
CodecTrial runCodecTrial(const KvSet& kv, const CodecParams& params, int level);

}  // namespace kvscope
