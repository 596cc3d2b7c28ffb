// `sweep` and `tune`: the rate-distortion curve of one context, and per-layer bins tuned under
// quality budgets over several contexts (core/eval/sweep.h, core/eval/tune.h).
#include "cli_eval.h"
#include "cli_grammar.h"

#include "common/file_io.h"
#include "eval/evaluate.h"
#include "eval/sweep.h"
#include "eval/suite.h"
#include "eval/tune.h"
#include "eval/tune_transform.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

namespace kvscope::cli {

namespace {

std::vector<std::string> splitList(const std::string& text, const char* option)
{
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    if (out.empty()) throw Error(std::string(option) + ": empty list");
    return out;
}

// Comma-separated numbers, each parsed whole by `parse` (std::stoi, std::stod).
template <typename T, typename Parse>
std::vector<T> numberList(const std::string& text, const char* option, Parse parse)
{
    std::vector<T> out;
    for (const std::string& s : splitList(text, option)) {
        size_t used = 0;
        T v{};
        try {
            v = parse(s, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != s.size()) throw Error(std::string(option) + ": '" + s + "' is not a number");
        out.push_back(v);
    }
    return out;
}

std::vector<int> intList(const std::string& text, const char* option)
{
    return numberList<int>(text, option, [](const std::string& s, size_t* used) { return std::stoi(s, used); });
}

std::vector<double> doubleList(const std::string& text, const char* option)
{
    return numberList<double>(text, option, [](const std::string& s, size_t* used) { return std::stod(s, used); });
}

std::vector<Quantizer> quantizerList(const std::string& text, const char* option)
{
    std::vector<Quantizer> out;
    for (const std::string& s : splitList(text, option)) {
        if (s == "token") out.push_back(Quantizer::PerToken);
        else if (s == "channel") out.push_back(Quantizer::PerChannel);
        else throw Error(std::string(option) + ": expected token or channel, got '" + s + "'");
    }
    return out;
}

// The sample's continuation file and question overrides, as eval applies them.
SampleContext loadContext(const EvalOpts& o, const std::string& id)
{
    SampleContext s = loadSampleContext(id);
    if (!o.continuationFile.empty()) s.continuation = readSmallFile(o.continuationFile, 64u << 20);
    if (!o.question.empty()) {
        s.question = o.question;
        s.answer.clear();
        s.answerAliases.clear();
    }
    return s;
}

json pointJson(const SweepPoint& p)
{
    json j = {{"codec", p.codec},
              {"key_bins", groupBinsText(p.keyGroups)},
              {"value_bins", groupBinsText(p.valueGroups)},
              {"chunk_tokens", p.chunkTokens},
              {"delta_group", p.deltaGroup},
              {"key_quantizer", p.codec == "cachegen" ? quantizerName(p.keyQuantizer) : ""},
              {"value_quantizer", p.codec == "cachegen" ? quantizerName(p.valueQuantizer) : ""},
              {"bytes", p.bytes},
              {"bits_per_value", p.bitsPerValue},
              {"ratio_vs_fp16", p.ratioVsFp16},
              {"ratio_vs_int8", p.ratioVsInt8},
              {"delta_ppl_pct", number(p.quality.deltaPplPct)},
              {"kl", number(p.quality.kl)},
              {"token_agreement", p.quality.tokenAgreement},
              {"key_rms", p.keyRms},
              {"value_rms", p.valueRms},
              {"pareto", p.pareto}};
    return j;
}

// One CSV row per point, the JSON keys as the header, in a fixed column order.
void writeSweepCsv(const json& points, const std::string& path)
{
    static const char* cols[] = {"codec",        "key_bins",     "value_bins",    "chunk_tokens", "delta_group",
                                 "key_quantizer", "value_quantizer", "bytes",      "bits_per_value", "ratio_vs_fp16",
                                 "ratio_vs_int8", "delta_ppl_pct", "kl",           "token_agreement", "key_rms",
                                 "value_rms",     "pareto"};
    std::string text;
    for (size_t c = 0; c < std::size(cols); ++c) text += std::string(c ? "," : "") + cols[c];
    text += "\n";
    for (const json& p : points) {
        for (size_t c = 0; c < std::size(cols); ++c) {
            const json& v = p[cols[c]];
            std::string cell;
            if (v.is_string()) cell = v.get<std::string>();
            else if (v.is_boolean()) cell = v.get<bool>() ? "1" : "0";
            else if (v.is_null()) cell = "";
            else {
                char buf[64];
                if (v.is_number_integer() || v.is_number_unsigned()) std::snprintf(buf, sizeof buf, "%lld", v.get<long long>());
                else std::snprintf(buf, sizeof buf, "%.9g", v.get<double>());
                cell = buf;
            }
            text += (c ? "," : "") + cell;
        }
        text += "\n";
    }
    writeFileAtomic(path, text);
}

void printSweep(const json& j)
{
    std::printf("%s: %d context tokens, %d continuation tokens (original perplexity %.4f)\n",
                j["context"].get<std::string>().c_str(), j["num_tokens"].get<int>(), j["continuation_tokens"].get<int>(),
                j["original_ppl"].get<double>());
    std::printf("%-9s %-9s %-6s %5s %5s %-7s %-7s %8s %7s %9s %10s %6s  %s\n", "codec", "K bins", "V bins", "chunk", "delta",
                "K quant", "V quant", "bits/val", "x int8", "dPPL %", "KL", "agree", "pareto");
    for (const json& p : j["points"])
        std::printf("%-9s %-9s %-6s %5d %5d %-7s %-7s %8.3f %7.2f %9.3f %10.6f %6.3f  %s\n", p["codec"].get<std::string>().c_str(),
                    p["key_bins"].get<std::string>().c_str(), p["value_bins"].get<std::string>().c_str(),
                    p["chunk_tokens"].get<int>(), p["delta_group"].get<int>(), p["key_quantizer"].get<std::string>().c_str(),
                    p["value_quantizer"].get<std::string>().c_str(), p["bits_per_value"].get<double>(),
                    p["ratio_vs_int8"].get<double>(), p["delta_ppl_pct"].is_null() ? NAN : p["delta_ppl_pct"].get<double>(),
                    p["kl"].is_null() ? NAN : p["kl"].get<double>(), p["token_agreement"].get<double>(),
                    p["pareto"].get<bool>() ? "*" : "");
}

}  // namespace

void addSweepCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("sweep", "Rate-distortion grid on one context: bins, chunk, delta, quantizer");
    struct Opts {
        EvalOpts eval;
        std::string keyBins = "6,8,12,16,24,32", valueBins = "6,8,12,16,24,32", chunks, deltas;
        std::string keyQuantizers = "token", valueQuantizers = "token", csv, jsonOut;
        bool answers = false, noBaselines = false;
    };
    auto o = std::make_shared<Opts>();
    auto so = std::make_shared<SuiteCliOpts>();
    o->eval.add(sub, false, true, false);
    so->add(sub, false);
    sub->add_option("--key-bins", o->keyBins, "key bins per point, comma-separated; a point is 16 or K groups 32/16/16")
        ->capture_default_str();
    sub->add_option("--value-bins", o->valueBins, "value bins per point; 16 or V groups 32/16")->capture_default_str();
    sub->add_option("--chunks", o->chunks, "chunk sizes in tokens (default: the profile's)");
    sub->add_option("--deltas", o->deltas, "delta groups, 0 = delta coding off (default: the profile's)");
    addDeprecated(sub, "--key-quantizers",
                  sub->add_option("--key-quantizer", o->keyQuantizers, "key quantizers swept: token, channel or token,channel")
                      ->capture_default_str(),
                  "--key-quantizer");
    addDeprecated(sub, "--value-quantizers",
                  sub->add_option("--value-quantizer", o->valueQuantizers, "value quantizers swept: token, channel or token,channel")
                      ->capture_default_str(),
                  "--value-quantizer");
    sub->add_flag("--answers", o->answers, "also generate the answer of every point (token agreement; slower)");
    sub->add_flag("--no-baselines", o->noBaselines, "leave out fp16, int8, kivi2, kivi4 and zstd");
    sub->add_option("--csv", o->csv, "write the points as CSV");
    addOutOption(sub, o->jsonOut, "write the result as JSON", false);
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli sweep --context long_1k --key-bins 8,16,24 --value-bins 8,12 --csv rd.csv");
    sub->callback([o, so, &out] {
        if (o->eval.context.empty() == so->suite.empty()) throw Error("sweep: give --context FILE or --suite SUITE.json (one of them)");
        SweepGrid grid;
        for (const std::string& s : splitList(o->keyBins, "--key-bins")) grid.keyBins.push_back(parseGroupBins(s));
        for (const std::string& s : splitList(o->valueBins, "--value-bins")) grid.valueBins.push_back(parseGroupBins(s));
        grid.keyQuantizers = quantizerList(o->keyQuantizers, "--key-quantizer");
        grid.valueQuantizers = quantizerList(o->valueQuantizers, "--value-quantizer");
        grid.answers = o->answers;
        if (o->noBaselines) grid.baselines.clear();
        if (!so->suite.empty()) {
            grid.chunkTokens = o->chunks.empty() ? std::vector<int>{} : intList(o->chunks, "--chunks");
            grid.deltaGroups = o->deltas.empty() ? std::vector<int>{} : intList(o->deltas, "--deltas");
            json j = sweepSuite(o->eval, *so, grid);
            if (!o->jsonOut.empty()) writeFileAtomic(o->jsonOut, j.dump(2) + "\n");
            out.emit(j, printSuiteSweep);
            return;
        }
        const SampleContext sample = loadContext(o->eval, o->eval.context);
        const std::unique_ptr<Model> model = openEvalModel(o->eval);
        const PreparedContext p = prepareContext(*model, o->eval, sample, o->answers);
        if (p.ref->task().continuation.empty())
            throw Error(sample.id + ": no continuation to score (give --continuation or --holdout-tokens)");
        grid.base = o->eval.profile.params(p.original).profile;
        grid.chunkTokens = o->chunks.empty() ? std::vector<int>{grid.base.chunkTokens} : intList(o->chunks, "--chunks");
        grid.deltaGroups = o->deltas.empty() ? std::vector<int>{grid.base.deltaGroup} : intList(o->deltas, "--deltas");
        std::fprintf(stderr, "sweeping %zu points and %zu baselines\n", grid.points(), grid.baselines.size());
        const double t0 = nowSeconds();
        const std::vector<SweepPoint> points = runSweep(*p.ref, p.original, grid, [](int done, int total) {
            if (done % 10 == 0 || done == total) std::fprintf(stderr, "  %d/%d points\n", done, total);
            return true;
        });
        json arr = json::array();
        for (const SweepPoint& s : points) arr.push_back(pointJson(s));
        json j = {{"model", model->spec().name},
                  {"fingerprint", model->runtime().fingerprint()},
                  {"context", sample.id},
                  {"num_tokens", p.original.shape().numTokens},
                  {"continuation_tokens", int(p.ref->task().continuation.size())},
                  {"continuation_held_out_from_context", p.heldOut},
                  {"original_ppl", p.ref->original().ppl},
                  {"seconds", nowSeconds() - t0},
                  {"points", arr}};
        if (!o->csv.empty()) writeSweepCsv(arr, o->csv);
        if (!o->jsonOut.empty()) writeFileAtomic(o->jsonOut, j.dump(2) + "\n");
        out.emit(j, printSweep);
    });
}

namespace {

// The tuned profile judged on contexts it never saw, next to the default profile and the
// baselines; `goal` is the smallest tuned level meeting dPPL <= 1 % and agreement >= 0.98 on
// every held-out context.
json evaluateHeldOut(const Model& model, const EvalOpts& o, const std::vector<std::string>& ids, const CodecProfile& tuned)
{
    json contexts = json::array();
    const size_t levels = tuned.levels.size();
    std::vector<bool> meets(levels, true);
    std::vector<uint64_t> levelBytes(levels, 0);
    uint64_t int8Total = 0;
    for (const std::string& id : ids) {
        const SampleContext sample = loadContext(o, id);
        const PreparedContext p = prepareContext(model, o, sample, true);
        if (p.ref->task().continuation.empty())
            throw Error(id + ": no continuation to score (give --holdout-tokens)");
        json rows = json::array();
        auto addRows = [&](const std::vector<EvalRow>& rs, const char* profile) {
            for (const EvalRow& r : rs)
                rows.push_back({{"profile", r.codec == "cachegen" ? profile : ""},
                                {"codec", r.codec},
                                {"level", r.level},
                                {"level_name", r.levelName},
                                {"bytes", r.bytes},
                                {"bits_per_value", r.bitsPerValue},
                                {"ratio_vs_int8", r.ratioVsInt8},
                                {"delta_ppl_pct", number(r.quality.deltaPplPct)},
                                {"kl", number(r.quality.kl)},
                                {"token_agreement", r.quality.tokenAgreement},
                                {"answer", model.tokenizer().decode(r.quality.answer, true)}});
        };
        EvalPlan plan;
        plan.textRecompute = false;
        plan.cachegen.codec = CodecId::CacheGen;
        plan.cachegen.shape = p.original.shape();
        plan.cachegen.dtype = p.original.dtype();
        plan.cachegen.profile = defaultProfile(p.original.shape().numLayers);
        plan.cachegen.profile.chunkTokens = tuned.chunkTokens;
        plan.baselines = {CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4};
        auto progress = [&](int done, int total) {
            std::fprintf(stderr, "  %s: %d/%d codecs measured\n", id.c_str(), done, total);
            return true;
        };
        addRows(evaluateCodecs(model.runtime(), *p.ref, p.original, plan, progress), "default");
        plan.cachegen.profile = tuned;
        plan.baselines.clear();
        const std::vector<EvalRow> tunedRows = evaluateCodecs(model.runtime(), *p.ref, p.original, plan, progress);
        addRows(tunedRows, "tuned");
        for (size_t l = 0; l < levels; ++l) {
            const Quality& q = tunedRows[l].quality;
            meets[l] = meets[l] && withinDeltaPplBar(q.deltaPplPct) && q.tokenAgreement >= 0.98;
            levelBytes[l] += tunedRows[l].bytes;
        }
        int8Total += int8Bytes(p.original.shape());
        contexts.push_back({{"context", id},
                            {"num_tokens", p.original.shape().numTokens},
                            {"continuation_tokens", int(p.ref->task().continuation.size())},
                            {"original_answer", model.tokenizer().decode(p.ref->original().answer, true)},
                            {"rows", rows}});
    }
    json goal = {{"criterion", "|delta_ppl_pct| <= 1 and token_agreement >= 0.98 on every held-out context"}, {"met", false}};
    for (size_t l = 0; l < levels; ++l)
        if (meets[l]) {
            goal = {{"criterion", goal["criterion"]},
                    {"met", true},
                    {"level", int(l) + 1},
                    {"level_name", tuned.levels[l].name},
                    {"ratio_vs_int8", double(int8Total) / double(levelBytes[l])}};
            break;
        }
    return {{"contexts", contexts}, {"goal", goal}};
}

void printTune(const json& j)
{
    std::printf("tuned on %s (%s)\n", j["tuning_contexts"].dump().c_str(), j["model"].get<std::string>().c_str());
    std::printf("%5s %-16s %8s %8s %7s %10s %10s %10s %7s\n", "level", "name", "budget", "bits/val", "x int8", "mean dPPL",
                "max dPPL", "mean KL", "agree");
    for (const json& l : j["levels"])
        std::printf("%5d %-16s %8.4g %8.3f %7.2f %10.3f %10.3f %10.6f %7.3f%s\n", l["level"].get<int>(),
                    l["name"].get<std::string>().c_str(), l["budget"].get<double>(),
                    l["bits_per_value"].get<double>(), l["ratio_vs_int8"].get<double>(),
                    l["mean_delta_ppl_pct"].get<double>(), l["max_delta_ppl_pct"].get<double>(), l["mean_kl"].get<double>(),
                    l["mean_token_agreement"].get<double>(), l["budget_met"].get<bool>() ? "" : "  (budget missed)");
    for (const json& l : j["levels"])
        std::printf("level %d K bins %s\n        V bins %s\n", l["level"].get<int>(), l["key_bins"].dump().c_str(),
                    l["value_bins"].dump().c_str());
    if (j.contains("held_out") && j["held_out"].contains("results")) {
        const json& h = j["held_out"];
        std::printf("judged on the held-out items %s (%d questions)\n", h["split"]["eval"].dump().c_str(), h["questions"].get<int>());
        printSuiteRows(h["results"]);
        const json& g = h["goal"];
        if (g["met"].get<bool>())
            std::printf("goal (%s): tuned level %d, %.2fx smaller than int8\n", g["criterion"].get<std::string>().c_str(),
                        g["level"].get<int>(), g["ratio_vs_int8"].get<double>());
        else
            std::printf("goal (%s): no tuned level meets it\n", g["criterion"].get<std::string>().c_str());
    } else if (j.contains("held_out")) {
        for (const json& c : j["held_out"]["contexts"]) {
            std::printf("held out: %s, %d tokens\n", c["context"].get<std::string>().c_str(), c["num_tokens"].get<int>());
            std::printf("  %-8s %-9s %5s %8s %7s %9s %10s %6s\n", "profile", "codec", "level", "bits/val", "x int8", "dPPL %",
                        "KL", "agree");
            for (const json& r : c["rows"])
                std::printf("  %-8s %-9s %5d %8.3f %7.2f %9.3f %10.6f %6.3f\n", r["profile"].get<std::string>().c_str(),
                            r["codec"].get<std::string>().c_str(), r["level"].get<int>(), r["bits_per_value"].get<double>(),
                            r["ratio_vs_int8"].get<double>(),
                            r["delta_ppl_pct"].is_null() ? NAN : r["delta_ppl_pct"].get<double>(),
                            r["kl"].is_null() ? NAN : r["kl"].get<double>(), r["token_agreement"].get<double>());
        }
        const json& g = j["held_out"]["goal"];
        if (g["met"].get<bool>())
            std::printf("goal (%s): level %d, %.2fx smaller than int8\n", g["criterion"].get<std::string>().c_str(),
                        g["level"].get<int>(), g["ratio_vs_int8"].get<double>());
        else
            std::printf("goal (%s): no tuned level meets it\n", g["criterion"].get<std::string>().c_str());
    }
    if (j.contains("profile_path")) std::printf("profile written to %s\n", j["profile_path"].get<std::string>().c_str());
}

}  // namespace

namespace {

// tune --codec transform: the tuner (eval/tune_transform.h) on the contexts, then (with --suite)
// the tuned levels judged on the suite's eval half next to fp16 and int8.
json tuneTransformCommand(const Model& model, const EvalOpts& o, const SuiteCliOpts& so, const Suite& suite, const json& names,
                          const std::vector<TuneContext>& contexts, const TransformTuneOptions& tt, const std::string& profileOut)
{
    const double t0 = nowSeconds();
    std::string lastStage;
    const TransformTuneResult r = tuneTransformProfile(model.runtime().fingerprint(), contexts, tt,
                                                       [&](const std::string& stage, int done, int total) {
                                                           if (stage != lastStage || done % 10 == 0 || done == total)
                                                               std::fprintf(stderr, "  %s %d/%d (%.0f s)\n", stage.c_str(), done,
                                                                            total, nowSeconds() - t0);
                                                           lastStage = stage;
                                                           return true;
                                                       });
    json levels = json::array();
    for (size_t l = 0; l < r.levels.size(); ++l) {
        const TransformTunedLevel& t = r.levels[l];
        json level = json::parse(t.level.measuredJson);
        level.update({{"level", int(l) + 1},
                      {"name", t.level.name},
                      {"key_theta", t.level.keyTheta},
                      {"value_theta", t.level.valueTheta},
                      {"key_layer_scale", t.level.keyLayerScale},
                      {"value_layer_scale", t.level.valueLayerScale}});
        levels.push_back(level);
    }
    json cands = json::array();
    for (const TransformTuneCandidate& c : r.candidates)
        cands.push_back({{"exponent", c.exponent}, {"multiplier", c.multiplier}, {"bits_per_value", c.bitsPerValue},
                         {"pooled_delta_ppl_pct", c.deltaPplPct}, {"pooled_kl", c.kl}});
    json sens = json::array();
    for (const LayerSensitivity& s : r.sensitivity)
        sens.push_back({{"layer", s.layer}, {"key_kl", s.keyKl}, {"value_kl", s.valueKl}, {"key_kl_per_distortion", s.keyRms},
                        {"value_kl_per_distortion", s.valueRms}});
    json j = {{"model", model.spec().name},
              {"fingerprint", model.runtime().fingerprint()},
              {"codec", "transform"},
              {"tuning_contexts", names},
              {"budget_metric", tuneMetricName(tt.metric)},
              {"budgets", tt.budgets},
              {"base_thetas", {tt.keyTheta, tt.valueTheta}},
              {"probe", tt.probe},
              {"sensitivity_floor", tt.sensitivityFloor},
              {"exponents", tt.exponents},
              {"multipliers", tt.multipliers},
              {"measured_candidates", r.candidates.size()},
              {"candidates", cands},
              {"tune_s", nowSeconds() - t0},
              {"default_level", r.profile.transformDefaultLevel},
              {"levels", levels},
              {"sensitivity", sens}};
    if (!profileOut.empty()) {
        saveProfile(r.profile, profileOut);
        j["profile_path"] = profileOut;
    }
    if (so.suite.empty()) return j;
    const Suite held = selectSplit(suite, SuiteSplit::Eval);
    // The reference, fp16 twice (the bar, then its row), int8 and every tuned level.
    const SuiteMeter meter(double(held.items.size()) * double(4 + r.profile.transformLevels.size()));
    const SuiteProgress& progress = meter.progress();
    std::fprintf(stderr, "judging on the held-out half: %zu items, %zu questions\n", held.items.size(), held.questionCount());
    const SuiteReference ref(model, held, so.options(o), progress);
    CodecParams base;
    base.codec = CodecId::Fp16;
    base.profile = r.profile;
    const SuiteResult fp16 = evaluateSuiteCodec(ref, base, 1, {}, progress).quality;
    json results = json::array();
    json split = {{"tune", names}, {"eval", json::array()}};
    for (const SuiteItem& i : held.items) split["eval"].push_back(i.id);
    CodecParams f = base;
    results.push_back(suiteRowJson(evaluateSuiteCodec(ref, f, 1, {}, progress), fp16));
    f.codec = CodecId::Int8;
    std::fprintf(stderr, "int8\n");
    results.push_back(suiteRowJson(evaluateSuiteCodec(ref, f, 1, {}, progress), fp16));
    CodecParams t = base;
    t.codec = CodecId::Transform;
    t.shape = ref.items().front().original.shape();
    t.dtype = ref.items().front().original.dtype();
    prepareTransform(t, ref.items().front().original, "tuned profile");
    json goal = {{"criterion", isoQualityRule() + " on the held-out items"},
                 {"met", false}};
    for (int l = 1; l <= int(r.profile.transformLevels.size()); ++l) {
        std::fprintf(stderr, "tuned transform level %d (%s)\n", l, r.profile.transformLevels[size_t(l - 1)].name.c_str());
        SuiteCodecRow row = evaluateSuiteCodec(ref, t, l, {}, progress);
        row.levelName = r.profile.transformLevels[size_t(l - 1)].name;
        json jr = suiteRowJson(row, fp16);
        jr["profile"] = "tuned";
        results.push_back(jr);
        if (!goal["met"].get<bool>() && meetsIsoQuality(row.quality, fp16))
            goal = {{"criterion", goal["criterion"]}, {"met", true}, {"level", l}, {"level_name", row.levelName},
                    {"bits_per_value", row.bitsPerValue}, {"ratio_vs_int8", row.ratioVsInt8}};
    }
    j["held_out"] = {{"split", split}, {"questions", int(held.questionCount())}, {"results", results}, {"goal", goal}};
    return j;
}

void printTuneTransform(const json& j)
{
    std::printf("transform tuned on %s (%s), %d candidates in %.0f s\n", j["tuning_contexts"].dump().c_str(),
                j["model"].get<std::string>().c_str(), int(j["measured_candidates"].get<size_t>()), j["tune_s"].get<double>());
    std::printf("%5s %-14s %8s %6s %6s %8s %7s %10s %10s\n", "level", "name", "budget", "alpha", "mult", "bits/val", "x int8",
                "pooled dPPL", "pooled KL");
    for (const json& l : j["levels"])
        std::printf("%5d %-14s %8.4g %6.2f %6.3f %8.3f %7.2f %10.3f %10.6f%s\n", l["level"].get<int>(),
                    l["name"].get<std::string>().c_str(), l["budget"].get<double>(), l["exponent"].get<double>(),
                    l["multiplier"].get<double>(), l["bits_per_value"].get<double>(), l["ratio_vs_int8"].get<double>(),
                    l["pooled_delta_ppl_pct"].get<double>(), l["pooled_kl"].get<double>(),
                    l["budget_met"].get<bool>() ? "" : "  (budget missed)");
    if (j.contains("held_out")) {
        const json& h = j["held_out"];
        std::printf("judged on the held-out items %s (%d questions)\n", h["split"]["eval"].dump().c_str(), h["questions"].get<int>());
        printSuiteRows(h["results"]);
        const json& g = h["goal"];
        if (g["met"].get<bool>())
            std::printf("goal (%s): tuned level %d, %.3f bits/value, %.2fx smaller than int8\n",
                        g["criterion"].get<std::string>().c_str(), g["level"].get<int>(), g["bits_per_value"].get<double>(),
                        g["ratio_vs_int8"].get<double>());
        else
            std::printf("goal (%s): no tuned level meets it\n", g["criterion"].get<std::string>().c_str());
    }
    if (j.contains("profile_path")) std::printf("profile written to %s\n", j["profile_path"].get<std::string>().c_str());
}

struct TuneOpts {
    EvalOpts eval;
    std::string contexts = "technical_note,story,conversation", budgets = "0.5,1,2,5",
                bins = "4,6,8,10,12,16,20,24,32,48,64,96,128", heldOut, profileOut, lmcacheOut;
    std::string metric = "dppl";
    // --codec transform
    std::string baseThetas = "0.03,0.003", exponents = "0,0.5,1", multipliers = "0.5,0.71,1,1.41,2,2.83,4";
    // The tuner's own defaults, so that --help shows what an unset option means.
    double probe = TransformTuneOptions{}.probe, sensitivityFloor = TransformTuneOptions{}.sensitivityFloor;
    int refine = TransformTuneOptions{}.refine;
    double minAgreement = 0;
    int probeBins = 8, lambdaSteps = 48;
};

void addTuneOptions(CLI::App* sub, TuneOpts& o, SuiteCliOpts& so)
{
    o.eval.add(sub, false, false);
    so.add(sub, false);
    sub->add_option("--contexts", o.contexts, "tuning contexts: sample ids or text files, comma-separated")
        ->capture_default_str();
    sub->add_option("--budgets", o.budgets, "quality budgets, one level each (delta PPL % or KL, see --budget-metric)")
        ->capture_default_str();
    sub->add_option("--budget-metric", o.metric, "what the budgets bound on the worst tuning context: dppl or kl")
        ->capture_default_str();
    sub->add_option("--min-agreement", o.minAgreement, "also require this mean token agreement per level (0 = off)")
        ->capture_default_str();
    sub->add_option("--bins", o.bins, "bins a layer may take")->capture_default_str();
    sub->add_option("--probe-bins", o.probeBins, "bins of the per-layer sensitivity probe")->capture_default_str();
    sub->add_option("--lambda-steps", o.lambdaSteps, "candidate allocations between smallest and best")->capture_default_str();
    addDeprecated(sub, "--eval",
                  sub->add_option("--held-out", o.heldOut, "held-out contexts to judge the tuned profile on: sample ids or text files, comma-separated"),
                  "--held-out");
    addOutOption(sub, o.profileOut, "write the tuned profile (JSON)", false);
    sub->add_option("--lmcache", o.lmcacheOut, "write each level's LMCache CacheGen QuantizationSpec lists (Python)");
    sub->add_option("--base-thetas", o.baseThetas, "transform: t_key,t_value of the base level (exponent 0, multiplier 1)")
        ->capture_default_str();
    sub->add_option("--exponents", o.exponents, "transform: per-layer exponents alpha (0 = base shape, 1 = theta ~ 1/sensitivity)")
        ->capture_default_str();
    sub->add_option("--multipliers", o.multipliers, "transform: multipliers of the water level tried per exponent")
        ->capture_default_str();
    sub->add_option("--probe", o.probe, "transform: sensitivity probe at this multiple of the base level")->capture_default_str();
    sub->add_option("--sensitivity-floor", o.sensitivityFloor,
                    "transform: a layer's sensitivity is at least this fraction of the largest")
        ->capture_default_str();
    sub->add_option("--refine", o.refine, "transform: bisection steps per budget after the grid")->capture_default_str();
}

}  // namespace

void addTuneCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("tune", "Per-layer bins under quality budgets over several contexts -> a profile");
    auto o = std::make_shared<TuneOpts>();
    o->eval.holdoutTokens = 192;
    o->eval.answerTokens = 32;
    auto so = std::make_shared<SuiteCliOpts>();
    addTuneOptions(sub, *o, *so);
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli tune --suite samples/suites/facts.json --budgets 0.5,1 --out tuned.json");
    sub->callback([o, so, &out] {
        TuneOptions to;
        if (o->metric == "kl") to.metric = TuneMetric::Kl;
        else if (o->metric != "dppl") throw Error("--budget-metric: expected dppl or kl, got '" + o->metric + "'");
        to.budgets = doubleList(o->budgets, "--budgets");
        to.binChoices = intList(o->bins, "--bins");
        to.probeBins = o->probeBins;
        to.lambdaSteps = o->lambdaSteps;
        to.minAgreement = o->minAgreement;
        for (int b : to.binChoices)
            if (b < 2 || b > 256) throw Error("--bins: " + std::to_string(b) + " is outside 2..256");
        std::vector<std::string> ids;
        const std::unique_ptr<Model> model = openEvalModel(o->eval);
        std::vector<PreparedContext> prepared;
        std::vector<TuneContext> contexts;
        json names = json::array();
        // --suite: tune on the suite's tune half (each item's context and continuation), judge on
        // the other half; the items never overlap.
        std::unique_ptr<SuiteReference> tuneRef;
        Suite suite;
        if (!so->suite.empty()) {
            if (!so->items.empty() || so->split != "all") throw Error("tune --suite: the split is fixed (even items tune, odd items judge)");
            suite = loadSuite(so->suite);
            const Suite half = selectSplit(suite, SuiteSplit::Tune);
            const SuiteMeter meter(double(half.items.size()));
            tuneRef = std::make_unique<SuiteReference>(*model, half, so->options(o->eval), meter.progress());
            for (const SuitePreparedItem& it : tuneRef->items()) {
                if (it.continuation.empty()) throw Error(so->suite + ": item " + it.id + " has no continuation to tune on");
                EvalTask task;
                task.context = it.context;
                task.continuation = it.continuation;
                PreparedContext p;
                p.original = it.original;
                p.ref = std::make_unique<QualityReference>(model->runtime(), task, p.original);
                prepared.push_back(std::move(p));
                ids.push_back(it.id);
                names.push_back(it.id);
            }
        } else {
            ids = splitList(o->contexts, "--contexts");
            for (const std::string& id : ids) {
                prepared.push_back(prepareContext(*model, o->eval, loadContext(o->eval, id), o->minAgreement > 0));
                if (prepared.back().ref->task().continuation.empty())
                    throw Error(id + ": no continuation to score (give --holdout-tokens N > 0)");
                names.push_back(id);
            }
        }
        for (size_t i = 0; i < ids.size(); ++i) contexts.push_back({ids[i], prepared[i].ref.get(), &prepared[i].original});
        if (o->eval.profile.codec == "transform") {
            if (!o->heldOut.empty()) throw Error("tune --codec transform: judge with --suite (its eval half), not --held-out");
            if (!o->lmcacheOut.empty()) throw Error("tune --codec transform: --lmcache is for CacheGen profiles");
            TransformTuneOptions tt;
            tt.metric = to.metric;
            tt.budgets = to.budgets;
            const std::vector<double> bt = doubleList(o->baseThetas, "--base-thetas");
            if (bt.size() != 2) throw Error("--base-thetas: give t_key,t_value");
            tt.keyTheta = bt[0];
            tt.valueTheta = bt[1];
            tt.exponents = doubleList(o->exponents, "--exponents");
            tt.multipliers = doubleList(o->multipliers, "--multipliers");
            tt.probe = o->probe;
            tt.sensitivityFloor = o->sensitivityFloor;
            tt.refine = o->refine;
            tt.base = *o->eval.profile.loadedProfile(prepared.front().original);
            if (!tt.base.hasTransform()) tt.base.transformLevels = defaultTransformLevels();
            out.emit(tuneTransformCommand(*model, o->eval, *so, suite, names, contexts, tt, o->profileOut), printTuneTransform);
            return;
        }
        to.base = o->eval.profile.params(prepared.front().original).profile;
        const double t0 = nowSeconds();
        std::string lastStage;
        const TuneResult r = tuneProfile(model->runtime().fingerprint(), contexts, to,
                                         [&](const std::string& stage, int done, int total) {
                                             if (stage != lastStage || done % 20 == 0 || done == total)
                                                 std::fprintf(stderr, "  %s %d/%d\n", stage.c_str(), done, total);
                                             lastStage = stage;
                                             return true;
                                         });
        json levels = json::array();
        for (size_t l = 0; l < r.levels.size(); ++l) {
            // The figures the profile records for the level, plus its place and bins.
            json level = json::parse(r.levels[l].level.measuredJson);
            level.update({{"level", int(l) + 1},
                          {"name", r.levels[l].level.name},
                          {"key_bins", r.levels[l].level.keyBins},
                          {"value_bins", r.levels[l].level.valueBins}});
            levels.push_back(level);
        }
        json sens = json::array();
        for (size_t c = 0; c < r.sensitivity.size(); ++c) {
            json layers = json::array();
            for (const LayerSensitivity& s : r.sensitivity[c])
                layers.push_back({{"layer", s.layer}, {"key_kl", s.keyKl}, {"value_kl", s.valueKl},
                                  {"key_delta_ppl_pct", s.keyDeltaPplPct}, {"value_delta_ppl_pct", s.valueDeltaPplPct}});
            sens.push_back({{"context", ids[c]}, {"probe_bins", to.probeBins}, {"layers", layers}});
        }
        json j = {{"model", model->spec().name},
                  {"fingerprint", model->runtime().fingerprint()},
                  {"tuning_contexts", names},
                  {"budget_metric", tuneMetricName(to.metric)},
                  {"budgets", to.budgets},
                  {"min_agreement", to.minAgreement},
                  {"measured_candidates", r.measuredCandidates},
                  {"tune_s", nowSeconds() - t0},
                  {"default_level", r.profile.defaultLevel},
                  {"tables", tableModeName(r.profile.tables)},
                  {"levels", levels},
                  {"sensitivity", sens}};
        if (!o->profileOut.empty()) {
            saveProfile(r.profile, o->profileOut);
            j["profile_path"] = o->profileOut;
        }
        if (!o->lmcacheOut.empty()) {
            std::string text = "# LMCache CacheGen configuration of each level of the profile tuned by kvscope-cli tune\n";
            for (size_t l = 0; l < r.profile.levels.size(); ++l)
                text += "# level " + std::to_string(l + 1) + ": " + r.profile.levels[l].name + "\n" +
                        lmcacheConfigPython(r.profile.levels[l]) + "\n";
            writeFileAtomic(o->lmcacheOut, text);
        }
        if (!so->suite.empty()) {
            if (!o->heldOut.empty()) throw Error("tune --suite judges on the suite's eval half: leave out --held-out");
            j["held_out"] = judgeTunedOnSuite(*model, o->eval, *so, suite, r.profile);
        } else if (!o->heldOut.empty()) {
            j["held_out"] = evaluateHeldOut(*model, o->eval, splitList(o->heldOut, "--held-out"), r.profile);
        }
        out.emit(j, printTune);
    });
}

}  // namespace kvscope::cli
