#include "codec/chunk_codec.h"

#include "codec/quantize.h"
#include "common/error.h"
#include "common/half.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>

namespace kvscope {

// ---------------------------------------------------------------------------------------------
// Names and parameters

const char* codecName(CodecId c)
{
    switch (c) {
    case CodecId::CacheGen: return "cachegen";
    case CodecId::Fp16: return "fp16";
    case CodecId::Int8: return "int8";
    case CodecId::Kivi2: return "kivi2";
    case CodecId::Kivi4: return "kivi4";
    case CodecId::Zstd: return "zstd";
    }
    return "unknown";
}

bool parseCodecName(const std::string& s, CodecId* out)
{
    for (CodecId c : {CodecId::CacheGen, CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4,
                      CodecId::Zstd})
        if (s == codecName(c)) {
            *out = c;
            return true;
        }
    return false;
}

int CodecParams::chunkLength(int chunk) const
{
    return std::min(profile.chunkTokens, shape.numTokens - chunkStart(chunk));
}

quant::BlockSpec cachegenBlockSpec(const CodecParams& p, KvKind kind, int layer, int level, int tokens)
{
    quant::BlockSpec b;
    b.heads = p.shape.numKvHeads;
    b.headDim = p.shape.headDim;
    b.tokens = tokens;
    b.quantizer = kind == KvKind::Key ? p.profile.keyQuantizer : p.profile.valueQuantizer;
    b.bins = p.binsFor(kind, layer, level);
    b.anchorBins = p.profile.anchorBinsFor(b.bins);
    b.deltaGroup = p.profile.deltaEnabled() ? p.profile.deltaGroup : 0;
    return b;
}

int CodecParams::binsFor(KvKind kind, int layer, int level) const
{
    const CodecLevel& l = profile.levels[size_t(level - 1)];
    return kind == KvKind::Key ? l.keyBins[size_t(layer)] : l.valueBins[size_t(layer)];
}

size_t int8Bytes(const KvShape& s)
{
    // per (kind, layer, token): one fp16 scale and one byte per channel
    return 2 * size_t(s.numLayers) * size_t(s.numTokens) * (2 + size_t(s.channels()));
}

namespace {

constexpr KvKind kKinds[2] = {KvKind::Key, KvKind::Value};

int numRoles(const CodecParams& p) { return p.profile.deltaEnabled() ? 2 : 1; }

// Reads one (kind, layer) block of a chunk as floats: (heads, n, head_dim).
void readBlock(const KvSet& kv, KvKind kind, int layer, int t0, int n, std::vector<float>& x)
{
    const KvShape& s = kv.shape();
    x.resize(size_t(s.numKvHeads) * n * s.headDim);
    for (int h = 0; h < s.numKvHeads; ++h)
        kv.readRows(kind, layer, h, t0, n, x.data() + size_t(h) * n * s.headDim);
}

void writeBlock(KvSet& kv, KvKind kind, int layer, int t0, int n, const float* x)
{
    const KvShape& s = kv.shape();
    for (int h = 0; h < s.numKvHeads; ++h)
        kv.writeRows(kind, layer, h, t0, n, x + size_t(h) * n * s.headDim);
}

// Reads and quantizes one (kind, layer) block of a chunk: what both encoding and calibration start from.
struct QuantizedBlock {
    quant::BlockSpec spec;
    std::vector<uint8_t> sym;      // (heads, n, head_dim)
    std::vector<uint16_t> scales;  // (spec.numScales())
};

QuantizedBlock quantizeUnit(const CodecParams& p, const KvSet& kv, KvKind kind, int layer, int level, int t0, int n)
{
    QuantizedBlock q;
    q.spec = cachegenBlockSpec(p, kind, layer, level, n);
    std::vector<float> x;
    readBlock(kv, kind, layer, t0, n, x);
    q.sym.resize(x.size());
    q.scales.resize(size_t(q.spec.numScales()));
    quant::quantizeBlock(q.spec, x.data(), q.sym.data(), q.scales.data());
    return q;
}

// Runs body(unit) for unit in [0, count) on all cores. When units fail, the error of the
// lowest-numbered one is rethrown, so a corrupt file gives the same message on every run.
template <typename Body>
void parallelUnits(int count, Body body)
{
    std::exception_ptr error;
    int errorUnit = count;
    std::mutex m;
#pragma omp parallel for schedule(dynamic, 1)
    for (int u = 0; u < count; ++u) {
        try {
            body(u);
        } catch (...) {
            std::lock_guard<std::mutex> lock(m);
            if (u < errorUnit) {
                errorUnit = u;
                error = std::current_exception();
            }
        }
    }
    if (error) std::rethrow_exception(error);
}

void putU32(std::vector<uint8_t>& out, uint32_t v)
{
    for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
uint32_t getU32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
void putU16s(std::vector<uint8_t>& out, const uint16_t* v, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        out.push_back(uint8_t(v[i]));
        out.push_back(uint8_t(v[i] >> 8));
    }
}
void getU16s(const uint8_t* p, uint16_t* v, size_t n)
{
    for (size_t i = 0; i < n; ++i) v[i] = uint16_t(p[2 * i] | p[2 * i + 1] << 8);
}

// A bounds-checked cursor over a payload; every read names `where` on failure.
struct Cursor {
    const uint8_t* p;
    const uint8_t* end;
    const std::string& where;

