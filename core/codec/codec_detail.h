// Internal to codec/: what the chunk-codec stages share (byte helpers, block I/O, the OpenMP
// driver) and the entry points of each stage. Not a public header: nothing outside codec/ includes it.
//
// The stages, one file each, in the order a CacheGen chunk is built:
//   codec_params.cpp   codec names, CodecParams, the int8 reference size
//   cachegen_chunk.cpp quantize a (kind, layer) block, then lay out the CacheGen chunk payload
//   level_tables.cpp   probability tables per level: counting, calibration, (de)serialisation
//   entropy_stage.cpp  one rANS stream per (kind, layer, head), decoding fused with dequantization;
//                      v1 (4 states) and v2 (32 states) streams, the scalar v2 reference
//   entropy_simd.cpp   AVX2 / AVX-512 row kernels of the v2 decoder, CPU detection
//   baselines.cpp      fp16, int8, KIVI-2/4 and zstd payloads
//   transform.cpp      the transform codec's model: fit, serialisation (math in transform.h)
//   transform_chunk.cpp the transform codec's chunk payload
//   symbol_stream.cpp  rANS coding of a symbol matrix with one table per column
//   chunk_codec.cpp    encodeChunk / decodeChunk: the dispatch by codec
#pragma once

#include "codec/chunk_codec.h"
#include "codec/quantize.h"
#include "codec/rans.h"
#include "codec/simd_path.h"
#include "common/error.h"

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace kvscope::detail {

inline constexpr KvKind kKinds[2] = {KvKind::Key, KvKind::Value};

inline int numRoles(const CodecParams& p) { return p.profile.deltaEnabled() ? 2 : 1; }
// Whether one probability table covers all channels of a KV head (TableScope::Head).
inline bool perHeadTables(const CodecParams& p) { return p.profile.tableScope == TableScope::Head; }
// Probability tables per (kind, layer, role): one per channel, or one per KV head.
inline int tablesPerRole(const CodecParams& p) { return perHeadTables(p) ? p.shape.numKvHeads : p.shape.channels(); }
// Channels one table covers: 1, or head_dim.
inline int channelsPerTable(const CodecParams& p) { return perHeadTables(p) ? p.shape.headDim : 1; }

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

// Runs body(unit) for unit in [0, count) on all cores. When units fail, the error of the one of
// lowest rank(unit) is rethrown (ranks distinct), so a corrupt file gives the same message on
// every run whatever order the units run in.
template <typename Rank, typename Body>
void parallelRanked(int count, Rank rank, Body body)
{
    std::exception_ptr error;
    long long errorRank = 0;
    std::mutex m;
#pragma omp parallel for schedule(dynamic, 1)
    for (int u = 0; u < count; ++u) {
        try {
            body(u);
        } catch (...) {
            std::lock_guard<std::mutex> lock(m);
            if (!error || rank(u) < errorRank) {
                errorRank = rank(u);
                error = std::current_exception();
            }
        }
    }
    if (error) std::rethrow_exception(error);
}

// parallelRanked with the unit's number as its rank.
template <typename Body>
void parallelUnits(int count, Body body)
{
    parallelRanked(count, [](int u) { return (long long)u; }, body);
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

// Counts a quantized block's symbols per (role, channel), or per (role, head) when perHead, into
// flat; returns the stride between tables.
size_t countUnit(const QuantizedBlock& q, int roles, bool perHead, std::vector<uint32_t>& flat);

// The per-(role, channel) coding tables (perHead: per (role, head)) of one block built from its
// own symbol counts (in-band mode): fills tab for encoding and appends their serialised form to
// `serialized`.
struct UnitTables;
void inBandUnitTables(const QuantizedBlock& q, int roles, bool perHead, UnitTables& tab, std::vector<uint8_t>& serialized);

std::vector<uint8_t> encodeCacheGenChunk(const CodecParams& p, const KvSet& kv, int chunk, int level,
                                         const LevelTables* shared);
void decodeCacheGenChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                         const LevelTables* shared, KvSet& out, const std::string& where);
void decodeCacheGenChunks(const CodecParams& p, const std::vector<ChunkPayload>& chunks,
                          const std::vector<LevelTables>* shared, KvSet& out);

// ---------------------------------------------------------------------------------------------
// Entropy stage (entropy_stage.cpp)

// The coding tables one (kind, layer) block uses: [role * channels + channel]. Reused across
// units on the same thread so the hot path never allocates.
struct UnitTables {
    std::vector<CodingTable> tables;
    int perRole = 0;           // tables per role
    int channelsPerTable = 1;  // 1 (per channel) or head_dim (per head)
    size_t index(int role, int channel) const { return size_t(role) * size_t(perRole) + size_t(channel / channelsPerTable); }
    const CodingTable& at(int role, int channel) const { return tables[index(role, channel)]; }
    void resize(int roles, int perRoleTables, int channelsPer)
    {
        perRole = perRoleTables;
        channelsPerTable = channelsPer;
        tables.resize(size_t(roles) * size_t(perRoleTables));
    }
};

// Symbol counts of a block into flat[(role * C + c) * stride + symbol], added to what is there;
// stride is at least the larger alphabet of the two roles.
void countBlock(const quant::BlockSpec& b, const uint8_t* sym, int roles, bool perHead, uint32_t* flat, size_t stride);

// One stream per head: symbols (t, d) in token-major order, symbol i coded by state i % 4.
void encodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* sym, const UnitTables& tab,
                      std::vector<uint8_t>& out);

