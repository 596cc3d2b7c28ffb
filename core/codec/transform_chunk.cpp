// The transform codec's chunk payload (FORMAT.md "Chunk payloads", transform): per (kind, layer)
// block, the sink/recent tokens as fp16, the coded tokens' components as one symbol stream, and
// an escape list for values beyond a component's alphabet. The math is in transform.h.
//
// The inverse transform (decodeBlock) is the hot loop of decoding: v_t = mean + sum_k A[:, j_k] zq_tk
// for every coded token t. It runs over tiles of kTileTokens tokens, so a decode column is read
// once per tile (scalar, AVX2 or AVX-512, simd_path.h; the tile loop and its store are in
// transform_decode.cpp, the kernels in transform_kernels.cpp, AMX tiles in transform_amx.cpp).
// The scalar path is FORMAT.md's reference arithmetic (this file and the kernels are compiled
// with -ffp-contract=off): each term one rounded multiply and one rounded add, in ascending k.
// The AVX2 and AVX-512 paths keep the sums of a few tokens in registers across all components
// with one fused multiply-add per term, and AMX multiplies bfloat16 tiles: both within
// FORMAT.md's stated tolerance of the reference, not its bytes.
//
// The encoder's forward transform (encodeBlock) is the same product the other way round: z_t =
// E (x_t - mean) for the coded rows of E = A^{-1}, over tiles of tokens with those rows
// transposed, every z summed over the channels in ascending order from +0 with one fused
// multiply-add per term (std::fma in the scalar loop), so every path gives the same payload bytes.
#include "codec/codec_detail.h"
#include "codec/escape_rules.h"
#include "codec/fold_rules.h"
#include "codec/simd_path.h"
#include "codec/symbol_stream.h"
#include "codec/transform.h"
#include "codec/transform_kernels.h"

#include "common/half.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace kvscope::detail {

namespace {

// Tokens of the chunk stored as fp16 rather than coded: the cache's first sinkTokens and last
// recentTokens.
bool rawToken(const TransformModel& m, int T, int absolute)
{
    return absolute < m.settings.sinkTokens || absolute >= T - m.settings.recentTokens;
}

// Fixed-width symbols, escapes and folded tables: the rules the GPU decoder shares
// (codec/escape_rules.h, codec/fold_rules.h).
using hd::bitsFor;
using hd::foldedMax;

std::vector<int> codedList(const TransformLevelBlock& lb)
{
    std::vector<int> coded;
    for (size_t j = 0; j < lb.step.size(); ++j)
        if (lb.step[j] > 0) coded.push_back(int(j));
    return coded;
}

void buildTables(const TransformLevelBlock& lb, bool forDecoding, std::vector<CodingTable>& tables)
{
    tables.resize(lb.freq.size());
    for (size_t k = 0; k < lb.freq.size(); ++k) {
        ProbTable t;
        t.alphabet = int(lb.freq[k].size());
        t.freq = lb.freq[k];
        toCodingTable(t, &tables[k], forDecoding);
    }
}

constexpr int kImportanceClasses = 4;  // step multipliers 1, 2, 4, 8

// Class of every token of the cache in block `layer` (READ ME FIRST, 7; with layer groups the
// mass of the group's layers adds up): 0 for raw tokens.
std::vector<uint8_t> importanceClasses(const TransformModel& m, const KvSet& kv, int layer)
{
    const int T = kv.shape().numTokens, H = kv.shape().numKvHeads, G = m.settings.layerGroup;
    std::vector<double> w(static_cast<size_t>(T), 0.0);
    for (int g = 0; g < G; ++g) {
        const std::vector<float>& a = kv.attnMass[size_t(layer * G + g)];
        for (int h = 0; h < H; ++h)
            for (int t = 0; t < T; ++t) w[size_t(t)] += double(a[size_t(h) * T + t]);
    }
    std::vector<double> coded;
    for (int t = 0; t < T; ++t)
        if (!rawToken(m, T, t)) coded.push_back(w[size_t(t)]);
    std::vector<uint8_t> cls(static_cast<size_t>(T), 0);
    if (coded.empty()) return cls;
    const size_t qi = std::min(coded.size() - 1, size_t(m.settings.importanceQuantile * double(coded.size() - 1) + 0.5));
    std::nth_element(coded.begin(), coded.begin() + std::ptrdiff_t(qi), coded.end());
    const double ref = std::max(coded[qi], 1e-30);
    for (int t = 0; t < T; ++t) {
        if (rawToken(m, T, t)) continue;
        const double c = std::nearbyint(m.settings.importancePower * std::log2(ref / std::max(w[size_t(t)], 1e-30)));
        cls[size_t(t)] = uint8_t(std::max(0.0, std::min(double(kImportanceClasses - 1), c)));
    }
    return cls;
}

// The level's table for component k folded for step multiplier 2^c (codec/fold_rules.h): symbol q
// (|q| < M) goes to rint(q / 2^c), |q'| >= M' = ceil(M / 2^c) and the escapes to the escapes.
std::vector<uint16_t> foldedFreq(const std::vector<uint16_t>& f, int M, int c, int& Mout)
{
    Mout = foldedMax(M, c);
    std::vector<uint32_t> acc(size_t(2 * Mout + 1), 0);
    hd::foldFrequencies(f.data(), M, c, acc.data());
    return std::vector<uint16_t>(acc.begin(), acc.end());
}

void buildClassTables(const TransformLevelBlock& lb, int c, bool forDecoding, std::vector<CodingTable>& tables)
{
    if (c == 0) return buildTables(lb, forDecoding, tables);
    tables.resize(lb.freq.size());
    int k = 0;
    for (size_t j = 0; j < lb.step.size(); ++j) {
        if (!(lb.step[j] > 0)) continue;
        ProbTable t;
        int Mf = 0;
        t.freq = foldedFreq(lb.freq[size_t(k)], lb.maxQ[j], c, Mf);
        t.alphabet = int(t.freq.size());
        toCodingTable(t, &tables[size_t(k)], forDecoding);
        ++k;
    }
}

}  // namespace

