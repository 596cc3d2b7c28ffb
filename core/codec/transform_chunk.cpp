// The transform codec's chunk payload (FORMAT.md "Chunk payloads", transform): per (kind, layer)
// block, the sink/recent tokens as fp16, the coded tokens' components as one symbol stream, and
// an escape list for values beyond a component's alphabet. The math is in transform.h.
#include "codec/codec_detail.h"
#include "codec/symbol_stream.h"
#include "codec/transform.h"

#include "common/half.h"

#include <cmath>

namespace kvscope::detail {

namespace {

// Tokens of the chunk stored as fp16 rather than coded: the cache's first sinkTokens and last
// recentTokens.
bool rawToken(const TransformModel& m, int T, int absolute)
{
    return absolute < m.settings.sinkTokens || absolute >= T - m.settings.recentTokens;
}

void putVarint(std::vector<uint8_t>& out, uint64_t v)
{
    while (v >= 0x80) {
        out.push_back(uint8_t(v | 0x80));
        v >>= 7;
    }
    out.push_back(uint8_t(v));
}

int bitsFor(int alphabet)
{
    int b = 0;
    while ((1 << b) < alphabet) ++b;
    return b;
}

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

struct BlockPayload {
    std::vector<uint16_t> raw;  // (H, raw tokens, D)
    std::vector<uint8_t> escapes, stream;
};

BlockPayload encodeBlock(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level, int t0, int n)
{
    const TransformModel& m = *p.transform;
    const int H = m.heads, D = m.headDim, C = H * D, T = p.shape.numTokens;
    const TransformBlock& b = m.block(kind, layer);
    const TransformLevelBlock& lb = m.levelBlock(level, kind, layer);
    std::vector<float> x;
    readBlock(kv, kind, layer, t0, n, x);  // (H, n, D)
    BlockPayload out;
    std::vector<int> codedTokens;
    for (int t = 0; t < n; ++t) {
        if (!rawToken(m, T, t0 + t)) {
            codedTokens.push_back(t);
            continue;
        }
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) out.raw.push_back(floatToHalf(x[(size_t(h) * n + t) * D + d]));
    }
    for (float v : x)
        if (!std::isfinite(v))
            throw Error(std::string(kindName(kind)) + " layer " + std::to_string(layer) + ": a value is not finite");
    if (kind == KvKind::Key && m.settings.ropeUndo)
        for (int h = 0; h < H; ++h)
            applyRope(x.data() + size_t(h) * n * D, n, D, m.ropeInvFreq.data(), m.ropePosition0, t0, true);

