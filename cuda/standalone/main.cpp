// kvs_gpu_check: GPU decode parity and speed without Qt, HDF5 or libtorch, for machines that have a
// GPU but not the whole build (cuda/gpu_check.sh falls back to it). Parity: every case of
// tests/codec_cases.h at every mix of levels, GPU output equal to kvscope::decodeChunk byte for
// byte, and corrupt payloads refused. Speed: a synthetic cache of the given shape (default
// Llama-2-7B at 8K tokens: 32 layers, 32 KV heads x 128, 8192 tokens, 4 GiB fp16), decoded from
// pinned host memory into device memory. Prints one JSON object on stdout; exit 1 on any failure.
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
    std::string parity = "[";
    for (const auto& [name, c] : parityCases()) {
        std::string err;
        try {
            err = parityCase(c);
        } catch (const std::exception& e) {
            err = e.what();
        }
        std::fprintf(stderr, "parity %-90s %s\n", name, err.empty() ? "bit-exact" : err.c_str());
        ok = ok && err.empty();
        parity += std::string(parity.size() > 1 ? ", " : "") + "{\"case\": \"" + name + "\", \"ok\": " + (err.empty() ? "true" : "false") + "}";
    }
    parity += "]";
    SyntheticSpec s;
    s.shape = {argInt(argc, argv, "--layers", 32), argInt(argc, argv, "--kv-heads", 32), argInt(argc, argv, "--head-dim", 128),
               argInt(argc, argv, "--tokens", 8192)};
    const int repeats = argInt(argc, argv, "--repeats", 3);
    std::string bench = "null";
    const KvSet kv = makeSyntheticKv(s);
    for (int shared = 0; shared < 2; ++shared) {
        try {
            CodecParams p;
            p.shape = s.shape;
            p.profile = defaultProfile(s.shape.numLayers);
            p.profile.chunkTokens = argInt(argc, argv, "--chunk-tokens", 256);
            if (shared) p.profile.tables = TableMode::Shared;
            const int level = argInt(argc, argv, "--level", p.profile.defaultLevel);
            const GpuDecodeStats st = benchGpuDecode(kv, p, level, 0, repeats);  // checks parity with the CPU too
            const double parts = st.h2dS + st.tableS + st.kernelS;
            char line[1024];
            std::snprintf(line, sizeof line,
                          "{\"tables\": \"%s\", \"device\": \"%s\", \"level\": %d, \"output_GB\": %.3f, \"compressed_GB\": %.3f, "
                          "\"wall_ms\": %.2f, \"decode_GBps\": %.1f, \"h2d_ms\": %.2f, \"table_kernels_ms\": %.2f, "
                          "\"decode_kernels_ms\": %.2f, \"copy_share\": %.3f, \"kernel_share\": %.3f, \"batches\": %d, \"parity\": true}",
                          shared ? "shared" : "inband", st.device.c_str(), level, double(st.outputBytes) / 1e9,
                          double(st.h2dBytes) / 1e9, st.wallS * 1e3, double(st.outputBytes) / st.wallS / 1e9, st.h2dS * 1e3,
                          st.tableS * 1e3, st.kernelS * 1e3, parts > 0 ? st.h2dS / parts : 0, parts > 0 ? (st.tableS + st.kernelS) / parts : 0,
                          st.batches);
            std::fprintf(stderr, "bench %s\n", line);
            bench = bench == "null" ? std::string("[") + line : bench + ", " + line;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "bench failed: %s\n", e.what());
            ok = false;
        }
    }
    if (bench != "null") bench += "]";
    std::printf("{\"ok\": %s, \"parity\": %s, \"bench\": %s}\n", ok ? "true" : "false", parity.c_str(), bench.c_str());
    return ok ? 0 : 1;
}