// What the coders derive per (level, kind, layer) of a model, once (TransformDecodeSlot).
struct TransformDecodeCache {
    struct Entry {
        std::once_flag tablesOnce, encTablesOnce, amxOnce;
        std::vector<CodingTable> tables, encTables;  // the level's decoding and encoding tables, class 0
        AmxProduct amx;                   // B of the coded decode columns and steps
        bool amxOk = false;
    };
    std::unique_ptr<Entry[]> entries;  // [(level - 1) * 2L + kind * L + layer]
    std::mutex ropeMutex;
    std::map<std::pair<int, int>, std::shared_ptr<const std::vector<double>>> rope;  // chunkRopeTable by (t0, n)
};

namespace {

TransformDecodeCache& decodeCache(const TransformModel& m)
{
    const TransformDecodeSlot& slot = m.decodeCache;
    std::lock_guard<std::mutex> lock(slot.m);
    if (!slot.cache) {
        slot.cache = std::make_shared<TransformDecodeCache>();
        slot.cache->entries.reset(new TransformDecodeCache::Entry[size_t(m.numLevels()) * 2 * size_t(m.numLayers)]);
    }
    return *slot.cache;
}

TransformDecodeCache::Entry& decodeEntry(const TransformModel& m, int level, KvKind kind, int layer)
{
    return decodeCache(m).entries[(size_t(level - 1) * 2 + size_t(kind)) * size_t(m.numLayers) + size_t(layer)];
}

struct BlockPayload {
    std::vector<uint16_t> raw;  // (H, raw tokens, D)
    std::vector<uint8_t> escapes, stream;
};

// One RoPE table (ropeTable) of the chunk's tokens, shared by every layer's keys; empty when the
// model keeps RoPE in. Kept with the model's derived state for the first kRopeTablesKept chunks
// asked for (a cos and a sin per pair and token cost more than applying them; a bench, a server
// and the encoder ask for the same chunks again), computed afresh beyond that.
constexpr size_t kRopeTablesKept = 64;  // 8 MB of tables at 256 tokens and 64 dims
std::shared_ptr<const std::vector<double>> chunkRopeTable(const TransformModel& m, int t0, int n)
{
    if (!m.settings.ropeUndo) return std::make_shared<const std::vector<double>>();
    TransformDecodeCache& cache = decodeCache(m);
    {
        std::lock_guard<std::mutex> lock(cache.ropeMutex);
        auto it = cache.rope.find({t0, n});
        if (it != cache.rope.end()) return it->second;
    }
    auto cs = std::make_shared<std::vector<double>>();
    ropeTable(n, m.headDim, m.ropeInvFreq.data(), m.ropePosition0, t0, *cs);
    std::lock_guard<std::mutex> lock(cache.ropeMutex);
    if (cache.rope.size() < kRopeTablesKept) cache.rope.emplace(std::make_pair(t0, n), cs);
    return cs;
}

// A block before its entropy coding: the fp16 tokens, the escapes, the symbols of the coded
// tokens (R x K) and each coded token's class.
struct TransformQuantized {
    BlockPayload out;  // raw and escapes filled
    std::vector<uint8_t> sym, rowClass;
    int R = 0, K = 0;
};

// Tokens [t0, t0 + n) of block `layer` as floats, (m.heads, n, D): the cache's layer, or with layer
// groups its G layers' heads side by side (READ ME FIRST, 10).
void readModelBlock(const TransformModel& m, const KvSet& kv, KvKind kind, int layer, int t0, int n, std::vector<float>& x)
{
    const int G = m.settings.layerGroup;
    if (G == 1) return readBlock(kv, kind, layer, t0, n, x);
    const size_t part = size_t(m.cacheHeads()) * n * m.headDim;
    x.resize(part * G);
    for (int g = 0; g < G; ++g)
        for (int h = 0; h < m.cacheHeads(); ++h)
            kv.readRows(kind, layer * G + g, h, t0, n, x.data() + size_t(g) * part + size_t(h) * n * m.headDim);
}

// rope: chunkRopeTable of the chunk (keys are rotated back with it when the model undoes RoPE).
TransformQuantized quantizeBlock(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level, int t0, int n,
                             const double* rope)
{
    const TransformModel& m = *p.transform;
    const int H = m.heads, D = m.headDim, C = H * D, T = p.shape.numTokens;
    const TransformBlock& b = m.block(kind, layer);
    const TransformLevelBlock& lb = m.levelBlock(level, kind, layer);
    thread_local std::vector<float> x;  // reused: a fresh one would be mapped and cleared per block
    readModelBlock(m, kv, kind, layer, t0, n, x);  // (H, n, D)
    TransformQuantized qb;
    BlockPayload& out = qb.out;
    std::vector<int> codedTokens;
    for (int t = 0; t < n; ++t) {
        if (!rawToken(m, T, t0 + t)) {
            codedTokens.push_back(t);
            continue;
        }
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) out.raw.push_back(floatToHalf(x[(size_t(h) * n + t) * D + d]));
    }
    if (!allFinite(x.data(), x.size()))
        throw Error(std::string(kindName(kind)) + (m.settings.layerGroup > 1 ? " layer group " : " layer ") +
                    std::to_string(layer) + ": a value is not finite");
    if (kind == KvKind::Key && m.settings.ropeUndo)
        for (int h = 0; h < H; ++h)
            applyRopeTable(x.data() + size_t(h) * n * D, n, D, rope, true);

