// Decoding .kvc chunks on a CUDA device through cuda/kvscope_cuda.h. Compiles with or without the
// CUDA library (KVSCOPE_HAVE_CUDA_BUILD); without it every decode call throws a one-line error.
#pragma once

#include "codec/container.h"
#include "kvscope_cuda.h"  // plain C, no CUDA types

#include <memory>
#include <string>
#include <vector>

namespace kvscope {

// The C API's description of a codec, with the arrays it points into (not copyable: self-pointers).
struct GpuCodec {
    kvscope_cuda_codec c{};
    std::vector<uint16_t> keyBins, valueBins;  // (levels, layers)
    std::vector<std::vector<uint8_t>> tables;  // shared mode: serialised tables per level
    std::vector<const uint8_t*> tablePtrs;
    std::vector<uint64_t> tableBytes;
    // transform codec: the model flattened (means and decode matrices point into p.transform)
    kvscope_cuda_transform tf{};
    std::shared_ptr<const TransformModel> model;
    std::vector<const float*> tfMean, tfDecode;
    std::vector<float> tfStep;
    std::vector<uint8_t> tfMaxQ;
    std::vector<uint16_t> tfFreq;

    GpuCodec() = default;
    GpuCodec(const GpuCodec&) = delete;
    GpuCodec& operator=(const GpuCodec&) = delete;
};

// shared: one LevelTables per level when p uses TableMode::Shared, else null.
std::unique_ptr<GpuCodec> gpuCodec(const CodecParams& p, const std::vector<LevelTables>* shared);

// True when kvscope was built with the CUDA library (nvcc found at configure time).
bool gpuDecodeBuilt();
// CUDA devices visible (0 when not built, no driver or no device).
int gpuDeviceCount();
// "NVIDIA H200 (sm_90)", or "" when there is no such device.
std::string gpuDeviceName(int device);

struct GpuDecodeStats {
    std::string device;
    std::string dtype;    // of the output
    double wallS = 0;     // chunks in host memory -> KV in device memory
    double h2dS = 0;      // sum of host-to-device copies
    double tableS = 0;    // in-band table kernels
    double kernelS = 0;   // stream decode kernels (transform: symbol, GEMM and raw-token kernels)
    double entropyS = 0;  // transform: the symbol kernel alone (part of kernelS)
    double stageS = 0;    // host copies into pinned staging
    double d2hS = 0;      // the decoded KV back to host memory (decodeAll only)
    uint64_t h2dBytes = 0, outputBytes = 0;
    int batches = 0;
};

// Decodes chunk i at levels[i] (one entry: that level for every chunk) on CUDA device `device`,
// then copies the result into a KvSet. Bit-identical to KvcReader::decodeAll. Throws
// kvscope::Error with a one-line reason when the CUDA library is not built, there is no device,
// the codec has no GPU decoder, or a chunk is corrupt.
KvSet gpuDecodeAll(const KvcReader& reader, const std::vector<int>& levels, int device, GpuDecodeStats* stats = nullptr);

// Times the GPU decode of payloads (chunk i of params at `level`, already in host memory; they are
// moved into pinned memory first) into device memory: best of `repeats` passes after a warm-up.
// With `output`, the decoded cache (GPU output layout) is copied there. Throws like gpuDecodeAll.
GpuDecodeStats gpuBenchDecode(const CodecParams& p, const std::vector<LevelTables>* shared,
                              const std::vector<std::vector<uint8_t>>& payloads, int level, int device, int repeats,
                              std::vector<uint8_t>* output = nullptr);

// `bench codec`'s GPU figures: encodes kv at `level` (calibrating shared tables on kv when the
// profile asks for them and has none; for the transform codec, the profile's model or one fitted
// on kv, as `encode` does), times gpuBenchDecode, and checks that the GPU output equals
// the CPU decoder's byte for byte (a mismatch throws: it is a bug).
GpuDecodeStats benchGpuDecode(const KvSet& kv, const CodecParams& p, int level, int device, int repeats);

}  // namespace kvscope
