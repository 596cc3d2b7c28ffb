// kvs_gpu_check: GPU decode parity and speed without Qt, HDF5 or libtorch, for machines that have a
// GPU but not the whole build (cuda/gpu_check.sh falls back to it). Parity: every case of
// tests/codec_cases.h at every mix of levels, GPU output equal to kvscope::decodeChunk byte for
// byte, and corrupt payloads refused. Speed: a synthetic cache of the given shape (default
// Llama-2-7B at 8K tokens: 32 layers, 32 KV heads x 128, 8192 tokens, 4 GiB fp16), decoded from
// pinned host memory into device memory, with in-band and shared tables, one table per KV head
// (the default profile, format 2.2) and one per channel. The transform codec (codec 6): parity
// over its stage switches, and the decode of a 4 GiB fp16 cache shaped like SmolLM2 (30 layers, 3 KV heads x 64,
// 186368 tokens: the transform encoder's fit inverts C x C matrices, which is out of reach for
// Llama-2-7B's C = 4096 within a few minutes), calibrated on a 2048-token cache of the same kind.
// Prints one JSON object on stdout; exit 1 on any failure. --only transform|cachegen limits it.
#include "codec/gpu_decode.h"
#include "codec_cases.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace kvscope;
using namespace kvscope_test;

namespace {

std::string parityCase(const Case& c)
{
    const KvSet kv = makeKv(c);
    const CodecParams p = makeParams(c, kv);
    std::vector<LevelTables> tables;
    if (c.tables == TableMode::Shared) tables = profileTables(p, "case");
    const std::vector<LevelTables>* shared = c.tables == TableMode::Shared ? &tables : nullptr;
    const auto codec = gpuCodec(p, shared);
    kvscope_cuda_decoder* dec = nullptr;
    if (kvscope_cuda_decoder_create(&codec->c, 0, 0, &dec) != 0) return kvscope_cuda_last_error();
    std::string err;
    for (int shift = 0; shift < p.numLevels() && err.empty(); ++shift) {
        KvSet cpu(p.shape, p.dtype);
        std::vector<std::vector<uint8_t>> pls;
        std::vector<kvscope_cuda_chunk> chunks;
        for (int ch = 0; ch < p.numChunks(); ++ch) {
            const int level = (ch + shift) % p.numLevels() + 1;
            pls.push_back(encodeChunk(p, kv, ch, level, shared ? &tables[size_t(level - 1)] : nullptr));
            decodeChunk(p, pls.back().data(), pls.back().size(), ch, level, shared ? &tables[size_t(level - 1)] : nullptr, cpu, "cpu");
        }
        for (int ch = 0; ch < p.numChunks(); ++ch)
            chunks.push_back({ch, (ch + shift) % p.numLevels() + 1, pls[size_t(ch)].data(), pls[size_t(ch)].size()});
        if (kvscope_cuda_decode(dec, chunks.data(), int(chunks.size())) != 0) {
            err = kvscope_cuda_last_error();
            break;
        }
        const std::vector<uint8_t> ref = flatten(cpu);
        std::vector<uint8_t> gpu(ref.size());
        if (kvscope_cuda_decoder_copy_output(dec, 0, gpu.data(), gpu.size()) != 0) err = kvscope_cuda_last_error();
        else if (gpu != ref) err = "output differs from the CPU decoder (shift " + std::to_string(shift) + ")";
        // corruption: a flipped byte in every 97th position of chunk 0 must never fault the device
        for (size_t at = 0; err.empty() && at < pls[0].size(); at += 97) {
            std::vector<uint8_t> bad = pls[0];
            bad[at] ^= 0x5a;
            const kvscope_cuda_chunk b{0, chunks[0].level, bad.data(), bad.size()};
            const int rc = kvscope_cuda_decode(dec, &b, 1);
            if (rc != 0 && rc != KVSCOPE_CUDA_EDATA) err = std::string("corrupt input: ") + kvscope_cuda_last_error();
        }
    }
    kvscope_cuda_decoder_destroy(dec);
    return err;
}

// Transform parity on the device: every level, all chunks in one call, byte for byte.
std::string transformParityCase(const std::string& v)
{
    const KvShape shape{3, 2, 64, 700};
    const KvSet calib = transformCache(shape, 41, DType::F16), kv = transformCache(shape, 42, DType::F16);
    TransformSettings s;
    s.tokenImportance = v == "importance" || v == "rans32-importance";
    if (v == "fixed") s.entropy = TransformEntropy::Fixed;
    if (v == "rans32" || v == "rans32-importance") s.entropy = TransformEntropy::Rans32;  // the warp symbol kernel
    if (v == "rope-off") s.ropeUndo = false;
    if (v == "recent") s.recentTokens = 100;
    CodecParams p = transformParams(kv, s, 128);
    calibrateTransform(p, {&calib}, kv);
    const auto codec = gpuCodec(p, nullptr);
    kvscope_cuda_decoder* dec = nullptr;
    if (kvscope_cuda_decoder_create(&codec->c, 0, 0, &dec) != 0) return kvscope_cuda_last_error();
    std::string err;
    for (int level = 1; level <= p.numLevels() && err.empty(); ++level) {
        KvSet cpu(p.shape, p.dtype);
        std::vector<std::vector<uint8_t>> pls;
        std::vector<kvscope_cuda_chunk> chunks;
        for (int ch = 0; ch < p.numChunks(); ++ch) {
            pls.push_back(encodeChunk(p, kv, ch, level, nullptr));
            decodeChunk(p, pls.back().data(), pls.back().size(), ch, level, nullptr, cpu, "cpu");
        }
        for (int ch = 0; ch < p.numChunks(); ++ch) chunks.push_back({ch, level, pls[size_t(ch)].data(), pls[size_t(ch)].size()});
        if (kvscope_cuda_decode(dec, chunks.data(), int(chunks.size())) != 0) {
            err = kvscope_cuda_last_error();
            break;
        }
        const std::vector<uint8_t> ref = flatten(cpu);
        std::vector<uint8_t> gpu(ref.size());
        if (kvscope_cuda_decoder_copy_output(dec, 0, gpu.data(), gpu.size()) != 0) err = kvscope_cuda_last_error();
        else if (gpu != ref) err = "output differs from the CPU decoder (level " + std::to_string(level) + ")";
        for (size_t at = 0; err.empty() && at < pls[1].size(); at += 89) {
            std::vector<uint8_t> bad = pls[1];
            bad[at] ^= 0x21;
            const kvscope_cuda_chunk b{1, level, bad.data(), bad.size()};
            const int rc = kvscope_cuda_decode(dec, &b, 1);
            if (rc != 0 && rc != KVSCOPE_CUDA_EDATA) err = std::string("corrupt input: ") + kvscope_cuda_last_error();
        }
    }
    kvscope_cuda_decoder_destroy(dec);
    return err;
}

std::string argStr(int argc, char** argv, const char* name, const char* def)
{
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
    return def;
}

int argInt(int argc, char** argv, const char* name, int def)
{
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
    return def;
}

}  // namespace