    const std::vector<int> coded = codedList(lb);
    const int K = int(coded.size()), R = int(codedTokens.size());
    const bool imp = m.settings.tokenImportance;
    qb.R = R, qb.K = K;
    std::vector<uint8_t>& rowClass = qb.rowClass;
    rowClass.assign(static_cast<size_t>(R), 0);
    if (imp) {
        const std::vector<uint8_t> cls = importanceClasses(m, kv, layer);
        for (int r = 0; r < R; ++r) rowClass[size_t(r)] = cls[size_t(t0 + codedTokens[size_t(r)])];
    }
    std::vector<uint8_t>& sym = qb.sym;
    sym.resize(size_t(R) * K);
    if (K == 0) return qb;  // every component below the water level: nothing to transform or quantise
    // RD rounding (READ ME FIRST, 8): code lengths per (class, component) of the tables in use.
    const bool rdo = m.settings.rdoLambda > 0 && entropyUsesTables(m.settings.entropy);
    std::vector<std::vector<float>> bits;  // [class * K + k]
    if (rdo) {
        bits.resize(size_t(kImportanceClasses) * K);
        for (int c = 0; c < (imp ? kImportanceClasses : 1); ++c)
            for (int k = 0; k < K; ++k) {
                int Mf = lb.maxQ[size_t(coded[size_t(k)])];
                bits[size_t(c) * K + size_t(k)] =
                    transformCodeLengths(c == 0 ? lb.freq[size_t(k)] : foldedFreq(lb.freq[size_t(k)], Mf, c, Mf));
            }
    }
    // The forward transform of the coded components as a product of tiles of tokens with the
    // encode rows transposed, eT (C, Kp); then per row the quantisation (escapes in token, then
    // component order) and, with RD rounding, the choice among the interior symbols.
    const TileKernels kernels = kernelsFor(simdPath());
    const int Kp = forwardStride(K);
    thread_local std::vector<float> eT, v, z;
    eT.resize(size_t(C) * Kp);
    transposeCodedRows(b.encode.data(), C, coded.data(), K, Kp, eT.data());
    std::vector<double> div(size_t(kImportanceClasses) * K), inv(div.size());  // [class * K + k]: Delta_j 2^class, 1 / it
    std::vector<int> folded(size_t(kImportanceClasses) * K);  // [class * K + k]: the folded max |q|
    for (int c = 0; c < kImportanceClasses; ++c)
        for (int k = 0; k < K; ++k) {
            const int j = coded[size_t(k)];
            div[size_t(c) * K + size_t(k)] = double(lb.step[size_t(j)]) * double(1 << c);
            inv[size_t(c) * K + size_t(k)] = 1.0 / div[size_t(c) * K + size_t(k)];
            folded[size_t(c) * K + size_t(k)] = foldedMax(lb.maxQ[size_t(j)], c);
        }
    constexpr int kForwardTile = 64;
    v.resize(size_t(kForwardTile) * C);
    z.resize(size_t(kForwardTile) * Kp);
    for (int r0 = 0; r0 < R; r0 += kForwardTile) {
        const int nt = std::min(kForwardTile, R - r0);
        for (int i = 0; i < nt; ++i) {
            const int t = codedTokens[size_t(r0 + i)];
            for (int h = 0; h < H; ++h)
                centreRow(&x[(size_t(h) * n + t) * D], &b.mean[size_t(h) * D], D, &v[size_t(i) * C + size_t(h) * D]);
        }
        kernels.forward(ForwardTile{v.data(), eT.data(), z.data(), nt, C, Kp});
        for (int i = 0; i < nt; ++i) {
            const int r = r0 + i, c = rowClass[size_t(r)];
            uint8_t* row = sym.data() + size_t(r) * K;
            const float* zr = z.data() + size_t(i) * Kp;
            kernels.quantize(zr, &div[size_t(c) * K], &inv[size_t(c) * K], &folded[size_t(c) * K], K, row, out.escapes);
            if (!rdo) continue;
            for (int k = 0; k < K; ++k) {
                const int M = folded[size_t(c) * K + size_t(k)];
                if (row[k] == 0 || row[k] == 2 * M) continue;  // escapes stay
                row[k] = uint8_t(rdoSymbol(double(zr[k]) / div[size_t(c) * K + size_t(k)], row[k], M,
                                           bits[size_t(c) * K + size_t(k)].data(), m.settings.rdoLambda));
            }
        }
    }
    return qb;
}

