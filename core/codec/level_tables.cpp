// Probability tables per level: symbol counting, shared tables calibrated on several caches,
// their serialised form (FORMAT.md, "Table order") and the tables a profile carries.
#include "codec/codec_detail.h"

#include "common/error.h"

namespace kvscope {

using namespace detail;

namespace detail {

// Fills tab for one block from the shared tables of its level.
void sharedUnitTables(const CodecParams& p, const LevelTables& shared, KvKind kind, int layer, bool forDecoding,
                      UnitTables& tab)
{
    const int n = tablesPerRole(p), roles = numRoles(p);
    tab.resize(roles, n, channelsPerTable(p));
    for (int role = 0; role < roles; ++role)
        for (int c = 0; c < n; ++c)
            toCodingTable(shared.at(p, kind, layer, role, c), &tab.tables[size_t(role) * n + c], forDecoding);
}

}  // namespace detail

const ProbTable& LevelTables::at(const CodecParams& p, KvKind kind, int layer, int role, int channel) const
{
    return tables[index(p, kind, layer, role, channel)];
}

size_t LevelTables::index(const CodecParams& p, KvKind kind, int layer, int role, int table)
{
    const size_t n = size_t(tablesPerRole(p));
    return ((size_t(kind) * p.shape.numLayers + size_t(layer)) * size_t(numRoles(p)) + size_t(role)) * n +
           size_t(table);
}

void countChunkSymbols(const CodecParams& p, const KvSet& kv, int chunk, int level, LevelCounts& counts)
{
    const int L = p.shape.numLayers, C = tablesPerRole(p), roles = numRoles(p);
    const bool perHead = perHeadTables(p);
    const size_t numTables = size_t(2) * L * roles * C;
    if (counts.counts.empty()) {
        counts.counts.resize(numTables);
        for (int k = 0; k < 2; ++k)
            for (int l = 0; l < L; ++l)
                for (int role = 0; role < roles; ++role) {
                    const int bins = p.binsFor(kKinds[k], l, level);
                    const int a = quant::alphabetSize(role == 1 ? p.profile.anchorBinsFor(bins) : bins);
                    for (int c = 0; c < C; ++c)
                        counts.counts[LevelTables::index(p, kKinds[k], l, role, c)].assign(size_t(a), 0);
                }
    }
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    parallelUnits(2 * L, [&](int u) {
        const KvKind kind = kKinds[u / L];
        const int layer = u % L;
        const QuantizedBlock q = quantizeUnit(p, kv, kind, layer, level, t0, n);
        std::vector<uint32_t> flat;
        const size_t stride = countUnit(q, roles, perHead, flat);
        const size_t base = LevelTables::index(p, kind, layer, 0, 0);
        for (size_t i = 0; i < size_t(roles) * C; ++i)  // tables of one block are disjoint across units
            for (size_t sy = 0; sy < counts.counts[base + i].size(); ++sy) counts.counts[base + i][sy] += flat[i * stride + sy];
    });
}

// The counts already follow the table order (and carry each table's alphabet), so the params and
// level of these two only name what the tables belong to.
LevelTables tablesFromCounts(const CodecParams& /*p*/, int /*level*/, const LevelCounts& counts)
{
    LevelTables t;
    t.tables.reserve(counts.counts.size());
    for (const auto& c : counts.counts) t.tables.push_back(buildProbTable(c.data(), int(c.size())));
    return t;
}

void serializeLevelTables(const CodecParams& /*p*/, int /*level*/, const LevelTables& t, std::vector<uint8_t>& out)
{
    for (const ProbTable& pt : t.tables) serializeProbTable(pt, out);
}

LevelTables parseLevelTables(const CodecParams& p, int level, const uint8_t* data, size_t size,
                             const std::string& where)
{
    const int L = p.shape.numLayers, C = tablesPerRole(p), roles = numRoles(p);
    const bool perHead = perHeadTables(p);
    const size_t numTables = size_t(2) * L * roles * C;
    if (size / 2 < numTables)  // every table takes at least 2 bytes: refuse before allocating
        throw Error(where + ": " + std::to_string(size) + " bytes cannot hold " + std::to_string(numTables) + " tables");
    LevelTables t;
    t.tables.resize(numTables);
    const uint8_t* cur = data;
    const uint8_t* end = data + size;
    for (int k = 0; k < 2; ++k)
        for (int l = 0; l < L; ++l)
            for (int role = 0; role < roles; ++role) {
                const int bins = p.binsFor(kKinds[k], l, level);
                const int a = quant::alphabetSize(role == 1 ? p.profile.anchorBinsFor(bins) : bins);
                for (int c = 0; c < C; ++c) {
                    std::string why;
                    if (!parseProbTable(&cur, end, a, &t.tables[LevelTables::index(p, kKinds[k], l, role, c)], &why))
                        throw Error(where + ": " + kindName(kKinds[k]) + " layer " + std::to_string(l) +
                                    (perHead ? " head " : " channel ") + std::to_string(c) + ": " + why);
                }
            }
    if (cur != end) throw Error(where + ": " + std::to_string(end - cur) + " bytes after the last table");
    return t;
}

std::vector<LevelTables> profileTables(const CodecParams& p, const std::string& source)
{
    if (!p.profile.hasCalibratedTables()) throw inputError(source, "calibrated_tables", "the profile has none");
    if (p.profile.tableChannels != p.shape.channels())
        throw inputError(source, "calibrated_tables", "calibrated for " + std::to_string(p.profile.tableChannels) +
                                                          " channels per layer, the cache has " +
                                                          std::to_string(p.shape.channels()));
    std::vector<LevelTables> out;
    for (int l = 1; l <= p.numLevels(); ++l) {
        const std::vector<uint8_t>& blob = p.profile.levelTables[size_t(l - 1)];
        out.push_back(parseLevelTables(p, l, blob.data(), blob.size(),
                                       source + ": calibrated_tables.levels[" + std::to_string(l - 1) + "]"));
    }
    return out;
}

void calibrateProfile(CodecParams& p, const std::vector<const KvSet*>& caches)
{
    KVSCOPE_ASSERT(p.codec == CodecId::CacheGen && !caches.empty());
    p.profile.levelTables.clear();
    for (int l = 1; l <= p.numLevels(); ++l) {
        LevelCounts counts;
        for (const KvSet* kv : caches) {
            CodecParams q = p;  // same codec settings, this cache's token count
            q.shape = kv->shape();
            KVSCOPE_ASSERT(q.shape.numLayers == p.shape.numLayers && q.shape.channels() == p.shape.channels());
            for (int c = 0; c < q.numChunks(); ++c) countChunkSymbols(q, *kv, c, l, counts);
        }
        std::vector<uint8_t> blob;
        serializeLevelTables(p, l, tablesFromCounts(p, l, counts), blob);
        p.profile.levelTables.push_back(std::move(blob));
    }
    p.profile.tableChannels = p.shape.channels();
    p.profile.tables = TableMode::Shared;
}

}  // namespace kvscope
