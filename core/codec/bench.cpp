#include "codec/bench.h"

#include "common/error.h"
#include "common/half.h"

#include <omp.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace kvscope {

namespace {

double now()
{
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

}  // namespace

CodecBenchResult benchCodec(const KvSet& kv, const CodecParams& p, int level, const BenchOptions& opt)
{
    ThreadScope threads(opt.threads);
    const int chunks = p.numChunks();
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    LevelTables tables;
    if (shared) {  // calibration is offline work: outside the timed region
        LevelCounts counts;
        for (int c = 0; c < chunks; ++c) countChunkSymbols(p, kv, c, level, counts);
        tables = tablesFromCounts(p, level, counts);
    }
    const LevelTables* t = shared ? &tables : nullptr;
    std::vector<std::vector<uint8_t>> payloads(static_cast<size_t>(chunks));
    const double enc = bestOf(opt.repeats, [&] {
        for (int c = 0; c < chunks; ++c) payloads[size_t(c)] = encodeChunk(p, kv, c, level, t);
    });
    KvSet out(p.shape, p.dtype);
    const double dec = bestOf(opt.repeats, [&] {
        for (int c = 0; c < chunks; ++c)
            decodeChunk(p, payloads[size_t(c)].data(), payloads[size_t(c)].size(), c, level, t, out, "bench");
    });
    // Decoding twice must give identical output: a cheap determinism check on the timed path.
    KvSet again(p.shape, p.dtype);
    for (int c = 0; c < chunks; ++c)
        decodeChunk(p, payloads[size_t(c)].data(), payloads[size_t(c)].size(), c, level, t, again, "bench");
    for (int l = 0; l < p.shape.numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            KVSCOPE_ASSERT(std::memcmp(out.data(k, l), again.data(k, l), out.tensorBytes()) == 0);

    CodecBenchResult r;
    r.codec = codecName(p.codec);
    r.level = level;
    for (auto& b : payloads) r.bytes += b.size();
    if (shared) {
        std::vector<uint8_t> blob;
        serializeLevelTables(p, level, tables, blob);
        r.bytes += blob.size();
    }
    r.bitsPerValue = 8.0 * double(r.bytes) / double(p.shape.totalValues());
    r.encodeMBps = fp16MB(p.shape) / enc;
    r.decodeMBps = fp16MB(p.shape) / dec;
    return r;
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

}  // namespace kvscope