    const std::vector<int> coded = codedList(lb);
    const int K = int(coded.size()), R = int(codedTokens.size());
    std::vector<uint8_t> sym(size_t(R) * K);
    std::vector<float> v(static_cast<size_t>(C));
    for (int r = 0; r < R; ++r) {
        const int t = codedTokens[size_t(r)];
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) v[size_t(h * D + d)] = x[(size_t(h) * n + t) * D + d] - b.mean[size_t(h * D + d)];
        for (int k = 0; k < K; ++k) {
            const int j = coded[size_t(k)];
            const float* e = &b.encode[size_t(j) * C];
            float z = 0;
            for (int c = 0; c < C; ++c) z += e[c] * v[size_t(c)];
            const int M = lb.maxQ[size_t(j)];
            const double qd = std::nearbyint(double(z) / double(lb.step[size_t(j)]));
            const int64_t q = int64_t(std::max(-2147483647.0, std::min(2147483647.0, qd)));
            int s;
            if (q <= -M || q >= M) {
                s = q < 0 ? 0 : 2 * M;
                putVarint(out.escapes, uint64_t(q < 0 ? (uint64_t(-q) << 1) - 1 : uint64_t(q) << 1));
            } else {
                s = int(q) + M;
            }
            sym[size_t(r) * K + size_t(k)] = uint8_t(s);
        }
    }
    if (m.settings.entropy == TransformEntropy::Rans) {
        thread_local std::vector<CodingTable> tables;
        buildTables(lb, false, tables);
        encodeSymbolMatrix(sym.data(), R, K, tables.data(), out.stream);
    } else {
        uint64_t acc = 0;
        int bits = 0;
        for (int r = 0; r < R; ++r)
            for (int k = 0; k < K; ++k) {
                const int w = bitsFor(2 * lb.maxQ[size_t(coded[size_t(k)])] + 1);
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
    return out;
}

void decodeBlock(const CodecParams& p, KvKind kind, int layer, int level, int t0, int n, const uint8_t* raw,
                 const uint8_t* esc, size_t escBytes, const uint8_t* stream, size_t streamBytes, KvSet& outKv,
                 const std::string& where)
{
    const TransformModel& m = *p.transform;
    const int H = m.heads, D = m.headDim, C = H * D, T = p.shape.numTokens;
    const TransformBlock& b = m.block(kind, layer);
    const TransformLevelBlock& lb = m.levelBlock(level, kind, layer);
    const std::vector<int> coded = codedList(lb);
    const int K = int(coded.size());
    std::vector<int> codedTokens, rawTokens;
    for (int t = 0; t < n; ++t) (rawToken(m, T, t0 + t) ? rawTokens : codedTokens).push_back(t);
    const int R = int(codedTokens.size());

    std::vector<uint8_t> sym(size_t(R) * K);
    if (m.settings.entropy == TransformEntropy::Rans) {
        thread_local std::vector<CodingTable> tables;
        buildTables(lb, true, tables);
        decodeSymbolMatrix(stream, streamBytes, R, K, tables.data(), sym.data(), where);
    } else {
        uint64_t totalBits = 0;
        std::vector<int> width(static_cast<size_t>(K));
        for (int k = 0; k < K; ++k) {
            width[size_t(k)] = bitsFor(2 * lb.maxQ[size_t(coded[size_t(k)])] + 1);
            totalBits += uint64_t(width[size_t(k)]) * uint64_t(R);
        }
        if (streamBytes != (totalBits + 7) / 8)
            throw Error(where + ": fixed-width symbols take " + std::to_string((totalBits + 7) / 8) + " bytes, the block has " +
                        std::to_string(streamBytes));
        uint64_t acc = 0;
        int bits = 0;
        size_t pos = 0;
        for (int r = 0; r < R; ++r)
            for (int k = 0; k < K; ++k) {
                const int w = width[size_t(k)];
                while (bits < w) {
                    acc |= uint64_t(stream[pos++]) << bits;
                    bits += 8;
                }
                const int s = int(acc & ((uint64_t(1) << w) - 1));
                acc >>= w;
                bits -= w;
                if (s > 2 * lb.maxQ[size_t(coded[size_t(k)])])
                    throw Error(where + ": fixed-width symbol " + std::to_string(s) + " is outside its alphabet");
                sym[size_t(r) * K + size_t(k)] = uint8_t(s);
            }
    }

    // Decode matrix columns of the coded components, contiguous: acol[k * C + c] = A[c][j_k].
    std::vector<float> acol(size_t(K) * C), step(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) {
        const int j = coded[size_t(k)];
        step[size_t(k)] = lb.step[size_t(j)];
        for (int c = 0; c < C; ++c) acol[size_t(k) * C + size_t(c)] = b.decode[size_t(c) * C + size_t(j)];
    }
    std::vector<float> y(size_t(H) * n * D);  // (H, n, D)
    std::vector<float> v(static_cast<size_t>(C));
    const uint8_t* ep = esc;
    const uint8_t* const eend = esc + escBytes;
    for (int r = 0; r < R; ++r) {
        const int t = codedTokens[size_t(r)];
        for (int c = 0; c < C; ++c) v[size_t(c)] = b.mean[size_t(c)];
        for (int k = 0; k < K; ++k) {
            const int M = lb.maxQ[size_t(coded[size_t(k)])];
            const int s = sym[size_t(r) * K + size_t(k)];
            int64_t q = s - M;
            if (s == 0 || s == 2 * M) {
                uint64_t z = 0;
                for (int shift = 0;; shift += 7) {
                    if (ep == eend || shift > 28) throw Error(where + ": escape list is truncated or malformed");
                    const uint8_t byte = *ep++;
                    z |= uint64_t(byte & 0x7f) << shift;
                    if (!(byte & 0x80)) break;
                }
                q = (z & 1) ? -int64_t((z + 1) >> 1) : int64_t(z >> 1);
                if ((s == 0) != (q < 0) || (q > -M && q < M) || q > 2147483647 || q < -2147483647)
                    throw Error(where + ": escape value does not match its symbol");
            }
            if (q == 0) continue;
            const float zq = float(q) * step[size_t(k)];
            const float* a = &acol[size_t(k) * C];
            for (int c = 0; c < C; ++c) v[size_t(c)] += a[c] * zq;
        }
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) y[(size_t(h) * n + t) * D + d] = v[size_t(h * D + d)];
    }
    if (ep != eend) throw Error(where + ": escape list has unused bytes");
    if (kind == KvKind::Key && m.settings.ropeUndo)  // re-apply RoPE (raw rows are overwritten below)
        for (int h = 0; h < H; ++h)
            applyRope(y.data() + size_t(h) * n * D, n, D, m.ropeInvFreq.data(), m.ropePosition0, t0, false);
    size_t ri = 0;
    for (int t : rawTokens)
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d, ++ri)
                y[(size_t(h) * n + t) * D + d] = halfToFloat(uint16_t(raw[2 * ri] | raw[2 * ri + 1] << 8));
    writeBlock(outKv, kind, layer, t0, n, y.data());
}

