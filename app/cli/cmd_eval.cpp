// `eval` and `demo`: codecs judged by the model's own answers (core/eval).
#include "cli_eval.h"
#include "cli_grammar.h"

#include "common/file_io.h"
#include "eval/evaluate.h"
#include "eval/sensitivity.h"
#include "eval/samples.h"
#include "kvio/kv_h5.h"
#include "model/generate.h"
#include "model/model.h"
#include "transport/link.h"

#include <cstdio>
#include <memory>

namespace kvscope::cli {

namespace {

json rowJson(const EvalRow& r, const Tokenizer& tok, const SampleContext& sample, bool perLayer)
{
    json j = {{"codec", r.codec},
              {"level", r.level},
              {"level_name", r.levelName},
              {"bytes", r.bytes},
              {"bits_per_value", r.bitsPerValue},
              {"ratio_vs_fp16", r.ratioVsFp16},
              {"ratio_vs_int8", r.ratioVsInt8},
              {"ppl", number(r.quality.ppl)},
              {"delta_ppl_pct", number(r.quality.deltaPplPct)},
              {"kl", number(r.quality.kl)},
              {"token_agreement", r.quality.tokenAgreement},
              {"answer", tok.decode(r.quality.answer, true)},
              {"exact", r.exact},
              {"encode_s", r.encodeSeconds},
              {"decode_s", r.decodeSeconds}};
    if (!sample.answer.empty()) j["answer_correct"] = answerMatches(sample, j["answer"].get<std::string>());
    j.update(errorJson(r.error, perLayer));
    return j;
}

void printTable(const json& j)
{
    const json& o = j["original"];
    std::printf("%s: %d context tokens, %d continuation tokens\n", j["context"].get<std::string>().c_str(),
                j["num_tokens"].get<int>(), j["continuation_tokens"].get<int>());
    if (!j["question"].get<std::string>().empty())
        std::printf("question: %s\noriginal KV answers: %s\n", j["question"].get<std::string>().c_str(),
                    o["answer"].get<std::string>().c_str());
    std::printf("%-10s %5s %8s %9s %9s %9s %9s %7s  %s\n", "codec", "level", "bits/val", "x fp16", "x int8",
                "dPPL %", "KL", "agree", "answer");
    for (const json& r : j["results"]) {
        std::string answer = r["answer"].get<std::string>();
        for (char& c : answer)
            if (c == '\n') c = ' ';
        if (answer.size() > 60) answer = answer.substr(0, 57) + "...";
        std::printf("%-10s %5d %8.3f %9.2f %9.2f %9.3f %9.5f %7.3f  %s\n", r["codec"].get<std::string>().c_str(),
                    r["level"].get<int>(), r["bits_per_value"].get<double>(), r["ratio_vs_fp16"].get<double>(),
                    r["ratio_vs_int8"].get<double>(), r["delta_ppl_pct"].is_null() ? NAN : r["delta_ppl_pct"].get<double>(),
                    r["kl"].is_null() ? NAN : r["kl"].get<double>(), r["token_agreement"].get<double>(), answer.c_str());
    }
}

// Runs the whole evaluation: load, capture, reference, rows. Fills `j` with everything but the
// command-specific keys.
json runEval(const EvalOpts& o, const SampleContext& sample, json* timings)
{
    const std::unique_ptr<Model> model = openEvalModel(o);
    const PreparedContext prep = prepareContext(*model, o, sample, true);
    const Model* m = model.get();
    const KvSet& original = prep.original;
    const QualityReference& ref = *prep.ref;
    const std::vector<int32_t>& context = ref.task().context;
    const std::vector<int32_t>& continuation = ref.task().continuation;
    const EvalTask& task = ref.task();
    const double captureSeconds = prep.captureSeconds, refSeconds = prep.refSeconds;

    EvalPlan plan;
    ProfileOptions cachegen = o.profile;
    cachegen.codec = "cachegen";
    plan.cachegen = cachegen.params(original);
    plan.textRecompute = !o.noText;
    // A profile with transform settings adds the transform codec's levels (prepared on this cache).
    {
        const std::unique_ptr<CodecProfile> pr = o.profile.loadedProfile(original);
        if (pr->hasTransform() || o.profile.codec == "transform") {
            ProfileOptions po = withDefaultTransform(o.profile, m, original.modelFingerprint);
            po.codec = "transform";
            plan.transforms.push_back(po.params(original));
            plan.transformNames.push_back("");
        }
    }
    for (const std::string& path : o.compareProfiles) {
        ProfileOptions po = o.profile;
        po.codec = "transform";
        po.profilePath = path;
        plan.transforms.push_back(po.params(original));
        const size_t slash = path.find_last_of('/');
        std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
        if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) name.resize(name.size() - 5);
        plan.transformNames.push_back(name);
    }
    if (o.onlyTransform) {
        plan.baselines.clear();
        plan.levels = false;
    }
    const double t0 = nowSeconds();
    const std::vector<EvalRow> rows = evaluateCodecs(m->runtime(), ref, original, plan, [](int done, int total) {
        std::fprintf(stderr, "  %d/%d codecs measured\n", done, total);
        return true;
    });
    const double evalSeconds = nowSeconds() - t0;

