// `encode`, `decode` and `bench codec`: the codec from the command line.
#include "cli_common.h"
#include "cli_grammar.h"
#include "cli_codec.h"

#include "bench/bench.h"
#include "codec/container.h"
#include "codec/gpu_decode.h"
#include "codec/simd_path.h"
#include "eval/codec_trial.h"
#include "eval/transform_default.h"
#include "kv/kv_compare.h"
#include "kvio/kv_h5.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

namespace kvscope::cli {

ProfileOptions withDefaultTransform(ProfileOptions po, const Model* model, const std::string& fingerprint)
{
    if (po.codec != "transform" || !po.profilePath.empty()) return po;
    auto log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
    if (model) {
        po.profilePath = ensureDefaultTransform(*model, log);
        return po;
    }
    std::string cached;
    try {
        cached = cachedDefaultTransform(fingerprint);
    } catch (const Error& e) {
        std::fprintf(stderr, "note: %s\n", e.what());
    }
    if (cached.empty())
        std::fprintf(stderr, "note: no calibrated transform profile for model %s yet (eval or stream with the model "
                             "calibrates it once); the transform is fitted on this cache alone\n",
                     fingerprint.empty() ? "(unknown)" : fingerprint.c_str());
    po.profilePath = cached;
    return po;
}

json sizeJson(uint64_t bytes, const KvShape& s)
{
    const SizeFigures size = sizeFigures(bytes, s);
    return {{"bytes", bytes},
            {"bits_per_value", size.bitsPerValue},
            {"ratio_vs_fp16", size.ratioVsFp16},
            {"ratio_vs_int8", size.ratioVsInt8}};
}

json errorJson(const KvError& e, bool perLayer)
{
    json j = {{"max_abs_error", e.maxAbs}, {"rms_error", e.rms}};
    if (perLayer) {
        json layers = json::array();
        for (const LayerError& l : e.layers)
            layers.push_back({{"layer", l.layer},
                              {"key_max_abs", l.key.maxAbs}, {"key_rms", l.key.rms}, {"key_snr_db", number(l.key.snrDb)},
                              {"value_max_abs", l.value.maxAbs}, {"value_rms", l.value.rms},
                              {"value_snr_db", number(l.value.snrDb)}});
        j["layers"] = layers;
    }
    return j;
}

// Encodes kv into path and describes every level; with verify, decodes each level and adds errors.
// Sizes count what a receiver must fetch: chunks, plus the shared tables when they were calibrated
// on this cache (they travel in the file), but not when they come from the profile (the receiver has it).
namespace {

json encodeReport(const KvSet& kv, const CodecParams& p, const std::string& path, bool verify, bool perLayer,
                  const std::string& profileSource = "default profile")
{
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    const bool fromProfile = shared && p.profile.hasCalibratedTables();
    std::vector<LevelTables> calibrated;
    if (fromProfile) calibrated = profileTables(p, profileSource);
    const KvcWriteReport rep = writeKvc(kv, p, path, fromProfile ? &calibrated : nullptr);
    const auto reader = KvcReader::openFile(path);
    json levels = json::array();
    for (int l = 1; l <= p.numLevels(); ++l) {
        const uint64_t chunkBytes = rep.levelBytes[size_t(l - 1)], tableBytes = rep.levelTableBytes[size_t(l - 1)];
        json j = sizeJson(chunkBytes + (fromProfile ? 0 : tableBytes), p.shape);
        j["level"] = l;
        j["chunk_bytes"] = chunkBytes;
        j["table_bytes"] = tableBytes;
        j["tables_from"] = !shared ? "chunks" : fromProfile ? "profile" : "file";
        if (verify) {
            const double t0 = nowSeconds();
            const KvSet decoded = reader->decodeAll({l});
            j["decode_s"] = nowSeconds() - t0;
            j.update(errorJson(compareKv(kv, decoded), perLayer));
        }
        levels.push_back(j);
    }
    const int def = p.defaultLevel();
    json j = levels[size_t(def - 1)];
    j.erase("level");
    j["file"] = path;
    j["codec"] = codecName(p.codec);
    j["file_bytes"] = rep.fileBytes;
    j["default_level"] = def;
    j["encode_s"] = rep.seconds;
    j["num_chunks"] = p.numChunks();
    j["chunk_tokens"] = p.profile.chunkTokens;
    j["levels"] = levels;
    if (p.codec == CodecId::Transform) {
        // The model travels in the file; a calibrated one is per-model data (not in "bytes").
        const size_t side = transformSideBytes(*p.transform);
        j["transform_model_bytes"] = transformModelBytes(*p.transform);
        j["model_from"] = p.transform->fittedOnCache ? "cache" : "profile";
        // Chained chunks (container_chain.h): a level decodes only whole and in order.
        if (p.chainsChunks())
            j["adapt_basis"] = {{"prior_tokens", p.profile.transform.adaptPriorTokens}, {"sweeps", p.profile.transform.adaptSweeps}};
        for (json& l : j["levels"]) {
            l.update(sizeJson(l["chunk_bytes"].get<uint64_t>() + side, p.shape));
            l["side_bytes"] = side;
        }
        json& first = j["levels"][size_t(def - 1)];
        for (const char* k : {"bytes", "bits_per_value", "ratio_vs_fp16", "ratio_vs_int8"}) j[k] = first[k];
    }
    if (p.codec == CodecId::CacheGen) {
        j["delta_group"] = p.profile.deltaGroup;
        j["tables"] = tableModeName(p.profile.tables);
        j["table_scope"] = tableScopeName(p.profile.tableScope);
        j["key_quantizer"] = quantizerName(p.profile.keyQuantizer);
        j["value_quantizer"] = quantizerName(p.profile.valueQuantizer);
    }
    return j;
}

void printEncode(const json& r)
{
    std::printf("%s: %s, %d chunks of %d tokens, %.3f s\n", r["file"].get<std::string>().c_str(),
                r["codec"].get<std::string>().c_str(), r["num_chunks"].get<int>(), r["chunk_tokens"].get<int>(),
                r["encode_s"].get<double>());
    for (const json& l : r["levels"]) {
        std::printf("  level %d: %10llu bytes  %.3f bits/value  %.2fx vs fp16  %.2fx vs int8", l["level"].get<int>(),
                    (unsigned long long)l["bytes"].get<uint64_t>(), l["bits_per_value"].get<double>(),
                    l["ratio_vs_fp16"].get<double>(), l["ratio_vs_int8"].get<double>());
        if (l.contains("max_abs_error"))
            std::printf("  max err %.4g  rms %.4g", l["max_abs_error"].get<double>(), l["rms_error"].get<double>());
        std::printf("\n");
    }
}

std::vector<int> parseLevels(const std::string& s)
{
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            out.push_back(std::stoi(item, &used));
            if (used != item.size()) throw std::invalid_argument(item);
        } catch (const std::exception&) {
            throw Error("--level: '" + item + "' is not a level number");
        }
    }
    if (out.empty()) throw Error("--level: empty");
    return out;
}