    const uint8_t* take(size_t n, const char* what)
    {
        if (size_t(end - p) < n)
            throw Error(where + ": truncated " + what + " (needs " + std::to_string(n) + " bytes, " +
                        std::to_string(end - p) + " left)");
        const uint8_t* r = p;
        p += n;
        return r;
    }
};

// ---------------------------------------------------------------------------------------------
// CacheGen: quantize -> (delta) -> per-channel rANS, one stream per (kind, layer, head)

// The coding tables one (kind, layer) block uses: [role * channels + channel]. Reused across
// units on the same thread so the hot path never allocates.
struct UnitTables {
    std::vector<CodingTable> tables;
    const CodingTable& at(int role, int channels, int channel) const { return tables[size_t(role) * channels + channel]; }
};

// Symbol counts of a block into flat[(role * C + c) * stride + symbol], added to what is there;
// stride is at least the larger alphabet of the two roles.
void countBlock(const quant::BlockSpec& b, const uint8_t* sym, int roles, uint32_t* flat, size_t stride)
{
    const int D = b.headDim, C = b.channels();
    for (int h = 0; h < b.heads; ++h)
        for (int t = 0; t < b.tokens; ++t) {
            const int role = (roles == 2 && b.isAnchor(t)) ? 1 : 0;
            const uint8_t* row = sym + (size_t(h) * b.tokens + t) * D;
            uint32_t* base = flat + (size_t(role) * C + size_t(h) * D) * stride;
            for (int d = 0; d < D; ++d) base[size_t(d) * stride + row[d]]++;
        }
}

// Counts a quantized block's symbols per (role, channel) into flat; returns the stride between tables.
size_t countUnit(const QuantizedBlock& q, int roles, std::vector<uint32_t>& flat)
{
    const size_t stride = size_t(quant::alphabetSize(std::max(q.spec.bins, q.spec.anchorBins)));
    flat.assign(size_t(roles) * q.spec.channels() * stride, 0);
    countBlock(q.spec, q.sym.data(), roles, flat.data(), stride);
    return stride;
}

// One stream per head: symbols (t, d) in token-major order, symbol i coded by state i % 4.
// Bytes are written backwards into a buffer sized for the worst case (2 bytes per symbol).
void encodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* sym, const UnitTables& tab,
                      std::vector<uint8_t>& out)
{
    const int D = b.headDim, C = b.channels();
    const size_t n = size_t(b.tokens) * D;
    const uint8_t* s = sym + size_t(h) * n;
    const rans::FreqDivider& div = rans::freqDivider();
    std::vector<uint8_t> buf(2 * n + 2 + 4 * rans::kRansWays);
    uint8_t* const bufEnd = buf.data() + buf.size();
    uint8_t* ptr = bufEnd;
    // Emits the 0, 1 or 2 low bytes renormalisation needs without a branch: both bytes are stored
    // below ptr and ptr moves by the count (a byte stored but not taken is overwritten later).
    auto put = [&ptr, &div](uint32_t& x, const CodingTable& ct, int sy) {
        const uint32_t sf = ct.sf[sy], freq = sf >> 16;
        const uint32_t xMax = ((rans::kRansL >> rans::kProbBits) << 8) * freq;  // < 2^31
        const uint32_t k = uint32_t(x >= xMax) + uint32_t(uint64_t(x) >= (uint64_t(xMax) << 8));
        ptr[-1] = uint8_t(x);
        ptr[-2] = uint8_t(x >> 8);
        ptr -= k;
        x >>= 8 * k;
        const uint32_t q = div.div(x, freq);
        x = (q << rans::kProbBits) + (x - q * freq) + (sf & 0xffffu);
    };
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) rans::encInit(&v);
    for (int t = b.tokens - 1; t >= 0; --t) {  // reverse order: see rans.h
        const CodingTable* row = &tab.at(b.isAnchor(t) ? 1 : 0, C, h * D);
        const uint8_t* st = s + size_t(t) * D;
        if (D % 4 == 0) {
            uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
            for (int d = D - 4; d >= 0; d -= 4) {  // symbol t*D+d+k uses state k
                put(x3, row[d + 3], st[d + 3]);
                put(x2, row[d + 2], st[d + 2]);
                put(x1, row[d + 1], st[d + 1]);
                put(x0, row[d], st[d]);
            }
            x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3;
        } else {
            for (int d = D - 1; d >= 0; --d) put(x[(size_t(t) * D + size_t(d)) % rans::kRansWays], row[d], st[d]);
        }
    }
    for (int k = rans::kRansWays - 1; k >= 0; --k)  // state 0 last, so the decoder reads it first
        for (int byte = 0; byte < 4; ++byte) *--ptr = uint8_t(x[k] >> (8 * (3 - byte)));
    KVSCOPE_ASSERT(ptr >= buf.data() + 2);
    out.insert(out.end(), ptr, bufEnd);
}

