// The transform model's binary form (FORMAT.md "Transform section"): serialisation, the parser that
// validates every field against the cache shape, and the size figures eval reports.
#include "codec/transform.h"

#include "codec/codec_detail.h"
#include "codec/prob_table.h"
#include "common/error.h"
#include "common/half.h"

#include <cmath>
#include <cstring>

namespace kvscope {

namespace {

const uint8_t kModelMagic[4] = {'K', 'V', 'T', 'R'};
constexpr uint16_t kModelVersion = 1;
// Version 2 adds, after recent_tokens: u8 token_importance (1), f32 importance_quantile, f32
// importance_power. Written only when token importance is on, so other models stay version 1.
constexpr uint16_t kModelVersionImportance = 2;
// Version 3 adds, after recent_tokens: f64 adapt_basis prior_tokens, u32 sweeps. Written only
// when the chunks chain through a backward-adaptive basis (transform_adapt.h), which a decoder
// must then run; never with token importance (the chain refuses it).
constexpr uint16_t kModelVersionAdaptive = 3;
// Version 4 is version 3 plus, after sweeps: u32 reset_chunks (1..2^20), the chain restarting at
// every multiple of it. Written only when reset_chunks > 0, so chains without resets stay version 3.
constexpr uint16_t kModelVersionAdaptiveResets = 4;

struct Writer {
    std::vector<uint8_t>& b;
    void u8(uint8_t v) { b.push_back(v); }
    void u16(uint16_t v) { b.push_back(uint8_t(v)), b.push_back(uint8_t(v >> 8)); }
    void u32(uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void f32(float f) { u32(floatToBits(f)); }
    void f64(double d) { uint64_t u; std::memcpy(&u, &d, 8); u32(uint32_t(u)); u32(uint32_t(u >> 32)); }
};

struct Reader {
    const uint8_t* p;
    const uint8_t* end;
    const std::string& where;
    const uint8_t* take(size_t n, const char* what)
    {
        if (size_t(end - p) < n) throw Error(where + ": truncated " + what);
        const uint8_t* r = p;
        p += n;
        return r;
    }
    uint8_t u8(const char* w) { return *take(1, w); }
    uint16_t u16(const char* w) { const uint8_t* q = take(2, w); return uint16_t(q[0] | q[1] << 8); }
    uint32_t u32(const char* w) { return detail::getU32(take(4, w)); }
    float f32(const char* w)
    {
        const float f = bitsToFloat(u32(w));
        if (!std::isfinite(f)) throw Error(where + ": " + w + " is not finite");
        return f;
    }
    double f64(const char* w)
    {
        const uint64_t lo = u32(w), hi = u32(w);
        const uint64_t u = lo | hi << 32;
        double d;
        std::memcpy(&d, &u, 8);
        if (!std::isfinite(d)) throw Error(where + ": " + w + " is not finite");
        return d;
    }
};

}  // namespace

void serializeTransformModel(const TransformModel& m, std::vector<uint8_t>& out)
{
    Writer w{out};
    for (uint8_t c : kModelMagic) w.u8(c);
    const TransformSettings& s = m.settings;
    const bool chained = s.adaptPriorTokens > 0;
    if (chained && s.tokenImportance) throw Error("transform.adapt_basis: token_importance is not supported with it");
    const bool resets = chained && s.adaptResetChunks > 0;
    w.u16(resets ? kModelVersionAdaptiveResets : chained ? kModelVersionAdaptive
                   : s.tokenImportance ? kModelVersionImportance : kModelVersion);
    w.u8(s.ropeUndo), w.u8(uint8_t(s.basis)), w.u8(s.acrossHeads), w.u8(uint8_t(s.weighting));
    w.u8(uint8_t(s.allocation)), w.u8(uint8_t(s.entropy));
    w.u32(uint32_t(s.sinkTokens)), w.u32(uint32_t(s.recentTokens));
    if (chained) w.f64(s.adaptPriorTokens), w.u32(uint32_t(s.adaptSweeps));
    if (resets) w.u32(uint32_t(s.adaptResetChunks));
    if (s.tokenImportance) w.u8(1), w.f32(float(s.importanceQuantile)), w.f32(float(s.importancePower));
    w.u32(uint32_t(m.numLayers)), w.u32(uint32_t(m.heads)), w.u32(uint32_t(m.headDim));
    w.u32(uint32_t(m.numLevels()));
    w.u32(uint32_t(m.ropeInvFreq.size()));
    for (float f : m.ropeInvFreq) w.f32(f);
    w.u32(uint32_t(m.ropePosition0));
    for (const TransformBlock& b : m.blocks) {
        for (float f : b.mean) w.f32(f);
        for (float f : b.variance) w.f32(f);
        for (float f : b.decode) w.u16(floatToHalf(f));
    }
    for (int l = 0; l < m.numLevels(); ++l) {
        w.f64(m.keyTheta[size_t(l)]);
        w.f64(m.valueTheta[size_t(l)]);
        for (const TransformLevelBlock& lb : m.levels[size_t(l)]) {
            for (size_t j = 0; j < lb.step.size(); ++j) {
                w.f32(lb.step[j]);
                w.u8(lb.maxQ[j]);
            }
            if (entropyUsesTables(s.entropy))
                for (const std::vector<uint16_t>& f : lb.freq) {
                    ProbTable t;
                    t.alphabet = int(f.size());
                    t.freq = f;
                    serializeProbTable(t, out);
                }
        }
    }
}

size_t transformModelBytes(const TransformModel& m)
{
    std::vector<uint8_t> b;
    serializeTransformModel(m, b);
    return b.size();
}

size_t transformSideBytes(const TransformModel& m)
{
    if (m.meansFromCache) return 2 * size_t(m.numLayers) * size_t(m.channels()) * sizeof(float);
    if (!m.fittedOnCache) return 0;
    const size_t matrices = 2 * size_t(m.numLayers) * size_t(m.channels()) * size_t(m.channels()) * 2;
    return transformModelBytes(m) - matrices;
}

TransformModel parseTransformModel(const uint8_t* data, size_t size, const KvShape& shape, const std::string& where)
{
    Reader r{data, data + size, where};
    if (std::memcmp(r.take(4, "magic"), kModelMagic, 4) != 0) throw Error(where + ": not a transform model (bad magic)");
    const uint16_t version = r.u16("version");
    if (version < kModelVersion || version > kModelVersionAdaptiveResets)
        throw Error(where + ": transform model version " + std::to_string(version) + " is not supported (this build reads 1..4)");
    TransformModel m;
    TransformSettings& s = m.settings;
    const uint8_t rope = r.u8("settings"), basis = r.u8("settings"), across = r.u8("settings"),
                  weighting = r.u8("settings"), alloc = r.u8("settings"), entropy = r.u8("settings");
    if (rope > 1 || basis > 2 || across > 1 || weighting > 1 || alloc > 1 || entropy > 2)
        throw Error(where + ": unknown transform setting id");
    s.ropeUndo = rope, s.basis = TransformBasis(basis), s.acrossHeads = across;
    s.weighting = TransformWeighting(weighting), s.allocation = TransformAllocation(alloc), s.entropy = TransformEntropy(entropy);
    const uint32_t sink = r.u32("sink_tokens"), recent = r.u32("recent_tokens");
    if (sink > 4096 || recent > 65536) throw Error(where + ": sink_tokens or recent_tokens out of range");
    s.sinkTokens = int(sink), s.recentTokens = int(recent);
    if (version == kModelVersionAdaptive || version == kModelVersionAdaptiveResets) {
        s.adaptPriorTokens = r.f64("adapt_basis prior_tokens");
        const uint32_t sweeps = r.u32("adapt_basis sweeps");
        if (!(s.adaptPriorTokens > 0 && s.adaptPriorTokens <= 1e7) || sweeps < 1 || sweeps > 50)
            throw Error(where + ": adapt_basis prior_tokens or sweeps out of range (0..1e7, 1..50)");
        s.adaptSweeps = int(sweeps);
    }
    if (version == kModelVersionAdaptiveResets) {
        const uint32_t g = r.u32("adapt_basis reset_chunks");
        if (g < 1 || g > uint32_t(kMaxAdaptResetChunks))
            throw Error(where + ": adapt_basis reset_chunks " + std::to_string(g) + " out of range (1.." +
                        std::to_string(kMaxAdaptResetChunks) + ")");
        s.adaptResetChunks = int(g);
    }
    if (version == kModelVersionImportance) {
        if (r.u8("token_importance") != 1) throw Error(where + ": token_importance must be 1 in a version-2 model");
        s.tokenImportance = true;
        s.importanceQuantile = r.f32("importance_quantile");
        s.importancePower = r.f32("importance_power");
        if (!(s.importanceQuantile >= 0 && s.importanceQuantile <= 1) || !(s.importancePower >= 0 && s.importancePower <= 8))
            throw Error(where + ": importance_quantile or importance_power out of range");
    }
    const uint32_t L = r.u32("num_layers"), H = r.u32("heads"), D = r.u32("head_dim"), levels = r.u32("num_levels");
    // Layer groups (transform.h, READ ME FIRST 10): G = the cache's layers over the model's, each
    // block holding the heads of its G layers.
    const uint32_t G = L > 0 && shape.numLayers > 0 && uint32_t(shape.numLayers) % L == 0 ? uint32_t(shape.numLayers) / L : 0;
    if (G < 1 || G > 64 || uint64_t(H) != uint64_t(G) * uint64_t(shape.numKvHeads) || int(D) != shape.headDim)
        throw Error(where + ": the model is for " + std::to_string(L) + " layers x " + std::to_string(H) + " heads x " +
                    std::to_string(D) + ", the cache has " + std::to_string(shape.numLayers) + " x " +
                    std::to_string(shape.numKvHeads) + " x " + std::to_string(shape.headDim));
    if (levels < 1 || levels > 64) throw Error(where + ": num_levels " + std::to_string(levels) + " is outside 1..64");
    m.numLayers = int(L), m.heads = int(H), m.headDim = int(D);
    s.layerGroup = int(G);
    const size_t C = size_t(H) * D;
    const uint32_t ropeN = r.u32("rope table size");
    if (ropeN != 0 && ropeN != D / 2) throw Error(where + ": rope table of " + std::to_string(ropeN) + " entries for head_dim " + std::to_string(D));
    if (s.ropeUndo != (ropeN != 0)) throw Error(where + ": rope_undo and the rope table disagree");
    for (uint32_t i = 0; i < ropeN; ++i) m.ropeInvFreq.push_back(r.f32("rope_inv_freq"));
    const uint32_t p0 = r.u32("rope_position0");
    if (p0 > (1u << 30)) throw Error(where + ": rope_position0 out of range");
    m.ropePosition0 = int(p0);
    // The fixed-size part must fit before anything is allocated for it.
    const size_t blockBytes = C * 8 + C * C * 2;
    if (size_t(r.end - r.p) / blockBytes < 2 * size_t(L)) throw Error(where + ": truncated blocks");
    m.blocks.resize(2 * size_t(L));
    for (TransformBlock& b : m.blocks) {
        b.mean.resize(C), b.variance.resize(C), b.decode.resize(C * C);
        for (float& f : b.mean) f = r.f32("mean");
        for (float& f : b.variance) {
            f = r.f32("variance");
            if (f < 0) throw Error(where + ": negative variance");
        }
        const uint8_t* a = r.take(C * C * 2, "decode matrix");
        for (size_t i = 0; i < C * C; ++i) {
            b.decode[i] = halfToFloat(uint16_t(a[2 * i] | a[2 * i + 1] << 8));
            if (!std::isfinite(b.decode[i])) throw Error(where + ": decode matrix entry is not finite");
        }
        prepareDecodeColumns(b);
    }
    for (uint32_t l = 0; l < levels; ++l) {
        m.keyTheta.push_back(r.f64("key theta"));
        m.valueTheta.push_back(r.f64("value theta"));
        if (size_t(r.end - r.p) / (C * 5) < 2 * size_t(L)) throw Error(where + ": truncated level " + std::to_string(l + 1));
        std::vector<TransformLevelBlock> lbs(2 * size_t(L));
        for (size_t u = 0; u < lbs.size(); ++u) {
            TransformLevelBlock& lb = lbs[u];
            const std::string place = where + ": level " + std::to_string(l + 1) + " " +
                                      kindName(u < L ? KvKind::Key : KvKind::Value) + " layer " + std::to_string(u % L);
            lb.step.resize(C), lb.maxQ.resize(C);
            for (size_t j = 0; j < C; ++j) {
                lb.step[j] = r.f32("step");
                lb.maxQ[j] = r.u8("alphabet");
                const bool coded = lb.step[j] > 0;
                if (lb.step[j] < 0 || (coded && (lb.maxQ[j] < 1 || lb.maxQ[j] > 127)) || (!coded && lb.maxQ[j] != 0))
                    throw Error(place + ": component " + std::to_string(j) + " has an invalid step or alphabet");
            }
            if (entropyUsesTables(s.entropy))
                for (size_t j = 0; j < C; ++j) {
                    if (lb.maxQ[j] == 0) continue;
                    ProbTable t;
                    std::string why;
                    if (!parseProbTable(&r.p, r.end, 2 * lb.maxQ[j] + 1, &t, &why))
                        throw Error(place + ": component " + std::to_string(j) + ": " + why);
                    lb.freq.push_back(std::move(t.freq));
                }
        }
        m.levels.push_back(std::move(lbs));
    }
    if (r.p != r.end) throw Error(where + ": unexpected trailing bytes");
    return m;
}

}  // namespace kvscope