json gpuStatsJson(const GpuDecodeStats& st)
{
    const double parts = st.h2dS + st.tableS + st.kernelS;
    return {{"device", st.device},
            {"dtype", st.dtype},
            {"wall_ms", st.wallS * 1e3},
            {"decode_GBps", st.wallS > 0 ? double(st.outputBytes) / st.wallS / 1e9 : 0.0},
            {"output_bytes", st.outputBytes},
            {"h2d_bytes", st.h2dBytes},
            {"h2d_ms", st.h2dS * 1e3},
            {"table_kernels_ms", st.tableS * 1e3},
            {"decode_kernels_ms", st.kernelS * 1e3},
            {"staging_ms", st.stageS * 1e3},
            {"copy_share", parts > 0 ? st.h2dS / parts : 0.0},
            {"kernel_share", parts > 0 ? (st.tableS + st.kernelS) / parts : 0.0},
            {"batches", st.batches}};
}

}  // namespace

void addEncodeCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("encode", "Compress a KV file into a .kvc container");
    struct Opts {
        std::string in, out;
        ProfileOptions profile;
        bool verify = false, perLayer = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("kv", o->in, "KV file (HDF5)")->required();
    addOutOption(sub, o->out, "container to write (.kvc)", true);
    o->profile.add(sub);
    sub->add_flag("--verify", o->verify, "decode every level and report the reconstruction error");
    sub->add_flag("--per-layer", o->perLayer, "with --verify: errors per layer");
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli encode kv.h5 --out kv.kvc --verify");
    sub->callback([o, &out] {
        const KvSet kv = readKvH5(o->in);
        const ProfileOptions po = withDefaultTransform(o->profile, nullptr, kv.modelFingerprint);
        const CodecParams p = po.params(kv);
        out.emit(encodeReport(kv, p, o->out, o->verify, o->perLayer, po.source()), printEncode);
    });
}