// o = (q - m) * scale + base over one row, with one scale per channel (perChannel) or one for all.
void dequantizeRow(const int* __restrict q, int m, const float* __restrict perChannel, float scale,
                   const float* __restrict base, float* __restrict o, int D)
{
    if (perChannel)
        for (int d = 0; d < D; ++d) o[d] = float(q[d] - m) * perChannel[d] + base[d];
    else
        for (int d = 0; d < D; ++d) o[d] = float(q[d] - m) * scale + base[d];
}

// Decodes one head's stream and dequantizes it in the same pass into out (tokens, head_dim):
// the fast path; quant::dequantizeBlock is the reference it must match.
void decodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* data, size_t size, const UnitTables& tab,
                      const uint16_t* scales, float* out, const std::string& where)
{
    const int D = b.headDim, C = b.channels();
    const int maxL = quant::maxLevel(b.bins), maxA = quant::maxLevel(b.anchorBins);
    static_assert(rans::kRansWays == 4, "the unrolled loops below assume 4 ways");
    rans::RansReader r{data, data + size, false};
    uint32_t x0 = rans::decInit(r), x1 = rans::decInit(r), x2 = rans::decInit(r), x3 = rans::decInit(r);
    std::vector<float> scale(static_cast<size_t>(D)), zero(static_cast<size_t>(D), 0.0f);
    std::vector<int> q(static_cast<size_t>(D));  // the row's symbols
    const bool perChannel = b.quantizer == Quantizer::PerChannel;
    for (int t = 0; t < b.tokens; ++t) {
        const bool anchor = b.isAnchor(t);
        const CodingTable* row = &tab.at(anchor ? 1 : 0, C, h * D);
        const int m = anchor ? maxA : maxL;
        if (perChannel) halfToFloatN(scales + (anchor ? C : 0) + h * D, scale.data(), size_t(D));
        const float* base = (b.deltaGroup >= 2 && !anchor) ? out + size_t(t - t % b.deltaGroup) * D : zero.data();
        float* o = out + size_t(t) * D;
        // A symbol renormalises with at most 2 bytes (its state stays >= 2^11 after the update), so
        // with 2 D bytes left a whole row decodes without bounds checks.
        if (D % 4 == 0 && size_t(r.end - r.p) >= 2 * size_t(D) + 2) {
            const uint8_t* p = r.p;
            // Renormalisation without a loop or a branch: the state after an update is >= 2^11, so
            // it takes k = (x < 2^23) + (x < 2^15) bytes, known before any byte is read. That keeps
            // the four states independent: the shared read pointer only adds each k. Reads may
            // look 2 bytes ahead of what they take, hence the "+ 2" above.
            auto advance = [&p](uint32_t& x, const CodingTable& ct, int sy) {
                const uint32_t sf = ct.sf[sy];
                x = (sf >> 16) * (x >> rans::kProbBits) + (x & (rans::kProbScale - 1)) - (sf & 0xffffu);
                const uint32_t k = uint32_t(x < rans::kRansL) + uint32_t(x < (rans::kRansL >> 8));
                const uint32_t two = uint32_t(p[0]) << 8 | p[1];  // the next two bytes, first one high
                const uint32_t bits = 8 * k;                       // 0, 8 or 16: shifts, no branches
                x = (x << bits) | (two >> (16 - bits));
                p += k;
            };
            // Symbol i = t * D + d uses state d % 4: four independent chains, kept in registers.
            for (int d = 0; d < D; d += 4) {
                const int s0 = row[d].symbolOf(rans::decSlot(x0));
                const int s1 = row[d + 1].symbolOf(rans::decSlot(x1));
                const int s2 = row[d + 2].symbolOf(rans::decSlot(x2));
                const int s3 = row[d + 3].symbolOf(rans::decSlot(x3));
                advance(x0, row[d], s0);
                advance(x1, row[d + 1], s1);
                advance(x2, row[d + 2], s2);
                advance(x3, row[d + 3], s3);
                q[size_t(d)] = s0;
                q[size_t(d) + 1] = s1;
                q[size_t(d) + 2] = s2;
                q[size_t(d) + 3] = s3;
            }
            r.p = p;
        } else {
            for (int d = 0; d < D; ++d) {
                const size_t i = size_t(t) * D + size_t(d);
                uint32_t& st = i % 4 == 0 ? x0 : i % 4 == 1 ? x1 : i % 4 == 2 ? x2 : x3;
                const CodingTable& ct = row[d];
                const int sy = ct.symbolOf(rans::decSlot(st));
                rans::decAdvance(&st, r, ct.start(sy), ct.freq(sy));
                q[size_t(d)] = sy;
            }
        }
        dequantizeRow(q.data(), m, perChannel ? scale.data() : nullptr, halfToFloat(scales[perChannel ? 0 : t]), base, o, D);
    }
    const uint32_t x[rans::kRansWays] = {x0, x1, x2, x3};
    // A correct stream ends exactly at its last byte with every state back at its initial value.
    bool statesOk = true;
    for (uint32_t v : x) statesOk = statesOk && v == rans::kRansL;
    if (r.overrun || r.p != r.end || !statesOk)
        throw Error(where + ": head " + std::to_string(h) + ": entropy-coded stream is corrupt");
}