BlockPayload encodeBlock(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level, int t0, int n,
                         const double* rope)
{
    const TransformModel& m = *p.transform;
    const TransformLevelBlock& lb = m.levelBlock(level, kind, layer);
    TransformQuantized qb = quantizeBlock(p, kv, kind, layer, level, t0, n, rope);
    BlockPayload& out = qb.out;
    const std::vector<uint8_t>& sym = qb.sym;
    const std::vector<uint8_t>& rowClass = qb.rowClass;
    const int R = qb.R, K = qb.K;
    const bool imp = m.settings.tokenImportance;
    const std::vector<int> coded = codedList(lb);
    if (imp) {  // 2 bits per coded token, LSB first
        std::vector<uint8_t> packed(size_t(R + 3) / 4, 0);
        for (int r = 0; r < R; ++r) packed[size_t(r) / 4] |= uint8_t(rowClass[size_t(r)] << (2 * (r % 4)));
        out.stream.insert(out.stream.end(), packed.begin(), packed.end());
    }
    // The symbol-matrix coder of the entropy choice (symbol_stream.h): 4 or 32 states.
    const auto encodeMatrix = m.settings.entropy == TransformEntropy::Rans32 ? encodeSymbolMatrixW32 : encodeSymbolMatrix;
    if (entropyUsesTables(m.settings.entropy) && imp) {
        // One stream per class present, in class order, each prefixed by its u32 byte count.
        thread_local std::vector<CodingTable> tables;
        std::vector<uint8_t> rows, part;
        for (int c = 0; c < kImportanceClasses; ++c) {
            rows.clear();
            int nr = 0;
            for (int r = 0; r < R; ++r)
                if (rowClass[size_t(r)] == c) {
                    rows.insert(rows.end(), sym.begin() + std::ptrdiff_t(size_t(r) * K), sym.begin() + std::ptrdiff_t(size_t(r + 1) * K));
                    ++nr;
                }
            if (nr == 0) continue;
            buildClassTables(lb, c, false, tables);
            part.clear();
            encodeMatrix(rows.data(), nr, K, tables.data(), part);
            putU32(out.stream, uint32_t(part.size()));
            out.stream.insert(out.stream.end(), part.begin(), part.end());
        }
    } else if (entropyUsesTables(m.settings.entropy)) {
        TransformDecodeCache::Entry& cached = decodeEntry(m, level, kind, layer);
        std::call_once(cached.encTablesOnce, [&] { buildTables(lb, false, cached.encTables); });
        encodeMatrix(sym.data(), R, K, cached.encTables.data(), out.stream);
    } else {
        uint64_t acc = 0;
        int bits = 0;
        for (int r = 0; r < R; ++r)
            for (int k = 0; k < K; ++k) {
                const int w = bitsFor(2 * foldedMax(lb.maxQ[size_t(coded[size_t(k)])], rowClass[size_t(r)]) + 1);
                acc |= uint64_t(sym[size_t(r) * K + size_t(k)]) << bits;
                bits += w;
                while (bits >= 8) {
                    out.stream.push_back(uint8_t(acc));
                    acc >>= 8;
                    bits -= 8;
                }
            }
        if (bits > 0) out.stream.push_back(uint8_t(acc));
    }
    return std::move(qb.out);
}

