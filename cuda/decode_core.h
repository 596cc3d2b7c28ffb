// The per-thread work of the GPU decoder, written once for both compilers: nvcc builds it into the
// kernels (cuda/decode.cu) and the host C++ compiler builds the very same functions into the CPU
// emulation (cuda/decode_plan.h, tests/tst_cuda_core.cpp), which checks them bit for bit against
// kvscope::decodeChunk on machines without a GPU.
//
// READ ME FIRST
// - Decomposition of one CacheGen chunk (FORMAT.md "Chunk payloads"), in launch order:
//     scanBlockTables  one thread per block (kind, layer): where each in-band table starts
//     buildTable       one thread per (block, role, table): frequencies -> cumulative starts
//     decodeStream     one thread per (block, head): rANS + dequantization + delta, written
//                      straight into the output layout (format 1.x streams: 4 states x bytes)
//     w32Phase1/2      format 2.x streams (32 states x 16-bit words): one warp per (block, head),
//                      lane j owning state j, so step g decodes symbols 32 g .. 32 g + 31 together:
//                      phase 1 looks the symbols up and updates the states, the lanes that need
//                      a word take them in lane order (a ballot and a prefix count), phase 2
//                      refills and writes the values. w32DecodeStreamHost runs both phases lane
//                      by lane for the emulation; decode.cu's kernel runs them as a warp.
//   Shared (calibrated) tables are built once per level on the host with the same two functions.
// - Tables (FORMAT.md "Probability tables"): one per (role, channel), or with table_scope 1 one
//   per (role, KV head) for all head_dim channels of the head (ChunkGeom::perHead). Everything
//   that indexes tables goes through tablesPerRole / tableOf. A format 2.x stream with per-head
//   tables reads at most two small tables (<= 256 starts each), which the warp copies into shared
//   memory before it starts (w32CopyHeadTables).
// - Every byte read is bounded by a range the host checked against the payload before launch
//   (decode_plan.h); a thread that meets bad bytes records an error and stops, it never reads
//   outside its range. Corrupt tables cannot make decodeStream read out of bounds either (the
//   symbol search always lands in [0, alphabet)).
// - Bit-exactness: reconstruction is (q - M) * s + base in float32 with two separately rounded
//   operations (no FMA contraction: __fmul_rn/__fadd_rn on the device), base = 0.0f when there is
//   no anchor (so -0 becomes +0 exactly as on the CPU), and the output rounding is done by the
//   integer routines below on both sides. (The product is exact anyway: |q - M| <= 127 times an
//   fp16 scale fits float32's 24 bits, so only the add rounds; tst_cuda_core confirmed that an
//   FMA-contracted variant gives the same bytes, while dropping the "+ 0.0f" is caught.)
// - Output layout: out[(((kind * L + layer) * H + h) * T + t) * D + d], elements of the output
//   dtype (0 float16, 1 bfloat16, 2 float32); t counts from the start of the cache.
#pragma once

#include "common/half_rules.h"
#include "common/host_device.h"

#include <stddef.h>
#include <stdint.h>