size_t rawBytesPerBlock(const CodecParams& p, int t0, int n)
{
    const TransformModel& m = *p.transform;
    size_t raw = 0;
    for (int t = 0; t < n; ++t) raw += rawToken(m, p.shape.numTokens, t0 + t);
    return raw * size_t(p.shape.channels()) * 2;
}

}  // namespace

std::vector<uint8_t> encodeTransformChunk(const CodecParams& p, const KvSet& kv, int chunk, int level)
{
    KVSCOPE_ASSERT(p.transform);
    const int L = p.shape.numLayers, B = 2 * L, t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    std::vector<BlockPayload> blocks(static_cast<size_t>(B));
    parallelUnits(B, [&](int u) { blocks[size_t(u)] = encodeBlock(p, kv, kKinds[u / L], u % L, level, t0, n); });
    std::vector<uint8_t> out;
    for (const BlockPayload& b : blocks) putU32(out, uint32_t(b.escapes.size()));
    for (const BlockPayload& b : blocks) putU32(out, uint32_t(b.stream.size()));
    for (const BlockPayload& b : blocks) putU16s(out, b.raw.data(), b.raw.size());
    for (const BlockPayload& b : blocks) {
        out.insert(out.end(), b.escapes.begin(), b.escapes.end());
        out.insert(out.end(), b.stream.begin(), b.stream.end());
    }
    return out;
}

void decodeTransformChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level, KvSet& out,
                          const std::string& where)
{
    if (!p.transform) throw Error(where + ": the transform codec needs its model (transform section)");
    const int L = p.shape.numLayers, B = 2 * L, t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    Cursor cur{data, data + size, where};
    const uint8_t* sizes = cur.take(8 * size_t(B), "size arrays");
    const size_t raw = rawBytesPerBlock(p, t0, n);
    const uint8_t* rawStart = cur.take(raw * B, "fp16 tokens");
    std::vector<size_t> escOff(static_cast<size_t>(B)), strOff(static_cast<size_t>(B)), escN(static_cast<size_t>(B)),
        strN(static_cast<size_t>(B));
    uint64_t off = uint64_t(cur.p - data);
    for (int b = 0; b < B; ++b) {
        escN[size_t(b)] = getU32(sizes + 4 * size_t(b));
        strN[size_t(b)] = getU32(sizes + 4 * size_t(B + b));
        escOff[size_t(b)] = size_t(off);
        off += escN[size_t(b)];
        strOff[size_t(b)] = size_t(off);
        off += strN[size_t(b)];
    }
    if (off != size)
        throw Error(where + ": block sizes add up to " + std::to_string(off) + " bytes, the payload has " + std::to_string(size));
    parallelUnits(B, [&](int u) {
        const KvKind kind = kKinds[u / L];
        const std::string w = where + ": " + kindName(kind) + " layer " + std::to_string(u % L);
        decodeBlock(p, kind, u % L, level, t0, n, rawStart + raw * size_t(u), data + escOff[size_t(u)], escN[size_t(u)],
                    data + strOff[size_t(u)], strN[size_t(u)], out, w);
    });
}

}  // namespace kvscope::detail
