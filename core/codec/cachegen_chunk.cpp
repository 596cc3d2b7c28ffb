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

void inBandUnitTables(const QuantizedBlock& q, int roles, bool perHead, UnitTables& tab, std::vector<uint8_t>& serialized)
{
    thread_local std::vector<uint32_t> flat;
    const size_t stride = countUnit(q, roles, perHead, flat);
    const int n = perHead ? q.spec.heads : q.spec.channels();
    tab.resize(roles, n, perHead ? q.spec.headDim : 1);
    for (int role = 0; role < roles; ++role)
        for (int c = 0; c < n; ++c) {
            const size_t i = size_t(role) * n + size_t(c);
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
    if (p.entropy == EntropyLayout::Rans4x8 && perHeadTables(p))
        throw Error("version-1 streams need per-channel tables (table_scope channel)");
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
            inBandUnitTables(q, roles, perHeadTables(p), tab, tableBytes[size_t(u)]);
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


namespace {

// Where each part of one cachegen payload lies, every size checked against the payload first.
struct ChunkLayout {
    int n = 0, level = 0;
    std::vector<uint32_t> tableSize, streamSize;
    std::vector<const uint8_t*> tablePtr, scalePtr, streamPtr;
    std::vector<quant::BlockSpec> specs;
};

void parseLayout(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level, bool shared,
                 const std::string& where, ChunkLayout& lay)
{
    const int L = p.shape.numLayers, H = p.shape.numKvHeads;
    lay.n = p.chunkLength(chunk);
    lay.level = level;
    Cursor cur{data, data + size, where};
    const size_t units = size_t(2) * L;
    lay.tableSize.assign(units, 0);
    lay.streamSize.resize(units * H);
    if (!shared) {
        const uint8_t* b = cur.take(4 * units, "table size list");
        for (size_t u = 0; u < units; ++u) lay.tableSize[u] = getU32(b + 4 * u);
    }
    const uint8_t* sb = cur.take(4 * units * H, "stream size list");
    for (size_t i = 0; i < units * H; ++i) lay.streamSize[i] = getU32(sb + 4 * i);
    lay.tablePtr.resize(units), lay.scalePtr.resize(units), lay.streamPtr.resize(units * H), lay.specs.resize(units);
    for (size_t u = 0; u < units; ++u) lay.tablePtr[u] = cur.take(lay.tableSize[u], "probability tables");
    for (size_t u = 0; u < units; ++u) {
        lay.specs[u] = cachegenBlockSpec(p, kKinds[u / L], int(u % L), level, lay.n);
        lay.scalePtr[u] = cur.take(2 * size_t(lay.specs[u].numScales()), "scales");
    }
    for (size_t i = 0; i < units * H; ++i) lay.streamPtr[i] = cur.take(lay.streamSize[i], "entropy-coded stream");
    if (cur.p != cur.end) throw Error(where + ": " + std::to_string(cur.end - cur.p) + " unexpected bytes after the last stream");
}

// Parses unit u's in-band tables into tab (decoding form).
void parseUnitTables(const CodecParams& p, const ChunkLayout& lay, int u, UnitTables& tab, const std::string& unitWhere)
{
    const int n = tablesPerRole(p), roles = numRoles(p);
    const bool perHead = perHeadTables(p);
    const quant::BlockSpec& b = lay.specs[size_t(u)];
    tab.resize(roles, n, channelsPerTable(p));
    const uint8_t* tp = lay.tablePtr[size_t(u)];
    const uint8_t* te = tp + lay.tableSize[size_t(u)];
    for (int role = 0; role < roles; ++role)
        for (int c = 0; c < n; ++c) {
            std::string why;
            if (!parseCodingTable(&tp, te, quant::alphabetSize(role ? b.anchorBins : b.bins),
                                  &tab.tables[size_t(role) * n + c], &why))
                throw Error(unitWhere + ": " + (perHead ? "head " : "channel ") + std::to_string(c) + ": " + why);
        }
    if (tp != te) throw Error(unitWhere + ": unexpected bytes after the probability tables");
}

// Decodes unit u (one kind and layer) of a chunk whose tables are in tab.
void decodeUnit(const CodecParams& p, const ChunkLayout& lay, int chunk, int u, const UnitTables& tab, KvSet& out,
                const std::string& unitWhere)
{
    const int L = p.shape.numLayers, H = p.shape.numKvHeads;
    const KvKind kind = kKinds[u / L];
    const int layer = u % L, t0 = p.chunkStart(chunk), n = lay.n;
    const quant::BlockSpec& b = lay.specs[size_t(u)];
    thread_local std::vector<uint16_t> scales;
    scales.resize(size_t(b.numScales()));
    getU16s(lay.scalePtr[size_t(u)], scales.data(), scales.size());
    if (p.entropy == EntropyLayout::Rans32x16) {  // straight into the output rows
        const size_t row = size_t(b.headDim) * dtypeSize(out.dtype());
        thread_local std::vector<const uint8_t*> ptr;
        thread_local std::vector<size_t> len;
        thread_local std::vector<uint8_t*> dst;
        ptr.resize(size_t(H)), len.resize(size_t(H)), dst.resize(size_t(H));
        for (int h = 0; h < H; ++h) {
            const size_t i = size_t(u) * H + size_t(h);
            ptr[size_t(h)] = lay.streamPtr[i];
            len[size_t(h)] = lay.streamSize[i];
            dst[size_t(h)] = out.data(kind, layer) + (size_t(h) * p.shape.numTokens + size_t(t0)) * row;
        }
        decodeHeadStreamsV2(b, ptr.data(), len.data(), tab, scales.data(), rowOutFor(out.dtype()), dst.data(), unitWhere);
        return;
    }
    std::vector<float> x(size_t(n) * b.headDim);
    for (int h = 0; h < H; ++h) {
        const size_t i = size_t(u) * H + size_t(h);
        decodeHeadStream(b, h, lay.streamPtr[i], lay.streamSize[i], tab, scales.data(), x.data(), unitWhere);
        out.writeRows(kind, layer, h, t0, n, x.data());
    }
}

std::string unitWhereOf(const std::string& where, int L, int u)
{
    return where + ": " + kindName(kKinds[u / L]) + " layer " + std::to_string(u % L);
}

}  // namespace

void decodeCacheGenChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                         const LevelTables* shared, KvSet& out, const std::string& where)
{
    const int L = p.shape.numLayers;
    if ((p.profile.tables == TableMode::Shared) != (shared != nullptr))
        throw Error(where + ": shared probability tables are missing");
    ChunkLayout lay;
    parseLayout(p, data, size, chunk, level, shared != nullptr, where, lay);
    parallelUnits(2 * L, [&](int u) {
        const std::string unitWhere = unitWhereOf(where, L, u);
        thread_local UnitTables tab;
        if (shared) sharedUnitTables(p, *shared, kKinds[u / L], u % L, true, tab);
        else parseUnitTables(p, lay, u, tab, unitWhere);
        decodeUnit(p, lay, chunk, u, tab, out, unitWhere);
    });
}

void decodeCacheGenChunks(const CodecParams& p, const std::vector<ChunkPayload>& chunks,
                          const std::vector<LevelTables>* shared, KvSet& out)
{
    const int L = p.shape.numLayers, units = 2 * L;
    const size_t count = chunks.size();
    // Failures are ranked as decoding the chunks one by one would meet them: chunk first, then its
    // layout before its units, then the lowest unit; only the lowest is rethrown.
    std::mutex m;
    size_t errorRank = SIZE_MAX;
    std::exception_ptr error;
    auto fail = [&](size_t rank) {
        std::lock_guard<std::mutex> lock(m);
        if (rank < errorRank) {
            errorRank = rank;
            error = std::current_exception();
        }
    };
    auto rank = [&](size_t i, int u) { return i * size_t(units + 1) + size_t(u + 1); };  // u = -1: the layout
    std::vector<ChunkLayout> lay(count);
    for (size_t i = 0; i < count; ++i) {
        const ChunkPayload& c = chunks[i];
        try {
            if ((p.profile.tables == TableMode::Shared) != (shared != nullptr) ||
                (shared && (c.level < 1 || size_t(c.level) > shared->size())))
                throw Error(c.where + ": shared probability tables are missing");
            parseLayout(p, c.data, c.size, c.chunk, c.level, shared != nullptr, c.where, lay[i]);
        } catch (...) {
            fail(rank(i, -1));
            break;
        }
    }
    const size_t good = errorRank == SIZE_MAX ? count : errorRank / size_t(units + 1);  // chunks before a bad layout
    // Unit-major: one (kind, layer) through every chunk, so that shared tables are built once per
    // unit and stay in cache across chunks, instead of once per chunk and unit.
#pragma omp parallel for schedule(dynamic, 1)
    for (int u = 0; u < units; ++u) {
        thread_local UnitTables tab;
        int builtLevel = 0;
        for (size_t i = 0; i < good; ++i) {
            const ChunkPayload& c = chunks[i];
            try {
                const std::string unitWhere = unitWhereOf(c.where, L, u);
                if (shared) {
                    if (builtLevel != c.level) {
                        sharedUnitTables(p, (*shared)[size_t(c.level - 1)], kKinds[u / L], u % L, true, tab);
                        builtLevel = c.level;
                    }
                } else {
                    parseUnitTables(p, lay[i], u, tab, unitWhere);
                }
                decodeUnit(p, lay[i], c.chunk, u, tab, out, unitWhere);
            } catch (...) {
                fail(rank(i, u));
                break;  // later chunks of this unit rank higher
            }
        }
    }
    if (error) std::rethrow_exception(error);
}

}  // namespace kvscope::detail
