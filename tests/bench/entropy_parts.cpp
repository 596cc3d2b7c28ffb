// Where the CacheGen codec's time goes, stage by stage, on one KV file at the default level, one
// thread (CPU time of the thread, best of N): quantise, count + build + serialise in-band tables, encode streams, parse tables,
// decode streams (symbols and fp16). A developer's tool for the entropy stage (not a test):
//   entropy_parts KV.h5 [repeats] [channel] [scalar|avx2|avx512 ...]   (channel: one table per channel)
// With several SIMD paths named, the decode passes alternate between them in one process (the
// fairest comparison on a machine whose speed drifts between runs) and each path's best is printed.
#include "codec/codec_detail.h"
#include "codec/rans.h"
#include "codec/simd_path.h"
#include "kvio/kv_h5.h"

#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>

using namespace kvscope;
using namespace kvscope::detail;

// Thread CPU time: on a shared machine the time this thread was descheduled does not count.
static double now()
{
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

template <typename F>
static double best(int reps, F f)
{
    double b = 1e300;
    for (int r = 0; r < reps; ++r) {
        const double t0 = now();
        f();
        b = std::min(b, now() - t0);
    }
    return b;
}

int main(int argc, char** argv)
{
    if (argc < 2) return 2;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
    std::vector<SimdPath> paths;
    bool perChannel = false;
    for (int i = 3; i < argc; ++i) {
        if (std::strcmp(argv[i], "channel") == 0) {
            perChannel = true;
            continue;
        }
        SimdPath sp;
        if (!parseSimdPath(argv[i], &sp) || !simdPathSupported(sp)) {
            std::fprintf(stderr, "error: SIMD path %s: unknown or not supported here\n", argv[i]);
            return 2;
        }
        paths.push_back(sp);
    }
    if (paths.empty()) paths.push_back(simdPath());
    setSimdPath(paths[0]);  // the encode side's path; decoding alternates below
    const KvSet kv = readKvH5(argv[1]);
    CodecParams p;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    p.profile = defaultProfile(p.shape.numLayers);
    if (perChannel) p.profile.tableScope = TableScope::Channel;  // CacheGen's one table per channel
    const int level = p.defaultLevel();
    const int L = p.shape.numLayers, H = p.shape.numKvHeads, C = p.shape.channels(), roles = numRoles(p);
    const int nt = tablesPerRole(p);  // tables per role: one per KV head with the default profile
    const bool perHead = perHeadTables(p);
    const int chunks = p.numChunks(), units = chunks * 2 * L;
    std::vector<QuantizedBlock> blocks(static_cast<size_t>(units));
    const double tq = best(reps, [&] {
        for (int u = 0; u < units; ++u) {
            const int c = u / (2 * L), kl = u % (2 * L);
            blocks[size_t(u)] = quantizeUnit(p, kv, kKinds[kl / L], kl % L, level, p.chunkStart(c), p.chunkLength(c));
        }
    });
    std::vector<UnitTables> tabs(static_cast<size_t>(units));
    std::vector<std::vector<uint8_t>> tbytes(static_cast<size_t>(units));
    const double tt = best(reps, [&] {
        for (int u = 0; u < units; ++u) {
            tbytes[size_t(u)].clear();
            inBandUnitTables(blocks[size_t(u)], roles, perHead, tabs[size_t(u)], tbytes[size_t(u)]);
        }
    });
    std::vector<std::vector<std::vector<uint8_t>>> streams(static_cast<size_t>(units), std::vector<std::vector<uint8_t>>(size_t(H)));
    const double te = best(reps, [&] {
        for (int u = 0; u < units; ++u)
            for (int h = 0; h < H; ++h) {
                streams[size_t(u)][size_t(h)].clear();
                encodeHeadStreamV2(blocks[size_t(u)].spec, h, blocks[size_t(u)].sym.data(), tabs[size_t(u)], streams[size_t(u)][size_t(h)]);
            }
    });
    // Decoding parses a unit's tables right before its streams (as decodeChunk does), so the
    // tables are warm in cache; the two parts are timed apart inside one pass.
    std::vector<uint8_t> sym(size_t(p.profile.chunkTokens) * C * 2 + 64);
    std::vector<uint8_t> f16(2 * sym.size());
    UnitTables dtab;
    dtab.resize(roles, nt, channelsPerTable(p));
    double tp = 1e300, ts = 1e300, tf = 1e300;
    std::vector<double> pathSym(paths.size(), 1e300), pathF16(paths.size(), 1e300);
    for (int rep = 0; rep < reps * int(paths.size()); ++rep) {
        const size_t pi = size_t(rep) % paths.size();
        setSimdPath(paths[pi]);
        double a = 0, b = 0, c = 0;
        for (int u = 0; u < units; ++u) {
            const QuantizedBlock& q = blocks[size_t(u)];
            const double t0 = now();
            const uint8_t* tp = tbytes[size_t(u)].data();
            const uint8_t* end = tp + tbytes[size_t(u)].size();
            for (int role = 0; role < roles; ++role)
                for (int ch = 0; ch < nt; ++ch) {
                    std::string why;
                    if (!parseCodingTable(&tp, end, quant::alphabetSize(role ? q.spec.anchorBins : q.spec.bins),
                                          &dtab.tables[size_t(role) * nt + ch], &why))
                        std::abort();
                }
            const double t1 = now();
            const size_t n = q.sym.size() / size_t(H);
            std::vector<const uint8_t*> ptr;
            std::vector<size_t> len;
            std::vector<uint8_t*> dsym, df16;
            for (int h = 0; h < H; ++h) {
                ptr.push_back(streams[size_t(u)][size_t(h)].data());
                len.push_back(streams[size_t(u)][size_t(h)].size());
                dsym.push_back(sym.data() + size_t(h) * n);
                df16.push_back(f16.data() + 2 * size_t(h) * n);
            }
            decodeHeadStreamsV2(q.spec, ptr.data(), len.data(), dtab, q.scales.data(), RowOut::Symbols, dsym.data(), "parts");
            const double t2 = now();
            if (std::memcmp(sym.data(), q.sym.data(), q.sym.size()) != 0) std::abort();
            const double t3 = now();
            decodeHeadStreamsV2(q.spec, ptr.data(), len.data(), dtab, q.scales.data(), RowOut::F16, df16.data(), "parts");
            const double t4 = now();
            a += t1 - t0;
            b += t2 - t1;
            c += t4 - t3;
        }
        tp = std::min(tp, a), ts = std::min(ts, b), tf = std::min(tf, c);
        pathSym[pi] = std::min(pathSym[pi], b), pathF16[pi] = std::min(pathF16[pi], c);
    }
    double symbols = 0;
    for (auto& q : blocks) symbols += double(q.sym.size());
    std::printf("symbols %.0f (%d units), simd %s\n", symbols, units, simdPathName(paths[0]));
    auto line = [&](const char* what, double t) { std::printf("%-28s %8.1f ms %8.2f ns/sym\n", what, 1e3 * t, 1e9 * t / symbols); };
    line("quantise (read + quant)", tq);
    line("count + build + serialise", tt);
    line("encode streams", te);
    line("parse tables", tp);
    line("decode streams -> symbols", ts);
    line("decode streams -> fp16", tf);
    for (size_t pi = 0; paths.size() > 1 && pi < paths.size(); ++pi) {
        std::printf("%s:\n", simdPathName(paths[pi]));
        line("  decode streams -> symbols", pathSym[pi]);
        line("  decode streams -> fp16", pathF16[pi]);
    }
    return 0;
}