    json results = json::array();
    for (const EvalRow& r : rows) results.push_back(rowJson(r, m->tokenizer(), sample, o.perLayer));
    for (const EvalRow& r : rows)
        if (r.codec == "text" && !r.exact)
            std::fprintf(stderr, "warning: text recompute did not reproduce the original KV bit for bit (a runtime bug)\n");
    json j = {{"model", m->spec().name},
              {"fingerprint", m->runtime().fingerprint()},
              {"context", sample.id},
              {"num_tokens", int(context.size())},
              {"continuation_tokens", int(continuation.size())},
              {"question", sample.question},
              {"expected_answer", sample.answer},
              {"original", {{"ppl", ref.original().ppl}, {"answer", m->tokenizer().decode(ref.original().answer, true)}}},
              {"profile", o.profile.source()},
              {"default_level", plan.cachegen.profile.defaultLevel},
              {"results", results}};
    if (!sample.answer.empty()) j["original"]["answer_correct"] = answerMatches(sample, j["original"]["answer"].get<std::string>());
    *timings = {{"load_s", m->loadSeconds()},
                {"capture_s", captureSeconds},
                {"prefill_tokens_per_s", double(context.size()) / captureSeconds},
                {"reference_s", refSeconds},
                {"eval_s", evalSeconds},
                {"runtime", m->runtime().describe()}};

    // Time to first token from each cache once it is in memory: the question's prefill and the
    // first decode step (measured), plus for text its whole prefill (measured). Transfer is
    // modelled by the caller from the bytes.
    InferenceSession q(m->runtime());
    q.loadKv(original);
    const std::vector<int32_t> question = task.question.empty() ? std::vector<int32_t>{context.back()} : task.question;
    (*timings)["question_first_token_s"] = generate(q, question, 1, SamplingOptions{}).firstTokenSeconds;
    return j;
}

}  // namespace

std::unique_ptr<Model> openEvalModel(const EvalOpts& o)
{
    ModelOpts m = o.model;
    m.attnMass = o.needsAttnMass();
    return m.open();
}

