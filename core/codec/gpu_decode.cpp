#include "codec/gpu_decode.h"
#include "codec/simd_path.h"

#include "common/error.h"
#include "kvscope/config.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace kvscope {

std::unique_ptr<GpuCodec> gpuCodec(const CodecParams& p, const std::vector<LevelTables>* shared)
{
    auto g = std::make_unique<GpuCodec>();
    kvscope_cuda_codec& c = g->c;
    c.codec = int(p.codec);
    c.dtype = int(p.dtype);
    c.num_layers = p.shape.numLayers;
    c.num_kv_heads = p.shape.numKvHeads;
    c.head_dim = p.shape.headDim;
    c.num_tokens = p.shape.numTokens;
    c.chunk_tokens = p.profile.chunkTokens;
    c.num_levels = p.numLevels();
    if (p.codec == CodecId::Transform) {
        if (!p.transform) throw Error("GPU decode: the transform codec needs its model (transform section)");
        const TransformModel& m = *p.transform;
        if (p.chainsChunks() || m.settings.adaptPriorTokens > 0)
            throw Error("GPU decode: the CUDA transform decoder does not run the adaptive-basis chain (transform.adapt_basis, "
                        "format 2.3): this file decodes on the CPU");
        if (m.settings.layerGroup != 1)
            throw Error("GPU decode: the CUDA transform decoder reads one layer per block; layer_group " +
                        std::to_string(m.settings.layerGroup) + " decodes on the CPU");
        g->model = p.transform;
        kvscope_cuda_transform& t = g->tf;
        t.rope_undo = m.settings.ropeUndo;
        t.entropy = int(m.settings.entropy);
        t.token_importance = m.settings.tokenImportance;
        t.sink_tokens = m.settings.sinkTokens;
        t.recent_tokens = m.settings.recentTokens;
        t.rope_position0 = m.ropePosition0;
        t.rope_inv_freq = m.ropeInvFreq.empty() ? nullptr : m.ropeInvFreq.data();
        for (const TransformBlock& b : m.blocks) {
            g->tfMean.push_back(b.mean.data());
            g->tfDecode.push_back(b.decode.data());
        }
        for (const auto& level : m.levels)
            for (const TransformLevelBlock& lb : level) {
                g->tfStep.insert(g->tfStep.end(), lb.step.begin(), lb.step.end());
                g->tfMaxQ.insert(g->tfMaxQ.end(), lb.maxQ.begin(), lb.maxQ.end());
                if (entropyUsesTables(m.settings.entropy))
                    for (const auto& f : lb.freq) g->tfFreq.insert(g->tfFreq.end(), f.begin(), f.end());
            }
        t.mean = g->tfMean.data();
        t.decode = g->tfDecode.data();
        t.step = g->tfStep.data();
        t.max_q = g->tfMaxQ.data();
        t.freq = g->tfFreq.data();
        t.freq_count = g->tfFreq.size();
        c.transform = &g->tf;
        return g;
    }
    if (p.codec != CodecId::CacheGen) return g;
    c.key_quantizer = int(p.profile.keyQuantizer);
    c.value_quantizer = int(p.profile.valueQuantizer);
    c.delta_group = p.profile.deltaEnabled() ? p.profile.deltaGroup : 0;
    c.anchor_bins = p.profile.anchorBins;
    c.table_mode = int(p.profile.tables);
    c.table_scope = int(p.profile.tableScope);
    c.entropy_layout = int(p.entropy);
    for (int l = 1; l <= p.numLevels(); ++l)
        for (int layer = 0; layer < p.shape.numLayers; ++layer) {
            g->keyBins.push_back(uint16_t(p.binsFor(KvKind::Key, layer, l)));
            g->valueBins.push_back(uint16_t(p.binsFor(KvKind::Value, layer, l)));
        }
    c.key_bins = g->keyBins.data();
    c.value_bins = g->valueBins.data();
    if (p.profile.tables == TableMode::Shared) {
        if (!shared || int(shared->size()) != p.numLevels()) throw Error("GPU decode: shared probability tables are missing");
        for (int l = 1; l <= p.numLevels(); ++l) {
            g->tables.emplace_back();
            serializeLevelTables(p, l, (*shared)[size_t(l - 1)], g->tables.back());
        }
        for (const auto& t : g->tables) {
            g->tablePtrs.push_back(t.data());
            g->tableBytes.push_back(t.size());
        }
        c.level_tables = g->tablePtrs.data();
        c.level_table_bytes = g->tableBytes.data();
    }
    return g;
}

bool gpuDecodeBuilt() { return KVSCOPE_HAVE_CUDA_BUILD != 0; }

#if KVSCOPE_HAVE_CUDA_BUILD