// Decodes one head's stream and dequantizes it in the same pass into out (tokens, head_dim):
// the fast path; quant::dequantizeBlock is the reference it must match.
void decodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* data, size_t size, const UnitTables& tab,
                      const uint16_t* scales, float* out, const std::string& where);

// v2 streams (FORMAT.md "Entropy coding", layout 2): the same symbols and tables, 32 states.
void encodeHeadStreamV2(const quant::BlockSpec& b, int h, const uint8_t* sym, const UnitTables& tab,
                        std::vector<uint8_t>& out);

// What a v2 decoder writes: a row of values in the output dtype, or the raw symbols.
enum class RowOut : uint8_t { F16, BF16, F32, Symbols };
inline RowOut rowOutFor(DType t) { return t == DType::F16 ? RowOut::F16 : t == DType::BF16 ? RowOut::BF16 : RowOut::F32; }
inline size_t rowOutBytes(RowOut k) { return k == RowOut::F32 ? 4 : k == RowOut::Symbols ? 1 : 2; }

// Decodes one head's v2 stream straight into out: (tokens, head_dim) elements of kind `k` (the
// head's rows of a KvSet tensor, or symbols), dequantized in the same pass. Uses simdPath().
void decodeHeadStreamV2(const quant::BlockSpec& b, int h, const uint8_t* data, size_t size, const UnitTables& tab,
                        const uint16_t* scales, RowOut k, uint8_t* out, const std::string& where);

// The same for all b.heads streams of a block (data[h], size[h] -> out[h]), their rows
// interleaved; on corruption it throws for the lowest corrupt head, like decoding them in order.
void decodeHeadStreamsV2(const quant::BlockSpec& b, const uint8_t* const* data, const size_t* size, const UnitTables& tab,
                         const uint16_t* scales, RowOut k, uint8_t* const* out, const std::string& where);

// The decoder state of one v2 stream, and one row's parameters: what the row kernels share.
struct W32Stream {
    alignas(64) uint32_t x[32];
    const uint8_t* p;
    const uint8_t* end;
    bool overrun;
};
// The end of a v2 encode: the words of a stream were pushed down from wordsEnd to w inside buf
// (the last symbol first); pushes the 32 final states (state 0 last, so the decoder reads it
// first) and appends the stream's bytes, little-endian words, to out.
void finishStreamV2(const uint32_t* x, uint16_t* w, const std::vector<uint16_t>& buf, uint16_t* wordsEnd,
                    std::vector<uint8_t>& out);
