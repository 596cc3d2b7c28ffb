// Encoding and decoding of one chunk (a run of tokens across every layer, K and V) at one level,
// for every built-in codec. Works on KvSet buffers only: no file, no torch, no HDF5.
//
// A chunk payload is self-delimiting given CodecParams (which the container header carries):
// shapes, chunk size and bins are never repeated inside a chunk. FORMAT.md documents each payload.
#pragma once

#include "codec/prob_table.h"
#include "codec/profile.h"
#include "codec/quantize.h"
#include "codec/transform.h"
#include "kv/kv_set.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

enum class CodecId : uint8_t { CacheGen = 0, Fp16 = 1, Int8 = 2, Kivi2 = 3, Kivi4 = 4, Zstd = 5, Transform = 6 };
const char* codecName(CodecId c);                      // "cachegen", "fp16", ...
bool parseCodecName(const std::string& s, CodecId* out);

// KIVI baseline settings (Liu et al., 2024): keys per channel in groups of kKiviGroup tokens,
// values per token in groups of kKiviGroup channels, min/scale in fp16, and the last
// kKiviResidual tokens of the context kept in fp16.
constexpr int kKiviGroup = 32;
constexpr int kKiviResidual = 128;

// The layout of cachegen's entropy-coded streams (FORMAT.md "Entropy coding"), given by the
// container's major version: 1 = 4 states with byte-wise renormalisation, 2 = 32 states with
// 16-bit words (SIMD and GPU-warp friendly). Writers use Rans32x16; Rans4x8 files still decode.
enum class EntropyLayout : uint8_t { Rans4x8 = 1, Rans32x16 = 2 };

// Everything a decoder needs besides the chunk bytes.
struct CodecParams {
    CodecId codec = CodecId::CacheGen;
    EntropyLayout entropy = EntropyLayout::Rans32x16;
    KvShape shape;               // of the whole cache
    DType dtype = DType::F16;    // of the source cache, and of decoded output
    CodecProfile profile;        // CacheGen settings; for baselines only chunkTokens matters
    // The transform codec's model (transform.h): set by prepareTransform before encoding, or by
    // the container reader from the transform section. Null for every other codec.
    std::shared_ptr<const TransformModel> transform;

    int numChunks() const { return (shape.numTokens + profile.chunkTokens - 1) / profile.chunkTokens; }
    int numLevels() const
    {
        if (codec == CodecId::CacheGen) return int(profile.levels.size());
        if (codec == CodecId::Transform) return transform ? transform->numLevels() : int(profile.transformLevels.size());
        return 1;
    }
    int defaultLevel() const
    {
        if (codec == CodecId::CacheGen) return profile.defaultLevel;
        if (codec == CodecId::Transform) return std::min(std::max(1, profile.transformDefaultLevel), numLevels());
        return 1;
    }
    int chunkStart(int chunk) const { return chunk * profile.chunkTokens; }
    int chunkLength(int chunk) const;
    // True when chunk n is coded in a basis derived from the chunks before it since the last reset
    // point at the same level (the transform codec's "adapt_basis", transform_adapt.h): such chunks
    // encode only as whole levels and decode in order from a reset point (writeKvc,
    // KvcReader::decodeAll, KvcChainDecoder in container_chain.h); decodeChunk takes reset points only.
    bool chainsChunks() const { return codec == CodecId::Transform && profile.transform.adaptPriorTokens > 0; }
    int binsFor(KvKind kind, int layer, int level) const;  // level is 1-based
};

// The quantizer settings of one CacheGen block (one kind and layer of a chunk of `tokens` tokens).
quant::BlockSpec cachegenBlockSpec(const CodecParams& p, KvKind kind, int layer, int level, int tokens);

// Shared (calibrated) probability tables of one level: [kind][layer][role][channel],
// role 0 = delta/plain symbols, role 1 = anchor symbols (present only with delta coding).
struct LevelTables {
    std::vector<ProbTable> tables;
    const ProbTable& at(const CodecParams& p, KvKind kind, int layer, int role, int channel) const;
    // table: the channel, or the KV head with TableScope::Head (tablesPerRole per role).
    static size_t index(const CodecParams& p, KvKind kind, int layer, int role, int table);
};