// The coded tokens' symbols (R x K) of a block's stream (past its token classes), with the
// entropy choice of the model, into sym.
void decodeBlockSymbols(const TransformModel& m, const TransformLevelBlock& lb, const std::vector<int>& coded,
                        const std::vector<uint8_t>& rowClass, const uint8_t* stream, size_t streamBytes,
                        TransformDecodeCache::Entry& cached, const std::string& where, std::vector<uint8_t>& sym)
{
    const int R = int(rowClass.size()), K = int(coded.size());
    const bool imp = m.settings.tokenImportance;
    sym.resize(size_t(R) * K);  // every symbol is written below
    const auto decodeMatrix = m.settings.entropy == TransformEntropy::Rans32 ? decodeSymbolMatrixW32 : decodeSymbolMatrix;
    if (entropyUsesTables(m.settings.entropy) && imp) {
        thread_local std::vector<CodingTable> tables;
        std::vector<uint8_t> rows;
        size_t pos = 0;
        for (int c = 0; c < kImportanceClasses; ++c) {
            int nr = 0;
            for (int r = 0; r < R; ++r) nr += rowClass[size_t(r)] == c;
            if (nr == 0) continue;
            if (streamBytes - pos < 4) throw Error(where + ": class stream size is truncated");
            const size_t len = getU32(stream + pos);
            pos += 4;
            if (len > streamBytes - pos) throw Error(where + ": class stream is truncated");
            buildClassTables(lb, c, true, tables);
            rows.assign(size_t(nr) * K, 0);
            decodeMatrix(stream + pos, len, nr, K, tables.data(), rows.data(), where);
            pos += len;
            int i = 0;
            for (int r = 0; r < R; ++r)
                if (rowClass[size_t(r)] == c) {
                    std::copy(rows.begin() + std::ptrdiff_t(size_t(i) * K), rows.begin() + std::ptrdiff_t(size_t(i + 1) * K),
                              sym.begin() + std::ptrdiff_t(size_t(r) * K));
                    ++i;
                }
        }
        if (pos != streamBytes) throw Error(where + ": class streams leave unused bytes");
    } else if (entropyUsesTables(m.settings.entropy)) {
        std::call_once(cached.tablesOnce, [&] { buildTables(lb, true, cached.tables); });
        decodeMatrix(stream, streamBytes, R, K, cached.tables.data(), sym.data(), where);
    } else {
        uint64_t totalBits = 0;
        std::vector<int> width(size_t(kImportanceClasses) * K);  // [class * K + k]
        for (int c = 0; c < kImportanceClasses; ++c)
            for (int k = 0; k < K; ++k) width[size_t(c) * K + size_t(k)] = bitsFor(2 * foldedMax(lb.maxQ[size_t(coded[size_t(k)])], c) + 1);
        for (int r = 0; r < R; ++r)
            for (int k = 0; k < K; ++k) totalBits += uint64_t(width[size_t(rowClass[size_t(r)]) * K + size_t(k)]);
        if (streamBytes != (totalBits + 7) / 8)
            throw Error(where + ": fixed-width symbols take " + std::to_string((totalBits + 7) / 8) + " bytes, the block has " +
                        std::to_string(streamBytes));
        hd::FixedWidthReader in{stream, 0, 0};
        for (int r = 0; r < R; ++r)
            for (int k = 0; k < K; ++k) {
                const int s = in.take(width[size_t(rowClass[size_t(r)]) * K + size_t(k)]);
                if (s > 2 * foldedMax(lb.maxQ[size_t(coded[size_t(k)])], rowClass[size_t(r)]))
                    throw Error(where + ": fixed-width symbol " + std::to_string(s) + " is outside its alphabet");
                sym[size_t(r) * K + size_t(k)] = uint8_t(s);
            }
    }

}

