// Host side of the GPU decoder for transform-coded chunks (codec 6), shared by cuda/decode.cu and
// the CPU emulation test: validates the flattened model of kvscope_cuda_transform and lays it out
// for the kernels (coded components, folded class tables, the transposed decode matrix as fp16),
// computes the RoPE table, checks a chunk payload's layout before launch, and emulates the
// kernels of transform_core.h thread by thread (emulateTransformChunk). Plain C++17.
#pragma once

#include "kvscope_cuda.h"
#include "transform_core.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {
namespace gpu {

struct TfLevel {
    std::vector<TfComp> comps;        // every block's coded components, block after block
    std::vector<uint32_t> compOffset; // per block (2L): first entry in comps
    std::vector<int32_t> K;           // per block: coded components
    std::vector<uint16_t> tables;     // start tables (2 M_c + 2 entries), TfComp::tab offsets
    std::vector<uint32_t> tileK;      // per block and unit tile: k_begin, k_end (tileRanges)
    std::vector<uint32_t> tileOffset; // per block: first entry in tileK
};

// A validated copy of kvscope_cuda_transform, in the kernels' layout.
struct TfModel {
    int entropy = 1, importance = 0, ropeUndo = 0, sink = 0, recent = 0, position0 = 0;
    std::vector<float> invFreq;   // D/2
    std::vector<float> mean;      // 2L x C
    std::vector<uint16_t> At;     // 2L x C x C fp16 bits: At[(b * C + j) * C + c] = A_b[c][j]
    std::vector<TfLevel> levels;