namespace {

std::vector<double> parseThetas(const std::string& s, const char* opt)
{
    std::vector<double> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            const double v = std::stod(item, &used);
            if (used != item.size() || !(v > 0) || v > 1e6) throw std::invalid_argument(item);
            out.push_back(v);
        } catch (const std::exception&) {
            throw Error(std::string(opt) + ": '" + item + "' is not a positive number");
        }
    }
    if (out.empty() || out.size() > 64) throw Error(std::string(opt) + ": give 1 to 64 numbers");
    return out;
}

// calibrate --codec transform: fits the transform model for the profile's switches and levels
// (or --thetas) and stores it in the profile.
void calibrateTransformCommand(CodecProfile pr, const std::vector<const KvSet*>& caches, const std::string& thetas,
                               const std::string& valueThetas, int layerGroup, const std::string& path, Output& out)
{
    const double t0 = nowSeconds();
    if (layerGroup > 0) {
        const int L = caches.front()->shape().numLayers;
        if (layerGroup > 64 || L % layerGroup != 0)
            throw Error("--layer-group: " + std::to_string(layerGroup) + " does not divide the " + std::to_string(L) + " layers (1..64)");
        pr.transform.layerGroup = layerGroup;
    }
    if (!thetas.empty()) {
        const std::vector<double> k = parseThetas(thetas, "--thetas");
        const std::vector<double> v = valueThetas.empty() ? k : parseThetas(valueThetas, "--value-thetas");
        if (v.size() != k.size()) throw Error("--value-thetas: give as many numbers as --thetas");
        pr.transformLevels.clear();
        for (size_t i = 0; i < k.size(); ++i) {
            TransformLevel l;
            char name[64];
            std::snprintf(name, sizeof name, "t %g/%g", k[i], v[i]);
            l.name = name;
            l.keyTheta = k[i];
            l.valueTheta = v[i];
            pr.transformLevels.push_back(l);
        }
        pr.transformDefaultLevel = std::min<int>(pr.transformDefaultLevel, int(k.size()));
    } else if (!pr.hasTransform()) {
        pr.transformLevels = defaultTransformLevels();
    }
    pr.transformDefaultLevel = std::max(1, std::min<int>(pr.transformDefaultLevel, int(pr.transformLevels.size())));
    const TransformModel m = fitTransform(pr.transform, pr.transformLevels, caches);
    pr.transformModel.clear();
    serializeTransformModel(m, pr.transformModel);
    if (pr.modelFingerprint.empty()) pr.modelFingerprint = caches.front()->modelFingerprint;
    pr.numLayers = caches.front()->shape().numLayers;
    saveProfile(pr, path);
    json levels = json::array();
    for (int l = 1; l <= m.numLevels(); ++l) {
        int coded[2] = {0, 0};
        for (int layer = 0; layer < m.numLayers; ++layer)
            for (KvKind k : {KvKind::Key, KvKind::Value}) coded[int(k)] += m.codedComponents(l, k, layer);
        const double all = double(m.numLayers) * m.channels();
        levels.push_back({{"level", l}, {"name", pr.transformLevels[size_t(l - 1)].name},
                          {"key_coded_fraction", coded[0] / all}, {"value_coded_fraction", coded[1] / all}});
    }
    out.emit({{"file", path}, {"codec", "transform"}, {"caches", caches.size()}, {"model_bytes", pr.transformModel.size()},
              {"basis", basisName(m.settings.basis)}, {"layer_group", m.settings.layerGroup}, {"levels", levels},
              {"seconds", nowSeconds() - t0}},
             [](const json& r) {
                 std::printf("wrote %s: transform model of %llu bytes (%s) from %d caches\n", r["file"].get<std::string>().c_str(),
                             (unsigned long long)r["model_bytes"].get<uint64_t>(), r["basis"].get<std::string>().c_str(),
                             r["caches"].get<int>());
                 for (const json& l : r["levels"])
                     std::printf("  level %d (%s): %.1f%% of key and %.1f%% of value components coded\n", l["level"].get<int>(),
                                 l["name"].get<std::string>().c_str(), 100 * l["key_coded_fraction"].get<double>(),
                                 100 * l["value_coded_fraction"].get<double>());
             });
}

}  // namespace

void addCalibrateCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("calibrate", "Calibrate shared probability tables on KV files and store them in a profile");
    struct Opts {
        std::vector<std::string> inputs;
        std::string out, thetas, valueThetas;
        int layerGroup = 0;
        ProfileOptions profile;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("kv", o->inputs, "KV files (HDF5) of one model")->required();
    addOutOption(sub, o->out, "profile to write (JSON)", true);
    o->profile.add(sub);
    addJsonFlag(sub, out);
    sub->add_option("--thetas", o->thetas,
                    "transform: relative water levels t, one level each, coarsest first (default 0.1,0.05,0.025,0.012,0.006)");
    sub->add_option("--value-thetas", o->valueThetas, "transform: t for values per level (default: --thetas)");
    sub->add_option("--layer-group", o->layerGroup,
                    "transform: layers per block, one PCA across G adjacent layers (default: the profile's layer_group, 1)");
    setExample(sub, "kvscope-cli calibrate --codec transform a.h5 b.h5 --out tp.json --thetas 0.03,0.01");
    sub->callback([o, &out] {
        if (o->profile.codec != "cachegen" && o->profile.codec != "transform")
            throw Error("--codec: only cachegen and transform calibrate");
        std::vector<KvSet> caches;
        for (const std::string& path : o->inputs) {
            caches.push_back(readKvH5(path));
            const KvShape& a = caches.front().shape();
            const KvShape& b = caches.back().shape();
            if (a.numLayers != b.numLayers || a.channels() != b.channels())
                throw Error(path + ": " + std::to_string(b.numLayers) + " layers x " + std::to_string(b.channels()) +
                            " channels, but " + o->inputs.front() + " has " + std::to_string(a.numLayers) + " x " +
                            std::to_string(a.channels()));
        }
        std::vector<const KvSet*> ptrs;
        for (const KvSet& kv : caches) ptrs.push_back(&kv);
        if (o->profile.codec == "transform") {
            calibrateTransformCommand(*o->profile.loadedProfile(caches.front()), ptrs, o->thetas, o->valueThetas,
                                      o->layerGroup, o->out, out);
            return;
        }
        ProfileOptions po = o->profile;
        po.tables.clear();
        po.recalibrate = true;
        CodecParams p = po.params(caches.front());
        const double t0 = nowSeconds();
        calibrateProfile(p, ptrs);
        if (p.profile.modelFingerprint.empty()) p.profile.modelFingerprint = caches.front().modelFingerprint;
        saveProfile(p.profile, o->out);
        json levels = json::array();
        for (int l = 1; l <= p.numLevels(); ++l)
            levels.push_back({{"level", l}, {"table_bytes", p.profile.levelTables[size_t(l - 1)].size()}});
        out.emit({{"file", o->out}, {"caches", caches.size()}, {"channels", p.profile.tableChannels},
                  {"table_scope", tableScopeName(p.profile.tableScope)}, {"levels", levels},
                  {"seconds", nowSeconds() - t0}},
                 [](const json& r) {
                     std::printf("wrote %s: one table per %s, %d channels per layer, from %zu caches\n",
                                 r["file"].get<std::string>().c_str(), r["table_scope"].get<std::string>().c_str(),
                                 r["channels"].get<int>(), r["caches"].get<size_t>());
                 });
    });
}

void addDecodeCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("decode", "Decompress a .kvc container into a KV file");
    struct Opts {
        std::string in, out, source, levels, device = "cpu";
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("kvc", o->in, "container (.kvc)")->required();
    sub->add_option("--device", o->device, "cpu, cuda or cuda:N (the CUDA decoder: the same bytes as --simd scalar)")->capture_default_str();
    addOutOption(sub, o->out, "KV file to write (HDF5)", true);
    sub->add_option("--level", o->levels, "level for every chunk, or one per chunk: 1,3,2,...; default: the file's default");
    sub->add_option("--source", o->source, "original KV file: report the reconstruction error against it");
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli decode kv.kvc --out back.h5 --level 1,3,2,2 --source kv.h5");
    sub->callback([o, &out] {
        const auto reader = KvcReader::openFile(o->in);
        const std::vector<int> levels =
            o->levels.empty() ? std::vector<int>{reader->params().profile.defaultLevel} : parseLevels(o->levels);
        for (int l : levels)
            if (l < 1 || l > reader->params().numLevels())
                throw Error(o->in + ": level " + std::to_string(l) + " does not exist (the file has " +
                            std::to_string(reader->params().numLevels()) + ")");
        const int device = parseDevice(o->device);
        const double t0 = nowSeconds();
        GpuDecodeStats gpu;
        const KvSet kv = device < 0 ? reader->decodeAll(levels) : gpuDecodeAll(*reader, levels, device, &gpu);
        const double decodeS = nowSeconds() - t0;
        writeKvH5(kv, o->out);
        json j = {{"file", o->out}, {"decode_s", decodeS}, {"codec", codecName(reader->params().codec)},
                  {"levels", levels}, {"num_tokens", kv.shape().numTokens}, {"device", o->device}};
        if (device >= 0) j["gpu"] = gpuStatsJson(gpu);
        if (!o->source.empty()) {
            const KvSet src = readKvH5(o->source);
            if (!(src.shape() == kv.shape())) throw Error(o->source + ": shape differs from the container's");
            j.update(errorJson(compareKv(src, kv), true));
        }
        out.emit(j, [](const json& r) {
            std::printf("wrote %s in %.3f s", r["file"].get<std::string>().c_str(), r["decode_s"].get<double>());
            if (r.contains("max_abs_error"))
                std::printf(", max abs error %.4g, rms %.4g", r["max_abs_error"].get<double>(), r["rms_error"].get<double>());
            std::printf("\n");
        });
    });
}

namespace {

struct BenchCodecOpts {
    std::string kv;
    ProfileOptions profile;
    int level = 0;
    BenchOptions bench;
    bool gpuOnly = false;
    std::string device = "cuda";
    int runs = 1;
    std::string simd = "auto";
};

void addBenchCodecOptions(CLI::App* sub, BenchCodecOpts& o)
{
    addDeprecated(sub, "--kv", sub->add_option("kv", o.kv, "KV file (HDF5)"), "the positional KV file");
    o.profile.add(sub);
    sub->add_option("--level", o.level, "level to time (default: the profile's default)");
    sub->add_option("--repeats", o.bench.repeats, "timed passes of a row per run, best taken")->capture_default_str();
    auto* runs = sub->add_option("--runs", o.runs, "runs that time every row in turn (ours, entropy stage, int8, zstd), each row's best kept")
                     ->check(CLI::Range(1, 100))
                     ->capture_default_str();
    addDeprecated(sub, "--rounds", runs, "--runs");
    sub->add_option("--threads", o.bench.threads, "threads (0 = all cores)")->capture_default_str();
    sub->add_option("--zstd-level", o.bench.zstdLevel, "zstd compression level")->capture_default_str();
    auto* device = sub->add_option("--device", o.device, "CUDA device of the GPU decode figures: cuda or cuda:N; cpu leaves them out")
                       ->capture_default_str();
    addDeprecated(sub, "--gpu-device", device, "--device cuda:N", [](const std::string& n) { return "cuda:" + n; });
    sub->add_flag("--gpu-only", o.gpuOnly, "only the GPU decode figures (skips the CPU and zstd timings)");
    sub->add_option("--simd", o.simd, "entropy decoder path: auto, scalar, avx2, avx512 (env KVSCOPE_SIMD)")
        ->capture_default_str();
}

// bench codec on a chained profile (adapt_basis): the calibrated codec's row after the chain's,
// and the chain's speed as a fraction of it.
void addChainFigures(json& j, const CodecParams& p, const CodecBenchResult& chain, const CodecBenchResult& cal, json calRow)
{
    calRow["codec"] = "transform (calibrated)";
    j["results"].insert(j["results"].begin() + 1, calRow);
    j["adapt_basis"] = {{"prior_tokens", p.profile.transform.adaptPriorTokens},
                        {"sweeps", p.profile.transform.adaptSweeps},
                        {"reset_chunks", p.profile.transform.adaptResetChunks}};
    j["calibrated_encode_MBps"] = cal.encodeMBps;
    j["calibrated_decode_MBps"] = cal.decodeMBps;
    j["calibrated_bits_per_value"] = cal.bitsPerValue;
    j["chain_encode_vs_calibrated"] = chain.encodeMBps / cal.encodeMBps;
    j["chain_decode_vs_calibrated"] = chain.decodeMBps / cal.decodeMBps;
}

}  // namespace