// rope: chunkRopeTable of the chunk (keys are rotated with it when the model undoes RoPE).
void decodeBlock(const CodecParams& p, KvKind kind, int layer, int level, int t0, int n, const uint8_t* raw,
                 const uint8_t* esc, size_t escBytes, const uint8_t* stream, size_t streamBytes, const double* rope,
                 KvSet& outKv, const std::string& where)
{
    const TransformModel& m = *p.transform;
    const int H = m.heads, D = m.headDim, C = H * D, T = p.shape.numTokens;
    const int G = m.settings.layerGroup, Hc = m.cacheHeads();  // block head h: head h % Hc of layer layer * G + h / Hc
    const TransformBlock& b = m.block(kind, layer);
    const TransformLevelBlock& lb = m.levelBlock(level, kind, layer);
    const std::vector<int> coded = codedList(lb);
    const int K = int(coded.size());
    std::vector<int> codedTokens, rawTokens;
    for (int t = 0; t < n; ++t) (rawToken(m, T, t0 + t) ? rawTokens : codedTokens).push_back(t);
    const int R = int(codedTokens.size());
    const bool imp = m.settings.tokenImportance;
    std::vector<uint8_t> rowClass(static_cast<size_t>(R), 0);
    if (imp) {
        const size_t nb = size_t(R + 3) / 4;
        if (streamBytes < nb) throw Error(where + ": token classes are truncated");
        for (int r = 0; r < R; ++r) rowClass[size_t(r)] = uint8_t((stream[size_t(r) / 4] >> (2 * (r % 4))) & 3);
        stream += nb;
        streamBytes -= nb;
    }

    TransformDecodeCache::Entry& cached = decodeEntry(m, level, kind, layer);
    thread_local std::vector<uint8_t> sym;
    decodeBlockSymbols(m, lb, coded, rowClass, stream, streamBytes, cached, where, sym);

    // The decode columns of the coded components (TransformBlock::columns: read in place when
    // the coded components are the first K, as a water level over a sorted basis gives them;
    // copied otherwise) and the channels [lo_k, hi_k) outside which column k is all +-0.
    bool prefix = true;
    for (int k = 0; k < K && prefix; ++k) prefix = coded[size_t(k)] == k;
    thread_local std::vector<float> colCopy;  // (K, C)
    if (!prefix) colCopy.resize(size_t(K) * C);
    const float* col = prefix ? b.columns.data() : colCopy.data();
    std::vector<float> step(static_cast<size_t>(K));
    std::vector<int> lo(static_cast<size_t>(K)), hi(static_cast<size_t>(K));
    bool finite = true;
    for (int k = 0; k < K; ++k) {
        const int j = coded[size_t(k)];
        if (!prefix) std::memcpy(&colCopy[size_t(k) * C], b.columns.data() + size_t(j) * C, sizeof(float) * size_t(C));
        step[size_t(k)] = lb.step[size_t(j)];
        finite = finite && step[size_t(k)] < FLT_MAX / 17179869184.0f;  // 2^34: |q| < 2^31, class <= 3
        lo[size_t(k)] = b.colLo[size_t(j)];
        hi[size_t(k)] = b.colHi[size_t(j)];
    }
    // A term (+-0) * z leaves a sum unchanged unless the sum is -0 or z is not finite: the sum
    // starts at mean[c] and round-to-nearest gives -0 only from -0 + -0, so with no mean -0 and
    // every step below 2^-34 FLT_MAX (z = q step 2^class stays finite) the zero rows of a column
    // can be skipped exactly. Otherwise every column spans all channels.
    bool negZeroMean = false;
    for (int c = 0; c < C; ++c) negZeroMean = negZeroMean || (std::signbit(b.mean[size_t(c)]) && b.mean[size_t(c)] == 0.0f);
    if (!finite || negZeroMean) std::fill(lo.begin(), lo.end(), 0), std::fill(hi.begin(), hi.end(), C);
    const bool plain = finite && !negZeroMean && b.decodeFinite;  // Tile::plain

    // Per tile of tokens (inverseTiles): the dequantised components (zq = q step 2^class, 0
    // exactly when q = 0, escapes read in the stream's order), then v_t = mean + sum over k
    // ascending of col_k zq_tk (terms with q = 0 skipped), then each head's row, keys rotated
    // back by RoPE when the model undoes it, straight into the output's dtype. On AMX (AVX-512
    // path, plain blocks) the product is Z B on tiles instead (transform_kernels.h, AmxProduct).
    std::vector<int> folded(size_t(kImportanceClasses) * K);  // [class * K + k]: the folded max |q|
    for (int c = 0; c < kImportanceClasses; ++c)
        for (int k = 0; k < K; ++k) folded[size_t(c) * K + size_t(k)] = foldedMax(lb.maxQ[size_t(coded[size_t(k)])], c);
    EscapeReader escapes{esc, esc + escBytes, &where};
    bool useAmx = simdPath() == SimdPath::Avx512 && plain && K > 0 && amxEnabled();
    if (useAmx) {
        std::call_once(cached.amxOnce, [&] { cached.amxOk = cached.amx.prepare(col, step.data(), b.mean.data(), K, C); });
        useAmx = cached.amxOk;
    }
    const bool ropeKeys = kind == KvKind::Key && m.settings.ropeUndo;
    inverseTiles(InverseJob{R, K, C, H, D, sym.data(), rowClass.data(), folded.data(), step.data(), col, lo.data(), hi.data(),
                            plain, b.mean.data(), useAmx ? &cached.amx : nullptr, codedTokens.data(), ropeKeys ? rope : nullptr,
                            kind, layer, G, Hc, t0},
                 escapes, outKv);
    if (escapes.p != escapes.end) throw Error(where + ": escape list has unused bytes");
    size_t ri = 0;  // raw tokens: their fp16 values as stored
    std::vector<float> v(static_cast<size_t>(D));
    for (int t : rawTokens)
        for (int h = 0; h < H; ++h) {
            for (int d = 0; d < D; ++d, ++ri) v[size_t(d)] = halfToFloat(uint16_t(raw[2 * ri] | raw[2 * ri + 1] << 8));
            outKv.writeRows(kind, layer * G + h / Hc, h % Hc, t0 + t, 1, v.data());
        }
}

