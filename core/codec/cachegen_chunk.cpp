// The CacheGen chunk payload (FORMAT.md, "Chunk payloads: cachegen"): every (kind, layer) block
// quantized per token or per channel, optionally delta-coded against anchors, then one rANS
// stream per head with in-band or shared probability tables.
#include "codec/codec_detail.h"

namespace kvscope::detail {

QuantizedBlock quantizeUnit(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level, int t0, int n)
{
    QuantizedBlock q;
    q.spec = cachegenBlockSpec(p, kind, layer, level, n);
    thread_local std::vector<float> x;  // reused: a fresh block-sized buffer per unit costs page faults
    readBlock(kv, kind, layer, t0, n, x);
    q.sym.resize(x.size());
    q.scales.resize(size_t(q.spec.numScales()));
    quant::quantizeBlock(q.spec, x.data(), q.sym.data(), q.scales.data());
    return q;
}

void inBandUnitTables(const QuantizedBlock& q, int roles, UnitTables& tab, std::vector<uint8_t>& serialized)
{
    thread_local std::vector<uint32_t> flat;
    const size_t stride = countUnit(q, roles, flat);
    const int C = q.spec.channels();
    tab.tables.resize(size_t(roles) * C);
    for (int role = 0; role < roles; ++role)
        for (int c = 0; c < C; ++c) {
            const size_t i = size_t(role) * C + size_t(c);
            const int a = quant::alphabetSize(role ? q.spec.anchorBins : q.spec.bins);
            buildCodingTable(flat.data() + i * stride, a, &tab.tables[i], false);
            serializeCodingTable(tab.tables[i], a, serialized);
        }
}

std::vector<uint8_t> encodeCacheGenChunk(const CodecParams& p, const KvSet& kv, int chunk, int level,
                                         const LevelTables* shared)
{
    const int L = p.shape.numLayers, H = p.shape.numKvHeads;
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    KVSCOPE_ASSERT((p.profile.tables == TableMode::Shared) == (shared != nullptr));
    const int roles = numRoles(p);
    std::vector<std::vector<uint8_t>> tableBytes(size_t(2) * L), scaleBytes(size_t(2) * L);
    std::vector<std::vector<std::vector<uint8_t>>> streams(size_t(2) * L, std::vector<std::vector<uint8_t>>(size_t(H)));
    parallelUnits(2 * L, [&](int u) {
        const KvKind kind = kKinds[u / L];
        const int layer = u % L;
        const QuantizedBlock q = quantizeUnit(p, kv, kind, layer, level, t0, n);
        const quant::BlockSpec& b = q.spec;
        const std::vector<uint8_t>& sym = q.sym;
        putU16s(scaleBytes[size_t(u)], q.scales.data(), q.scales.size());

        thread_local UnitTables tab;
        if (shared) {
            sharedUnitTables(p, *shared, kind, layer, false, tab);
        } else {
            inBandUnitTables(q, roles, tab, tableBytes[size_t(u)]);
        }
        for (int h = 0; h < H; ++h) {
            if (p.entropy == EntropyLayout::Rans4x8) encodeHeadStream(b, h, sym.data(), tab, streams[size_t(u)][size_t(h)]);
            else encodeHeadStreamV2(b, h, sym.data(), tab, streams[size_t(u)][size_t(h)]);
        }
    });

    // Layout: [u32 table sizes (in-band only)] [u32 stream sizes] [tables] [scales] [streams]
    std::vector<uint8_t> out;
    if (!shared)
        for (auto& t : tableBytes) putU32(out, uint32_t(t.size()));
    for (auto& unit : streams)
        for (auto& s : unit) putU32(out, uint32_t(s.size()));
    for (auto& t : tableBytes) out.insert(out.end(), t.begin(), t.end());
    for (auto& s : scaleBytes) out.insert(out.end(), s.begin(), s.end());
    for (auto& unit : streams)
        for (auto& s : unit) out.insert(out.end(), s.begin(), s.end());
    return out;
}


void decodeCacheGenChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                         const LevelTables* shared, KvSet& out, const std::string& where)
{
    const int L = p.shape.numLayers, H = p.shape.numKvHeads, C = p.shape.channels();
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    if ((p.profile.tables == TableMode::Shared) != (shared != nullptr))
        throw Error(where + ": shared probability tables are missing");
    const int roles = numRoles(p);
    Cursor cur{data, data + size, where};
    const size_t units = size_t(2) * L;
    std::vector<uint32_t> tableSize(units, 0), streamSize(units * H);
    if (!shared) {
        const uint8_t* b = cur.take(4 * units, "table size list");
        for (size_t u = 0; u < units; ++u) tableSize[u] = getU32(b + 4 * u);
    }
    const uint8_t* sb = cur.take(4 * units * H, "stream size list");
    for (size_t i = 0; i < units * H; ++i) streamSize[i] = getU32(sb + 4 * i);

    // Section offsets, each checked against the payload size before any decoding starts.
    std::vector<const uint8_t*> tablePtr(units), scalePtr(units), streamPtr(units * H);
    for (size_t u = 0; u < units; ++u) tablePtr[u] = cur.take(tableSize[u], "probability tables");
    std::vector<quant::BlockSpec> specs(units);
    for (size_t u = 0; u < units; ++u) {
        specs[u] = cachegenBlockSpec(p, kKinds[u / L], int(u % L), level, n);
        scalePtr[u] = cur.take(2 * size_t(specs[u].numScales()), "scales");
    }
    for (size_t i = 0; i < units * H; ++i) streamPtr[i] = cur.take(streamSize[i], "entropy-coded stream");
    if (cur.p != cur.end) throw Error(where + ": " + std::to_string(cur.end - cur.p) + " unexpected bytes after the last stream");

    parallelUnits(int(units), [&](int u) {
        const KvKind kind = kKinds[u / L];
        const int layer = u % L;
        const quant::BlockSpec& b = specs[size_t(u)];
        const std::string unitWhere = where + ": " + kindName(kind) + " layer " + std::to_string(layer);
        thread_local UnitTables tab;
        if (shared) {
            sharedUnitTables(p, *shared, kind, layer, true, tab);
        } else {
            tab.tables.resize(size_t(roles) * C);
            const uint8_t* tp = tablePtr[size_t(u)];
            const uint8_t* te = tp + tableSize[size_t(u)];
            for (int role = 0; role < roles; ++role)
                for (int c = 0; c < C; ++c) {
                    std::string why;
                    if (!parseCodingTable(&tp, te, quant::alphabetSize(role ? b.anchorBins : b.bins),
                                          &tab.tables[size_t(role) * C + c], &why))
                        throw Error(unitWhere + ": channel " + std::to_string(c) + ": " + why);
                }
            if (tp != te) throw Error(unitWhere + ": unexpected bytes after the probability tables");
        }
        std::vector<uint16_t> scales(static_cast<size_t>(b.numScales()));
        getU16s(scalePtr[size_t(u)], scales.data(), scales.size());
        if (p.entropy == EntropyLayout::Rans32x16) {  // straight into the output rows
            const size_t row = size_t(b.headDim) * dtypeSize(out.dtype());
            thread_local std::vector<const uint8_t*> ptr;
            thread_local std::vector<size_t> len;
            thread_local std::vector<uint8_t*> dst;
            ptr.resize(size_t(H)), len.resize(size_t(H)), dst.resize(size_t(H));
            for (int h = 0; h < H; ++h) {
                const size_t i = size_t(u) * H + size_t(h);
                ptr[size_t(h)] = streamPtr[i];
                len[size_t(h)] = streamSize[i];
                dst[size_t(h)] = out.data(kind, layer) + (size_t(h) * p.shape.numTokens + size_t(t0)) * row;
            }
            decodeHeadStreamsV2(b, ptr.data(), len.data(), tab, scales.data(), rowOutFor(out.dtype()), dst.data(), unitWhere);
            return;
        }
        std::vector<float> x(size_t(n) * b.headDim);
        for (int h = 0; h < H; ++h) {
            const size_t i = size_t(u) * H + size_t(h);
            decodeHeadStream(b, h, streamPtr[i], streamSize[i], tab, scales.data(), x.data(), unitWhere);
            out.writeRows(kind, layer, h, t0, n, x.data());
        }
    });
}


}  // namespace kvscope::detail