void addBenchCommand(CLI::App& app, Output& out)
{
    auto* bench = app.add_subcommand("bench", "Benchmarks that print figures");
    bench->require_subcommand(1);
    auto* sub = bench->add_subcommand("codec", "Codec encode/decode speed next to int8 and zstd on the same KV");
    auto o = std::make_shared<BenchCodecOpts>();
    addBenchCodecOptions(sub, *o);
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli bench codec kv.h5 --threads 1 --runs 3 --json");
    sub->callback([o, &out] {
        requireInput(o->kv, "kv");
        const int device = parseDevice(o->device);
        if (device < 0 && o->gpuOnly) throw Error("--gpu-only needs --device cuda or cuda:N");
        const KvSet kv = readKvH5(o->kv);
        const CodecParams p = withDefaultTransform(o->profile, nullptr, kv.modelFingerprint).params(kv);
        const int level = o->level ? o->level : p.defaultLevel();
        if (level < 1 || level > p.numLevels()) throw Error("--level " + std::to_string(level) + " does not exist");
        // GPU decode: chunks in pinned memory -> KV in device memory, checked against the CPU decoder.
        json gpu;
        if (device < 0) gpu = "gpu: left out (--device cpu)";
        else if (!gpuDecodeBuilt()) gpu = "gpu: not built (no nvcc at configure time)";
        else if (gpuDeviceCount() == 0) gpu = "gpu: no CUDA device";
        else gpu = gpuStatsJson(benchGpuDecode(kv, p, level, device, o->bench.repeats));
        auto printGpu = [](const json& g) {
            if (g.is_string()) {
                std::printf("%s\n", g.get<std::string>().c_str());
                return;
            }
            std::printf("gpu %s: decode %.1f GB/s of %s output (%.2f ms for %.3f GB; copies %.2f ms, table kernels %.2f ms, "
                        "decode kernels %.2f ms: %.0f%% copies, %.0f%% kernels; %d batches)\n",
                        g["device"].get<std::string>().c_str(), g["decode_GBps"].get<double>(), g["dtype"].get<std::string>().c_str(),
                        g["wall_ms"].get<double>(), double(g["output_bytes"].get<uint64_t>()) / 1e9, g["h2d_ms"].get<double>(),
                        g["table_kernels_ms"].get<double>(), g["decode_kernels_ms"].get<double>(),
                        100 * g["copy_share"].get<double>(), 100 * g["kernel_share"].get<double>(), g["batches"].get<int>());
        };
        if (o->gpuOnly) {
            out.emit({{"kv", o->kv}, {"codec", codecName(p.codec)}, {"level", level},
                      {"fp16_MB", 2.0 * double(kv.shape().totalValues()) / 1e6}, {"gpu", gpu}},
                     [printGpu](const json& r) { printGpu(r["gpu"]); });
            return;
        }
        SimdPath simd;
        if (!parseSimdPath(o->simd, &simd)) throw Error("--simd " + o->simd + ": expected auto, scalar, avx2 or avx512");
        if (o->simd != "auto" || std::getenv("KVSCOPE_SIMD") == nullptr) setSimdPath(simd);
        // Every row is timed once per round, the rows in turn, and keeps its fastest round: a burst
        // of load on a shared machine then costs one round of every row, not every repeat of one
        // row, and the ratios compare each side's quietest time.
        // The entropy stage alone: CacheGen's streams, or the transform codec's symbol matrices.
        const bool entropyStage = p.codec == CodecId::CacheGen ||
                                  (p.codec == CodecId::Transform && entropyUsesTables(p.transform->settings.entropy));
        CodecParams p8 = p;
        p8.codec = CodecId::Int8;
        // A chained profile (adapt_basis): the calibrated codec it starts from, timed beside it.
        const bool chained = p.chainsChunks();
        const CodecParams pCal = chained ? withoutChain(p) : CodecParams{};
        CodecBenchResult ours, cal, int8, z;
        EntropyBenchResult ent;
        auto keep = [](CodecBenchResult& best, const CodecBenchResult& r) {
            if (best.codec.empty()) best = r;
            best.encodeMBps = std::max(best.encodeMBps, r.encodeMBps);
            best.decodeMBps = std::max(best.decodeMBps, r.decodeMBps);
        };
        for (int round = 0; round < o->runs; ++round) {
            keep(ours, benchCodec(kv, p, level, o->bench));
            if (chained) keep(cal, benchCodec(kv, pCal, level, o->bench));
            if (entropyStage) {
                const EntropyBenchResult e = benchEntropy(kv, p, level, o->bench);
                if (round == 0) ent = e;
                ent.encodeMBps = std::max(ent.encodeMBps, e.encodeMBps);
                ent.decodeMBps = std::max(ent.decodeMBps, e.decodeMBps);
                ent.htsEncodeMBps = std::max(ent.htsEncodeMBps, e.htsEncodeMBps);
                ent.htsDecodeMBps = std::max(ent.htsDecodeMBps, e.htsDecodeMBps);
            }
            keep(int8, benchCodec(kv, p8, 1, o->bench));
            keep(z, benchZstd(kv, p, o->bench));
        }
        auto row = [&](const CodecBenchResult& r) {
            json j = sizeJson(r.bytes, kv.shape());
            j["codec"] = r.codec;
            j["level"] = r.level;
            j["encode_MBps"] = r.encodeMBps;
            j["decode_MBps"] = r.decodeMBps;
            return j;
        };
        json j = {{"kv", o->kv},
                  {"codec", ours.codec},
                  {"level", level},
                  {"fp16_MB", 2.0 * double(kv.shape().totalValues()) / 1e6},
                  {"threads", benchThreads(o->bench)},
                  {"runs", o->runs},
                  {"rounds", o->runs},  // the old name of "runs", for one release
                  {"repeats", o->bench.repeats},
                  {"simd", simdPathName(simdPath())},
                  // the transform decoder's product on AMX tiles (simd_path.h; KVSCOPE_AMX=0 turns it off)
                  {"amx", p.codec == CodecId::Transform && simdPath() == SimdPath::Avx512 && amxEnabled()},
                  {"entropy_encode_MBps", ent.encodeMBps},
                  {"entropy_decode_MBps", ent.decodeMBps},
                  {"entropy_bytes", ent.bytes},
                  {"htscodecs_encode_MBps", ent.htsEncodeMBps},
                  {"htscodecs_decode_MBps", ent.htsDecodeMBps},
                  {"htscodecs_bytes", ent.htsBytes},
                  {"entropy_symbols", ent.symbols},
                  {"entropy_decode_vs_htscodecs", entropyStage ? ent.decodeMBps / ent.htsDecodeMBps : 0.0},
                  {"entropy_encode_vs_htscodecs", entropyStage ? ent.encodeMBps / ent.htsEncodeMBps : 0.0},
                  {"encode_MBps", ours.encodeMBps},
                  {"decode_MBps", ours.decodeMBps},
                  {"bits_per_value", ours.bitsPerValue},
                  {"zstd_level", o->bench.zstdLevel},
                  {"zstd_compress_MBps", z.encodeMBps},
                  {"zstd_decompress_MBps", z.decodeMBps},
                  {"zstd_bits_per_value", z.bitsPerValue},
                  {"decode_vs_zstd_decompress", ours.decodeMBps / z.decodeMBps},
                  {"encode_vs_zstd_compress", ours.encodeMBps / z.encodeMBps},
                  {"size_vs_zstd", double(ours.bytes) / double(z.bytes)},
                  {"results", json::array({row(ours), row(int8), row(z)})},
                  {"gpu", gpu}};
        if (chained) addChainFigures(j, p, ours, cal, row(cal));
        out.emit(j, [printGpu](const json& r) {
            std::printf("%-22s %5s %12s %12s %10s\n", "codec", "level", "encode MB/s", "decode MB/s", "bits/value");
            for (const json& x : r["results"])
                std::printf("%-22s %5d %12.1f %12.1f %10.3f\n", x["codec"].get<std::string>().c_str(), x["level"].get<int>(),
                            x["encode_MBps"].get<double>(), x["decode_MBps"].get<double>(),
                            x["bits_per_value"].get<double>());
            std::printf("ours vs zstd: decode %.2fx, encode %.2fx, size %.3fx (%d threads, %s)\n",
                        r["decode_vs_zstd_decompress"].get<double>(), r["encode_vs_zstd_compress"].get<double>(),
                        r["size_vs_zstd"].get<double>(), r["threads"].get<int>(), r["simd"].get<std::string>().c_str());
            if (r["entropy_symbols"].get<uint64_t>() > 0)
                std::printf("entropy stage, MB of symbols/s: ours encode %.1f decode %.1f (%llu bytes), htscodecs rANS32x16 "
                            "encode %.1f decode %.1f (%llu bytes): decode %.2fx, encode %.2fx\n",
                            r["entropy_encode_MBps"].get<double>(), r["entropy_decode_MBps"].get<double>(),
                            (unsigned long long)r["entropy_bytes"].get<uint64_t>(), r["htscodecs_encode_MBps"].get<double>(),
                            r["htscodecs_decode_MBps"].get<double>(), (unsigned long long)r["htscodecs_bytes"].get<uint64_t>(),
                            r["entropy_decode_vs_htscodecs"].get<double>(), r["entropy_encode_vs_htscodecs"].get<double>());
            if (r.contains("chain_decode_vs_calibrated"))
                std::printf("adaptive chain vs the calibrated codec: encode %.3fx, decode %.3fx of its MB/s\n",
                            r["chain_encode_vs_calibrated"].get<double>(), r["chain_decode_vs_calibrated"].get<double>());
            printGpu(r["gpu"]);
        });
    });
}

}  // namespace kvscope::cli

