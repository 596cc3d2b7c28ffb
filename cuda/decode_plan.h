// Host side of the GPU decoder, shared by cuda/decode.cu and the CPU emulation test: validates the
// decoder parameters, checks a chunk payload's layout (every size and offset inside the payload)
// before anything is launched, lays out the probability-table store, builds shared tables, turns
// device error records into messages, and emulates the kernels' thread decomposition on the host
// (emulateDecodeChunk) so that the per-thread code of decode_core.h is tested without a GPU.
// Plain C++17; no CUDA, torch or Qt types.
#pragma once

#include "decode_core.h"
#include "kvscope_cuda.h"
#include "transform_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {
namespace gpu {

// A validated copy of kvscope_cuda_codec.
struct Codec {
    int codec = 0, dtype = 0;
    int L = 0, H = 0, D = 0, T = 0, N = 0, levels = 1;
    int quantizer[2] = {0, 0};  // per kind
    int deltaGroup = 0, anchorBins = 0, tableMode = 0;
    int tableScope = 0;         // cachegen: 0 one table per channel, 1 one per KV head
    int layout = 2;             // cachegen streams: 1 (format 1.x) or 2 (format 2.x)
    std::vector<int> bins[2];   // per kind: level-major (level - 1) * L + layer
    std::vector<std::vector<uint8_t>> sharedBlobs;  // table_mode 1: per level
    TfModel tf;                 // codec 6
    std::vector<double> rope;   // codec 6 with rope_undo: ropeTable(tf, T, D)