namespace kvscope {
namespace gpu {

constexpr uint32_t kProbBits = 12;
constexpr uint32_t kProbScale = 1u << kProbBits;
constexpr uint32_t kRansL = 1u << 23;

// Codes a thread records (ErrorInfo::code); the host turns them into messages (decode_plan.h).
enum ErrorCode : int32_t {
    kOk = 0,
    kErrTableTruncated = 1,  // a table runs past the block's table bytes
    kErrTableSymbol = 2,     // hi >= alphabet
    kErrTableVarint = 3,     // a frequency varint longer than the reference accepts
    kErrTableFreq = 4,       // a frequency >= 4096
    kErrTableSum = 5,        // frequencies do not sum to 4096
    kErrTableTrailing = 6,   // bytes left after the block's last table
    kErrStream = 7,          // entropy-coded stream overrun, trailing bytes or bad final states
    kErrTableOffset = 8,     // a table offset outside its block (only after an earlier failure)
};

// First failure of a chunk: the code, the block (kind * L + layer) and a table or head index.
struct ErrorInfo {
    int32_t code;
    int32_t block;
    int32_t index;
    int32_t pad;
};

// What every thread of one chunk needs to know.
struct ChunkGeom {
    int32_t L, H, D;       // layers, KV heads, head_dim
    int32_t n;             // tokens in this chunk
    int32_t T;             // tokens in the whole cache (output rows)
    int32_t t0;            // first token of the chunk
    int32_t deltaGroup;    // 0: no delta coding
    int32_t roles;         // 2 with delta coding, else 1
    int32_t dtype;         // output: 0 float16, 1 bfloat16, 2 float32
    int32_t codec;         // 0 cachegen, 1 fp16, 2 int8
    int32_t layout;        // cachegen streams: 1 (4 states x bytes) or 2 (32 states x 16-bit words)
    int32_t perHead;       // cachegen tables: 0 one per channel (H * D per role), 1 one per KV head (H per role)
};

// One block (kind, layer) of a cachegen chunk.
struct BlockPlan {
    uint32_t tableBegin, tableEnd;  // payload offsets of the block's in-band tables (empty when shared)
    uint32_t scaleOffset;           // payload offset of the block's fp16 scales
    uint32_t tableStore[2];         // element offset of role r's tablesPerRole tables (alphabet[r] + 1 starts each)
    int32_t alphabet[2];            // per role
    int32_t maxL, maxA;             // MAX of the layer's bins and of the anchor bins
    int32_t perChannel;             // quantizer: 0 per token, 1 per channel
};

struct StreamPlan {
    uint32_t offset, size;  // payload bytes of one (block, head) rANS stream
};

// Tables per (block, role): one per channel, or one per KV head.
KVS_HD int tablesPerRole(const ChunkGeom& g) { return g.perHead ? g.H : g.H * g.D; }

// Index, within its role, of the table that codes channel d of head h.
KVS_HD size_t tableOf(const ChunkGeom& g, int h, int d)
{
    return g.perHead ? size_t(h) : size_t(h) * size_t(g.D) + size_t(d);
}

// The largest alphabet of a table: bins <= 256 give 2 * 127 + 1 symbols.
constexpr int kMaxAlphabet = 255;

// ---------------------------------------------------------------------------------------------
// Arithmetic that must round the same way on both sides (common/host_device.h)

using hd::bitsFloat;
using hd::faddRn;
using hd::floatBits;
using hd::fmulRn;
// Output rounding: the integer routines of common/half_rules.h, the same on both sides.
using hd::floatToBf16;
using hd::floatToHalf;
using hd::halfToFloat;

KVS_HD void storeOut(void* out, size_t i, int dtype, float v)
{
    if (dtype == 2)
        static_cast<float*>(out)[i] = v;
    else
        static_cast<uint16_t*>(out)[i] = dtype == 0 ? floatToHalf(v) : floatToBf16(v);
}

KVS_HD uint16_t loadU16(const uint8_t* p) { return uint16_t(p[0] | (uint32_t(p[1]) << 8)); }

// Records the chunk's first error (on the device: whichever thread gets there first).
KVS_HD void setError(ErrorInfo* e, int32_t code, int32_t block, int32_t index)
{
#if defined(__CUDA_ARCH__)
    if (atomicCAS(&e->code, 0, code) == 0) {
        e->block = block;
        e->index = index;
    }
#else
    if (e->code == 0) {
        e->code = code;
        e->block = block;
        e->index = index;
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// Probability tables (FORMAT.md "Probability tables"; the reference is prob_table.cpp parseFreq)

// Walks the roles * n serialised tables of one block (n = tablesPerRole: channels or KV heads)
// starting at payload offset `begin`, never past `limit`, and stores each table's offset in
// off[role * n + c]. Checks the structure only (lengths, symbol range, varint length); values and
// sums are buildTable's. Returns kOk and the offset after the last table in *endOut, or an error
// code and the failing table in *badIndex.
KVS_HD int32_t scanBlockTables(const uint8_t* base, uint32_t begin, uint32_t limit, int n, int roles,
                               const int32_t* alphabet, uint32_t* off, uint32_t* endOut, int32_t* badIndex)
{
    uint32_t p = begin;
    for (int role = 0; role < roles; ++role) {
        const int A = alphabet[role];
        for (int c = 0; c < n; ++c) {
            const int idx = role * n + c;
            *badIndex = idx;
            off[idx] = p;
            if (limit - p < 2) return kErrTableTruncated;
            const uint32_t lo = base[p], hi = base[p + 1];
            p += 2;
            if (lo > hi) continue;
            if (hi >= uint32_t(A)) return kErrTableSymbol;
            for (uint32_t s = lo; s <= hi; ++s) {
                for (int shift = 0;; shift += 7) {  // up to 3 bytes, as the reference parser allows
                    if (shift > 14) return kErrTableVarint;
                    if (p == limit) return kErrTableTruncated;
                    if (!(base[p++] & 0x80)) break;
                }
            }
        }
    }
    *endOut = p;
    return kOk;
}

// Parses the table at payload offset p (inside [begin, limit), as scanBlockTables found it) into
// start[0..A]: start[s] = f[0] + ... + f[s-1], start[A] = 4096. Returns kOk or an error code.
KVS_HD int32_t buildTable(const uint8_t* base, uint32_t begin, uint32_t p, uint32_t limit, int A, uint16_t* start)
{
    if (p < begin || p > limit) return kErrTableOffset;
    if (limit - p < 2) return kErrTableTruncated;
    const uint32_t lo = base[p], hi = base[p + 1];
    p += 2;
    for (int s = 0; s < A; ++s) start[s] = 1;
    uint32_t sum = uint32_t(A);
    if (lo <= hi) {
        if (hi >= uint32_t(A)) return kErrTableSymbol;
        for (uint32_t s = lo; s <= hi; ++s) {
            uint32_t v = 0;
            for (int shift = 0;; shift += 7) {
                if (shift > 14) return kErrTableVarint;
                if (p == limit) return kErrTableTruncated;
                const uint8_t b = base[p++];
                v |= uint32_t(b & 0x7f) << shift;
                if (!(b & 0x80)) break;
            }
            if (v >= kProbScale) return kErrTableFreq;
            start[s] = uint16_t(v + 1);
            sum += v;
        }
    }
    if (sum != kProbScale) return kErrTableSum;
    uint32_t acc = 0;
    for (int s = 0; s < A; ++s) {
        const uint32_t f = start[s];
        start[s] = uint16_t(acc);
        acc += f;
    }
    start[A] = uint16_t(acc);  // 4096
    return kOk;
}

// ---------------------------------------------------------------------------------------------
// rANS streams

// Forward reader over one stream: reads past the end give 0 and set overrun (rans.h RansReader).
struct StreamReader {
    const uint8_t* p;
    const uint8_t* end;
    bool overrun;

    KVS_HD uint32_t byte()
    {
        if (p < end) return *p++;
        overrun = true;
        return 0;
    }
    KVS_HD uint32_t u32()
    {
        uint32_t x = byte();
        x |= byte() << 8;
        x |= byte() << 16;
        x |= byte() << 24;
        return x;
    }
};

// The symbol s of a table with start[s] <= slot < start[s + 1]: the largest s in [0, A) whose start
// is <= slot. Always returns a value in [0, A), whatever the table holds.
KVS_HD int findSymbol(const uint16_t* start, int A, uint32_t slot)
{
    int lo = 0, hi = A - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (uint32_t(start[mid]) <= slot)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// The frequency of s (garbage, but harmless, for a table that failed to build).
KVS_HD uint32_t freqOf(const uint16_t* start, int s) { return uint32_t(start[s + 1]) - uint32_t(start[s]); }

// Decodes stream (block, h) of a cachegen chunk, dequantizes it and writes it into `out`.
// tables: the table store (role r of this block at bp.tableStore[r], tablesPerRole(g) tables of
// alphabet + 1 entries). anchorSym: D bytes of scratch for the current group's anchor symbols, element d at
// anchorSym[d * anchorStride]. Returns kOk or kErrStream.
KVS_HD int32_t decodeStream(const uint8_t* payload, const ChunkGeom& g, const BlockPlan& bp, StreamPlan sp, int block,
                            int h, const uint16_t* tables, uint8_t* anchorSym, int anchorStride, void* out)
{
    const int D = g.D, C = g.H * g.D, G = g.deltaGroup;
    const bool delta = G >= 2;
    StreamReader r{payload + sp.offset, payload + sp.offset + sp.size, false};
    uint32_t x0 = r.u32(), x1 = r.u32(), x2 = r.u32(), x3 = r.u32();
    const uint8_t* scales = payload + bp.scaleOffset;
    const size_t rowBase = (size_t(block) * g.H + size_t(h)) * size_t(g.T) + size_t(g.t0);
    for (int t = 0; t < g.n; ++t) {
        const bool anchor = delta && t % G == 0;
        const int role = anchor ? 1 : 0;
        const int A = bp.alphabet[role];
        const int m = anchor ? bp.maxA : bp.maxL;
        const uint16_t* tab = tables + bp.tableStore[role];
        // per token: this token's scale and (delta) its anchor's
        float tokenScale = 0.0f, anchorScale = 0.0f;
        if (!bp.perChannel) {
            tokenScale = halfToFloat(loadU16(scales + 2 * size_t(t)));
            if (delta && !anchor) anchorScale = halfToFloat(loadU16(scales + 2 * size_t(t - t % G)));
        }
        const size_t outRow = (rowBase + size_t(t)) * size_t(D);
        for (int d = 0; d < D; ++d) {
            const uint32_t slot = x0 & (kProbScale - 1);
            const uint16_t* st = tab + tableOf(g, h, d) * size_t(A + 1);
            const int s = findSymbol(st, A, slot);
            uint32_t x = freqOf(st, s) * (x0 >> kProbBits) + slot - uint32_t(st[s]);
            const int k = int(x < kRansL) + int(x < (kRansL >> 8));
            for (int i = 0; i < k; ++i) x = (x << 8) | r.byte();
            // symbol t * D + d used state (t * D + d) % 4: rotate so the next one is in x0
            x0 = x1;
            x1 = x2;
            x2 = x3;
            x3 = x;

            float sc = tokenScale, base = 0.0f;
            if (bp.perChannel) sc = halfToFloat(loadU16(scales + 2 * (size_t(anchor ? C : 0) + size_t(h) * D + d)));
            if (delta) {
                uint8_t& a = anchorSym[size_t(d) * anchorStride];
                if (anchor) {
                    a = uint8_t(s);
                } else {
                    const float as = bp.perChannel ? halfToFloat(loadU16(scales + 2 * (size_t(C) + size_t(h) * D + d)))
                                                   : anchorScale;
                    base = faddRn(fmulRn(float(int(a) - bp.maxA), as), 0.0f);  // the anchor as the CPU stored it
                }
            }
            storeOut(out, outRow + size_t(d), g.dtype, faddRn(fmulRn(float(s - m), sc), base));
        }
    }
    // After the last symbol every state is back at L and the stream is used up exactly.
    if (r.overrun || r.p != r.end || x0 != kRansL || x1 != kRansL || x2 != kRansL || x3 != kRansL) return kErrStream;
    return kOk;
}

// ---------------------------------------------------------------------------------------------
// Format 2.x streams: 32 states, 16-bit words, one warp per stream

constexpr uint32_t kW32L = 1u << 16;

// Anchor symbols of the groups a warp step can touch live in a ring of w32AnchorRing(D, G) rows
// of D bytes, slot (t / G) % ring: one step spans at most 32 / D + 2 rows, so a slot is never
// rewritten while a lane still needs it.
KVS_HD int w32AnchorRing(int D, int G) { return G >= 2 ? 32 / (D * G) + 3 : 0; }

// What one lane keeps between the phases of a step.
struct W32Lane {
    uint32_t x;      // state after the update, before renormalisation
    int32_t t, d;    // the symbol's token (in the chunk) and channel
    int32_t sym;
    int32_t active;  // symbol index < n * D
    int32_t need;    // takes a word
};

// The tables one stream reads: role r's table of channel d starts at role[r] + d * step[r], with
// step alphabet + 1 (a table per channel) or 0 (one table per KV head).
struct W32Tables {
    const uint16_t* role[2];
    uint32_t step[2];
};

// Stream (block, h)'s tables in the table store.
KVS_HD W32Tables w32StreamTables(const ChunkGeom& g, const BlockPlan& bp, int h, const uint16_t* tables)
{
    W32Tables t{};
    for (int r = 0; r < g.roles && r < 2; ++r) {
        const size_t entries = size_t(bp.alphabet[r]) + 1;
        t.role[r] = tables + bp.tableStore[r] + tableOf(g, h, 0) * entries;
        t.step[r] = g.perHead ? 0u : uint32_t(entries);
    }
    return t;
}

// Entries of a per-head stream's local table copy: both roles, kMaxAlphabet + 1 starts each.
constexpr int kW32HeadTableElems = 2 * (kMaxAlphabet + 1);

// Per-head tables (g.perHead): lane `lane` of `lanes` copies its share of the stream's one or two
// tables from src into dst (kW32HeadTableElems entries, role r at r * (kMaxAlphabet + 1)). Returns
// the tables as read from dst; the lanes must synchronise before the first lookup.
KVS_HD W32Tables w32CopyHeadTables(const ChunkGeom& g, const BlockPlan& bp, const W32Tables& src, int lane, int lanes,
                                   uint16_t* dst)
{
    W32Tables t{};
    for (int r = 0; r < g.roles && r < 2; ++r) {
        uint16_t* d = dst + r * (kMaxAlphabet + 1);
        for (int i = lane; i <= bp.alphabet[r]; i += lanes) d[i] = src.role[r][i];
        t.role[r] = d;
        t.step[r] = 0;
    }
    return t;
}

// Phase 1 of step g for `lane`: slot lookup and state update of symbol 32 g + lane.
KVS_HD void w32Phase1(const ChunkGeom& g, const BlockPlan& bp, int step, int lane, uint32_t x, const W32Tables& tab,
                      uint8_t* ring, W32Lane* w)
{
    const int D = g.D, G = g.deltaGroup;
    const uint64_t i = uint64_t(step) * 32u + uint64_t(lane);
    w->active = i < uint64_t(g.n) * uint64_t(D);
    w->x = x;
    w->need = 0;
    if (!w->active) return;
    w->t = int32_t(i / uint64_t(D));
    w->d = int32_t(i % uint64_t(D));
    const bool anchor = G >= 2 && w->t % G == 0;  // role 1
    // selects, not indexing: a runtime index into these small arrays would put them in local memory
    const int A = anchor ? bp.alphabet[1] : bp.alphabet[0];
    const uint16_t* st = (anchor ? tab.role[1] : tab.role[0]) + size_t(w->d) * (anchor ? tab.step[1] : tab.step[0]);
    const uint32_t slot = x & (kProbScale - 1);
    const int s = findSymbol(st, A, slot);
    w->x = freqOf(st, s) * (x >> kProbBits) + slot - uint32_t(st[s]);
    w->need = w->x < kW32L;
    w->sym = s;
    if (anchor) ring[size_t((w->t / G) % w32AnchorRing(D, G)) * D + size_t(w->d)] = uint8_t(s);
}

// Phase 2: refill with word `word` (when needed; `overrun` when there was none) and write the
// value. Returns the lane's new state.
KVS_HD uint32_t w32Phase2(const uint8_t* payload, const ChunkGeom& g, const BlockPlan& bp, int block, int h,
                          const W32Lane& w, uint32_t word, const uint8_t* ring, void* out)
{
    if (!w.active) return w.x;
    const int D = g.D, C = g.H * g.D, G = g.deltaGroup;
    const bool delta = G >= 2, anchor = delta && w.t % G == 0;
    const uint32_t x = w.need ? (w.x << 16) | word : w.x;
    const uint8_t* scales = payload + bp.scaleOffset;
    const int m = anchor ? bp.maxA : bp.maxL;
    float sc, base = 0.0f;
    if (bp.perChannel) sc = halfToFloat(loadU16(scales + 2 * (size_t(anchor ? C : 0) + size_t(h) * D + size_t(w.d))));
    else sc = halfToFloat(loadU16(scales + 2 * size_t(w.t)));
    if (delta && !anchor) {
        const int a = ring[size_t((w.t / G) % w32AnchorRing(D, G)) * D + size_t(w.d)];
        const float as = bp.perChannel ? halfToFloat(loadU16(scales + 2 * (size_t(C) + size_t(h) * D + size_t(w.d))))
                                       : halfToFloat(loadU16(scales + 2 * size_t(w.t - w.t % G)));
        base = faddRn(fmulRn(float(a - bp.maxA), as), 0.0f);  // the anchor as the CPU keeps it
    }
    const size_t row = (size_t(block) * g.H + size_t(h)) * size_t(g.T) + size_t(g.t0) + size_t(w.t);
    storeOut(out, row * size_t(D) + size_t(w.d), g.dtype, faddRn(fmulRn(float(w.sym - m), sc), base));
    return x;
}

KVS_HD int w32Steps(const ChunkGeom& g) { return int((uint64_t(g.n) * uint64_t(g.D) + 31) / 32); }

// The host's warp: both phases lane by lane, words handed out in lane order; per-head tables are
// read from a local copy as the kernel reads them from shared memory. ring: w32AnchorRing rows of
// D bytes. Returns kOk or kErrStream, exactly when kvscope::decodeChunk refuses the stream.
inline int32_t w32DecodeStreamHost(const uint8_t* payload, const ChunkGeom& g, const BlockPlan& bp, StreamPlan sp,
                                   int block, int h, const uint16_t* tables, uint8_t* ring, void* out)
{
    if (sp.size < 128) return kErrStream;
    const uint8_t* s = payload + sp.offset;
    uint32_t x[32];
    for (int j = 0; j < 32; ++j)
        x[j] = uint32_t(s[4 * j]) | uint32_t(s[4 * j + 1]) << 8 | uint32_t(s[4 * j + 2]) << 16 | uint32_t(s[4 * j + 3]) << 24;
    const uint8_t* words = s + 128;
    const uint32_t nwords = (sp.size - 128) / 2;
    uint32_t pos = 0;
    bool overrun = false;
    W32Lane w[32];
    W32Tables tab = w32StreamTables(g, bp, h, tables);
    uint16_t local[kW32HeadTableElems];
    if (g.perHead) {
        const W32Tables src = tab;
        for (int j = 0; j < 32; ++j) tab = w32CopyHeadTables(g, bp, src, j, 32, local);
    }
    for (int step = 0, steps = w32Steps(g); step < steps; ++step) {
        for (int j = 0; j < 32; ++j) w32Phase1(g, bp, step, j, x[j], tab, ring, &w[j]);
        for (int j = 0; j < 32; ++j) {
            uint32_t word = 0;
            if (w[j].active && w[j].need) {
                if (pos < nwords) word = loadU16(words + 2 * size_t(pos));
                else overrun = true;
                ++pos;
            }
            x[j] = w32Phase2(payload, g, bp, block, h, w[j], word, ring, out);
        }
    }
    bool ok = !overrun && pos == nwords && sp.size % 2 == 0;
    for (int j = 0; j < 32; ++j) ok = ok && x[j] == kW32L;
    return ok ? kOk : kErrStream;
}

// ---------------------------------------------------------------------------------------------
// Baselines: fp16 and int8 (blocks at fixed offsets, one thread per (block, head))

KVS_HD size_t baselineBlockBytes(const ChunkGeom& g)
{
    const size_t values = size_t(g.H) * size_t(g.n) * size_t(g.D);
    return g.codec == 1 ? 2 * values : 2 * size_t(g.n) + values;
}

KVS_HD void decodeBaselineHead(const uint8_t* payload, const ChunkGeom& g, int block, int h, void* out)
{
    const int D = g.D, n = g.n;
    const uint8_t* b = payload + size_t(block) * baselineBlockBytes(g);
    const size_t rowBase = (size_t(block) * g.H + size_t(h)) * size_t(g.T) + size_t(g.t0);
    for (int t = 0; t < n; ++t) {
        const size_t in = (size_t(h) * n + size_t(t)) * D, outRow = (rowBase + size_t(t)) * size_t(D);
        if (g.codec == 1) {
            for (int d = 0; d < D; ++d) storeOut(out, outRow + d, g.dtype, halfToFloat(loadU16(b + 2 * (in + d))));
        } else {
            const float s = halfToFloat(loadU16(b + 2 * size_t(t)));
            const uint8_t* q = b + 2 * size_t(n) + in;
            for (int d = 0; d < D; ++d)
                storeOut(out, outRow + d, g.dtype, faddRn(fmulRn(float(int(q[d]) - 127), s), 0.0f));
        }
    }
}

}  // namespace gpu
}  // namespace kvscope