size_t rawBytesPerBlock(const CodecParams& p, int t0, int n)
{
    const TransformModel& m = *p.transform;
    size_t raw = 0;
    for (int t = 0; t < n; ++t) raw += rawToken(m, p.shape.numTokens, t0 + t);
    return raw * size_t(m.channels()) * 2;
}

}  // namespace

std::vector<uint8_t> encodeTransformChunk(const CodecParams& p, const KvSet& kv, int chunk, int level)
{
    return std::move(encodeTransformChunks(p, kv, {ChunkRequest{chunk, level}}).front());
}

// Pair k is block k / N of request k % N: a thread goes through one block's chunks in turn, with its
// encode matrix in cache. Failures rank as request after request, block after block.
std::vector<std::vector<uint8_t>> encodeTransformChunks(const CodecParams& p, const KvSet& kv,
                                                        const std::vector<ChunkRequest>& which)
{
    KVSCOPE_ASSERT(p.transform);
    const int L = p.transform->numLayers, B = 2 * L, N = int(which.size());
    std::vector<std::shared_ptr<const std::vector<double>>> rope(static_cast<size_t>(N));
    parallelUnits(N, [&](int i) {
        rope[size_t(i)] = chunkRopeTable(*p.transform, p.chunkStart(which[size_t(i)].chunk), p.chunkLength(which[size_t(i)].chunk));
    });
    std::vector<BlockPayload> blocks(size_t(N) * B);  // [request * B + block]
    parallelRanked(N * B, [&](int k) { return (long long)(k % N) * B + k / N; }, [&](int k) {
        const ChunkRequest& r = which[size_t(k % N)];
        const int u = k / N;
        blocks[size_t(k % N) * B + u] = encodeBlock(p, kv, kKinds[u / L], u % L, r.level, p.chunkStart(r.chunk),
                                                    p.chunkLength(r.chunk), rope[size_t(k % N)]->data());
    });
    std::vector<std::vector<uint8_t>> out(static_cast<size_t>(N));
    for (int i = 0; i < N; ++i) {
        const BlockPayload* b = blocks.data() + size_t(i) * B;
        std::vector<uint8_t>& o = out[size_t(i)];
        for (int u = 0; u < B; ++u) putU32(o, uint32_t(b[u].escapes.size()));
        for (int u = 0; u < B; ++u) putU32(o, uint32_t(b[u].stream.size()));
        for (int u = 0; u < B; ++u) putU16s(o, b[u].raw.data(), b[u].raw.size());
        for (int u = 0; u < B; ++u) {
            o.insert(o.end(), b[u].escapes.begin(), b[u].escapes.end());
            o.insert(o.end(), b[u].stream.begin(), b[u].stream.end());
        }
    }
    return out;
}

std::vector<TransformSymbols> transformBlockSymbols(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level,
                                                   int chunk)
{
    KVSCOPE_ASSERT(p.transform);
    std::vector<TransformSymbols> out;
    if (!entropyUsesTables(p.transform->settings.entropy)) return out;
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    const auto rope = chunkRopeTable(*p.transform, t0, n);
    const TransformQuantized qb = quantizeBlock(p, kv, kind, layer, level, t0, n, rope->data());
    for (int c = 0; c < kImportanceClasses; ++c) {
        TransformSymbols m;
        m.cls = c;
        m.cols = qb.K;
        for (int r = 0; r < qb.R; ++r)
            if (qb.rowClass[size_t(r)] == c) {
                m.sym.insert(m.sym.end(), qb.sym.begin() + std::ptrdiff_t(size_t(r) * qb.K),
                             qb.sym.begin() + std::ptrdiff_t(size_t(r + 1) * qb.K));
                ++m.rows;
            }
        if (m.rows > 0) out.push_back(std::move(m));
    }
    return out;
}