// Fills tab for one block from the shared tables of its level.
void sharedUnitTables(const CodecParams& p, const LevelTables& shared, KvKind kind, int layer, bool forDecoding,
                      UnitTables& tab)
{
    const int C = p.shape.channels(), roles = numRoles(p);
    tab.tables.resize(size_t(roles) * C);
    for (int role = 0; role < roles; ++role)
        for (int c = 0; c < C; ++c)
            toCodingTable(shared.at(p, kind, layer, role, c), &tab.tables[size_t(role) * C + c], forDecoding);
}

}  // namespace

const ProbTable& LevelTables::at(const CodecParams& p, KvKind kind, int layer, int role, int channel) const
{
    return tables[index(p, kind, layer, role, channel)];
}

size_t LevelTables::index(const CodecParams& p, KvKind kind, int layer, int role, int channel)
{
    const size_t C = size_t(p.shape.channels());
    return ((size_t(kind) * p.shape.numLayers + size_t(layer)) * size_t(numRoles(p)) + size_t(role)) * C +
           size_t(channel);
}

void countChunkSymbols(const CodecParams& p, const KvSet& kv, int chunk, int level, LevelCounts& counts)
{
    const int L = p.shape.numLayers, C = p.shape.channels(), roles = numRoles(p);
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
        const size_t stride = countUnit(q, roles, flat);
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
    const int L = p.shape.numLayers, C = p.shape.channels(), roles = numRoles(p);
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
                                    " channel " + std::to_string(c) + ": " + why);
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