// Whether st ended exactly at its last word with every state back at its initial value. When
// its end was decoded from a zero-padded copy (tail, holding the bytes from tailBase on; null
// if not), st is first mapped back to stream addresses, reads into the padding counting as an
// overrun.
inline bool w32StreamEnded(W32Stream& st, const uint8_t* tail, const uint8_t* tailBase, const uint8_t* realEnd)
{
    if (tailBase) {
        const size_t used = size_t(st.p - tail), left = size_t(realEnd - tailBase);
        st.p = used <= left ? tailBase + used : realEnd;
        st.overrun = st.overrun || used > left;
        st.end = realEnd;
    }
    bool statesOk = true;
    for (uint32_t v : st.x) statesOk = statesOk && v == rans::w32::kL;
    return !st.overrun && st.p == st.end && statesOk;
}
struct W32Row {
    const uint32_t* tables;    // the unit's CodingTables, as 32-bit words
    const int32_t* tableWord;  // (D) word offset of the table of channel d for this row's role
    // When every channel of the row uses one table (uniform kernels), 64-byte aligned, else null:
    // its 64 bucket entries split into low words [0, 64) and high words [64, 128); start(s) for
    // s < 32 in [128, 160) (4096 past the alphabet); [160] is 1 when the alphabet has <= 32 symbols.
    const uint32_t* split;
    int D;
    int lane0;                 // state of the row's first symbol: (t * D) % 32
    int m;                     // MAX of the row's bins: value = (q - m) * scale + base
    const float* scaleVec;     // (D) per-channel scales, or null: `scale` for the whole row
    float scale;
    const float* base;         // (D) the group's reconstructed anchor, or null: +0
    float* anchorOut;          // (D) an anchor row's float values go here too (delta coding), or null
    uint8_t* out;              // D elements of the RowOut kind
    // The SIMD kernels decode `rows` consecutive rows of the same role and base in one call (out
    // advancing by a row each); row j's per-token scale is rowScales[j] (f16) when set, else
    // `scale`. The scalar reference takes one row.
    int rows = 1;
    const uint16_t* rowScales = nullptr;
    // AVX2 kernels, uniform rows: the row's one table as a slot index (w32SlotIndex), or null.
    const uint32_t* slots = nullptr;
};
// A SIMD row kernel needs D % width == 0 and at least w32RowSlack(D) bytes left in the stream.
using W32RowFn = void (*)(W32Stream&, const W32Row&);
inline size_t w32RowSlack(int D, int rows = 1) { return 2 * size_t(D) * size_t(rows) + 64; }
// uniform: every row's channels share one table (W32Row::split is set). nullptr: use the scalar rows.
W32RowFn w32RowKernel(SimdPath path, RowOut k, int D, bool uniform);
// Whether the kernel w32RowKernel(path, k, D, true) reads W32Row::slots (AVX2 rows: 16
// registers cannot hold a table, so a slot index turns two gathers and the bucket arithmetic
// into one gather).
bool w32RowUsesSlots(SimdPath path, int D);
// The slot index of a decoding table of `alphabet` symbols: slots[s] for every slot s < 4096 is
// symbol | (s - start(symbol)) << 8 | (freq(symbol) - 1) << 20.
void w32SlotIndex(const CodingTable& t, int alphabet, uint32_t* slots);

// A whole stream's symbols for a SIMD encoder: x (32 states, 64-byte aligned) and the word
// pointer move exactly as in encodeHeadStreamV2's scalar loop.
struct W32EncJob {
    const uint32_t* tables;    // the unit's CodingTables, as 32-bit words
    const int32_t* tableWord;  // (2, D): word offset of channel d's table, role 0 then role 1
    const uint8_t* sym;        // (tokens, D) of this head
    int tokens, D, deltaGroup;
    // When each role's row uses one table of at most 32 symbols: per role, sf[s] of that table
    // (32 words, 0 past the alphabet) then 1.0f / freq(s) as float bits (32 words), 64-byte
    // aligned; the AVX-512 encoder then looks both up in registers. Else null.
    const uint32_t* small = nullptr;
};
using W32EncFn = void (*)(const W32EncJob&, uint32_t* x, uint16_t*& words);
W32EncFn w32EncodeKernel(SimdPath path, int D, bool small);  // small: W32EncJob::small is set. nullptr: scalar
void w32RowScalar(W32Stream& s, const W32Row& r, RowOut k);

// Symbol counts of one head's rows (tokens, D): counts[role * roleStride + s] += how often s occurs
// in the rows of that role (role 1: anchor rows when deltaGroup >= 2, token t % deltaGroup == 0).
// Every symbol must be < stride.
using CountFn = void (*)(const uint8_t* sym, int tokens, int D, int deltaGroup, int roles, int stride,
                         size_t roleStride, uint32_t* counts);
// An AVX-512 or AVX2 counter (compare and popcount per symbol value) for alphabets of at most
// 32 symbols, else nullptr (the scalar sub-histograms).
CountFn countKernel(SimdPath path, int stride);

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
// Every request of `which` (encodeChunks), the pairs of request and block in one parallel loop.
std::vector<std::vector<uint8_t>> encodeTransformChunks(const CodecParams& p, const KvSet& kv,
                                                        const std::vector<ChunkRequest>& which);
void decodeTransformChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level, KvSet& out,
                          const std::string& where);
// Every chunk of `chunks` (decodeChunks), the pairs of chunk and block in one parallel loop.
void decodeTransformChunks(const CodecParams& p, const std::vector<ChunkPayload>& chunks, KvSet& out);
// The entropy stage's input (bench codec): the symbols of one (kind, layer) block of a chunk, one
// matrix per token class present (rows: that class's coded tokens, cols: the coded components),
// and the tables class `cls` is coded with (built for decoding or encoding). Empty for entropy "fixed".
struct TransformSymbols {
    int cls = 0, rows = 0, cols = 0;
    std::vector<uint8_t> sym;  // (rows, cols)
};
std::vector<TransformSymbols> transformBlockSymbols(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level,
                                                   int chunk);
void transformCodingTables(const CodecParams& p, KvKind kind, int layer, int level, int cls, bool forDecoding,
                           std::vector<CodingTable>& tables);

}  // namespace kvscope::detail