    int C() const { return H * D; }
    int tablesPerRole() const { return tableScope == 1 ? H : H * D; }  // per (kind, layer, role)
    int roles() const { return deltaGroup >= 2 ? 2 : 1; }
    int numChunks() const { return (T + N - 1) / N; }
    int chunkLength(int c) const { return (c + 1) * N <= T ? N : T - c * N; }
    int binsFor(int kind, int layer, int level) const { return bins[kind][size_t(level - 1) * L + layer]; }
    size_t dtypeBytes() const { return dtype == 2 ? 4 : 2; }
    uint64_t outputElems() const { return 2ull * uint64_t(L) * uint64_t(H) * uint64_t(T) * uint64_t(D); }
};

inline const char* kindName(int kind) { return kind == 0 ? "key" : "value"; }

inline bool validBins(int b) { return b >= 4 && b <= 256 && b % 2 == 0; }

inline bool makeCodec(const kvscope_cuda_codec& in, Codec* out, std::string* why)
{
    Codec c;
    auto bad = [why](const std::string& s) {
        *why = "decoder parameters: " + s;
        return false;
    };
    if (in.codec == 3 || in.codec == 4 || in.codec == 5)
        return bad(std::string("codec ") + (in.codec == 5 ? "zstd" : in.codec == 3 ? "kivi2" : "kivi4") +
                   " has no GPU decoder (cachegen, fp16, int8 and transform do); decode it on the CPU");
    if (in.codec < 0 || (in.codec > 2 && in.codec != 6)) return bad("unknown codec " + std::to_string(in.codec));
    if (in.dtype < 0 || in.dtype > 2) return bad("unknown dtype " + std::to_string(in.dtype));
    c.codec = in.codec;
    c.dtype = in.dtype;
    c.L = in.num_layers, c.H = in.num_kv_heads, c.D = in.head_dim, c.T = in.num_tokens, c.N = in.chunk_tokens;
    if (c.L < 1 || c.L > 1024 || c.H < 1 || c.H > 1024 || c.D < 1 || c.D > 1024 || c.T < 1 || c.T > (1 << 21))
        return bad("shape " + std::to_string(c.L) + "x" + std::to_string(c.H) + "x" + std::to_string(c.D) + "x" +
                   std::to_string(c.T) + " outside the limits");
    if (c.N < 1 || c.N > 8192) return bad("chunk_tokens " + std::to_string(c.N) + " outside 1..8192");
    if (c.outputElems() > (uint64_t(1) << 36)) return bad("cache too large");
    if (c.codec == 6) {
        c.levels = in.num_levels;
        if (c.levels < 1 || c.levels > 64) return bad("num_levels " + std::to_string(c.levels) + " outside 1..64");
        if (!makeTfModel(in.transform, c.L, c.H, c.D, c.levels, &c.tf, why)) return false;
        c.rope = ropeTable(c.tf, c.T, c.D);
        *out = std::move(c);
        return true;
    }
    if (c.codec != 0) {
        if (in.num_levels != 1) return bad("baselines have one level");
        *out = std::move(c);
        return true;
    }
    c.levels = in.num_levels;
    if (c.levels < 1 || c.levels > 64) return bad("num_levels " + std::to_string(c.levels) + " outside 1..64");
    for (int k = 0; k < 2; ++k) {
        const int q = k == 0 ? in.key_quantizer : in.value_quantizer;
        if (q != 0 && q != 1) return bad(std::string(kindName(k)) + " quantizer " + std::to_string(q) + " unknown");
        c.quantizer[k] = q;
        const uint16_t* b = k == 0 ? in.key_bins : in.value_bins;
        if (!b) return bad(std::string(kindName(k)) + " bins missing");
        c.bins[k].assign(b, b + size_t(c.levels) * c.L);
        for (int v : c.bins[k])
            if (!validBins(v)) return bad(std::string(kindName(k)) + " bins " + std::to_string(v) + " invalid");
    }
    c.deltaGroup = in.delta_group;
    if (c.deltaGroup != 0 && (c.deltaGroup < 2 || c.deltaGroup > c.N))
        return bad("delta_group " + std::to_string(c.deltaGroup) + " not 0 or 2..chunk_tokens");
    c.anchorBins = in.anchor_bins;
    if (c.anchorBins != 0 && !validBins(c.anchorBins)) return bad("anchor_bins " + std::to_string(c.anchorBins) + " invalid");
    c.layout = in.entropy_layout == 0 ? 2 : in.entropy_layout;
    if (c.layout != 1 && c.layout != 2) return bad("entropy_layout " + std::to_string(in.entropy_layout) + " unknown");
    c.tableMode = in.table_mode;
    if (c.tableMode != 0 && c.tableMode != 1) return bad("table_mode " + std::to_string(c.tableMode) + " unknown");
    c.tableScope = in.table_scope;
    if (c.tableScope != 0 && c.tableScope != 1) return bad("table_scope " + std::to_string(c.tableScope) + " unknown");
    if (c.tableScope == 1 && c.layout != 2) return bad("per-head tables (table_scope 1) need format 2.x streams");
    if (c.tableMode == 1) {
        if (!in.level_tables || !in.level_table_bytes) return bad("shared tables missing");
        for (int l = 0; l < c.levels; ++l) {
            if (!in.level_tables[l] && in.level_table_bytes[l]) return bad("shared tables of level " + std::to_string(l + 1) + " missing");
            if (in.level_table_bytes[l] >= (uint64_t(1) << 32)) return bad("shared tables too large");
            c.sharedBlobs.emplace_back(in.level_tables[l], in.level_tables[l] + in.level_table_bytes[l]);
        }
    }
    *out = std::move(c);
    return true;
}

// The blocks of one level (2L, kind-major) with their quantizer settings and the layout of the
// table store: role r of block u at blocks[u].tableStore[r], tablesPerRole tables of alphabet + 1
// starts each.
// Table offsets in the payload are filled in by planChunk.
inline void levelBlocks(const Codec& c, int level, std::vector<BlockPlan>* blocks, uint64_t* storeElems)
{
    blocks->assign(size_t(2) * c.L, BlockPlan{});
    uint64_t pos = 0;
    for (int k = 0; k < 2; ++k)
        for (int l = 0; l < c.L; ++l) {
            BlockPlan& b = (*blocks)[size_t(k) * c.L + l];
            const int bins = c.binsFor(k, l, level);
            const int abins = c.anchorBins > 0 ? c.anchorBins : bins;
            b.maxL = bins / 2 - 1;
            b.maxA = abins / 2 - 1;
            b.alphabet[0] = 2 * b.maxL + 1;
            b.alphabet[1] = c.roles() == 2 ? 2 * b.maxA + 1 : 0;
            b.perChannel = c.quantizer[k];
            for (int r = 0; r < c.roles(); ++r) {
                b.tableStore[r] = uint32_t(pos);  // checked below
                pos += uint64_t(c.tablesPerRole()) * uint64_t(b.alphabet[r] + 1);
            }
        }
    *storeElems = pos;
}

inline ChunkGeom chunkGeom(const Codec& c, int chunk)
{
    ChunkGeom g{};
    g.L = c.L, g.H = c.H, g.D = c.D, g.T = c.T;
    g.n = c.chunkLength(chunk);
    g.t0 = chunk * c.N;
    g.deltaGroup = c.codec == 0 ? c.deltaGroup : 0;
    g.roles = c.codec == 0 ? c.roles() : 1;
    g.dtype = c.dtype;
    g.codec = c.codec;
    g.layout = c.layout;
    g.perHead = c.codec == 0 && c.tableScope == 1;
    return g;
}

struct ChunkPlan {
    ChunkGeom geom{};
    std::vector<BlockPlan> blocks;    // 2L (cachegen)
    std::vector<StreamPlan> streams;  // 2L * H (cachegen)
    uint64_t storeElems = 0;          // table store of this level
};

inline uint32_t readU32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

// The checks every codec's plan starts with: the chunk and level exist, the payload fits the
// 32-bit offsets and has bytes when it has a size. Returns false with "reason" in *why.
inline bool checkChunkRequest(const Codec& c, int chunk, int level, const uint8_t* data, uint64_t size, std::string* why)
{
    if (chunk < 0 || chunk >= c.numChunks()) {
        *why = "chunk " + std::to_string(chunk) + " does not exist (the cache has " + std::to_string(c.numChunks()) + ")";
        return false;
    }
    if (level < 1 || level > c.levels) {
        *why = "level " + std::to_string(level) + " does not exist (the codec has " + std::to_string(c.levels) + ")";
        return false;
    }
    if (size >= (uint64_t(1) << 32)) {
        *why = "payload of " + std::to_string(size) + " bytes exceeds 4 GiB";
        return false;
    }
    if (size > 0 && !data) {
        *why = "payload pointer is null";
        return false;
    }
    return true;
}

// Checks the layout of a chunk payload (FORMAT.md "Chunk payloads") exactly as decodeChunk does
// and fills the plan. Returns false with "reason" in *why.
inline bool planChunk(const Codec& c, int chunk, int level, const uint8_t* data, uint64_t size, ChunkPlan* plan,
                      std::string* why)
{
    if (!checkChunkRequest(c, chunk, level, data, size, why)) return false;
    plan->geom = chunkGeom(c, chunk);
    const ChunkGeom& g = plan->geom;
    if (c.codec != 0) {
        plan->blocks.clear();
        plan->streams.clear();
        plan->storeElems = 0;
        const uint64_t want = uint64_t(2) * c.L * baselineBlockBytes(g);
        if (size != want) {
            *why = "payload holds " + std::to_string(size) + " bytes, the " + (c.codec == 1 ? "fp16" : "int8") +
                   " layout needs " + std::to_string(want);
            return false;
        }
        return true;
    }
    levelBlocks(c, level, &plan->blocks, &plan->storeElems);
    if (plan->storeElems >= (uint64_t(1) << 32)) {
        *why = "probability tables too large for the GPU decoder";
        return false;
    }
    const size_t units = size_t(2) * c.L;
    uint64_t pos = 0;
    auto take = [&](uint64_t n, const char* what, uint64_t* at) {
        if (size - pos < n) {
            *why = std::string("truncated ") + what + " (needs " + std::to_string(n) + " bytes, " + std::to_string(size - pos) +
                   " left)";
            return false;
        }
        *at = pos;
        pos += n;
        return true;
    };
    uint64_t at = 0;
    std::vector<uint32_t> tableSize(units, 0);
    if (c.tableMode == 0) {
        if (!take(4 * uint64_t(units), "table size list", &at)) return false;
        for (size_t u = 0; u < units; ++u) tableSize[u] = readU32(data + at + 4 * u);
    }
    if (!take(4 * uint64_t(units) * c.H, "stream size list", &at)) return false;
    const uint64_t streamList = at;
    for (size_t u = 0; u < units; ++u) {
        if (!take(tableSize[u], "probability tables", &at)) return false;
        plan->blocks[u].tableBegin = uint32_t(at);
        plan->blocks[u].tableEnd = uint32_t(at + tableSize[u]);
    }
    const int n = g.n;
    for (size_t u = 0; u < units; ++u) {
        const uint64_t scales = plan->blocks[u].perChannel ? uint64_t(c.roles()) * c.C() : uint64_t(n);
        if (!take(2 * scales, "scales", &at)) return false;
        plan->blocks[u].scaleOffset = uint32_t(at);
    }
    plan->streams.resize(units * c.H);
    for (size_t i = 0; i < units * c.H; ++i) {
        const uint32_t s = readU32(data + streamList + 4 * i);
        if (!take(s, "entropy-coded stream", &at)) return false;
        plan->streams[i] = StreamPlan{uint32_t(at), s};
    }
    if (pos != size) {
        *why = std::to_string(size - pos) + " unexpected bytes after the last stream";
        return false;
    }
    return true;
}

// "key layer 3: channel 17: <reason>" / "value layer 0: head 2: <reason>" (a stream, or a table
// with table_scope 1).
inline std::string errorMessage(const Codec& c, const ErrorInfo& e)
{
    static const char* const reasons[] = {"ok",
                                          "probability table truncated",
                                          "probability table names a symbol outside the alphabet",
                                          "probability table frequency too long",
                                          "probability table frequency out of range",
                                          "probability table does not sum to 4096",
                                          "unexpected bytes after the probability tables",
                                          "entropy-coded stream is corrupt",
                                          "probability table offset outside its block"};
    if (c.codec == 6)
        return (e.block >= 0 && e.block < 2 * c.L ? std::string(kindName(e.block / c.L)) + " layer " + std::to_string(e.block % c.L) + ": "
                                                  : std::string()) + tfReason(e.code);
    const char* reason = e.code >= 0 && e.code <= 8 ? reasons[e.code] : "unknown device error";
    std::string where;
    if (e.block >= 0 && e.block < 2 * c.L) where = std::string(kindName(e.block / c.L)) + " layer " + std::to_string(e.block % c.L) + ": ";
    if (e.code == kErrStream)
        where += "head " + std::to_string(e.index) + ": ";
    else if (e.code != kErrTableTrailing && c.tablesPerRole() > 0) {
        const int n = c.tablesPerRole();
        where += std::string(c.tableScope == 1 ? "head " : "channel ") + std::to_string(e.index % n) +
                 (e.index >= n ? " (anchor table)" : "") + ": ";
    }
    return where + reason;
}

// Builds the table store of a level from its shared blob (tables section, Table order), with the
// same per-thread functions the kernels use. Returns false with a reason.
inline bool buildSharedStore(const Codec& c, int level, const uint8_t* blob, uint64_t size, std::vector<uint16_t>* store,
                             std::string* why)
{
    std::vector<BlockPlan> blocks;
    uint64_t elems = 0;
    levelBlocks(c, level, &blocks, &elems);
    if (elems >= (uint64_t(1) << 32) || size >= (uint64_t(1) << 32)) {
        *why = "shared tables too large for the GPU decoder";
        return false;
    }
    store->assign(size_t(elems), 0);
    const int C = c.tablesPerRole(), roles = c.roles();
    std::vector<uint32_t> off(size_t(roles) * C);
    uint32_t pos = 0;
    for (size_t u = 0; u < blocks.size(); ++u) {
        const BlockPlan& b = blocks[u];
        uint32_t end = 0;
        int32_t bad = 0;
        ErrorInfo e{};
        int32_t code = scanBlockTables(blob, pos, uint32_t(size), C, roles, b.alphabet, off.data(), &end, &bad);
        for (int r = 0; code == kOk && r < roles; ++r)
            for (int ch = 0; code == kOk && ch < C; ++ch) {
                bad = r * C + ch;
                code = buildTable(blob, pos, off[size_t(bad)], uint32_t(size), b.alphabet[r],
                                  store->data() + b.tableStore[r] + size_t(ch) * (b.alphabet[r] + 1));
            }
        if (code != kOk) {
            setError(&e, code, int32_t(u), bad);
            *why = "shared tables of level " + std::to_string(level) + ": " + errorMessage(c, e);
            return false;
        }
        pos = end;
    }
    if (pos != size) {
        *why = "shared tables of level " + std::to_string(level) + ": " + std::to_string(size - pos) +
               " bytes after the last table";
        return false;
    }
    return true;
}

// planTransformChunk after the checks every codec shares (chunk, level, payload size).
inline bool planTransform(const Codec& c, int chunk, int level, const uint8_t* data, uint64_t size, TfChunkPlan* plan,
                          std::string* why)
{
    if (!checkChunkRequest(c, chunk, level, data, size, why)) return false;
    return planTransformChunk(c.tf, c.L, c.H, c.D, c.T, c.dtype, chunk * c.N, c.chunkLength(chunk), level, data, size, plan, why);
}

// Runs the kernels' per-thread code on the host, in the kernels' decomposition and order:
// the scan kernel (one thread per block), the build kernel (one per table), the decode kernel
// (one per (block, head), each with its own anchor scratch). `out` is the whole-cache output
// buffer (Codec::outputElems() elements of the dtype); `shared` holds the table store of every
// level in table_mode 1. Returns false with a reason for a corrupt payload.
inline bool emulateDecodeChunk(const Codec& c, int chunk, int level, const uint8_t* data, uint64_t size,
                               const std::vector<std::vector<uint16_t>>& shared, void* out, std::string* why)
{
    if (c.codec == 6) {
        TfChunkPlan tp;
        if (!planTransform(c, chunk, level, data, size, &tp, why)) return false;
        return emulateTransformChunk(c.tf, tp, level, data, c.rope, out, why);
    }
    ChunkPlan plan;
    if (!planChunk(c, chunk, level, data, size, &plan, why)) return false;
    const ChunkGeom& g = plan.geom;
    const int units = 2 * c.L;
    if (c.codec != 0) {
        for (int u = 0; u < units; ++u)
            for (int h = 0; h < c.H; ++h) decodeBaselineHead(data, g, u, h, out);
        return true;
    }
    const int C = c.tablesPerRole(), roles = c.roles();  // tables per role
    ErrorInfo err{};
    std::vector<uint16_t> scratch;
    const uint16_t* store = nullptr;
    if (c.tableMode == 1) {
        store = shared.at(size_t(level - 1)).data();
    } else {
        scratch.assign(size_t(plan.storeElems), 0);
        std::vector<uint32_t> off(size_t(units) * roles * C, 0);
        for (int u = 0; u < units; ++u) {  // scan kernel: thread u
            const BlockPlan& b = plan.blocks[size_t(u)];
            uint32_t end = 0;
            int32_t bad = 0;
            int32_t code = scanBlockTables(data, b.tableBegin, b.tableEnd, C, roles, b.alphabet,
                                           off.data() + size_t(u) * roles * C, &end, &bad);
            if (code == kOk && end != b.tableEnd) code = kErrTableTrailing;
            if (code != kOk) setError(&err, code, u, bad);
        }
        if (!err.code)
            for (int u = 0; u < units; ++u)  // build kernel: thread (u, role, table)
                for (int i = 0; i < roles * C; ++i) {
                    const BlockPlan& b = plan.blocks[size_t(u)];
                    const int r = i / C, ch = i % C;
                    const int32_t code = buildTable(data, b.tableBegin, off[size_t(u) * roles * C + i], b.tableEnd,
                                                    b.alphabet[r], scratch.data() + b.tableStore[r] + size_t(ch) * (b.alphabet[r] + 1));
                    if (code != kOk) setError(&err, code, u, i);
                }
        store = scratch.data();
    }
    if (!err.code) {
        std::vector<uint8_t> anchor(size_t(c.D) * size_t(std::max(1, w32AnchorRing(c.D, g.deltaGroup))));
        for (int u = 0; u < units; ++u)  // decode kernel: thread (v1) or warp (v2) per (u, head)
            for (int h = 0; h < c.H; ++h) {
                const BlockPlan& bp = plan.blocks[size_t(u)];
                const StreamPlan sp = plan.streams[size_t(u) * c.H + h];
                const int32_t code = g.layout == 1 ? decodeStream(data, g, bp, sp, u, h, store, anchor.data(), 1, out)
                                                   : w32DecodeStreamHost(data, g, bp, sp, u, h, store, anchor.data(), out);
                if (code != kOk) setError(&err, code, u, h);
            }
    }
    if (err.code) {
        *why = errorMessage(c, err);
        return false;
    }
    return true;
}

}  // namespace gpu
}  // namespace kvscope
