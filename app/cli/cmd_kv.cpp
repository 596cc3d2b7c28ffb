// `stats` and `synth`: look at a KV file, or make a synthetic one.
#include "cli_common.h"
#include "cli_grammar.h"
#include "cli_stats.h"

#include "kvio/kv_h5.h"
#include "kv/kv_stats.h"

#include <cstdio>
#include <memory>

namespace kvscope::cli {

void addStatsCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("stats", "Per-layer and per-channel statistics of a KV file");
    struct Opts {
        std::string path;
        StatsOptions stats;
        bool perChannel = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("kv", o->path, "KV file (HDF5)")->required();
    sub->add_option("--delta-group", o->stats.deltaGroup, "tokens per anchor group for the delta variance")->capture_default_str();
    sub->add_option("--bins", o->stats.bins, "bins for the entropy figures (CacheGen convention)")->capture_default_str();
    sub->add_flag("--per-channel", o->perChannel, "include every channel's statistics");
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli stats kv.h5 --delta-group 2 --json");
    sub->callback([o, &out] {
        if (o->stats.deltaGroup < 2) throw Error("--delta-group must be at least 2");
        if (o->stats.bins < 4 || o->stats.bins > 256 || o->stats.bins % 2) throw Error("--bins must be an even number in 4..256");
        const KvSet kv = readKvH5(o->path);
        json j = kvStatsJson(kv, o->stats, o->perChannel);
        j["file"] = o->path;
        out.emit(j, [](const json& r) {
            std::printf("%s: %d layers, %d kv heads x %d, %d tokens, %s\n", r["file"].get<std::string>().c_str(),
                        r["num_layers"].get<int>(), r["num_kv_heads"].get<int>(), r["head_dim"].get<int>(),
                        r["num_tokens"].get<int>(), r["dtype"].get<std::string>().c_str());
            std::printf("layer  kind   absmax     std   var_raw/var_delta  entropy@%d  (delta)  outliers\n",
                        r["bins"].get<int>());
            for (const json& l : r["layers"])
                for (const char* kind : {"key", "value"}) {
                    const json& t = l[kind];
                    std::printf("%5d  %-5s %7.3f %7.3f  %17s  %9.3f  %7.3f  %zu\n", l["layer"].get<int>(), kind,
                                t["absmax"].get<double>(), t["std"].get<double>(),
                                t["delta_variance_ratio"].is_null() ? "inf"
                                    : std::to_string(t["delta_variance_ratio"].get<double>()).substr(0, 6).c_str(),
                                t["entropy_bits"].get<double>(), t["entropy_bits_delta"].get<double>(),
                                t["outlier_channels"].size());
                }
        });
    });
}

void addSynthCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("synth", "Write a synthetic KV file with real-KV-like structure (for tests and demos)");
    struct Opts {
        std::string path;
        SyntheticSpec spec;
        std::string dtype = "float16";
    };
    auto o = std::make_shared<Opts>();
    addOutOption(sub, o->path, "KV file to write", true);
    sub->add_option("--layers", o->spec.shape.numLayers)->capture_default_str();
    sub->add_option("--kv-heads", o->spec.shape.numKvHeads)->capture_default_str();
    sub->add_option("--head-dim", o->spec.shape.headDim)->capture_default_str();
    sub->add_option("--tokens", o->spec.shape.numTokens, "tokens (a count)")->capture_default_str();
    sub->add_option("--dtype", o->dtype, "float16, bfloat16 or float32")->capture_default_str();
    sub->add_option("--seed", o->spec.seed)->capture_default_str();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli synth --out syn.h5 --layers 30 --kv-heads 3 --head-dim 64 --tokens 4096");
    sub->callback([o, &out] {
        if (!parseDType(o->dtype, &o->spec.dtype)) throw Error("--dtype: unknown dtype '" + o->dtype + "'");
        validateShape(o->spec.shape, "synthetic cache");
        const double t0 = nowSeconds();
        KvSet kv = makeSyntheticKv(o->spec);
        kv.modelName = "synthetic";
        writeKvH5(kv, o->path);
        const KvShape& s = kv.shape();
        out.emit({{"file", o->path}, {"num_layers", s.numLayers}, {"num_kv_heads", s.numKvHeads}, {"head_dim", s.headDim},
                  {"num_tokens", s.numTokens}, {"dtype", dtypeName(kv.dtype())}, {"seconds", nowSeconds() - t0}},
                 [](const json& r) {
                     std::printf("wrote %s (%d layers, %d tokens)\n", r["file"].get<std::string>().c_str(),
                                 r["num_layers"].get<int>(), r["num_tokens"].get<int>());
                 });
    });
}

}  // namespace kvscope::cli
