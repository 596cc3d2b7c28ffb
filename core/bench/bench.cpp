#include "bench/bench.h"

#include "codec/codec_detail.h"
#include "codec/simd_path.h"
#include "codec/symbol_stream.h"
#include "codec/transform.h"
#include "codec/transform_adapt.h"

#include "common/error.h"
#include "common/half.h"

#include <htscodecs/rANS_static4x16.h>
#include <omp.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <memory>

namespace kvscope {

namespace {

// The clock of a timing: with one thread (OpenMP runs a one-thread region on the calling
// thread) the CPU time of this thread, so that on a shared machine the time the scheduler gave
// to other processes does not count against one row and not another; with more threads the
// wall clock, since their overlap is what is measured.
double now()
{
    if (omp_get_max_threads() == 1) {
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best of `repeats` runs of f, in seconds.
template <typename F>
double bestOf(int repeats, F f)
{
    double best = 1e300;
    for (int r = 0; r < std::max(1, repeats); ++r) {
        const double t0 = now();
        f();
        best = std::min(best, now() - t0);
    }
    return best;
}

double fp16MB(const KvShape& s) { return 2.0 * double(s.totalValues()) / 1e6; }

struct ThreadScope {  // sets the OpenMP thread count for the scope of a benchmark
    int saved;
    explicit ThreadScope(int n) : saved(omp_get_max_threads()) { if (n > 0) omp_set_num_threads(n); }
    ~ThreadScope() { omp_set_num_threads(saved); }
};

// The timed whole-cache decode and a chunk-by-chunk decode must give the same bytes.
void requireSameBytes(const KvSet& a, const KvSet& b)
{
    for (int l = 0; l < a.shape().numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            KVSCOPE_ASSERT(std::memcmp(a.data(k, l), b.data(k, l), a.tensorBytes()) == 0);
}

// A result's size and rates from its payload bytes (side information added by the caller) and its
// best encode and decode times.
CodecBenchResult sizedResult(const CodecParams& p, int level, size_t bytes, double enc, double dec)
{
    CodecBenchResult r;
    r.codec = codecName(p.codec);
    r.level = level;
    r.bytes = bytes;
    r.bitsPerValue = 8.0 * double(r.bytes) / double(p.shape.totalValues());
    r.encodeMBps = fp16MB(p.shape) / enc;
    r.decodeMBps = fp16MB(p.shape) / dec;
    return r;
}

}  // namespace

int benchThreads(const BenchOptions& opt) { return opt.threads > 0 ? opt.threads : omp_get_max_threads(); }

namespace {

// A chained cache (adapt_basis): the level's chain encoded and decoded whole, as writeKvc and
// KvcReader::decodeAll run it (chunk after chunk: each needs the state the chunks before it left).
CodecBenchResult benchChain(const KvSet& kv, const CodecParams& p, int level, const BenchOptions& opt)
{
    const AdaptiveSettings s = chainSettings(p);
    std::vector<std::vector<uint8_t>> payloads;
    const double enc = bestOf(opt.repeats, [&] { payloads = encodeAdaptiveChunks(p, kv, level, s); });
    KvSet out(p.shape, p.dtype), again(p.shape, p.dtype);
    const double dec = bestOf(opt.repeats, [&] { decodeAdaptiveChunks(p, payloads, level, s, out); });
    // Chunk by chunk through AdaptiveChain, one chain per segment from its reset point: the same bytes.
    std::unique_ptr<AdaptiveChain> chain;
    for (int c = 0; c < p.numChunks(); ++c) {
        if (chainStartsAt(s, c)) chain = std::make_unique<AdaptiveChain>(p, level, s, c);
        chain->decodeNext(payloads[size_t(c)].data(), payloads[size_t(c)].size(), again);
    }
    requireSameBytes(out, again);
    size_t bytes = 0;
    for (auto& b : payloads) bytes += b.size();
    return sizedResult(p, level, bytes, enc, dec);
}

}  // namespace

CodecParams withoutChain(const CodecParams& p)
{
    CodecParams q = p;
    q.profile.transform.adaptPriorTokens = 0;
    q.profile.transform.adaptResetChunks = 0;
    if (q.transform) {
        auto m = std::make_shared<TransformModel>(*q.transform);
        m->settings.adaptPriorTokens = 0;
        m->settings.adaptResetChunks = 0;
        q.transform = m;
    }
    return q;
}

CodecBenchResult benchCodec(const KvSet& kv, const CodecParams& p, int level, const BenchOptions& opt)
{
    ThreadScope threads(opt.threads);
    if (p.chainsChunks()) return benchChain(kv, p, level, opt);
    const int chunks = p.numChunks();
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    LevelTables tables;
    if (shared) {  // calibration is offline work: outside the timed region
        LevelCounts counts;
        for (int c = 0; c < chunks; ++c) countChunkSymbols(p, kv, c, level, counts);
        tables = tablesFromCounts(p, level, counts);
    }
    const LevelTables* t = shared ? &tables : nullptr;
    std::vector<LevelTables> perLevel(shared ? size_t(p.numLevels()) : 0);
    if (shared) perLevel[size_t(level - 1)] = tables;
    // Encoding is the whole-cache path (writeKvc): encodeChunks over every chunk.
    std::vector<ChunkRequest> all;
    for (int c = 0; c < chunks; ++c) all.push_back({c, level});
    std::vector<std::vector<uint8_t>> payloads;
    const double enc = bestOf(opt.repeats, [&] { payloads = encodeChunks(p, kv, all, shared ? &perLevel : nullptr); });
    // Decoding is the whole-cache path (KvcReader::decodeAll): decodeChunks over every chunk.
    std::vector<ChunkPayload> batch;
    for (int c = 0; c < chunks; ++c) batch.push_back({c, level, payloads[size_t(c)].data(), payloads[size_t(c)].size(), "bench"});
    KvSet out(p.shape, p.dtype);
    const double dec = bestOf(opt.repeats, [&] { decodeChunks(p, batch, shared ? &perLevel : nullptr, out); });
    // Decoding chunk by chunk must give identical output: a cheap determinism check on the timed path.
    KvSet again(p.shape, p.dtype);
    for (int c = 0; c < chunks; ++c)
        decodeChunk(p, payloads[size_t(c)].data(), payloads[size_t(c)].size(), c, level, t, again, "bench");
    requireSameBytes(out, again);

    size_t bytes = 0;
    for (auto& b : payloads) bytes += b.size();
    if (shared) {
        std::vector<uint8_t> blob;
        serializeLevelTables(p, level, tables, blob);
        bytes += blob.size();
    }
    return sizedResult(p, level, bytes, enc, dec);
}

CodecBenchResult benchZstd(const KvSet& kv, const CodecParams& p, const BenchOptions& opt)
{
    ThreadScope threads(opt.threads);
    const int chunks = p.numChunks();
    const KvShape& s = p.shape;
    // fp16 bytes of each chunk in the container's (kind, layer, head, token, d) order.
    std::vector<std::vector<uint8_t>> raw(static_cast<size_t>(chunks));
    for (int c = 0; c < chunks; ++c) {
        const int t0 = p.chunkStart(c), n = p.chunkLength(c);
        std::vector<float> row(size_t(n) * s.headDim);
        auto& b = raw[size_t(c)];
        b.reserve(size_t(2) * 2 * s.numLayers * s.numKvHeads * n * s.headDim);
        for (KvKind k : {KvKind::Key, KvKind::Value})
            for (int l = 0; l < s.numLayers; ++l)
                for (int h = 0; h < s.numKvHeads; ++h) {
                    kv.readRows(k, l, h, t0, n, row.data());
                    for (float v : row) {
                        const uint16_t x = floatToHalf(v);
                        b.push_back(uint8_t(x));
                        b.push_back(uint8_t(x >> 8));
                    }
                }
    }
    std::vector<std::vector<uint8_t>> comp(static_cast<size_t>(chunks)), back(static_cast<size_t>(chunks));
    const double enc = bestOf(opt.repeats, [&] {
#pragma omp parallel for schedule(dynamic, 1)
        for (int c = 0; c < chunks; ++c) {
            auto& z = comp[size_t(c)];
            z.resize(ZSTD_compressBound(raw[size_t(c)].size()));
            const size_t n = ZSTD_compress(z.data(), z.size(), raw[size_t(c)].data(), raw[size_t(c)].size(), opt.zstdLevel);
            KVSCOPE_ASSERT(!ZSTD_isError(n));
            z.resize(n);
        }
    });
    const double dec = bestOf(opt.repeats, [&] {
#pragma omp parallel for schedule(dynamic, 1)
        for (int c = 0; c < chunks; ++c) {
            back[size_t(c)].resize(raw[size_t(c)].size());
            const size_t n = ZSTD_decompress(back[size_t(c)].data(), back[size_t(c)].size(), comp[size_t(c)].data(),
                                              comp[size_t(c)].size());
            KVSCOPE_ASSERT(!ZSTD_isError(n) && n == raw[size_t(c)].size());
        }
    });
    for (int c = 0; c < chunks; ++c) KVSCOPE_ASSERT(back[size_t(c)] == raw[size_t(c)]);
    CodecBenchResult r;
    r.codec = "zstd";
    r.level = opt.zstdLevel;
    for (auto& z : comp) r.bytes += z.size();
    r.bitsPerValue = 8.0 * double(r.bytes) / double(s.totalValues());
    r.encodeMBps = fp16MB(s) / enc;
    r.decodeMBps = fp16MB(s) / dec;
    return r;
}

namespace {

// The rates of an entropy bench from its best times (seconds) over r.symbols symbols, and the
// decoder path that ran.
void setRates(EntropyBenchResult& r, double encS, double decS, double htsEncS, double htsDecS)
{
    const double mb = double(r.symbols) / 1e6;
    r.encodeMBps = mb / encS;
    r.decodeMBps = mb / decS;
    r.htsEncodeMBps = mb / htsEncS;
    r.htsDecodeMBps = mb / htsDecS;
    r.simd = simdPathName(simdPath());
}

// htscodecs' rANS 32x16 order 0 on `streams` byte strings (sym(i, &n) gives stream i), in the
// timed passes of bestOf: the same call for every codec's symbols. Returns its bytes.
template <typename Streams>
uint64_t benchHtscodecs(int streams, Streams sym, const BenchOptions& opt, double* encS, double* decS)
{
    std::vector<std::vector<uint8_t>> hts(static_cast<size_t>(streams));
    std::vector<std::vector<uint8_t>> back(static_cast<size_t>(streams));
    const int order = 0 | RANS_ORDER_X32;
    *encS = bestOf(opt.repeats, [&] {
#pragma omp parallel for schedule(dynamic, 4)
        for (int s = 0; s < streams; ++s) {
            unsigned n = 0;
            uint8_t* in = sym(s, &n);
            auto& o = hts[size_t(s)];
            o.resize(rans_compress_bound_4x16(n, order));
            unsigned outSize = unsigned(o.size());
            const unsigned char* res = rans_compress_to_4x16(in, n, o.data(), &outSize, order);
            KVSCOPE_ASSERT(res);
            o.resize(outSize);
        }
    });
    *decS = bestOf(opt.repeats, [&] {
#pragma omp parallel for schedule(dynamic, 4)
        for (int s = 0; s < streams; ++s) {
            unsigned n = 0;
            sym(s, &n);
            auto& o = back[size_t(s)];
            o.resize(n);
            unsigned outSize = n;
            const unsigned char* res = rans_uncompress_to_4x16(hts[size_t(s)].data(), unsigned(hts[size_t(s)].size()), o.data(), &outSize);
            KVSCOPE_ASSERT(res && outSize == n);
        }
    });
    uint64_t bytes = 0;
    for (int s = 0; s < streams; ++s) {
        unsigned n = 0;
        const uint8_t* in = sym(s, &n);
        KVSCOPE_ASSERT(std::memcmp(back[size_t(s)].data(), in, n) == 0);
        bytes += hts[size_t(s)].size();
    }
    return bytes;
}

// The transform codec's entropy stage: every (chunk, kind, layer) block's symbol matrices (one
// per token class) coded with the level's calibrated tables by the profile's entropy choice
// (rans: 4 states, rans32: 32 states on the SIMD kernels), as the codec codes them. Tables are
// per level, not per chunk: built once outside the timing, and the blocks go (kind, layer)-major
// so that a block's tables stay in cache.
EntropyBenchResult benchEntropyTransform(const KvSet& kv, const CodecParams& p, int level, const BenchOptions& opt)
{
    using namespace detail;
    const int L = p.transform->numLayers, chunks = p.numChunks(), units = chunks * 2 * L;  // blocks (layer groups)
    const bool w32 = p.transform->settings.entropy == TransformEntropy::Rans32;
    // Unit u = (kind, layer) * chunks + chunk.
    std::vector<std::vector<TransformSymbols>> mats(static_cast<size_t>(units));
    parallelUnits(units, [&](int u) {
        const int kl = u / chunks;
        mats[size_t(u)] = transformBlockSymbols(p, kv, kKinds[kl / L], kl % L, level, u % chunks);
    });
    constexpr int kClasses = 4;
    std::vector<std::vector<CodingTable>> enc(size_t(2) * L * kClasses), dec(size_t(2) * L * kClasses);
    for (int u = 0; u < units; ++u)
        for (const TransformSymbols& m : mats[size_t(u)]) {
            const int kl = u / chunks;
            const size_t ti = size_t(kl) * kClasses + size_t(m.cls);
            if (!enc[ti].empty()) continue;
            transformCodingTables(p, kKinds[kl / L], kl % L, level, m.cls, false, enc[ti]);
            transformCodingTables(p, kKinds[kl / L], kl % L, level, m.cls, true, dec[ti]);
        }
    struct Ref {
        int unit;
        size_t index;
    };
    std::vector<Ref> list;  // every matrix, in unit order
    for (int u = 0; u < units; ++u)
        for (size_t i = 0; i < mats[size_t(u)].size(); ++i) list.push_back({u, i});
    const int streams = int(list.size());
    auto tablesOf = [&](const Ref& r, bool decoding) {
        const size_t ti = size_t(r.unit / chunks) * kClasses + size_t(mats[size_t(r.unit)][r.index].cls);
        return decoding ? dec[ti].data() : enc[ti].data();
    };
    std::vector<std::vector<uint8_t>> coded(static_cast<size_t>(streams)), back(static_cast<size_t>(streams));
    EntropyBenchResult r;
    const double encS = bestOf(opt.repeats, [&] {
        parallelUnits(streams, [&](int i) {
            const TransformSymbols& m = mats[size_t(list[size_t(i)].unit)][list[size_t(i)].index];
            coded[size_t(i)].clear();
            (w32 ? encodeSymbolMatrixW32 : encodeSymbolMatrix)(m.sym.data(), m.rows, m.cols, tablesOf(list[size_t(i)], false),
                                                                coded[size_t(i)]);
        });
    });
    const double decS = bestOf(opt.repeats, [&] {
        parallelUnits(streams, [&](int i) {
            const TransformSymbols& m = mats[size_t(list[size_t(i)].unit)][list[size_t(i)].index];
            back[size_t(i)].resize(m.sym.size());
            (w32 ? decodeSymbolMatrixW32 : decodeSymbolMatrix)(coded[size_t(i)].data(), coded[size_t(i)].size(), m.rows, m.cols,
                                                                tablesOf(list[size_t(i)], true), back[size_t(i)].data(), "bench");
        });
    });
    for (int i = 0; i < streams; ++i) {
        const TransformSymbols& m = mats[size_t(list[size_t(i)].unit)][list[size_t(i)].index];
        KVSCOPE_ASSERT(back[size_t(i)] == m.sym);
        r.symbols += m.sym.size();
        r.bytes += coded[size_t(i)].size();
    }
    double hEnc = 0, hDec = 0;
    r.htsBytes = benchHtscodecs(
        streams,
        [&](int i, unsigned* n) {
            auto& m = mats[size_t(list[size_t(i)].unit)][list[size_t(i)].index];
            *n = unsigned(m.sym.size());
            return m.sym.data();
        },
        opt, &hEnc, &hDec);
    setRates(r, encS, decS, hEnc, hDec);
    return r;
}

}  // namespace

EntropyBenchResult benchEntropy(const KvSet& kv, const CodecParams& p, int level, const BenchOptions& opt)
{
    using namespace detail;
    ThreadScope threads(opt.threads);
    if (p.codec == CodecId::Transform) return benchEntropyTransform(kv, p, level, opt);
    KVSCOPE_ASSERT(p.codec == CodecId::CacheGen);
    const int L = p.shape.numLayers, H = p.shape.numKvHeads, C = tablesPerRole(p), roles = numRoles(p);
    const bool perHead = perHeadTables(p);
    const int chunks = p.numChunks(), units = chunks * 2 * L;
    const bool shared = p.profile.tables == TableMode::Shared;
    LevelTables levelTables;
    if (shared) {
        LevelCounts counts;
        for (int c = 0; c < chunks; ++c) countChunkSymbols(p, kv, c, level, counts);
        levelTables = tablesFromCounts(p, level, counts);
    }
    // Quantised blocks, unit = (chunk, kind, layer): the input of both coders, outside the timing.
    std::vector<QuantizedBlock> blocks(static_cast<size_t>(units));
    parallelUnits(units, [&](int u) {
        const int c = u / (2 * L), kl = u % (2 * L);
        blocks[size_t(u)] = quantizeUnit(p, kv, kKinds[kl / L], kl % L, level, p.chunkStart(c), p.chunkLength(c));
    });
    // Shared tables are per level, not per chunk: converted once, outside the timing.
    std::vector<UnitTables> sharedTabs(shared ? size_t(2) * L : 0);
    for (size_t kl = 0; kl < sharedTabs.size(); ++kl)
        sharedUnitTables(p, levelTables, kKinds[kl / size_t(L)], int(kl % size_t(L)), true, sharedTabs[kl]);

    struct Coded {
        std::vector<uint8_t> tables;
        std::vector<std::vector<uint8_t>> streams;
    };
    std::vector<Coded> coded(static_cast<size_t>(units));
    EntropyBenchResult r;
    for (const QuantizedBlock& q : blocks) r.symbols += q.sym.size();
    // Shared tables: (kind, layer)-major, every chunk of one (kind, layer) in turn, as
    // decodeChunks does, so that a unit's tables stay in cache; in-band: chunk-major.
    auto unitAt = [&](int i) { return shared ? (i % chunks) * 2 * L + i / chunks : i; };
    const double enc = bestOf(opt.repeats, [&] {
        parallelUnits(units, [&](int i) {
            const int u = unitAt(i);
            const QuantizedBlock& q = blocks[size_t(u)];
            Coded& out = coded[size_t(u)];
            out.tables.clear();
            out.streams.assign(size_t(H), {});
            thread_local UnitTables tab;
            const UnitTables* t = &tab;
            if (shared) {
                t = &sharedTabs[size_t(u % (2 * L))];
            } else {
                inBandUnitTables(q, roles, perHead, tab, out.tables);
            }
            for (int h = 0; h < H; ++h) encodeHeadStreamV2(q.spec, h, q.sym.data(), *t, out.streams[size_t(h)]);
        });
    });
    std::vector<std::vector<uint8_t>> decoded(static_cast<size_t>(units));
    const double dec = bestOf(opt.repeats, [&] {
        parallelUnits(units, [&](int i) {
            const int u = unitAt(i);
            const QuantizedBlock& q = blocks[size_t(u)];
            const Coded& in = coded[size_t(u)];
            thread_local UnitTables tab;
            const UnitTables* t = &tab;
            if (shared) {
                t = &sharedTabs[size_t(u % (2 * L))];
            } else {
                tab.resize(roles, C, channelsPerTable(p));
                const uint8_t* tp = in.tables.data();
                const uint8_t* te = tp + in.tables.size();
                for (int role = 0; role < roles; ++role)
                    for (int c = 0; c < C; ++c) {
                        std::string why;
                        const bool ok = parseCodingTable(&tp, te, quant::alphabetSize(role ? q.spec.anchorBins : q.spec.bins),
                                                         &tab.tables[size_t(role) * C + c], &why);
                        KVSCOPE_ASSERT(ok);
                    }
            }
            std::vector<uint8_t>& out = decoded[size_t(u)];
            out.resize(q.sym.size());
            const size_t n = q.sym.size() / size_t(H);
            thread_local std::vector<const uint8_t*> ptr;
            thread_local std::vector<size_t> len;
            thread_local std::vector<uint8_t*> dst;
            ptr.resize(size_t(H)), len.resize(size_t(H)), dst.resize(size_t(H));
            for (int h = 0; h < H; ++h) {
                ptr[size_t(h)] = in.streams[size_t(h)].data();
                len[size_t(h)] = in.streams[size_t(h)].size();
                dst[size_t(h)] = out.data() + size_t(h) * n;
            }
            decodeHeadStreamsV2(q.spec, ptr.data(), len.data(), *t, q.scales.data(), RowOut::Symbols, dst.data(), "bench");
        });
    });
    for (int u = 0; u < units; ++u) {
        KVSCOPE_ASSERT(decoded[size_t(u)] == blocks[size_t(u)].sym);
        r.bytes += coded[size_t(u)].tables.size();
        for (const auto& st : coded[size_t(u)].streams) r.bytes += st.size();
    }

    // htscodecs on the same streams: (unit, head) -> one rans_compress_to_4x16 call.
    double henc = 0, hdec = 0;
    r.htsBytes = benchHtscodecs(
        units * H,
        [&](int s, unsigned* n) {
            const QuantizedBlock& q = blocks[size_t(s / H)];
            *n = unsigned(q.sym.size() / size_t(H));
            return const_cast<uint8_t*>(q.sym.data()) + size_t(s % H) * *n;
        },
        opt, &henc, &hdec);
    setRates(r, enc, dec, henc, hdec);
    return r;
}

}  // namespace kvscope