// ---------------------------------------------------------------------------------------------
// Baselines

namespace {

size_t blockValues(const CodecParams& p, int n) { return size_t(p.shape.numKvHeads) * n * p.shape.headDim; }

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
    case CodecId::CacheGen: break;
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
    case CodecId::CacheGen: break;
    }
    KVSCOPE_ASSERT(false);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Chunk entry points

std::vector<uint8_t> encodeChunk(const CodecParams& p, const KvSet& kv, int chunk, int level,
                                 const LevelTables* shared)
{
    KVSCOPE_ASSERT(kv.shape() == p.shape);
    KVSCOPE_ASSERT(chunk >= 0 && chunk < p.numChunks() && level >= 1 && level <= p.numLevels());
    const int L = p.shape.numLayers, H = p.shape.numKvHeads, C = p.shape.channels();
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);
    std::vector<std::vector<uint8_t>> units(size_t(2) * L);

    if (p.codec != CodecId::CacheGen) {
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
            thread_local std::vector<uint32_t> flat;
            const size_t stride = countUnit(q, roles, flat);
            tab.tables.resize(size_t(roles) * C);
            for (int role = 0; role < roles; ++role)
                for (int c = 0; c < C; ++c) {
                    const size_t i = size_t(role) * C + size_t(c);
                    const int a = quant::alphabetSize(role ? b.anchorBins : b.bins);
                    buildCodingTable(flat.data() + i * stride, a, &tab.tables[i], false);
                    serializeCodingTable(tab.tables[i], a, tableBytes[size_t(u)]);
                }
        }
        for (int h = 0; h < H; ++h) encodeHeadStream(b, h, sym.data(), tab, streams[size_t(u)][size_t(h)]);
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

void decodeChunk(const CodecParams& p, const uint8_t* data, size_t size, int chunk, int level,
                 const LevelTables* shared, KvSet& out, const std::string& where)
{
    KVSCOPE_ASSERT(out.shape() == p.shape);
    KVSCOPE_ASSERT(chunk >= 0 && chunk < p.numChunks() && level >= 1 && level <= p.numLevels());
    const int L = p.shape.numLayers, H = p.shape.numKvHeads, C = p.shape.channels();
    const int t0 = p.chunkStart(chunk), n = p.chunkLength(chunk);

    if (p.codec != CodecId::CacheGen) {
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
        std::vector<float> x(size_t(n) * b.headDim);
        for (int h = 0; h < H; ++h) {
            const size_t i = size_t(u) * H + size_t(h);
            decodeHeadStream(b, h, streamPtr[i], streamSize[i], tab, scales.data(), x.data(), unitWhere);
            out.writeRows(kind, layer, h, t0, n, x.data());
        }
    });
}

}  // namespace kvscope
