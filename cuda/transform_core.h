// The per-thread work of the GPU decoder for transform-coded chunks (codec 6, core/codec/transform.h
// has the math), written once for both compilers like decode_core.h: nvcc builds it into the
// kernels of cuda/decode.cu, the host compiler into the emulation (cuda/transform_plan.h
// emulateTransformChunk) that tests/tst_cuda_core.cpp checks bit for bit against the CPU decoder.
//
// READ ME FIRST
// - One chunk, one block (kind, layer) of n tokens. The coded tokens of a block are one contiguous
//   run [a, b) of the chunk (the raw fp16 tokens are the cache's first sink_tokens and last
//   recent_tokens, so inside a chunk they form a prefix and a suffix); row r of the coded matrix
//   is token a + r, and R = b - a.
// - Kernels, in launch order:
//     tfDecodeBlockSymbols  one thread per (chunk, block): the token classes, the entropy-coded
//                           symbols of every class stream (entropy rans: 4 interleaved rANS states,
//                           byte renormalisation; rans32: 32 states, 16-bit words; symbol_stream.h)
//                           or the fixed-width symbols, then the escape list, into
//                           zq[r * K + k] = q * step_k * 2^class_r (float32). A 4-state stream is
//                           sequential per block: this stage has 2L threads per chunk and is the
//                           slow one on a GPU (see gpu_check.sh). A rans32 stream is decoded by a
//                           warp per block instead (tfSymbolsWarpKernel in decode.cu): lane j owns
//                           state j and the 32 lanes step 32 consecutive symbols in lock step
//                           (tfDecodeMatrixW32 is the same decomposition lane by lane).
//     tfGemm*               a tiled GEMM per block: y[r][c] = mean[c] + sum_k At[j_k][c] zq[r][k]
//                           (tokens x components times components x channels), a 32 x 64 output
//                           tile per 256 threads, each thread owning 4 rows x one column pair
//                           (c, c + ceil(D/2)) of one head so that the epilogue re-applies RoPE
//                           to keys in registers and writes the output dtype straight into the
//                           whole-cache layout of decode_core.h.
//                           A unit tile only visits the components [k_begin, k_end) whose decode
//                           columns are not all zero there (per-head bases: its own head's), see
//                           transform_plan.h tileRanges for why skipping the rest stays exact.
//     tfRawTokens           one thread per raw value: fp16 bits copied through storeOut.
// - Bit-exactness with the CPU decoder (transform_chunk.cpp decodeBlock):
//   * zq is (float(q) * step) * 2^class, two float32 products rounded separately, and components
//     with q = 0 are skipped: z == 0 exactly when q == 0 (step > 0, |q| >= 1, so the rounded
//     product is at least step), and tfAccum skips them the same way.
//   * every output accumulates in the CPU's order: acc = mean[c], then acc + A[c][j_k] zq_k for
//     k = 0, 1, ... (ascending component), each product and each sum rounded (no FMA contraction:
//     __fmul_rn/__fadd_rn on the device). The tiling changes which thread computes an output,
//     never the order of its sum, so the GEMM is exact, not just close.
//   * RoPE in double as applyRope does: cos and sin of (position0 + t) * inv_freq[i] come from a
//     table the host computes with the C library (transform_plan.h ropeTable), so the device's
//     own cos/sin (2 ulp) never enters; the rotation is x1 c - x2 s and x2 c + x1 s in double,
//     rounded once to float.
//   * the output rounding is decode_core.h's storeOut (the same integer routines as common/half.h).
// - Every read is bounded: payload ranges were checked on the host (transform_plan.h
//   planTransformChunk); inside them a thread that meets bad bytes records an error and stops.
#pragma once

#include "codec/escape_rules.h"
#include "codec/fold_rules.h"
#include "decode_core.h"

