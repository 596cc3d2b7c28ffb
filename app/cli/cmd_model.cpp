// `info`, `tokenize`, `generate` and `capture`: the model runtime from the command line.
#include "cli_common.h"
#include "cli_grammar.h"
#include "cli_model.h"

#include "eval/samples.h"

#include "common/file_io.h"
#include "kvio/kv_h5.h"
#include "model/generate.h"
#include "modelio/gguf.h"
#include "model/model.h"

#include <sys/resource.h>

#include <cstdio>
#include <memory>

namespace kvscope::cli {

namespace {

json idsJson(const std::vector<int32_t>& ids) { return json(ids); }

}  // namespace

json modelInfoJson(const Model& m)
{
    const LlamaSpec& s = m.spec();
    const ModelConfig& c = s.config;
    const int64_t kvBytesPerToken = 2LL * c.numLayers * c.numKvHeads * c.headDim * 2;
    return {
        {"path", m.path()},
        {"name", s.name},
        {"format", s.format},
        {"architecture", c.architecture},
        {"model_type", c.modelType},
        {"num_layers", c.numLayers},
        {"hidden_size", c.hiddenSize},
        {"intermediate_size", c.intermediateSize},
        {"num_heads", c.numHeads},
        {"num_kv_heads", c.numKvHeads},
        {"head_dim", c.headDim},
        {"vocab_size", c.vocabSize},
        {"max_position_embeddings", c.maxPositionEmbeddings},
        {"rope_theta", c.ropeTheta},
        {"rope_scaling", c.rope.type.empty() ? "none" : c.rope.type},
        {"rms_norm_eps", c.rmsNormEps},
        {"sliding_window", c.slidingWindow},
        {"tied_embeddings", s.tiedEmbeddings},
        {"qkv_bias", s.qkvBias},
        {"parameters", s.parameters},
        {"weight_types", s.weightTypes},
        {"fingerprint", m.runtime().fingerprint()},
        {"tokenizer", m.tokenizer().description()},
        {"bos_id", m.tokenizer().bosId()},
        {"eos_id", m.tokenizer().eosId()},
        {"chat", m.isChat()},
        {"kv_bytes_per_token_fp16", kvBytesPerToken},
        {"runtime", m.runtime().describe()},
        {"load_s", m.loadSeconds()},
    };
}

KvSet captureContext(const Model& m, const std::string& text, const ProgressFn& progress, double* prefillSeconds)
{
    const std::vector<int32_t> tokens = m.contextTokens(text);
    InferenceSession session(m.runtime());
    const double t0 = nowSeconds();
    session.append(tokens, nullptr, nullptr, progress);
    if (prefillSeconds) *prefillSeconds = nowSeconds() - t0;
    KvSet kv = session.exportKv();
    kv.context = text;
    return kv;
}

json generateJson(const Model& m, const GenerateRequest& r)
{
    if (r.maxNew < 1) throw Error("--max-new-tokens must be at least 1");
    InferenceSession session(m.runtime());
    if (r.kv) session.loadKv(*r.kv);
    const std::vector<int32_t> prompt = r.kv ? m.questionTokens(r.prompt) : m.promptTokens(r.prompt, r.chat);
    const double t0 = nowSeconds();
    const Generation g = generate(session, prompt, r.maxNew, r.sampling, r.noStop ? std::vector<int32_t>{} : m.stopIds());
    const double seconds = nowSeconds() - t0;
    const double decodeSeconds = seconds - g.firstTokenSeconds;
    return {
        {"prompt_tokens", idsJson(prompt)},
        {"cached_tokens", r.kv ? r.kv->shape().numTokens : 0},
        {"tokens", idsJson(g.tokens)},
        {"text", m.tokenizer().decode(g.tokens, true)},
        {"stopped_at_eos", g.stoppedAtEos},
        {"load_s", m.loadSeconds()},
        {"first_token_s", g.firstTokenSeconds},
        {"prefill_tokens_per_s", number(double(prompt.size()) / g.firstTokenSeconds)},
        {"decode_tokens_per_s", number(g.tokens.size() > 1 ? double(g.tokens.size() - 1) / decodeSeconds : NAN)},
        {"runtime", m.runtime().describe()},
    };
}

void addInfoCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("info", "Summary of a model (architecture, sizes, tokenizer)");
    auto o = std::make_shared<ModelOpts>();
    sub->add_option("MODEL", o->model, "the model to describe (the same as --model)");
    o->add(sub, false);
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli info ~/.cache/kvscope/models/gemma-3-270m-q4_k_m.gguf --json");
    sub->callback([o, &out] {
        const std::unique_ptr<Model> m = o->open();
        const json j = modelInfoJson(*m);
        out.emit(j, [](const json& j) {
            std::printf("%s (%s, %s)\n", j["name"].get<std::string>().c_str(), j["architecture"].get<std::string>().c_str(),
                        j["format"].get<std::string>().c_str());
            std::printf("  %d layers, hidden %d, %d heads / %d KV heads x %d, vocab %d, %.1fM parameters\n",
                        j["num_layers"].get<int>(), j["hidden_size"].get<int>(), j["num_heads"].get<int>(),
                        j["num_kv_heads"].get<int>(), j["head_dim"].get<int>(), j["vocab_size"].get<int>(),
                        j["parameters"].get<double>() / 1e6);
            std::printf("  weights: %s\n  tokenizer: %s\n  KV cache: %lld bytes per token in fp16\n",
                        j["weight_types"].get<std::string>().c_str(), j["tokenizer"].get<std::string>().c_str(),
                        j["kv_bytes_per_token_fp16"].get<long long>());
        });
    });
}

void addTokenizeCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("tokenize", "Token ids of a text");
    struct Opts {
        std::string tokenizer, text, textFile;
        bool noSpecial = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--tokenizer", o->tokenizer, "tokenizer.json, tokenizer.model, tokenizer.bin, a model folder or a GGUF file (default: the embedded model's)");
    auto* text = sub->add_option("--text", o->text, "the text");
    sub->add_option("--text-file", o->textFile, "read the text from a file")->excludes(text);
    sub->add_flag("--no-special", o->noSpecial, "do not add BOS / template tokens");
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli tokenize --text \"Hello world\" --json");
    sub->callback([o, &out] {
        const std::string path = o->tokenizer.empty() ? resolveModelPath("") : o->tokenizer;
        const std::unique_ptr<Tokenizer> tok = isGgufFile(path) ? tokenizerFromGguf(GgufFile::open(path)) : loadTokenizer(path);
        const std::string text = o->textFile.empty() ? o->text : readSmallFile(o->textFile, 64u << 20);
        const std::vector<int32_t> ids = tok->encode(text, !o->noSpecial);
        json pieces = json::array();
        for (int32_t id : ids) pieces.push_back(tok->decode({id}, false));
        const json j = {{"ids", idsJson(ids)}, {"count", ids.size()}, {"pieces", pieces}, {"tokenizer", tok->description()}};
        out.emit(j, [](const json& j) {
            for (const auto& id : j["ids"]) std::printf("%d ", id.get<int>());
            std::printf("\n(%zu tokens)\n", j["ids"].size());
        });
    });
}

void addGenerateCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("generate", "Generate text from a prompt");
    struct Opts : ModelOpts {
        std::string prompt;
        int maxNew = 64;
        SamplingOptions sampling;
        bool chat = false;
        bool raw = false;
        std::string kv;
    };
    auto o = std::make_shared<Opts>();
    o->add(sub);
    sub->add_option("--prompt", o->prompt, "the prompt")->required();
    sub->add_option("--max-new-tokens", o->maxNew, "tokens to generate")->capture_default_str();
    sub->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
    sub->add_option("--top-p", o->sampling.topP, "nucleus sampling mass")->capture_default_str();
    sub->add_option("--seed", o->sampling.seed, "sampling seed")->capture_default_str();
    sub->add_flag("--chat", o->chat, "wrap the prompt in the model's chat format (ChatML models)");
    sub->add_flag("--no-stop", o->raw, "do not stop at EOS / end-of-turn tokens");
    sub->add_option("KV", o->kv,
                    "a captured context to continue (KV file of `capture`, or a decoded one): the prompt is asked after it "
                    "as the question, as eval and stream ask theirs (--chat is then not consulted)");
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli generate --prompt \"What is the capital of France?\" --chat --max-new-tokens 30");
    sub->callback([o, &out] {
        if (o->maxNew < 1) throw Error("--max-new-tokens must be at least 1");
        GenerateRequest r;
        r.prompt = o->prompt;
        r.maxNew = o->maxNew;
        r.sampling = o->sampling;
        r.chat = o->chat;
        r.noStop = o->raw;
        KvSet cached;
        if (!o->kv.empty()) {
            cached = readKvH5(o->kv);
            r.kv = &cached;
        }
        const std::unique_ptr<Model> m = o->open();
        const json j = generateJson(*m, r);
        out.emit(j, [](const json& j) { std::printf("%s\n", j["text"].get<std::string>().c_str()); });
    });
}

void addCaptureCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("capture", "Prefill a context and save its KV cache (HDF5)");
    struct Opts : ModelOpts {
        std::string context, outPath;
        int gzip = 0;
    };
    auto o = std::make_shared<Opts>();
    o->add(sub);
    addContextOption(sub, o->context, true);
    addOutOption(sub, o->outPath, "KV file to write (HDF5)", true);
    sub->add_option("--gzip", o->gzip, "HDF5 shuffle+gzip level (0 = none)")->capture_default_str();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli capture --context long_4k --out kv.h5 --threads 1");
    sub->callback([o, &out] {
        if (o->gzip < 0 || o->gzip > 9) throw Error("--gzip must be in 0..9");
        const std::string text = loadSampleContext(o->context).text;  // a sample id or a file
        const std::unique_ptr<Model> m = o->open();
        int lastPct = -1;
        double prefill = 0;
        const KvSet kv = captureContext(*m, text, [&](int done, int total) {
            if (lastPct < 0) std::fprintf(stderr, "prefill of %d tokens\n", total);
            const int pct = int(100.0 * done / total);
            if (pct / 10 != lastPct / 10) std::fprintf(stderr, "  %d%% (%d/%d tokens)\n", pct, done, total);
            lastPct = pct;
            return true;
        }, &prefill);
        H5WriteOptions wo;
        wo.gzipLevel = o->gzip;
        writeKvH5(kv, o->outPath, wo);
        const KvShape& s = kv.shape();
        const json j = {
            {"out", o->outPath},
            {"model", m->spec().name},
            {"fingerprint", kv.modelFingerprint},
            {"num_tokens", s.numTokens},
            {"num_layers", s.numLayers},
            {"num_kv_heads", s.numKvHeads},
            {"head_dim", s.headDim},
            {"dtype", dtypeName(kv.dtype())},
            {"bytes_fp16", uint64_t(s.totalValues()) * 2},
            {"prefill_s", prefill},
            {"prefill_tokens_per_s", double(s.numTokens) / prefill},
            {"attn_mass", !kv.attnMass.empty()},
            {"runtime", m->runtime().describe()},
        };
        out.emit(j, [](const json& j) {
            std::printf("%d tokens -> %s (%.1f MB in fp16), prefill %.2f s (%.0f tokens/s)\n", j["num_tokens"].get<int>(),
                        j["out"].get<std::string>().c_str(), j["bytes_fp16"].get<double>() / 1e6, j["prefill_s"].get<double>(),
                        j["prefill_tokens_per_s"].get<double>());
        });
    });
}

}  // namespace kvscope::cli

