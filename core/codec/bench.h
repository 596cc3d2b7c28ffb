// Codec throughput next to zstd on the same input in the same process, so the figures compare
// like with like on a shared, noisy machine. Throughputs are MB (1e6 bytes) of fp16 KV per second
// (2 bytes per value), whatever the codec.
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

// Encodes and decodes every chunk of kv with params at `level` (in memory, no file I/O).
// Decoding is checked against the encoder's reconstruction; a mismatch throws (it is a bug).
CodecBenchResult benchCodec(const KvSet& kv, const CodecParams& params, int level, const BenchOptions& opt);

// zstd on the fp16 bytes of kv, in chunks of params.profile.chunkTokens like our codec, single
// stream per chunk; uses as many threads as our codec (one chunk per thread).
CodecBenchResult benchZstd(const KvSet& kv, const CodecParams& params, const BenchOptions& opt);

}  // namespace kvscope