// Symbol counts for calibration, same indexing as LevelTables, `alphabet` counters per table.
struct LevelCounts {
    std::vector<std::vector<uint32_t>> counts;
};

// Accumulates the symbol counts of chunk `chunk` at `level` into `counts` (sized on first use).
void countChunkSymbols(const CodecParams& p, const KvSet& kv, int chunk, int level, LevelCounts& counts);
LevelTables tablesFromCounts(const CodecParams& p, int level, const LevelCounts& counts);
void serializeLevelTables(const CodecParams& p, int level, const LevelTables& t, std::vector<uint8_t>& out);
// Throws kvscope::Error "where: reason" on malformed bytes.
LevelTables parseLevelTables(const CodecParams& p, int level, const uint8_t* data, size_t size,
                             const std::string& where);

// The calibrated tables a profile carries (p.profile.levelTables), parsed for this cache's shape.
// Throws kvscope::Error naming `source` when they are absent, for another channel count, or corrupt.
std::vector<LevelTables> profileTables(const CodecParams& p, const std::string& source);

// Calibrates shared tables on several caches of one shape: the symbol counts of every chunk of
// every cache at each level, then one table per (kind, layer, role, channel). Stores them in
// p.profile (levelTables, tableChannels) with tables = Shared.
void calibrateProfile(CodecParams& p, const std::vector<const KvSet*>& caches);

// Encodes tokens [chunkStart, chunkStart + chunkLength) of kv at `level` (1-based).
// `shared` must hold this level's tables when the profile uses TableMode::Shared, else nullptr.
// Parallel over (kind, layer) with OpenMP. Throws kvscope::Error on non-finite values.
std::vector<uint8_t> encodeChunk(const CodecParams& p, const KvSet& kv, int chunk, int level,
                                 const LevelTables* shared);

// A chunk for encodeChunks to encode, at a level (1-based).
struct ChunkRequest {
    int chunk = 0;
    int level = 1;
};

// Encodes every request of `which`, giving each the bytes encodeChunk gives it, and on failure
// the error of the first failing request in the list's order. The transform codec runs every pair
// of request and (kind, layer) block in one parallel loop, block after block (so a block's
// matrices stay in cache across chunks); the other codecs encode request after request.
// sharedPerLevel: one LevelTables per level when the profile uses TableMode::Shared, else null.
std::vector<std::vector<uint8_t>> encodeChunks(const CodecParams& p, const KvSet& kv, const std::vector<ChunkRequest>& which,
                                               const std::vector<LevelTables>* sharedPerLevel);

// Decodes a payload produced by encodeChunk into the chunk's tokens of `out`, whose shape and
// dtype must match p. Validates every size and offset; throws kvscope::Error "where: reason" on
// any inconsistency and never reads outside [data, data + size).
void decodeChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                 const LevelTables* shared, KvSet& out, const std::string& where);

// Why a chunk of a chained cache (CodecParams::chainsChunks) that does not start a chain (chunk 0
// or a reset point, transform_adapt.h) cannot be decoded on its own: the reason decodeChunk and
// decodeChunks give (after their `where`) for such a chunk.
std::string chainedChunkReason(const CodecParams& p, int chunk, int level);

// One payload of a batch for decodeChunks: (chunk, level), its bytes, and the `where` its errors name.
struct ChunkPayload {
    int chunk = 0;
    int level = 1;
    const uint8_t* data = nullptr;
    size_t size = 0;
    std::string where;
};

// Decodes several payloads (distinct chunks) into out, exactly as decodeChunk on each in turn would,
// and with the same error when one is corrupt (that of the first failure in chunk order). CacheGen
// decodes unit by unit through all the chunks, so that shared tables (sharedPerLevel: one per level,
// or null in-band) are prepared once per (kind, layer) and stay in cache: the whole-cache path.
void decodeChunks(const CodecParams& p, const std::vector<ChunkPayload>& chunks,
                  const std::vector<LevelTables>* sharedPerLevel, KvSet& out);

// Exact size in bytes of the int8 baseline's payload for a whole cache of this shape: the
// reference every ratio_vs_int8 is computed against.
size_t int8Bytes(const KvShape& shape);

}  // namespace kvscope