namespace kvscope::cli {

namespace {
// CPU time of this process (user + system), seconds.
double cpuSeconds()
{
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
}  // namespace

void addBenchModelCommand(CLI::App& app, Output& out)
{
    auto* sub = app.get_subcommand("bench")->add_subcommand("model", "Prefill and decode speed of the runtime");
    struct Opts : ModelOpts {
        std::vector<int> tokens = {512};
        int decode = 32;
        int keyBlock = RuntimeOptions{}.keyBlock;
        int queryBlock = RuntimeOptions{}.queryBlock;
    };
    auto o = std::make_shared<Opts>();
    o->add(sub);
    auto* lengths = sub->add_option("--prefill-tokens", o->tokens, "prefill lengths, comma-separated (token ids drawn from the vocabulary)")
                        ->delimiter(',')
                        ->capture_default_str();
    addDeprecated(sub, "--tokens", lengths, "--prefill-tokens");
    sub->add_option("--decode", o->decode, "tokens decoded one at a time after each prefill")->capture_default_str();
    sub->add_option("--key-block", o->keyBlock, "keys per step of the blocked attention")->capture_default_str();
    sub->add_option("--query-block", o->queryBlock, "queries per sub-block of the blocked attention")->capture_default_str();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli bench model --prefill-tokens 512,2048 --threads 1");
    sub->callback([o, &out] {
        if (o->tokens.empty() || o->decode < 1) throw Error("--prefill-tokens and --decode must be at least 1");
        for (int t : o->tokens)
            if (t < 1) throw Error("--prefill-tokens must be at least 1");
        RuntimeOptions ro = o->runtime();
        if (o->keyBlock < 1) throw Error("--key-block must be at least 1");
        ro.keyBlock = o->keyBlock;
        if (o->queryBlock < 1) throw Error("--query-block must be at least 1");
        ro.queryBlock = o->queryBlock;
        // Weights only: no tokenizer needed, the ids are a fixed pseudo-random sequence.
        const LlamaRuntime rt(loadLlamaWeights(resolveModelPath(o->model)), ro);
        const int vocab = rt.spec().config.vocabSize;
        json runs = json::array();
        for (int n : o->tokens) {
            std::vector<int32_t> ids(static_cast<size_t>(n));
            uint32_t x = 12345;
            for (int32_t& id : ids) id = int32_t((x = x * 1664525u + 1013904223u) % uint32_t(vocab));
            InferenceSession s(rt);
            std::vector<float> logits;
            double t0 = nowSeconds();
            const double c0 = cpuSeconds();
            s.append(ids, &logits);
            const double prefill = nowSeconds() - t0;
            const double prefillCpu = cpuSeconds() - c0;
            t0 = nowSeconds();
            const double d0 = cpuSeconds();
            for (int i = 0; i < o->decode; ++i) s.append({argmax(logits.data(), logits.size())}, &logits);
            const double decode = nowSeconds() - t0;
            const double decodeCpu = cpuSeconds() - d0;
            struct rusage ru {};
            getrusage(RUSAGE_SELF, &ru);
            runs.push_back({{"prefill_tokens", n},
                            {"prefill_s", prefill},
                            {"prefill_tokens_per_s", n / prefill},
                            {"prefill_cpu_s", prefillCpu},
                            {"prefill_tokens_per_cpu_s", n / prefillCpu},
                            {"decode_tokens", o->decode},
                            {"decode_tokens_per_s", o->decode / decode},
                            {"decode_ms_per_token", 1e3 * decode / o->decode},
                            {"decode_cpu_ms_per_token", 1e3 * decodeCpu / o->decode},
                            {"peak_rss_mb", double(ru.ru_maxrss) / 1024.0}});
            if (!out.asJson)
                std::fprintf(stderr, "  %d tokens: prefill %.2f s wall, %.2f s CPU\n", n, prefill, prefillCpu);
        }
        const double first = runs[0]["prefill_tokens_per_s"].get<double>();
        const double firstCpu = runs[0]["prefill_tokens_per_cpu_s"].get<double>();
        for (json& r : runs) {
            r["prefill_speed_vs_first"] = r["prefill_tokens_per_s"].get<double>() / first;
            r["prefill_cpu_speed_vs_first"] = r["prefill_tokens_per_cpu_s"].get<double>() / firstCpu;
        }
        const json j = {{"model", rt.spec().name},
                        {"runs", runs},
                        {"key_block", ro.keyBlock},
                        {"query_block", ro.queryBlock},
                        {"attn_mass", ro.attnMass},
                        {"runtime", rt.describe()},
                        {"weights", rt.packedWeights() ? "packed" : "expanded"},
                        {"decode_kernels", rt.decodeKernels()},
                        {"stored_weight_mb", double(rt.spec().weightBytes) / 1e6}};
        out.emit(j, [](const json& j) {
            std::printf("%s (%s, key block %d, query block %d%s, weights %.0f MB as stored)\n",
                        j["model"].get<std::string>().c_str(), j["runtime"].get<std::string>().c_str(),
                        j["key_block"].get<int>(), j["query_block"].get<int>(),
                        j["attn_mass"].get<bool>() ? ", attention mass recorded" : "", j["stored_weight_mb"].get<double>());
            // CPU-second figures are what a shared machine can compare: wall time there depends on
            // what else runs.
            std::printf("%8s %10s %13s %9s %14s %9s %14s %12s\n", "tokens", "prefill s", "prefill tok/s", "vs first",
                        "tok/CPU-s", "vs first", "decode ms/tok", "peak RSS MB");
            for (const json& r : j["runs"])
                std::printf("%8d %10.2f %13.1f %8.0f%% %14.1f %8.0f%% %14.1f %12.0f\n", r["prefill_tokens"].get<int>(),
                            r["prefill_s"].get<double>(), r["prefill_tokens_per_s"].get<double>(),
                            100.0 * r["prefill_speed_vs_first"].get<double>(), r["prefill_tokens_per_cpu_s"].get<double>(),
                            100.0 * r["prefill_cpu_speed_vs_first"].get<double>(), r["decode_ms_per_token"].get<double>(),
                            r["peak_rss_mb"].get<double>());
        });
    });
}

}  // namespace kvscope::cli