    bool rawToken(int T, int t) const { return t < sink || t >= T - recent; }
};

// The level's table of the 2 M + 1 symbols folded for step 2^c (codec/fold_rules.h, as the CPU
// decoder folds it).
inline std::vector<uint32_t> tfFoldedFreq(const uint16_t* f, int M, int c)
{
    std::vector<uint32_t> acc(size_t(2 * foldedMax(M, c) + 1), 0);
    hd::foldFrequencies(f, M, c, acc.data());
    return acc;
}

inline void tileRanges(TfModel& m, int L, int H, int D);

inline bool makeTfModel(const kvscope_cuda_transform* in, int L, int H, int D, int levels, TfModel* out, std::string* why)
{
    auto bad = [why](const std::string& s) {
        *why = "decoder parameters: transform model: " + s;
        return false;
    };
    if (!in) return bad("missing");
    const int C = H * D, B = 2 * L;
    if (uint64_t(B) * C * C > (uint64_t(1) << 32)) return bad("decode matrices too large for the GPU decoder");
    TfModel m;
    if (in->entropy < 0 || in->entropy > 2) return bad("entropy " + std::to_string(in->entropy) + " unknown");
    m.entropy = in->entropy;
    m.importance = in->token_importance ? 1 : 0;
    m.ropeUndo = in->rope_undo ? 1 : 0;
    if (in->sink_tokens < 0 || in->recent_tokens < 0 || in->rope_position0 < 0) return bad("negative token counts");
    m.sink = in->sink_tokens, m.recent = in->recent_tokens, m.position0 = in->rope_position0;
    if (m.ropeUndo) {
        if (D % 2 || !in->rope_inv_freq) return bad("rope_undo needs an even head_dim and the inverse frequencies");
        m.invFreq.assign(in->rope_inv_freq, in->rope_inv_freq + D / 2);
    }
    if (!in->mean || !in->decode || !in->step || !in->max_q) return bad("arrays missing");
    m.At.resize(size_t(B) * C * C);
    for (int b = 0; b < B; ++b) {
        if (!in->mean[b] || !in->decode[b]) return bad("arrays missing");
        m.mean.insert(m.mean.end(), in->mean[b], in->mean[b] + C);
    }
    for (int b = 0; b < B; ++b)
        for (int c = 0; c < C; ++c)
            for (int j = 0; j < C; ++j) {
                const float v = in->decode[b][size_t(c) * C + j];
                const uint16_t h = floatToHalf(v);
                if (!(halfToFloat(h) == v) || (h & 0x7c00u) == 0x7c00u) return bad("decode matrix entry is not a finite fp16 value");
                m.At[(size_t(b) * C + j) * C + c] = h;
            }
    uint64_t fpos = 0;
    for (int l = 0; l < levels; ++l) {
        TfLevel lv;
        for (int b = 0; b < B; ++b) {
            lv.compOffset.push_back(uint32_t(lv.comps.size()));
            int K = 0;
            for (int j = 0; j < C; ++j) {
                const size_t at = (size_t(l) * B + b) * C + j;
                const float step = in->step[at];
                const int M = in->max_q[at];
                if (!(step > 0)) {
                    if (M != 0) return bad("an uncoded component with an alphabet");
                    continue;
                }
                if (M < 1 || M > 127) return bad("alphabet " + std::to_string(M) + " outside 1..127");
                TfComp cp{};
                cp.j = j, cp.M = M, cp.step = step;
                if (m.entropy != 0) {  // rans and rans32: the same tables
                    const int A = 2 * M + 1;
                    if (!in->freq || fpos + uint64_t(A) > in->freq_count) return bad("frequency tables truncated");
                    const uint16_t* f = in->freq + fpos;
                    fpos += uint64_t(A);
                    uint32_t sum = 0;
                    for (int s = 0; s < A; ++s) {
                        if (f[s] == 0) return bad("a zero frequency");
                        sum += f[s];
                    }
                    if (sum != kProbScale) return bad("frequencies do not sum to 4096");
                    for (int c = 0; c < (m.importance ? kTfClasses : 1); ++c) {
                        const std::vector<uint32_t> ff = tfFoldedFreq(f, M, c);
                        cp.tab[c] = uint32_t(lv.tables.size());
                        uint32_t acc = 0;
                        for (uint32_t v : ff) lv.tables.push_back(uint16_t(acc)), acc += v;
                        lv.tables.push_back(uint16_t(acc));  // 4096
                    }
                    if (lv.tables.size() >= (size_t(1) << 32)) return bad("probability tables too large for the GPU decoder");
                }
                lv.comps.push_back(cp);
                ++K;
            }
            lv.K.push_back(K);
        }
        m.levels.push_back(std::move(lv));
    }
    if (m.entropy != 0 && fpos != in->freq_count) return bad("frequency tables have unused entries");
    tileRanges(m, L, H, D);
    *out = std::move(m);
    return true;
}

// The components a unit tile of the GEMM visits. Outside [k_begin, k_end) every decode entry of
// the tile's columns is +-0, so the CPU's terms acc + (+-0) * z are skipped: exact as long as
// acc is never -0 (then adding a signed zero leaves it unchanged) and z is finite (0 * inf would
// be NaN). acc starts at mean[c] and round-to-nearest gives -0 only from -0 + -0, so "no mean is
// -0" keeps acc off -0; z = q * step * 2^c with |q| < 2^31 and c <= 3 stays finite when every
// step is below 2^-34 FLT_MAX. When either check fails the tile visits every component.
inline void tileRanges(TfModel& m, int L, int H, int D)
{
    const int B = 2 * L, C = H * D, units = H * ((D + 1) / 2);
    const int tiles = (units + kTfTileUnits - 1) / kTfTileUnits;
    for (TfLevel& lv : m.levels) {
        bool finite = true;
        for (const TfComp& cp : lv.comps) finite = finite && cp.step < 3.4028234e38f / 17179869184.0f;
        lv.tileK.clear();
        lv.tileOffset.clear();
        for (int b = 0; b < B; ++b) {
            lv.tileOffset.push_back(uint32_t(lv.tileK.size()));
            const int K = lv.K[size_t(b)];
            bool negZeroMean = false;
            for (int c = 0; c < C; ++c) negZeroMean = negZeroMean || floatBits(m.mean[size_t(b) * C + c]) == 0x80000000u;
            const TfComp* comps = lv.comps.data() + lv.compOffset[size_t(b)];
            for (int t = 0; t < tiles; ++t) {
                int kb = 0, ke = K;
                if (finite && !negZeroMean) {
                    kb = K, ke = 0;
                    for (int k = 0; k < K; ++k) {
                        const uint16_t* row = m.At.data() + (size_t(b) * C + size_t(comps[k].j)) * C;
                        bool nz = false;
                        for (int u = t * kTfTileUnits; u < units && u < (t + 1) * kTfTileUnits && !nz; ++u) {
                            int c1, c2, i;
                            tfUnitColumns(D, u, &c1, &c2, &i);
                            nz = (row[c1] & 0x7fffu) || (c2 >= 0 && (row[c2] & 0x7fffu));
                        }
                        if (nz) kb = k < kb ? k : kb, ke = k + 1;
                    }
                    if (kb >= ke) kb = ke = 0;
                }
                lv.tileK.push_back(uint32_t(kb));
                lv.tileK.push_back(uint32_t(ke));
            }
        }
    }
}

// {cos a, sin a} of a = (position0 + t) * inv_freq[i] for every token t < T and pair i < D/2, in
// double with the C library, exactly as applyRope computes them.
inline std::vector<double> ropeTable(const TfModel& m, int T, int D)
{
    std::vector<double> r;
    if (!m.ropeUndo) return r;
    r.resize(size_t(T) * size_t(D / 2) * 2);
    for (int t = 0; t < T; ++t) {
        const double pos = double(m.position0) + double(t);
        for (int i = 0; i < D / 2; ++i) {
            const double a = pos * double(m.invFreq[size_t(i)]);
            r[(size_t(t) * (D / 2) + i) * 2] = std::cos(a);
            r[(size_t(t) * (D / 2) + i) * 2 + 1] = std::sin(a);
        }
    }
    return r;
}

struct TfChunkPlan {
    TfGeom geom{};
    std::vector<TfBlockPlan> blocks;  // 2L
    uint64_t zqElems = 0;             // scratch of the chunk (sum of R x K)
};

// Checks a transform payload's layout (transform_chunk.cpp decodeTransformChunk) and fills the
// plan. t0, n: the chunk's tokens; T: the cache's. Returns false with "reason" in *why.
inline bool planTransformChunk(const TfModel& m, int L, int H, int D, int T, int dtype, int t0, int n, int level,
                               const uint8_t* data, uint64_t size, TfChunkPlan* plan, std::string* why)
{
    const int B = 2 * L, C = H * D;
    TfGeom& g = plan->geom;
    g = TfGeom{};
    g.L = L, g.H = H, g.D = D, g.T = T, g.n = n, g.t0 = t0, g.dtype = dtype;
    g.entropy = m.entropy, g.importance = m.importance, g.ropeUndo = m.ropeUndo;
    int a = 0, R = 0;
    for (int t = 0; t < n; ++t)
        if (!m.rawToken(T, t0 + t)) {
            if (R == 0) a = t;
            ++R;
        }
    g.a = a, g.R = R;
    const uint64_t raw = uint64_t(n - R) * uint64_t(C) * 2;
    if (size < 8 * uint64_t(B)) {
        *why = "truncated size arrays";
        return false;
    }
    if (size - 8 * uint64_t(B) < raw * B) {
        *why = "truncated fp16 tokens";
        return false;
    }
    const TfLevel& lv = m.levels[size_t(level - 1)];
    plan->blocks.assign(size_t(B), TfBlockPlan{});
    uint64_t off = 8 * uint64_t(B) + raw * B, zq = 0;
    for (int b = 0; b < B; ++b) {
        TfBlockPlan& bp = plan->blocks[size_t(b)];
        bp.rawOffset = uint32_t(8 * uint64_t(B) + raw * b);
        bp.escSize = tfU32(data + 4 * size_t(b));
        bp.strSize = tfU32(data + 4 * size_t(B + b));
        bp.escOffset = uint32_t(off);
        off += bp.escSize;
        bp.strOffset = uint32_t(off);
        off += bp.strSize;
        if (off >= (uint64_t(1) << 32)) break;  // reported below
        bp.comps = lv.compOffset[size_t(b)];
        bp.K = lv.K[size_t(b)];
        bp.tileK = lv.tileOffset[size_t(b)];
        bp.zq = zq;
        zq += uint64_t(R) * uint64_t(bp.K);
    }
    if (off != size) {
        *why = "block sizes add up to " + std::to_string(off) + " bytes, the payload has " + std::to_string(size);
        return false;
    }
    plan->zqElems = zq;
    return true;
}

inline const char* tfReason(int32_t code)
{
    switch (code) {
    case kErrStream: return "entropy-coded stream is corrupt";
    case kErrTfClasses: return "token classes are truncated";
    case kErrTfClassSize: return "class stream is truncated";
    case kErrTfClassUnused: return "class streams leave unused bytes";
    case kErrTfFixed: return "fixed-width symbols do not match the block";
    case kErrTfEscape: return "escape list is truncated, malformed or does not match its symbols";
    default: return "unknown device error";
    }
}

// Runs the transform kernels' per-thread code on the host in their decomposition: the symbol
// stage (one thread per block), the GEMM tiles (256 threads per tile, shared-memory phases in
// the kernel's order) and the raw-token copy. rope: ropeTable(m, T, D). Returns false with a
// reason for a corrupt payload; `out` is the whole-cache output buffer.
inline bool emulateTransformChunk(const TfModel& m, const TfChunkPlan& plan, int level, const uint8_t* data,
                                  const std::vector<double>& rope, void* out, std::string* why)
{
    const TfGeom& g = plan.geom;
    const int B = 2 * g.L, C = g.H * g.D;
    const TfLevel& lv = m.levels[size_t(level - 1)];
    std::vector<float> zq(size_t(plan.zqElems));
    for (int b = 0; b < B; ++b) {  // symbol kernel: thread b
        const TfBlockPlan& bp = plan.blocks[size_t(b)];
        const int32_t code = tfDecodeBlockSymbols(data, g, bp, lv.comps.data() + bp.comps, lv.tables.data(), zq.data() + bp.zq);
        if (code != kOk) {
            *why = std::string(b < g.L ? "key" : "value") + " layer " + std::to_string(b % g.L) + ": " + tfReason(code);
            return false;
        }
    }
    const int units = g.H * ((g.D + 1) / 2);
    TfTileShm shm;
    std::vector<TfAcc> acc(kTfThreads);
    for (int b = 0; b < B; ++b) {  // GEMM kernel: one 256-thread tile per (row tile, unit tile, block)
        const TfBlockPlan& bp = plan.blocks[size_t(b)];
        const TfComp* comps = lv.comps.data() + bp.comps;
        const uint16_t* At = m.At.data() + size_t(b) * C * C;
        const float* mean = m.mean.data() + size_t(b) * C;
        for (int row0 = 0; row0 < g.R; row0 += kTfTileRows)
            for (int unit0 = 0; unit0 < units; unit0 += kTfTileUnits) {
                for (int tid = 0; tid < kTfThreads; ++tid) tfInitAcc(tid, g, mean, unit0, &acc[size_t(tid)]);
                const uint32_t* kr = lv.tileK.data() + bp.tileK + 2 * size_t(unit0 / kTfTileUnits);
                const int kEnd = int(kr[1]);
                for (int k0 = int(kr[0]); k0 < kEnd; k0 += kTfTileK) {
                    for (int tid = 0; tid < kTfThreads; ++tid)
                        tfLoadTile(tid, g, bp, comps, zq.data() + bp.zq, At, row0, unit0, k0, kEnd, &shm);
                    const int kc = kEnd - k0 < kTfTileK ? kEnd - k0 : kTfTileK;
                    for (int tid = 0; tid < kTfThreads; ++tid) tfComputeTile(tid, kc, &shm, &acc[size_t(tid)]);
                }
                for (int tid = 0; tid < kTfThreads; ++tid)
                    tfStoreTile(tid, g, b, rope.data(), row0, unit0, &acc[size_t(tid)], out);
            }
        const uint32_t raws = uint32_t(g.n - g.R) * uint32_t(C);
        for (uint32_t e = 0; e < raws; ++e) tfRawValue(data, g, bp, b, e, out);  // raw kernel: thread e
    }
    return true;
}

}  // namespace gpu
}  // namespace kvscope
