// Internal to codec/: what the chunk-codec stages share (byte helpers, block I/O, the OpenMP
// driver) and the entry points of each stage. Not a public header: nothing outside codec/ includes it.
//
// The stages, one file each, in the order a CacheGen chunk is built:
//   codec_params.cpp   codec names, CodecParams, the int8 reference size
//   cachegen_chunk.cpp quantize a (kind, layer) block, then lay out the CacheGen chunk payload
//   level_tables.cpp   probability tables per level: counting, calibration, (de)serialisation
//   entropy_stage.cpp  one rANS stream per (kind, layer, head), decoding fused with dequantization
//   baselines.cpp      fp16, int8, KIVI-2/4 and zstd payloads
//   transform.cpp      the transform codec's model: fit, serialisation (math in transform.h)
//   transform_chunk.cpp the transform codec's chunk payload
//   symbol_stream.cpp  rANS coding of a symbol matrix with one table per column
//   chunk_codec.cpp    encodeChunk / decodeChunk: the dispatch by codec
#pragma once

#include "codec/chunk_codec.h"
#include "codec/quantize.h"
#include "common/error.h"

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace kvscope::detail {

inline constexpr KvKind kKinds[2] = {KvKind::Key, KvKind::Value};

inline int numRoles(const CodecParams& p) { return p.profile.deltaEnabled() ? 2 : 1; }

// Reads one (kind, layer) block of a chunk as floats: (heads, n, head_dim).
inline void readBlock(const KvSet& kv, KvKind kind, int layer, int t0, int n, std::vector<float>& x)
{
    const KvShape& s = kv.shape();
    x.resize(size_t(s.numKvHeads) * n * s.headDim);
    for (int h = 0; h < s.numKvHeads; ++h)
        kv.readRows(kind, layer, h, t0, n, x.data() + size_t(h) * n * s.headDim);
}

inline void writeBlock(KvSet& kv, KvKind kind, int layer, int t0, int n, const float* x)
{
    const KvShape& s = kv.shape();
    for (int h = 0; h < s.numKvHeads; ++h)
        kv.writeRows(kind, layer, h, t0, n, x + size_t(h) * n * s.headDim);
}

// Runs body(unit) for unit in [0, count) on all cores. When units fail, the error of the
// lowest-numbered one is rethrown, so a corrupt file gives the same message on every run.
template <typename Body>
void parallelUnits(int count, Body body)
{
    std::exception_ptr error;
    int errorUnit = count;
    std::mutex m;
#pragma omp parallel for schedule(dynamic, 1)
    for (int u = 0; u < count; ++u) {
        try {
            body(u);
        } catch (...) {
            std::lock_guard<std::mutex> lock(m);
            if (u < errorUnit) {
                errorUnit = u;
                error = std::current_exception();
            }
        }
    }
    if (error) std::rethrow_exception(error);
}

inline void putU32(std::vector<uint8_t>& out, uint32_t v)
{
    for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
inline uint32_t getU32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
inline void putU16s(std::vector<uint8_t>& out, const uint16_t* v, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        out.push_back(uint8_t(v[i]));
        out.push_back(uint8_t(v[i] >> 8));
    }
}
inline void getU16s(const uint8_t* p, uint16_t* v, size_t n)
{
    for (size_t i = 0; i < n; ++i) v[i] = uint16_t(p[2 * i] | p[2 * i + 1] << 8);
}

// A bounds-checked cursor over a payload; every read names `where` on failure.
struct Cursor {
    const uint8_t* p;
    const uint8_t* end;
    const std::string& where;

    const uint8_t* take(size_t n, const char* what)
    {
        if (size_t(end - p) < n)
            throw Error(where + ": truncated " + what + " (needs " + std::to_string(n) + " bytes, " +
                        std::to_string(end - p) + " left)");
        const uint8_t* r = p;
        p += n;
        return r;
    }
};

// ---------------------------------------------------------------------------------------------
// CacheGen blocks (cachegen_chunk.cpp)

// One (kind, layer) block of a chunk, read and quantized: what encoding and calibration start from.
struct QuantizedBlock {
    quant::BlockSpec spec;
    std::vector<uint8_t> sym;      // (heads, n, head_dim)
    std::vector<uint16_t> scales;  // (spec.numScales())
};
QuantizedBlock quantizeUnit(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level, int t0, int n);

// Counts a quantized block's symbols per (role, channel) into flat; returns the stride between tables.
size_t countUnit(const QuantizedBlock& q, int roles, std::vector<uint32_t>& flat);

std::vector<uint8_t> encodeCacheGenChunk(const CodecParams& p, const KvSet& kv, int chunk, int level,
                                         const LevelTables* shared);
void decodeCacheGenChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                         const LevelTables* shared, KvSet& out, const std::string& where);

// ---------------------------------------------------------------------------------------------
// Entropy stage (entropy_stage.cpp)

// The coding tables one (kind, layer) block uses: [role * channels + channel]. Reused across
// units on the same thread so the hot path never allocates.
struct UnitTables {
    std::vector<CodingTable> tables;
    const CodingTable& at(int role, int channels, int channel) const { return tables[size_t(role) * channels + channel]; }
};

// Symbol counts of a block into flat[(role * C + c) * stride + symbol], added to what is there;
// stride is at least the larger alphabet of the two roles.
void countBlock(const quant::BlockSpec& b, const uint8_t* sym, int roles, uint32_t* flat, size_t stride);

// One stream per head: symbols (t, d) in token-major order, symbol i coded by state i % 4.
void encodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* sym, const UnitTables& tab,
                      std::vector<uint8_t>& out);

// Decodes one head's stream and dequantizes it in the same pass into out (tokens, head_dim):
// the fast path; quant::dequantizeBlock is the reference it must match.
void decodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* data, size_t size, const UnitTables& tab,
                      const uint16_t* scales, float* out, const std::string& where);

// ---------------------------------------------------------------------------------------------
// Level tables (level_tables.cpp)

// Fills tab for one block from the shared tables of its level.
void sharedUnitTables(const CodecParams& p, const LevelTables& shared, KvKind kind, int layer, bool forDecoding,
                      UnitTables& tab);

// ---------------------------------------------------------------------------------------------
// Baselines (baselines.cpp): fp16, int8, KIVI-2/4, zstd

inline size_t blockValues(const CodecParams& p, int n) { return size_t(p.shape.numKvHeads) * n * p.shape.headDim; }
std::vector<uint8_t> encodeBaselineChunk(const CodecParams& p, const KvSet& kv, int chunk);
void decodeBaselineChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, KvSet& out,
                         const std::string& where);

// ---------------------------------------------------------------------------------------------
// Transform codec (transform_chunk.cpp); p.transform must be set.

std::vector<uint8_t> encodeTransformChunk(const CodecParams& p, const KvSet& kv, int chunk, int level);
void decodeTransformChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level, KvSet& out,
                          const std::string& where);

}  // namespace kvscope::detail
