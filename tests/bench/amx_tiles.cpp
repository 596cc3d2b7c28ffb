// What the AMX product of the transform decoder costs, and what its operands' alignment does to
// it (issue 31). A developer's tool (not a test):
//   amx_tiles [K C [repeats]]        (default: 147 192 2000, a SmolLM2 block at level 4)
// Prints, in ns (best of 5 rounds, CPU time of the thread): one 1 KB tile load with its rows on
// cache lines and 16 bytes off; AmxProduct::accumulate of one 64-token tile of a random block
// with Z and the sums on cache lines and 16 bytes off (B and the mean rows are always aligned:
// CacheLineVector). Exits 0 with a note on a CPU or kernel without AMX.
#include "codec/simd_path.h"
#include "codec/transform_kernels.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define AMX_TILES_X86 1
#endif

using namespace kvscope;

static double now()
{
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

template <typename F>
static double bestNs(int reps, F f)
{
    double best = 1e30;
    for (int round = 0; round < 5; ++round) {
        const double t0 = now();
        for (int i = 0; i < reps; ++i) f();
        best = std::min(best, (now() - t0) / reps);
    }
    return best * 1e9;
}

#ifdef AMX_TILES_X86
struct TileConfig {
    uint8_t palette = 1, startRow = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Four 16 x 64-byte tile loads from `p` (rows 64 bytes apart, 4 KB between the tiles).
__attribute__((target("amx-tile"))) static void fourLoads(const char* p)
{
    _tile_loadd(4, p, 64);
    _tile_loadd(5, p + 1024, 64);
    _tile_loadd(6, p + 2048, 64);
    _tile_loadd(7, p + 3072, 64);
}

__attribute__((target("amx-tile"))) static double tileLoadNs(const char* p, int reps)
{
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    const double ns = bestNs(reps, [&] { fourLoads(p); }) / 4;
    _tile_release();
    return ns;
}
#endif

int main(int argc, char** argv)
{
    const int K = argc > 1 ? std::atoi(argv[1]) : 147, C = argc > 2 ? std::atoi(argv[2]) : 192;
    const int reps = argc > 3 ? std::atoi(argv[3]) : 2000;
    if (K < 1 || C < 1 || C % 16 != 0 || reps < 1) {
        std::fprintf(stderr, "usage: amx_tiles [K C [repeats]] (C a multiple of 16)\n");
        return 2;
    }
    if (!amxSupported()) {
        std::printf("no AMX on this CPU (or the kernel refuses its tile state)\n");
        return 0;
    }
#ifdef AMX_TILES_X86
    detail::CacheLineVector<char> raw(1 << 16);
    for (int off : {0, 16})
        std::printf("tile load, rows %2d bytes off a cache line: %6.1f ns\n", off, tileLoadNs(raw.data() + off, reps * 16));

    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 0.1f);
    std::vector<float> col(size_t(K) * C), step(size_t(K), 0.05f), mean(static_cast<size_t>(C));
    for (float& x : col) x = g(rng);
    for (float& x : mean) x = g(rng);
    detail::AmxProduct amx;
    if (!amx.prepare(col.data(), step.data(), mean.data(), K, C)) return 1;
    const size_t zn = size_t(detail::kTileTokens) * amx.Kp, vn = size_t(detail::kTileTokens) * amx.Cp;
    detail::CacheLineVector<uint16_t> zbuf(zn + 32);
    detail::CacheLineVector<float> vbuf(vn + 16);
    std::uniform_int_distribution<int> q(-3, 3);
    for (int off : {0, 16}) {
        uint16_t* z = zbuf.data() + off / 2;
        float* v = vbuf.data() + off / 4;
        for (size_t i = 0; i < zn; ++i) {  // q as bfloat16: the high half of the float
            const float f = float(q(rng));
            uint32_t u;
            std::memcpy(&u, &f, 4);
            z[i] = uint16_t(u >> 16);
        }
        const double ns = bestNs(reps, [&] { amx.accumulate(v, z, detail::kTileTokens); });
        std::printf("AmxProduct::accumulate, 64 tokens, K %d (Kp %d), C %d, Z and sums %2d bytes off: %8.0f ns\n", K, amx.Kp, C, off, ns);
    }
#endif
    return 0;
}