namespace {

double nowS() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Owns a decoder handle; throws kvscope::Error "GPU decode: <reason>" on failure.
struct Decoder {
    kvscope_cuda_decoder* d = nullptr;
    ~Decoder() { kvscope_cuda_decoder_destroy(d); }
};

void check(int rc, const std::string& what)
{
    if (rc != KVSCOPE_CUDA_OK) throw Error(what + ": " + kvscope_cuda_last_error());
}

void requireDevice(int device)
{
    const int n = kvscope_cuda_device_count();
    if (n == 0) throw Error("GPU decode: no CUDA device (or no driver) on this machine");
    if (device < 0 || device >= n)
        throw Error("GPU decode: CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " found)");
}

struct PinnedBuffer {
    void* p = nullptr;
    ~PinnedBuffer() { kvscope_cuda_host_free(p); }
};

}  // namespace

int gpuDeviceCount() { return kvscope_cuda_device_count(); }

std::string gpuDeviceName(int device)
{
    char name[256];
    int major = 0, minor = 0;
    if (kvscope_cuda_device_name(device, name, sizeof name, &major, &minor) != KVSCOPE_CUDA_OK) return "";
    return std::string(name) + " (sm_" + std::to_string(major) + std::to_string(minor) + ")";
}

KvSet gpuDecodeAll(const KvcReader& reader, const std::vector<int>& levels, int device, GpuDecodeStats* stats)
{
    const CodecParams& p = reader.params();
    requireDevice(device);
    if (levels.size() != 1 && int(levels.size()) != p.numChunks())
        throw Error(reader.name() + ": " + std::to_string(levels.size()) + " levels for " + std::to_string(p.numChunks()) + " chunks");
    const uint64_t outBytes = p.shape.totalValues() * dtypeSize(p.dtype);
    if (outBytes > reader.maxOutputBytes())
        throw Error(reader.name() + ": decoded cache of " + std::to_string(outBytes) + " bytes exceeds the limit");
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    const auto codec = gpuCodec(p, shared ? &reader.sharedTables() : nullptr);
    Decoder dec;
    check(kvscope_cuda_decoder_create(&codec->c, device, 0, &dec.d), reader.name() + ": GPU decode");
    // Every chunk read (CRC checked) first, so the GPU pipeline is timed without file I/O.
    std::vector<std::vector<uint8_t>> payloads(size_t(p.numChunks()));
    std::vector<kvscope_cuda_chunk> chunks;
    for (int c = 0; c < p.numChunks(); ++c) {
        const int level = levels.size() == 1 ? levels[0] : levels[size_t(c)];
        payloads[size_t(c)] = reader.readChunk(c, level);
        chunks.push_back({c, level, payloads[size_t(c)].data(), payloads[size_t(c)].size()});
    }
    check(kvscope_cuda_decode(dec.d, chunks.data(), int(chunks.size())), reader.name() + ": GPU decode");
    KvSet out(p.shape, p.dtype);
    out.modelName = reader.modelName();
    out.modelFingerprint = reader.modelFingerprint();
    out.context = reader.context();
    out.tokens = reader.tokens();
    const double t0 = nowS();
    for (int k = 0; k < 2; ++k)
        for (int l = 0; l < p.shape.numLayers; ++l) {
            const uint64_t off = (uint64_t(k) * p.shape.numLayers + uint64_t(l)) * out.tensorBytes();
            check(kvscope_cuda_decoder_copy_output(dec.d, off, out.data(KvKind(k), l), out.tensorBytes()),
                  reader.name() + ": GPU decode");
        }
    if (stats) {
        kvscope_cuda_timing t{};
        kvscope_cuda_decoder_timing(dec.d, &t);
        stats->device = gpuDeviceName(device);
        stats->dtype = dtypeName(p.dtype);
        stats->wallS = t.wall_ms / 1e3;
        stats->h2dS = t.h2d_ms / 1e3;
        stats->tableS = t.table_ms / 1e3;
        stats->kernelS = (t.kernel_ms + t.entropy_ms) / 1e3;
        stats->entropyS = t.entropy_ms / 1e3;
        stats->stageS = t.stage_ms / 1e3;
        stats->d2hS = nowS() - t0;
        stats->h2dBytes = t.h2d_bytes;
        stats->outputBytes = t.output_bytes;
        stats->batches = t.batches;
    }
    return out;
}