PreparedContext prepareContext(const Model& m, const EvalOpts& o, const SampleContext& sample, bool withQuestion)
{
    PreparedContext p;
    EvalTask task;
    task.context = m.contextTokens(sample.text);
    if (!sample.continuation.empty()) {
        task.continuation = m.tokenizer().encode(sample.continuation, false);
        if (int(task.continuation.size()) > o.maxContinuation) task.continuation.resize(size_t(o.maxContinuation));
    } else if (o.holdoutTokens > 0) {
        // No held-out text of its own: the context's last tokens become the continuation.
        if (int(task.context.size()) < o.holdoutTokens + 16)
            throw Error(sample.id + ": " + std::to_string(task.context.size()) + " tokens are too few to hold out " +
                        std::to_string(o.holdoutTokens));
        task.continuation.assign(task.context.end() - o.holdoutTokens, task.context.end());
        task.context.resize(task.context.size() - size_t(o.holdoutTokens));
        p.heldOut = true;
    }
    if (withQuestion && !sample.question.empty()) task.question = m.questionTokens(sample.question);
    task.answerTokens = o.answerTokens;
    task.stopIds = m.stopIds();

    std::fprintf(stderr, "%s: capturing the KV of %zu tokens\n", sample.id.c_str(), task.context.size());
    double t0 = nowSeconds();
    InferenceSession session(m.runtime());
    session.append(task.context, nullptr);
    p.original = session.exportKv();
    p.original.context = sample.text;
    p.captureSeconds = nowSeconds() - t0;

    std::fprintf(stderr, "%s: reference pass (continuation of %zu tokens, answer of up to %d)\n", sample.id.c_str(),
                 task.continuation.size(), task.question.empty() ? 0 : o.answerTokens);
    t0 = nowSeconds();
    p.ref = std::make_unique<QualityReference>(m.runtime(), task, p.original);
    p.refSeconds = nowSeconds() - t0;
    return p;
}

void addEvalCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("eval", "Quality of every profile level and baseline on a context or a suite");
    auto o = std::make_shared<EvalOpts>();
    auto so = std::make_shared<SuiteCliOpts>();
    o->add(sub, false);
    so->add(sub, true);
    sub->add_flag("--no-text", o->noText, "skip the text-recompute row");
    sub->add_option("--transform-profile", o->compareProfiles,
                    "more transform profiles to evaluate, every level of each (rows named after the file); repeatable");
    sub->add_flag("--only-transform", o->onlyTransform,
                  "only the transform codec's levels (no baselines, no CacheGen levels); with --no-text, no other row");
    sub->add_flag("--per-layer", o->perLayer, "reconstruction error of every layer, K and V");
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli eval --suite samples/suites/facts.json --split eval --threads 1");
    sub->callback([o, so, &out] {
        if (o->context.empty() == so->suite.empty()) throw Error("eval: give --context FILE or --suite SUITE.json (one of them)");
        if (!so->suite.empty()) {
            // The suite scorer measures one codec's levels and the baselines; refuse what it would ignore.
            if (!o->compareProfiles.empty() || o->onlyTransform)
                throw Error("eval --suite: --transform-profile and --only-transform apply to one --context; with --suite "
                            "give the profile with --profile and the rows with --baselines and --levels");
            emitSuiteEval(runSuiteEval(*o, *so), out);
            return;
        }
        SampleContext sample = loadSampleContext(o->context);
        if (!o->continuationFile.empty()) sample.continuation = readSmallFile(o->continuationFile, 64u << 20);
        if (!o->question.empty()) {
            sample.question = o->question;
            sample.answer.clear();
            sample.answerAliases.clear();
        }
        json timings;
        json j = runEval(*o, sample, &timings);
        j["timings"] = timings;
        out.emit(j, printTable);
    });
}

void addDemoCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("demo", "End to end on the embedded default: capture, encode, decode, answer");
    auto o = std::make_shared<EvalOpts>();
    auto bandwidth = std::make_shared<std::string>("100Mbit");
    o->add(sub, false);
    sub->add_flag("--no-text", o->noText, "skip the text-recompute row");
    sub->add_flag("--per-layer", o->perLayer, "reconstruction error of every layer, K and V");
    o->context = "long_1k";
    sub->add_option("--bandwidth", *bandwidth, "link rate for the modelled transfer in the TTFT estimate")->capture_default_str();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli demo --threads 1");
    sub->callback([o, bandwidth, &out] {
        const double bps = 8.0 * parseRate(*bandwidth, "--bandwidth");  // bits per second
        const SampleContext sample = loadSampleContext(o->context);
        json timings;
        json j = runEval(*o, sample, &timings);
        // TTFT per row: transfer of its bytes over the link (modelled), decode (measured), then the
        // question's prefill and first token (measured). Text: its prefill instead of a decode.
        const double firstToken = timings["question_first_token_s"].get<double>();
        double best = INFINITY;
        for (json& r : j["results"]) {
            const double transfer = 8.0 * r["bytes"].get<double>() / bps;
            const double rebuild = r["codec"] == "text" ? timings["capture_s"].get<double>() : r["decode_s"].get<double>();
            r["ttft_s"] = transfer + rebuild + firstToken;
            r["ttft_parts"] = {{"transfer_s", transfer}, {"transfer", "modelled"},
                               {"rebuild_s", rebuild}, {"rebuild", "measured"},
                               {"first_token_s", firstToken}, {"first_token", "measured"}};
            if (r["codec"] == "cachegen" && r["level"] == j["default_level"]) best = r["ttft_s"].get<double>();
        }
        j["ttft_s"] = number(best);
        j["bandwidth_bps"] = bps;
        j["timings"] = timings;
        out.emit(j, [](const json& j) {
            printTable(j);
            std::printf("time to first token at %.0f Mbit/s (transfer modelled, decode and prefill measured):\n",
                        j["bandwidth_bps"].get<double>() / 1e6);
            for (const json& r : j["results"])
                std::printf("  %-8s level %d: %.3f s\n", r["codec"].get<std::string>().c_str(), r["level"].get<int>(),
                            r["ttft_s"].get<double>());
        });
    });
}

void addSensitivityCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("sensitivity", "Perplexity change when one layer's K or V alone is quantized");
    auto o = std::make_shared<EvalOpts>();
    auto bins = std::make_shared<int>(16);
    o->add(sub, true);
    sub->add_option("--bins", *bins, "bins used for the quantized layer")->capture_default_str();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli sensitivity --context long_1k --bins 8 --threads 1");
    sub->callback([o, bins, &out] {
        SampleContext sample = loadSampleContext(o->context);
        if (!o->continuationFile.empty()) sample.continuation = readSmallFile(o->continuationFile, 64u << 20);
        if (sample.continuation.empty()) throw Error("--context " + o->context + " has no continuation to score (give --continuation)");
        const std::unique_ptr<Model> model = openEvalModel(*o);
        const PreparedContext p = prepareContext(*model, *o, sample, false);
        const double t0 = nowSeconds();
        const std::vector<LayerSensitivity> s =
            measureLayerSensitivity(*p.ref, p.original, o->profile.params(p.original), *bins, [](int done, int total) {
                if (done % 10 == 0 || done == total) std::fprintf(stderr, "  %d/%d passes\n", done, total);
                return true;
            });
        json layers = json::array();
        for (const LayerSensitivity& l : s)
            layers.push_back({{"layer", l.layer}, {"key_delta_ppl_pct", l.keyDeltaPplPct}, {"value_delta_ppl_pct", l.valueDeltaPplPct},
                              {"key_kl", l.keyKl}, {"value_kl", l.valueKl}, {"key_rms", l.keyRms}, {"value_rms", l.valueRms}});
        const json j = {{"model", model->spec().name}, {"context", sample.id}, {"num_tokens", p.original.shape().numTokens},
                        {"continuation_tokens", p.ref->task().continuation.size()}, {"bins", *bins},
                        {"original_ppl", p.ref->original().ppl}, {"layers", layers}, {"seconds", nowSeconds() - t0}};
        out.emit(j, [](const json& j) {
            std::printf("%s, %d tokens, one layer at %d bins (original perplexity %.3f)\n", j["context"].get<std::string>().c_str(),
                        j["num_tokens"].get<int>(), j["bins"].get<int>(), j["original_ppl"].get<double>());
            std::printf("layer  K dPPL%%    V dPPL%%    K KL       V KL\n");
            for (const json& l : j["layers"])
                std::printf("%5d %8.3f %9.3f %10.5f %10.5f\n", l["layer"].get<int>(), l["key_delta_ppl_pct"].get<double>(),
                            l["value_delta_ppl_pct"].get<double>(), l["key_kl"].get<double>(), l["value_kl"].get<double>());
        });
    });
}

}  // namespace kvscope::cli