int main(int argc, char** argv)
{
    if (gpuDeviceCount() == 0) {
        std::printf("{\"error\": \"no CUDA device\"}\n");
        return 1;
    }
    bool ok = true;
    const std::string only = argStr(argc, argv, "--only", "");
    const bool doCachegen = only != "transform", doTransform = only != "cachegen";
    std::string parity = "[";
    auto note = [&](const std::string& name, const std::string& err) {
        std::fprintf(stderr, "parity %-90s %s\n", name.c_str(), err.empty() ? "bit-exact" : err.c_str());
        ok = ok && err.empty();
        parity += std::string(parity.size() > 1 ? ", " : "") + "{\"case\": \"" + name + "\", \"ok\": " + (err.empty() ? "true" : "false") + "}";
    };
    if (doTransform)
        for (const char* v : {"default", "importance", "fixed", "rope-off", "recent", "rans32", "rans32-importance"}) {
            std::string err;
            try {
                err = transformParityCase(v);
            } catch (const std::exception& e) {
                err = e.what();
            }
            note(std::string("transform ") + v, err);
        }
    for (const auto& [name, c] : doCachegen ? parityCases() : std::vector<std::pair<const char*, Case>>{}) {
        std::string err;
        try {
            err = parityCase(c);
        } catch (const std::exception& e) {
            err = e.what();
        }
        note(name, err);
    }
    parity += "]";
    SyntheticSpec s;
    s.shape = {argInt(argc, argv, "--layers", 32), argInt(argc, argv, "--kv-heads", 32), argInt(argc, argv, "--head-dim", 128),
               argInt(argc, argv, "--tokens", 8192)};
    const int repeats = argInt(argc, argv, "--repeats", 3);
    std::string bench = "null";
    auto addBench = [&](const std::string& line) {
        std::fprintf(stderr, "bench %s\n", line.c_str());
        bench = bench == "null" ? std::string("[") + line : bench + ", " + line;
    };
    const KvSet kv = doCachegen ? makeSyntheticKv(s) : KvSet(KvShape{1, 1, 1, 1}, DType::F16);
    for (int run = 0; run < (doCachegen ? 4 : 0); ++run) {
        const int shared = run / 2;
        const TableScope scope = run % 2 == 0 ? TableScope::Head : TableScope::Channel;
        try {
            CodecParams p;
            p.shape = s.shape;
            p.profile = defaultProfile(s.shape.numLayers);
            p.profile.chunkTokens = argInt(argc, argv, "--chunk-tokens", 256);
            p.profile.tableScope = scope;
            if (shared) p.profile.tables = TableMode::Shared;
            const int level = argInt(argc, argv, "--level", p.profile.defaultLevel);
            const GpuDecodeStats st = benchGpuDecode(kv, p, level, 0, repeats);  // checks parity with the CPU too
            const double parts = st.h2dS + st.tableS + st.kernelS;
            char line[1024];
            std::snprintf(line, sizeof line,
                          "{\"tables\": \"%s\", \"table_scope\": \"%s\", \"device\": \"%s\", \"level\": %d, \"output_GB\": %.3f, \"compressed_GB\": %.3f, "
                          "\"wall_ms\": %.2f, \"decode_GBps\": %.1f, \"h2d_ms\": %.2f, \"table_kernels_ms\": %.2f, "
                          "\"decode_kernels_ms\": %.2f, \"copy_share\": %.3f, \"kernel_share\": %.3f, \"batches\": %d, \"parity\": true}",
                          shared ? "shared" : "inband", tableScopeName(scope), st.device.c_str(), level, double(st.outputBytes) / 1e9,
                          double(st.h2dBytes) / 1e9, st.wallS * 1e3, double(st.outputBytes) / st.wallS / 1e9, st.h2dS * 1e3,
                          st.tableS * 1e3, st.kernelS * 1e3, parts > 0 ? st.h2dS / parts : 0, parts > 0 ? (st.tableS + st.kernelS) / parts : 0,
                          st.batches);
            addBench(line);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "bench failed: %s\n", e.what());
            ok = false;
        }
    }
    if (doTransform) {
        try {
            KvShape ts{30, 3, 64, argInt(argc, argv, "--transform-tokens", 186368)};
            KvShape cs = ts;
            cs.numTokens = 2048;
            const KvSet calib = transformCache(cs, 1, DType::F16);
            const KvSet tkv = transformCache(ts, 2, DType::F16);
            CodecParams p = transformParams(tkv, TransformSettings{}, argInt(argc, argv, "--chunk-tokens", 256));
            calibrateTransform(p, {&calib}, tkv);
            const int level = argInt(argc, argv, "--transform-level", p.defaultLevel());
            const GpuDecodeStats st = benchGpuDecode(tkv, p, level, 0, repeats);  // checks parity with the CPU too
            const double parts = st.h2dS + st.kernelS;
            char line[1024];
            std::snprintf(line, sizeof line,
                          "{\"codec\": \"transform\", \"device\": \"%s\", \"shape\": \"30x3x64x%d\", \"level\": %d, "
                          "\"output_GB\": %.3f, \"compressed_GB\": %.3f, \"bits_per_value\": %.3f, \"wall_ms\": %.2f, "
                          "\"decode_GBps\": %.1f, \"h2d_ms\": %.2f, \"entropy_kernel_ms\": %.2f, \"gemm_kernels_ms\": %.2f, "
                          "\"copy_share\": %.3f, \"kernel_share\": %.3f, \"batches\": %d, \"parity\": true}",
                          st.device.c_str(), ts.numTokens, level, double(st.outputBytes) / 1e9, double(st.h2dBytes) / 1e9,
                          8.0 * double(st.h2dBytes) / double(ts.totalValues()), st.wallS * 1e3, double(st.outputBytes) / st.wallS / 1e9,
                          st.h2dS * 1e3, st.entropyS * 1e3, (st.kernelS - st.entropyS) * 1e3, parts > 0 ? st.h2dS / parts : 0,
                          parts > 0 ? st.kernelS / parts : 0, st.batches);
            addBench(line);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "transform bench failed: %s\n", e.what());
            ok = false;
        }
    }
    if (bench != "null") bench += "]";
    std::printf("{\"ok\": %s, \"parity\": %s, \"bench\": %s}\n", ok ? "true" : "false", parity.c_str(), bench.c_str());
    return ok ? 0 : 1;
}
