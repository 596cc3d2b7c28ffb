// The baselines researchers compare against, as chunk payloads (FORMAT.md, "Chunk payloads"):
// fp16, CacheGen's 8-bit per-token quantization, KIVI-2/4 and zstd-3 over the fp16 bytes.
#include "codec/codec_detail.h"

#include "common/half.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvscope::detail {

namespace {

// int8: CacheGen's "default quantization" baseline, per (layer, token) symmetric 8-bit.
quant::BlockSpec int8Spec(const CodecParams& p, int n)
{
    quant::BlockSpec b;
    b.heads = p.shape.numKvHeads;
    b.headDim = p.shape.headDim;
    b.tokens = n;
    b.quantizer = Quantizer::PerToken;
    b.bins = b.anchorBins = 256;
    b.deltaGroup = 0;
    return b;
}

// KIVI: asymmetric round-to-nearest with fp16 min and scale per group.
struct KiviGroupParams {
    uint16_t minBits, scaleBits;
};

KiviGroupParams kiviParams(float lo, float hi, int levels)
{
    uint16_t mn = floatToHalf(lo);
    while (halfToFloat(mn) > lo) mn = uint16_t(mn & 0x8000u ? mn + 1 : (mn == 0 ? 0x8001u : mn - 1));
    const float range = hi - halfToFloat(mn);
    uint16_t sc = 0;
    if (range > 0.0f) {
        sc = floatToHalf(range / float(levels - 1));
        while (halfToFloat(sc) * float(levels - 1) < range) ++sc;
    }
    return {mn, sc};
}

// Packs b-bit symbols (b = 2 or 4), first symbol in the low bits of each byte.
void packBits(const uint8_t* sym, size_t n, int bits, std::vector<uint8_t>& out)
{
    const int per = 8 / bits;
    for (size_t i = 0; i < n; i += size_t(per)) {
        uint8_t byte = 0;
        for (int k = 0; k < per && i + size_t(k) < n; ++k) byte = uint8_t(byte | (sym[i + size_t(k)] << (k * bits)));
        out.push_back(byte);
    }
}

void unpackBits(const uint8_t* packed, size_t n, int bits, uint8_t* sym)
{
    const int per = 8 / bits;
    const uint8_t mask = uint8_t((1u << bits) - 1);
    for (size_t i = 0; i < n; ++i) sym[i] = uint8_t((packed[i / size_t(per)] >> ((i % size_t(per)) * bits)) & mask);
}

int kiviBits(CodecId c) { return c == CodecId::Kivi2 ? 2 : 4; }

// Number of leading tokens of a chunk that KIVI quantizes (the rest fall in the fp16 residual).
int kiviQuantized(const CodecParams& p, int chunk)
{
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    const int residualStart = std::max(0, p.shape.numTokens - kKiviResidual);
    return std::clamp(residualStart - t0, 0, n);
}

// Group g of a KIVI block: keys group tokens per channel, values group channels per token.
// Calls f(index into the (heads, n, head_dim) block) for every member.
template <typename F>
void forKiviGroups(KvKind kind, int heads, int nq, int n, int headDim, F f /* f(group, idx) */)
{
    const int C = heads * headDim;
    int group = 0;
    if (kind == KvKind::Key) {
        for (int c = 0; c < C; ++c)
            for (int g0 = 0; g0 < nq; g0 += kKiviGroup, ++group)
                for (int t = g0; t < std::min(nq, g0 + kKiviGroup); ++t)
                    f(group, (size_t(c / headDim) * n + t) * headDim + size_t(c % headDim));
    } else {
        for (int t = 0; t < nq; ++t)
            for (int c0 = 0; c0 < C; c0 += kKiviGroup, ++group)
                for (int c = c0; c < std::min(C, c0 + kKiviGroup); ++c)
                    f(group, (size_t(c / headDim) * n + t) * headDim + size_t(c % headDim));
    }
}

int kiviGroupCount(KvKind kind, int C, int nq)
{
    if (nq == 0) return 0;
    return kind == KvKind::Key ? C * ((nq + kKiviGroup - 1) / kKiviGroup) : nq * ((C + kKiviGroup - 1) / kKiviGroup);
}

// One (kind, layer) block of a baseline codec, encoded into out.
void encodeBaselineBlock(const CodecParams& p, KvKind kind, int chunk, const std::vector<float>& x,
                         std::vector<uint8_t>& out)
{
    const int n = p.chunkLength(chunk), H = p.shape.numKvHeads, D = p.shape.headDim, C = H * D;
    switch (p.codec) {
    case CodecId::Fp16:
    case CodecId::Zstd:
        for (float v : x) {
            const uint16_t h = floatToHalf(v);
            out.push_back(uint8_t(h));
            out.push_back(uint8_t(h >> 8));
        }
        return;
    case CodecId::Int8: {
        const quant::BlockSpec b = int8Spec(p, n);
        std::vector<uint8_t> sym(x.size());
        std::vector<uint16_t> scales(static_cast<size_t>(n));
        quant::quantizeBlock(b, x.data(), sym.data(), scales.data());
        putU16s(out, scales.data(), scales.size());
        out.insert(out.end(), sym.begin(), sym.end());
        return;
    }
    case CodecId::Kivi2:
    case CodecId::Kivi4: {
        const int bits = kiviBits(p.codec), levels = 1 << bits;
        const int nq = kiviQuantized(p, chunk);
        const int groups = kiviGroupCount(kind, C, nq);
        std::vector<float> lo(size_t(groups), INFINITY), hi(size_t(groups), -INFINITY);
        forKiviGroups(kind, H, nq, n, D, [&](int g, size_t i) {
            if (!std::isfinite(x[i])) throw Error("KV value is not finite (NaN or infinity)");
            lo[size_t(g)] = std::min(lo[size_t(g)], x[i]);
            hi[size_t(g)] = std::max(hi[size_t(g)], x[i]);
        });
        std::vector<KiviGroupParams> gp(static_cast<size_t>(groups));
        for (int g = 0; g < groups; ++g) {
            gp[size_t(g)] = kiviParams(lo[size_t(g)], hi[size_t(g)], levels);
            putU16s(out, &gp[size_t(g)].minBits, 1);
            putU16s(out, &gp[size_t(g)].scaleBits, 1);
        }
        // quantized symbols in (head, token < nq, d) order, then the fp16 residual tokens
        std::vector<uint8_t> sym(size_t(H) * nq * D);
        std::vector<uint8_t> full(x.size(), 0);
        forKiviGroups(kind, H, nq, n, D, [&](int g, size_t i) {
            const float mn = halfToFloat(gp[size_t(g)].minBits), sc = halfToFloat(gp[size_t(g)].scaleBits);
            const int q = sc > 0.0f ? int(std::lrint((x[i] - mn) / sc)) : 0;
            full[i] = uint8_t(std::clamp(q, 0, levels - 1));
        });
        for (int h = 0; h < H; ++h)
            for (int t = 0; t < nq; ++t)
                std::memcpy(&sym[(size_t(h) * nq + t) * D], &full[(size_t(h) * n + t) * D], size_t(D));
        packBits(sym.data(), sym.size(), bits, out);
        for (int h = 0; h < H; ++h)
            for (int t = nq; t < n; ++t)
                for (int d = 0; d < D; ++d) {
                    const uint16_t hb = floatToHalf(x[(size_t(h) * n + t) * D + d]);
                    out.push_back(uint8_t(hb));
                    out.push_back(uint8_t(hb >> 8));
                }
        return;
    }
    case CodecId::CacheGen:
    case CodecId::Transform: break; // coded by their own chunk layouts
    }
    KVSCOPE_ASSERT(false);
}

void decodeBaselineBlock(const CodecParams& p, KvKind kind, int chunk, Cursor& cur, std::vector<float>& x)
{
    const int n = p.chunkLength(chunk), H = p.shape.numKvHeads, D = p.shape.headDim, C = H * D;
    x.assign(blockValues(p, n), 0.0f);
    switch (p.codec) {
    case CodecId::Fp16:
    case CodecId::Zstd: {
        const uint8_t* b = cur.take(2 * x.size(), "fp16 values");
        for (size_t i = 0; i < x.size(); ++i) x[i] = halfToFloat(uint16_t(b[2 * i] | b[2 * i + 1] << 8));
        return;
    }
    case CodecId::Int8: {
        const quant::BlockSpec b = int8Spec(p, n);
        std::vector<uint16_t> scales(static_cast<size_t>(n));
        getU16s(cur.take(2 * size_t(n), "int8 scales"), scales.data(), scales.size());
        const uint8_t* sym = cur.take(x.size(), "int8 symbols");
        quant::dequantizeBlock(b, sym, scales.data(), x.data());
        return;
    }
    case CodecId::Kivi2:
    case CodecId::Kivi4: {
        const int bits = kiviBits(p.codec);
        const int nq = kiviQuantized(p, chunk);
        const int groups = kiviGroupCount(kind, C, nq);
        const uint8_t* gb = cur.take(4 * size_t(groups), "KIVI group parameters");
        const size_t nsym = size_t(H) * nq * D;
        const uint8_t* packed = cur.take((nsym * size_t(bits) + 7) / 8, "KIVI symbols");
        std::vector<uint8_t> sym(nsym);
        unpackBits(packed, nsym, bits, sym.data());
        forKiviGroups(kind, H, nq, n, D, [&](int g, size_t i) {
            const uint16_t mn = uint16_t(gb[4 * g] | gb[4 * g + 1] << 8);
            const uint16_t sc = uint16_t(gb[4 * g + 2] | gb[4 * g + 3] << 8);
            const size_t h = i / (size_t(n) * D), t = (i / D) % size_t(n), d = i % D;
            x[i] = halfToFloat(mn) + float(sym[(h * nq + t) * D + d]) * halfToFloat(sc);
        });
        const uint8_t* res = cur.take(2 * size_t(H) * (n - nq) * D, "KIVI fp16 residual");
        size_t k = 0;
        for (int h = 0; h < H; ++h)
            for (int t = nq; t < n; ++t)
                for (int d = 0; d < D; ++d, ++k)
                    x[(size_t(h) * n + t) * D + d] = halfToFloat(uint16_t(res[2 * k] | res[2 * k + 1] << 8));
        return;
    }
    case CodecId::CacheGen:
    case CodecId::Transform: break; // coded by their own chunk layouts
    }
    KVSCOPE_ASSERT(false);
}

}  // namespace