void transformCodingTables(const CodecParams& p, KvKind kind, int layer, int level, int cls, bool forDecoding,
                           std::vector<CodingTable>& tables)
{
    buildClassTables(p.transform->levelBlock(level, kind, layer), cls, forDecoding, tables);
}

namespace {

// Where each block's parts lie in one chunk's payload (FORMAT.md "Chunk payloads (transform)"),
// with the chunk's RoPE table.
struct ChunkLayout {
    int t0 = 0, n = 0;
    size_t raw = 0;  // fp16 bytes per block
    const uint8_t* rawStart = nullptr;
    std::vector<size_t> escOff, strOff, escN, strN;  // per block
    std::shared_ptr<const std::vector<double>> rope;
};

ChunkLayout parseLayout(const CodecParams& p, const uint8_t* data, size_t size, int chunk, const std::string& where)
{
    if (!p.transform) throw Error(where + ": the transform codec needs its model (transform section)");
    const int B = 2 * p.transform->numLayers;
    ChunkLayout c;
    c.t0 = p.chunkStart(chunk), c.n = p.chunkLength(chunk);
    Cursor cur{data, data + size, where};
    const uint8_t* sizes = cur.take(8 * size_t(B), "size arrays");
    c.raw = rawBytesPerBlock(p, c.t0, c.n);
    c.rawStart = cur.take(c.raw * B, "fp16 tokens");
    for (auto* v : {&c.escOff, &c.strOff, &c.escN, &c.strN}) v->resize(size_t(B));
    uint64_t off = uint64_t(cur.p - data);
    for (int b = 0; b < B; ++b) {
        c.escN[size_t(b)] = getU32(sizes + 4 * size_t(b));
        c.strN[size_t(b)] = getU32(sizes + 4 * size_t(B + b));
        c.escOff[size_t(b)] = size_t(off);
        off += c.escN[size_t(b)];
        c.strOff[size_t(b)] = size_t(off);
        off += c.strN[size_t(b)];
    }
    if (off != size)
        throw Error(where + ": block sizes add up to " + std::to_string(off) + " bytes, the payload has " + std::to_string(size));
    c.rope = chunkRopeTable(*p.transform, c.t0, c.n);
    return c;
}

void decodeUnit(const CodecParams& p, const ChunkLayout& c, const uint8_t* data, int u, int level, KvSet& out,
                const std::string& where)
{
    const int L = p.transform->numLayers;
    const KvKind kind = kKinds[u / L];
    const std::string w = where + ": " + kindName(kind) + (p.transform->settings.layerGroup > 1 ? " layer group " : " layer ") +
                          std::to_string(u % L);
    decodeBlock(p, kind, u % L, level, c.t0, c.n, c.rawStart + c.raw * size_t(u), data + c.escOff[size_t(u)],
                c.escN[size_t(u)], data + c.strOff[size_t(u)], c.strN[size_t(u)], c.rope->data(), out, w);
}

}  // namespace

void decodeTransformChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level, KvSet& out,
                          const std::string& where)
{
    const ChunkLayout c = parseLayout(p, data, size, chunk, where);
    parallelUnits(2 * p.transform->numLayers, [&](int u) { decodeUnit(p, c, data, u, level, out, where); });
}

// Every (chunk, block) pair in one parallel loop, so that threads do not wait for each other at
// the end of every chunk; pair k is block k / count of chunk k % count, so that a thread goes
// through one block's chunks in turn with its columns, tables and tiles in cache. Failures are
// ranked as decoding the chunks one by one would meet them: chunk first, its layout before its
// blocks, then the lowest block; only the first is rethrown.
void decodeTransformChunks(const CodecParams& p, const std::vector<ChunkPayload>& chunks, KvSet& out)
{
    const size_t count = chunks.size();
    std::vector<ChunkLayout> lay(count);
    std::exception_ptr error;
    size_t good = count;
    for (size_t i = 0; i < count && !error; ++i) {
        try {
            lay[i] = parseLayout(p, chunks[i].data, chunks[i].size, chunks[i].chunk, chunks[i].where);
        } catch (...) {
            error = std::current_exception();
            good = i;
        }
    }
    const int units = good > 0 ? 2 * p.transform->numLayers : 0, n = int(good);
    // A failing pair's chunk comes before a failing layout's (good is the first such chunk).
    parallelRanked(n * units, [&](int k) { return (long long)(k % n) * units + k / n; }, [&](int k) {
        const ChunkPayload& c = chunks[size_t(k % n)];
        decodeUnit(p, lay[size_t(k % n)], c.data, k / n, c.level, out, c.where);
    });
    if (error) std::rethrow_exception(error);
}

}  // namespace kvscope::detail