GpuDecodeStats gpuBenchDecode(const CodecParams& p, const std::vector<LevelTables>* shared,
                              const std::vector<std::vector<uint8_t>>& payloads, int level, int device, int repeats,
                              std::vector<uint8_t>* output)
{
    requireDevice(device);
    const auto codec = gpuCodec(p, shared);
    Decoder dec;
    check(kvscope_cuda_decoder_create(&codec->c, device, 0, &dec.d), "GPU decode");
    uint64_t total = 0;
    for (const auto& pl : payloads) total += pl.size();
    PinnedBuffer pinned;
    pinned.p = kvscope_cuda_host_alloc(total ? total : 1);
    if (!pinned.p) throw Error("GPU decode: cannot allocate " + std::to_string(total) + " bytes of pinned host memory");
    std::vector<kvscope_cuda_chunk> chunks;
    uint64_t pos = 0;
    for (size_t c = 0; c < payloads.size(); ++c) {
        uint8_t* dst = static_cast<uint8_t*>(pinned.p) + pos;
        if (!payloads[c].empty()) std::memcpy(dst, payloads[c].data(), payloads[c].size());
        chunks.push_back({int(c), level, dst, payloads[c].size()});
        pos += payloads[c].size();
    }
    GpuDecodeStats best;
    best.wallS = 1e300;
    for (int r = 0; r < std::max(1, repeats) + 1; ++r) {  // the first pass warms up and is not counted
        check(kvscope_cuda_decode(dec.d, chunks.data(), int(chunks.size())), "GPU decode");
        kvscope_cuda_timing t{};
        kvscope_cuda_decoder_timing(dec.d, &t);
        if (r == 0 || t.wall_ms / 1e3 >= best.wallS) continue;
        best.wallS = t.wall_ms / 1e3;
        best.h2dS = t.h2d_ms / 1e3;
        best.tableS = t.table_ms / 1e3;
        best.kernelS = (t.kernel_ms + t.entropy_ms) / 1e3;
        best.entropyS = t.entropy_ms / 1e3;
        best.stageS = t.stage_ms / 1e3;
        best.h2dBytes = t.h2d_bytes;
        best.outputBytes = t.output_bytes;
        best.batches = t.batches;
    }
    best.device = gpuDeviceName(device);
    best.dtype = dtypeName(p.dtype);
    if (output) {
        void* ptr = nullptr;
        uint64_t bytes = 0;
        check(kvscope_cuda_decoder_output(dec.d, &ptr, &bytes), "GPU decode");
        output->resize(bytes);
        const double t0 = nowS();
        check(kvscope_cuda_decoder_copy_output(dec.d, 0, output->data(), bytes), "GPU decode");
        best.d2hS = nowS() - t0;
    }
    return best;
}

GpuDecodeStats benchGpuDecode(const KvSet& kv, const CodecParams& params, int level, int device, int repeats)
{
    requireDevice(device);
    CodecParams p = params;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    if (p.codec == CodecId::Transform && !p.transform) prepareTransform(p, kv, "bench");
    std::vector<LevelTables> tables;
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    if (shared) {
        if (!p.profile.hasCalibratedTables()) calibrateProfile(p, {&kv});
        tables = profileTables(p, "bench profile");
    }
    const LevelTables* t = shared ? &tables[size_t(level - 1)] : nullptr;
    std::vector<std::vector<uint8_t>> payloads(static_cast<size_t>(p.numChunks()));
    for (int c = 0; c < p.numChunks(); ++c) payloads[size_t(c)] = encodeChunk(p, kv, c, level, t);
    std::vector<uint8_t> gpuOut;
    GpuDecodeStats st = gpuBenchDecode(p, shared ? &tables : nullptr, payloads, level, device, repeats, &gpuOut);
    KvSet cpu(p.shape, p.dtype);
    {
        // The kernels give the bytes of the CPU's scalar path, the reference; its fast transform
        // paths are only within FORMAT.md's tolerance of it.
        struct KeepPath {
            SimdPath saved = simdPath();
            ~KeepPath() { setSimdPath(saved); }
        } keep;
        setSimdPath(SimdPath::Scalar);
        for (int c = 0; c < p.numChunks(); ++c)
            decodeChunk(p, payloads[size_t(c)].data(), payloads[size_t(c)].size(), c, level, t, cpu, "bench");
    }
    for (int k = 0; k < 2; ++k)
        for (int l = 0; l < p.shape.numLayers; ++l) {
            const uint64_t off = (uint64_t(k) * p.shape.numLayers + uint64_t(l)) * cpu.tensorBytes();
            if (std::memcmp(gpuOut.data() + off, cpu.data(KvKind(k), l), cpu.tensorBytes()) != 0)
                throw Error("GPU decode: output differs from the CPU decoder at " + std::string(kindName(KvKind(k))) +
                            " layer " + std::to_string(l) + " (a bug: please report it)");
        }
    return st;
}

#else  // built without the CUDA library

namespace {
[[noreturn]] void notBuilt()
{
    throw Error("GPU decode: this kvscope was built without the CUDA library (nvcc was not found at configure time)");
}
}  // namespace

int gpuDeviceCount() { return 0; }
std::string gpuDeviceName(int) { return ""; }
KvSet gpuDecodeAll(const KvcReader&, const std::vector<int>&, int, GpuDecodeStats*) { notBuilt(); }
GpuDecodeStats gpuBenchDecode(const CodecParams&, const std::vector<LevelTables>*, const std::vector<std::vector<uint8_t>>&,
                              int, int, int, std::vector<uint8_t>*)
{
    notBuilt();
}
GpuDecodeStats benchGpuDecode(const KvSet&, const CodecParams&, int, int, int) { notBuilt(); }

#endif

}  // namespace kvscope