namespace kvscope::cli {

void addProfileCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("profile", "Show a codec profile and export its bins in LMCache's CacheGen form");
    struct Opts {
        std::string path;
        int layers = 30;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("profile", o->path, "profile (JSON); default: the default profile for --layers");
    sub->add_option("--layers", o->layers, "layers of the default profile")->capture_default_str();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli profile samples/profiles/smollm2-135m-instruct.json");
    sub->callback([o, &out] {
        if (o->path.empty() && (o->layers < 1 || o->layers > KvLimits::maxLayers))
            throw Error("--layers must be in 1.." + std::to_string(KvLimits::maxLayers));
        const CodecProfile p = o->path.empty() ? defaultProfile(o->layers) : loadProfile(o->path);
        // LMCache's CacheGen configuration: per level, QuantizationSpec(start_layer, end_layer,
        // bins) lists for keys (kspecs) and values (vspecs), end_layer exclusive.
        auto specs = [](const std::vector<int>& bins) {
            json a = json::array();
            for (const LayerRange& r : toLayerRanges(bins))
                a.push_back({{"start_layer", r.start}, {"end_layer", r.end}, {"bins", r.bins}});
            return a;
        };
        json levels = json::array();
        for (size_t i = 0; i < p.levels.size(); ++i) {
            const CodecLevel& l = p.levels[i];
            levels.push_back({{"level", int(i) + 1}, {"name", l.name}, {"kspecs", specs(l.keyBins)},
                              {"vspecs", specs(l.valueBins)}, {"lmcache_python", lmcacheConfigPython(l)}});
        }
        const json j = {{"profile", o->path.empty() ? "default" : o->path},
                        {"num_layers", int(p.levels.front().keyBins.size())},
                        {"chunk_tokens", p.chunkTokens},
                        {"delta_group", p.deltaGroup},
                        {"default_level", p.defaultLevel},
                        {"calibrated_tables", p.hasCalibratedTables()},
                        {"model_fingerprint", p.modelFingerprint},
                        {"levels", levels}};
        out.emit(j, [](const json& j) {
            std::printf("%s: %d layers, chunks of %d tokens, delta group %d, default level %d\n",
                        j["profile"].get<std::string>().c_str(), j["num_layers"].get<int>(), j["chunk_tokens"].get<int>(),
                        j["delta_group"].get<int>(), j["default_level"].get<int>());
            for (const json& l : j["levels"])
                std::printf("level %d (%s):\n  %s\n", l["level"].get<int>(), l["name"].get<std::string>().c_str(),
                            l["lmcache_python"].get<std::string>().c_str());
        });
    });
}

}  // namespace kvscope::cli