namespace kvscope {
namespace gpu {

// Codes a transform thread records (ErrorInfo::code), after decode_core.h's.
enum TfErrorCode : int32_t {
    kErrTfClasses = 20,      // token classes are truncated
    kErrTfClassSize = 21,    // a class stream size is truncated or past the block
    kErrTfClassUnused = 22,  // bytes after the last class stream
    kErrTfFixed = 23,        // fixed-width symbols: wrong byte count or a symbol outside its alphabet
    kErrTfEscape = 24,       // escape list truncated, malformed, unused bytes or not matching its symbol
};

constexpr int kTfClasses = 4;  // step multipliers 1, 2, 4, 8

// One coded component of a (level, block): its index, alphabet, step and the start tables of
// the four class foldings (element offsets into the table store; class 0 is the level's table).
struct TfComp {
    int32_t j;        // component index in [0, C)
    int32_t M;        // M_j (class 0)
    float step;       // Delta_j
    uint32_t tab[kTfClasses];  // start table (2 M_c + 2 entries) of class c; rANS only
};

// What every thread of one transform chunk needs to know.
struct TfGeom {
    int32_t L, H, D, T;  // layers, KV heads, head_dim, tokens of the cache
    int32_t n, t0;       // tokens of the chunk, its first token
    int32_t a, R;        // coded tokens: chunk rows [a, a + R)
    int32_t dtype;       // output: 0 float16, 1 bfloat16, 2 float32
    int32_t entropy;     // 0 fixed-width, 1 rANS (4 states), 2 rans32 (32 states)
    int32_t importance;  // token classes present
    int32_t ropeUndo;    // keys: re-apply RoPE
};

// One block (kind, layer) of one chunk: payload ranges and where its components and scratch live.
struct TfBlockPlan {
    uint32_t rawOffset;            // payload offset of the raw tokens (H, raw rows, D) as fp16
    uint32_t escOffset, escSize;   // escape list
    uint32_t strOffset, strSize;   // classes + streams (rANS) or packed symbols (fixed)
    uint32_t comps;                // element offset of the level block's K TfComp entries
    int32_t K;                     // coded components
    uint32_t tileK;                // element offset of the level block's k range per unit tile (2 each)
    uint64_t zq;                   // element offset of this block's R x K scratch (chunk-relative)
};

// Folded alphabets and fixed-width symbols: the CPU decoder's rules (codec/fold_rules.h,
// codec/escape_rules.h).
using hd::bitsFor;
using hd::foldedMax;

KVS_HD int tfClassOf(const uint8_t* classes, int r) { return (classes[r >> 2] >> (2 * (r & 3))) & 3; }

KVS_HD uint32_t tfU32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

// Decodes `rows` x K symbols of one symbol_stream.h stream (4 states, symbol i by state i % 4,
// column k with the class-c table of component k) from [p, p + size). Row i goes to scratch row
// rowOf(i): the i-th row of class `cls` when `classes` is set, else row i. Symbols are stored as
// float(s) (exact) for tfResolve. Returns kOk or kErrStream, exactly when decodeSymbolMatrix throws.
KVS_HD int32_t tfDecodeMatrix(const uint8_t* p, uint32_t size, int rows, int K, const TfComp* comps, const uint16_t* tables,
                              int cls, const uint8_t* classes, int R, float* zq)
{
    const uint64_t n = uint64_t(rows) * uint64_t(K);
    if (n == 0) return size == 0 ? kOk : kErrStream;
    StreamReader rd{p, p + size, false};
    uint32_t x[4];
    for (int w = 0; w < 4; ++w) x[w] = rd.u32();
    int r = -1;  // scratch row of the current matrix row
    uint64_t i = 0;
    for (int row = 0; row < rows; ++row) {
        ++r;
        if (classes)
            while (r < R && tfClassOf(classes, r) != cls) ++r;
        for (int k = 0; k < K; ++k, ++i) {
            const TfComp& cp = comps[k];
            const int A = 2 * foldedMax(cp.M, cls) + 1;
            const uint16_t* st = tables + cp.tab[cls];
            uint32_t& xs = x[i & 3];
            const uint32_t slot = xs & (kProbScale - 1);
            const int s = findSymbol(st, A, slot);
            uint32_t v = freqOf(st, s) * (xs >> kProbBits) + slot - uint32_t(st[s]);
            const int nb = int(v < kRansL) + int(v < (kRansL >> 8));
            for (int b = 0; b < nb; ++b) v = (v << 8) | rd.byte();
            xs = v;
            zq[size_t(r) * K + k] = float(s);
            if (rd.overrun) return kErrStream;
        }
    }
    if (rd.overrun || rd.p != rd.end) return kErrStream;
    for (int w = 0; w < 4; ++w)
        if (x[w] != kRansL) return kErrStream;
    return kOk;
}

// ---- rans32 matrices (entropy 2) ---------------------------------------------------------------
// One stream per matrix in the layout of symbol_stream.h encodeSymbolMatrixW32: u32 state[32],
// then u16 words; symbol i = row * K + k by state i % 32 with the class-c table of component k.
// Decoded 32 symbols at a time, lane j of a group holding state j: every lane steps its state,
// then the lanes whose state fell below 2^16 take the next words in lane order (lane order is
// symbol order within a group, and groups come in symbol order: the stream's word order).

constexpr uint32_t kTfW32L = 1u << 16;

// The scratch row of matrix row `row` of class `cls`, scanning on from matrix row fromRow (at
// scratch row fromScratch, fromRow <= row); without classes, row itself. Every lane computes it
// the same way from the group's cursor.
KVS_HD int tfScratchRow(const uint8_t* classes, int cls, int R, int fromRow, int fromScratch, int row)
{
    if (!classes) return row;
    int r = fromScratch;
    for (int m = fromRow; m < row; ++m) {
        ++r;
        while (r < R && tfClassOf(classes, r) != cls) ++r;
    }
    return r;
}

// The scratch row of matrix row 0: the first row of class cls.
KVS_HD int tfFirstScratchRow(const uint8_t* classes, int cls, int R)
{
    int r = 0;
    if (classes)
        while (r < R && tfClassOf(classes, r) != cls) ++r;
    return r;
}

// A lane's state update for symbol i of the matrix (before renormalisation): the decoded symbol
// and its zq element.
struct TfW32Lane {
    uint32_t x;
    int32_t sym;
    uint64_t at;  // zq element
    bool active, need;
};

KVS_HD void tfW32Phase1(uint64_t i, uint64_t n, int K, const TfComp* comps, const uint16_t* tables, int cls,
                        const uint8_t* classes, int R, int curRow, int curScratch, uint32_t x, TfW32Lane* w)
{
    w->active = i < n;
    w->x = x;
    w->need = false;
    w->sym = 0;
    w->at = 0;
    if (!w->active) return;
    const int row = int(i / uint64_t(K)), k = int(i % uint64_t(K));
    const TfComp& cp = comps[k];
    const int A = 2 * foldedMax(cp.M, cls) + 1;
    const uint16_t* st = tables + cp.tab[cls];
    const uint32_t slot = x & (kProbScale - 1);
    const int s = findSymbol(st, A, slot);
    w->x = freqOf(st, s) * (x >> kProbBits) + slot - uint32_t(st[s]);
    w->need = w->x < kTfW32L;
    w->sym = s;
    w->at = uint64_t(tfScratchRow(classes, cls, R, curRow, curScratch, row)) * uint64_t(K) + uint64_t(k);
}

// After a group that started at symbol `base`: the cursor moves to the row of its last symbol.
KVS_HD void tfW32Advance(uint64_t base, uint64_t n, int K, const uint8_t* classes, int cls, int R, int* curRow,
                         int* curScratch)
{
    const uint64_t last = base + 32 <= n ? base + 31 : n - 1;
    const int row = int(last / uint64_t(K));
    *curScratch = tfScratchRow(classes, cls, R, *curRow, *curScratch, row);
    *curRow = row;
}

// The host's warp over one rans32 matrix: both phases lane by lane, words handed out in lane
// order. Same arguments and results as tfDecodeMatrix: kOk or kErrStream, exactly when
// decodeSymbolMatrixW32 throws.
KVS_HD int32_t tfDecodeMatrixW32(const uint8_t* p, uint32_t size, int rows, int K, const TfComp* comps,
                                 const uint16_t* tables, int cls, const uint8_t* classes, int R, float* zq)
{
    const uint64_t n = uint64_t(rows) * uint64_t(K);
    if (n == 0) return size == 0 ? kOk : kErrStream;
    if (size < 128) return kErrStream;
    uint32_t x[32];
    for (int j = 0; j < 32; ++j) x[j] = tfU32(p + 4 * j);
    uint32_t pos = 128;
    int curRow = 0, curScratch = tfFirstScratchRow(classes, cls, R);
    TfW32Lane w[32];
    for (uint64_t base = 0; base < n; base += 32) {
        uint32_t words = 0;
        for (int j = 0; j < 32; ++j) {
            tfW32Phase1(base + uint64_t(j), n, K, comps, tables, cls, classes, R, curRow, curScratch, x[j], &w[j]);
            words += w[j].need ? 1u : 0u;
        }
        if (size - pos < 2 * words) return kErrStream;
        for (int j = 0; j < 32; ++j) {
            if (!w[j].active) continue;
            uint32_t v = w[j].x;
            if (w[j].need) {
                v = (v << 16) | uint32_t(p[pos]) | uint32_t(p[pos + 1]) << 8;
                pos += 2;
            }
            x[j] = v;
            zq[w[j].at] = float(w[j].sym);
        }
        tfW32Advance(base, n, K, classes, cls, R, &curRow, &curScratch);
    }
    if (pos != size) return kErrStream;
    for (int j = 0; j < 32; ++j)
        if (x[j] != kTfW32L) return kErrStream;
    return kOk;
}

// The one-thread rans32 matrix decoder for tfBlockMatrices.
struct TfW32Host {
    KVS_HD int32_t operator()(const uint8_t* p, uint32_t size, int rows, int K, const TfComp* comps, const uint16_t* tables,
                              int cls, const uint8_t* classes, int R, float* zq) const
    {
        return tfDecodeMatrixW32(p, size, rows, K, comps, tables, cls, classes, R, zq);
    }
};

// Stage 1a of a block: classes and symbols -> zq holds float(symbol) (R x K). *classesOut: the
// token classes (null without token importance). W32 decodes one rans32 matrix (the host's
// lanes, or a warp's).
template <typename W32>
KVS_HD int32_t tfBlockMatrices(const uint8_t* payload, const TfGeom& g, const TfBlockPlan& bp, const TfComp* comps,
                               const uint16_t* tables, float* zq, const uint8_t** classesOut, const W32& w32)
{
    const int R = g.R, K = bp.K;
    const uint8_t* stream = payload + bp.strOffset;
    uint32_t streamBytes = bp.strSize;
    const uint8_t* classes = nullptr;
    if (g.importance) {
        const uint32_t nb = uint32_t(R + 3) / 4;
        if (streamBytes < nb) return kErrTfClasses;
        classes = stream;
        stream += nb;
        streamBytes -= nb;
    }
    *classesOut = classes;
    if (g.entropy != 0 && classes) {
        uint32_t pos = 0;
        for (int c = 0; c < kTfClasses; ++c) {
            int nr = 0;
            for (int r = 0; r < R; ++r) nr += tfClassOf(classes, r) == c;
            if (nr == 0) continue;
            if (streamBytes - pos < 4) return kErrTfClassSize;
            const uint32_t len = tfU32(stream + pos);
            pos += 4;
            if (len > streamBytes - pos) return kErrTfClassSize;
            const int32_t code = g.entropy == 2 ? w32(stream + pos, len, nr, K, comps, tables, c, classes, R, zq)
                                                : tfDecodeMatrix(stream + pos, len, nr, K, comps, tables, c, classes, R, zq);
            if (code != kOk) return code;
            pos += len;
        }
        if (pos != streamBytes) return kErrTfClassUnused;
    } else if (g.entropy != 0) {
        const int32_t code = g.entropy == 2 ? w32(stream, streamBytes, R, K, comps, tables, 0, nullptr, R, zq)
                                            : tfDecodeMatrix(stream, streamBytes, R, K, comps, tables, 0, nullptr, R, zq);
        if (code != kOk) return code;
    } else {
        uint64_t totalBits = 0;
        for (int r = 0; r < R; ++r) {
            const int c = classes ? tfClassOf(classes, r) : 0;
            for (int k = 0; k < K; ++k) totalBits += uint64_t(bitsFor(2 * foldedMax(comps[k].M, c) + 1));
        }
        if (uint64_t(streamBytes) != (totalBits + 7) / 8) return kErrTfFixed;
        hd::FixedWidthReader in{stream, 0, 0};
        for (int r = 0; r < R; ++r) {
            const int c = classes ? tfClassOf(classes, r) : 0;
            for (int k = 0; k < K; ++k) {
                const int Mf = foldedMax(comps[k].M, c);
                const int s = in.take(bitsFor(2 * Mf + 1));
                if (s > 2 * Mf) return kErrTfFixed;
                zq[size_t(r) * K + k] = float(s);
            }
        }
    }
    return kOk;
}

// Stage 1b of a block (one thread): the escapes, in row order over every class, then
// dequantization of zq in place.
KVS_HD int32_t tfResolveSymbols(const uint8_t* payload, const TfGeom& g, const TfBlockPlan& bp, const TfComp* comps,
                                const uint8_t* classes, float* zq)
{
    const int R = g.R, K = bp.K;
    const uint8_t* ep = payload + bp.escOffset;
    const uint8_t* const eend = ep + bp.escSize;
    for (int r = 0; r < R; ++r) {
        const int c = classes ? tfClassOf(classes, r) : 0;
        const float mult = float(1 << c);
        for (int k = 0; k < K; ++k) {
            const int M = foldedMax(comps[k].M, c);
            float& z = zq[size_t(r) * K + k];
            const int s = int(z);
            int64_t q = s - M;
            if ((s == 0 || s == 2 * M) && hd::readEscape(ep, eend, s, M, &q) != hd::kEscapeOk) return kErrTfEscape;
            z = q == 0 ? 0.0f : fmulRn(fmulRn(float(q), comps[k].step), mult);
        }
    }
    if (ep != eend) return kErrTfEscape;
    return kOk;
}

// Stage 1 of a block (one thread): classes, symbols, escapes -> zq (R x K floats).
KVS_HD int32_t tfDecodeBlockSymbols(const uint8_t* payload, const TfGeom& g, const TfBlockPlan& bp, const TfComp* comps,
                                    const uint16_t* tables, float* zq)
{
    const uint8_t* classes = nullptr;
    const int32_t code = tfBlockMatrices(payload, g, bp, comps, tables, zq, &classes, TfW32Host{});
    if (code != kOk) return code;
    return tfResolveSymbols(payload, g, bp, comps, classes, zq);
}

// One term of the reconstruction sum, skipped for q = 0 as the CPU does (see READ ME FIRST).
KVS_HD float tfAccum(float acc, float a, float z) { return z == 0.0f ? acc : faddRn(acc, fmulRn(a, z)); }

using hd::d2fRn;
using hd::daddRn;
using hd::dmulRn;

// RoPE of one pair (applyRope, inverse = false): cs = {cos a, sin a}.
KVS_HD void tfRope(float* lo, float* hi, double c, double s)
{
    const double x1 = *lo, x2 = *hi;
    *lo = d2fRn(daddRn(dmulRn(x1, c), -dmulRn(x2, s)));
    *hi = d2fRn(daddRn(dmulRn(x2, c), dmulRn(x1, s)));
}

// ---------------------------------------------------------------------------------------------
// The GEMM tile: 256 threads, 32 rows x 32 column units (a unit is the column pair (c, c + Dh) of
// head h, Dh = ceil(D / 2); the second column is absent when D is odd and i + Dh >= D), k in
// tiles of 32. Thread tid: unit tx = tid % 32, rows ty + 8 m for m < 4, ty = tid / 32.

constexpr int kTfTileRows = 32, kTfTileUnits = 32, kTfTileK = 32, kTfThreads = 256;

// Shared memory of one tile.
struct TfTileShm {
    float z[kTfTileRows][kTfTileK + 1];     // zq rows of the tile (+1: no bank conflicts)
    float a[kTfTileK][kTfTileUnits][2];     // At[j_k][c] for the unit's two columns
};

// Columns of unit u (in [0, H * Dh)); c2 < 0 when absent.
KVS_HD void tfUnitColumns(int D, int u, int* c1, int* c2, int* i)
{
    const int Dh = (D + 1) / 2;
    const int h = u / Dh;
    *i = u % Dh;
    *c1 = h * D + *i;
    *c2 = *i + Dh < D ? h * D + *i + Dh : -1;
}

// Loads k tile [k0, k0 + 32) for the tile at (row0, unit0): zq rows and decode-matrix columns
// (At: C x C fp16 bits, row j = column j of A, i.e. At[j * C + c] = A[c][j]).
KVS_HD void tfLoadTile(int tid, const TfGeom& g, const TfBlockPlan& bp, const TfComp* comps, const float* zq,
                       const uint16_t* At, int row0, int unit0, int k0, int kEnd, TfTileShm* shm)
{
    const int C = g.H * g.D, units = g.H * ((g.D + 1) / 2);
    for (int e = tid; e < kTfTileRows * kTfTileK; e += kTfThreads) {
        const int rr = e / kTfTileK, kk = e % kTfTileK;
        const int r = row0 + rr, k = k0 + kk;
        shm->z[rr][kk] = r < g.R && k < kEnd ? zq[size_t(r) * bp.K + k] : 0.0f;
    }
    for (int e = tid; e < kTfTileK * kTfTileUnits; e += kTfThreads) {
        const int kk = e / kTfTileUnits, uu = e % kTfTileUnits;
        const int k = k0 + kk, u = unit0 + uu;
        float v1 = 0.0f, v2 = 0.0f;
        if (k < kEnd && u < units) {
            int c1, c2, i;
            tfUnitColumns(g.D, u, &c1, &c2, &i);
            const uint16_t* row = At + size_t(comps[k].j) * C;
            v1 = halfToFloat(row[c1]);
            if (c2 >= 0) v2 = halfToFloat(row[c2]);
        }
        shm->a[kk][uu][0] = v1;
        shm->a[kk][uu][1] = v2;
    }
}

// The thread's 4 x 2 accumulators.
struct TfAcc {
    float v[4][2];
};

KVS_HD void tfInitAcc(int tid, const TfGeom& g, const float* mean, int unit0, TfAcc* acc)
{
    const int units = g.H * ((g.D + 1) / 2), u = unit0 + tid % kTfTileUnits;
    float m1 = 0.0f, m2 = 0.0f;
    if (u < units) {
        int c1, c2, i;
        tfUnitColumns(g.D, u, &c1, &c2, &i);
        m1 = mean[c1];
        if (c2 >= 0) m2 = mean[c2];
    }
    for (int m = 0; m < 4; ++m) acc->v[m][0] = m1, acc->v[m][1] = m2;
}

// Accumulates the loaded k tile, components in ascending order.
KVS_HD void tfComputeTile(int tid, int kCount, const TfTileShm* shm, TfAcc* acc)
{
    const int tx = tid % kTfTileUnits, ty = tid / kTfTileUnits;
    for (int kk = 0; kk < kCount; ++kk) {
        const float a1 = shm->a[kk][tx][0], a2 = shm->a[kk][tx][1];
        for (int m = 0; m < 4; ++m) {
            const float z = shm->z[ty + 8 * m][kk];
            acc->v[m][0] = tfAccum(acc->v[m][0], a1, z);
            acc->v[m][1] = tfAccum(acc->v[m][1], a2, z);
        }
    }
}

// Epilogue: RoPE (keys with rope_undo; rope: T x (D/2) pairs {cos, sin} by absolute token) and
// the output store. block = kind * L + layer.
KVS_HD void tfStoreTile(int tid, const TfGeom& g, int block, const double* rope, int row0, int unit0, TfAcc* acc, void* out)
{
    const int units = g.H * ((g.D + 1) / 2), u = unit0 + tid % kTfTileUnits, ty = tid / kTfTileUnits;
    if (u >= units) return;
    int c1, c2, i;
    tfUnitColumns(g.D, u, &c1, &c2, &i);
    const int h = c1 / g.D;
    const bool rotate = g.ropeUndo && block < g.L && c2 >= 0;
    for (int m = 0; m < 4; ++m) {
        const int r = row0 + ty + 8 * m;
        if (r >= g.R) continue;
        const int t = g.t0 + g.a + r;  // absolute token
        float lo = acc->v[m][0], hi = acc->v[m][1];
        if (rotate) {
            const double* cs = rope + (size_t(t) * size_t(g.D / 2) + size_t(i)) * 2;
            tfRope(&lo, &hi, cs[0], cs[1]);
        }
        const size_t rowOut = ((size_t(block) * g.H + size_t(h)) * size_t(g.T) + size_t(t)) * size_t(g.D);
        storeOut(out, rowOut + size_t(c1 - h * g.D), g.dtype, lo);
        if (c2 >= 0) storeOut(out, rowOut + size_t(c2 - h * g.D), g.dtype, hi);
    }
}

// Raw value e of a block, in the payload's order: raw token j (prefix rows first, then the
// suffix), head h, channel d at e = (j * H + h) * D + d; e < (n - R) * H * D.
KVS_HD void tfRawValue(const uint8_t* payload, const TfGeom& g, const TfBlockPlan& bp, int block, uint32_t e, void* out)
{
    const int d = int(e % uint32_t(g.D));
    const int h = int((e / uint32_t(g.D)) % uint32_t(g.H));
    const int j = int(e / (uint32_t(g.D) * uint32_t(g.H)));
    const int t = j < g.a ? j : g.R + j;  // chunk row: prefix [0, a), then suffix [a + R, n)
    const size_t rowOut = ((size_t(block) * g.H + size_t(h)) * size_t(g.T) + size_t(g.t0 + t)) * size_t(g.D);
    storeOut(out, rowOut + size_t(d), g.dtype, halfToFloat(loadU16(payload + bp.rawOffset + 2 * size_t(e))));
}

}  // namespace gpu
}  // namespace kvscope