std::vector<uint8_t> encodeBaselineChunk(const CodecParams& p, const KvSet& kv, int chunk)
{
    const int L = p.shape.numLayers;
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    std::vector<std::vector<uint8_t>> units(size_t(2) * L);
    parallelUnits(2 * L, [&](int u) {
        std::vector<float> x;
        readBlock(kv, kKinds[u / L], u % L, t0, n, x);
        encodeBaselineBlock(p, kKinds[u / L], chunk, x, units[size_t(u)]);
    });
    std::vector<uint8_t> out;
    for (auto& u : units) out.insert(out.end(), u.begin(), u.end());
    if (p.codec != CodecId::Zstd) return out;
    std::vector<uint8_t> z(ZSTD_compressBound(out.size()));
    const size_t zn = ZSTD_compress(z.data(), z.size(), out.data(), out.size(), 3);
    KVSCOPE_ASSERT(!ZSTD_isError(zn));
    z.resize(zn);
    return z;
}

void decodeBaselineChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, KvSet& out,
                         const std::string& where)
{
    const int L = p.shape.numLayers;
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    std::vector<uint8_t> raw;
    if (p.codec == CodecId::Zstd) {
        const size_t expected = 2 * size_t(2) * L * blockValues(p, n);
        const unsigned long long declared = ZSTD_getFrameContentSize(data, size);
        if (declared != expected)
            throw Error(where + ": zstd frame holds " +
                        (declared == ZSTD_CONTENTSIZE_ERROR ? std::string("no valid frame")
                                                            : std::to_string(declared) + " bytes") +
                        ", expected " + std::to_string(expected));
        raw.resize(expected);
        const size_t got = ZSTD_decompress(raw.data(), raw.size(), data, size);
        if (ZSTD_isError(got) || got != expected)
            throw Error(where + ": zstd frame is corrupt (" +
                        (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short output") + ")");
        data = raw.data();
        size = raw.size();
    }
    Cursor cur{data, data + size, where};
    std::vector<float> x;
    for (int u = 0; u < 2 * L; ++u) {  // sequential: baseline blocks are not self-delimiting
        decodeBaselineBlock(p, kKinds[u / L], chunk, cur, x);
        writeBlock(out, kKinds[u / L], u % L, t0, n, x.data());
    }
    if (cur.p != cur.end) throw Error(where + ": " + std::to_string(cur.end - cur.p) + " unexpected bytes after the last block");
    return;
}

}  // namespace kvscope::detail
