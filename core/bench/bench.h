// Codec throughput next to zstd on the same input in the same process, so the figures compare
// like with like on a shared, noisy machine. Throughputs are MB (1e6 bytes) of fp16 KV per second
// (2 bytes per value), whatever the codec. Single-thread timings are the thread's CPU time (best
// of N), multi-thread ones wall time.
#pragma once

#include "codec/chunk_codec.h"

namespace kvscope {

struct CodecBenchResult {
    std::string codec;
    int level = 0;
    double encodeMBps = 0, decodeMBps = 0;
    double bitsPerValue = 0;
    uint64_t bytes = 0;
};

struct BenchOptions {
    int repeats = 3;       // best of N timed passes
    int zstdLevel = 3;
    int threads = 0;       // 0 = all cores
};

// The thread count a benchmark with these options runs on (threads, or all cores when 0).
int benchThreads(const BenchOptions& opt);

// The entropy stage alone on the quantised symbols of every (chunk, kind, layer, head) stream:
// ours (v2 streams plus, in-band, counting, building and parsing the tables) next to htscodecs'
// rANS 32x16 order-0 on the very same symbol streams, same threads. MB of symbols (1 byte each).
// For the transform codec: every (chunk, kind, layer) block's symbol matrices with the level's
// calibrated tables (built outside the timing) in the profile's entropy layout (rans or rans32),
// htscodecs on the same matrices.
struct EntropyBenchResult {
    double encodeMBps = 0, decodeMBps = 0;        // ours
    double htsEncodeMBps = 0, htsDecodeMBps = 0;  // htscodecs rans_compress_to_4x16, order 0 | X32
    uint64_t symbols = 0;
    uint64_t bytes = 0;     // our streams (+ in-band tables)
    uint64_t htsBytes = 0;  // htscodecs output
    std::string simd;       // the decoder path used (simd_path.h)
};
EntropyBenchResult benchEntropy(const KvSet& kv, const CodecParams& params, int level, const BenchOptions& opt);

// Encodes and decodes every chunk of kv with params at `level` (in memory, no file I/O).
// Decoding is checked against the encoder's reconstruction; a mismatch throws (it is a bug).
// A chained cache (params.chainsChunks(), adapt_basis) codes the level as its chain, chunk after
// chunk, and checks the whole-level decode against a chunk-by-chunk one.
CodecBenchResult benchCodec(const KvSet& kv, const CodecParams& params, int level, const BenchOptions& opt);

// params with the transform codec's adapt_basis turned off, on a copy of the same calibrated
// model: the codec a chained cache's chain starts from, for timing the two side by side.
CodecParams withoutChain(const CodecParams& params);

// zstd on the fp16 bytes of kv, in chunks of params.profile.chunkTokens like our codec, single
// stream per chunk; uses as many threads as our codec (one chunk per thread).
CodecBenchResult benchZstd(const KvSet& kv, const CodecParams& params, const BenchOptions& opt);

}  // namespace kvscope
