// `eval --suite`, and the suite side of `tune --suite` / `sweep --suite`: codecs judged on a
// quality suite (core/eval/suite.h) with intervals, the paired test and the iso-quality bar.
#include "cli_eval.h"
#include "cli_grammar.h"

#include "codec/profile.h"
#include "eval/suite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace kvscope::cli {

namespace {

std::vector<std::string> commaList(const std::string& text)
{
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

json interval(const Interval& i) { return json::array({number(i.low), number(i.high)}); }

}  // namespace

void SuiteCliOpts::add(CLI::App* sub, bool evalOptions)
{
    sub->add_option("--suite", suite, "quality suite (JSON: name, items with context, continuation, questions); every row is judged by the " +
                                          isoQualityRule())
        ->group(kSuiteGroup);
    sub->add_option("--items", items, "only these item ids, comma-separated")->group(kSuiteGroup);
    sub->add_option("--split", split, "all, tune (even items) or eval (odd items)")->capture_default_str()->group(kSuiteGroup);
    if (evalOptions) {
        sub->add_option("--baselines", baselines, "baseline rows, comma-separated (fp16 is always measured: it is the bar)")
            ->capture_default_str()
            ->group(kSuiteGroup);
        sub->add_option("--levels", levels, "levels of --codec to measure: all, none, or a comma-separated list")
            ->capture_default_str()
            ->group(kSuiteGroup);
    }
    sub->add_option("--suite-cache", cacheDir, "reference cache directory (default: $XDG_CACHE_HOME/kvscope/suite-ref)")->group(kSuiteGroup);
    sub->add_flag("--no-suite-cache", noCache, "neither read nor write the reference cache")->group(kSuiteGroup);
}

Suite SuiteCliOpts::load() const
{
    Suite s = loadSuite(suite);
    if (!items.empty()) {
        if (split != "all") throw Error("--items and --split exclude each other");
        return selectItems(s, commaList(items));
    }
    return selectSplit(s, parseSuiteSplit(split));
}

SuiteOptions SuiteCliOpts::options(const EvalOpts& o) const
{
    SuiteOptions so;
    so.maxContinuation = o.maxContinuation;
    so.cacheDir = cacheDir;
    so.useCache = !noCache;
    return so;
}

struct SuiteMeter::State {
    double planned = 0, done = 0, partial = 0, start = 0;
    std::string countedStage, printedStage;
    int countedDone = 0, printedDone = 0, lastTenth = -1;

    // Steps done after a (stage, done, total) report: a prefill is the fraction of its item's
    // reference step; another stage counts its items, a count that starts again being a new row.
    double count(const std::string& stage, int d, int total)
    {
        if (stage.rfind("prefill", 0) == 0) {
            partial = total > 0 ? std::min(1.0, double(d) / total) : 0.0;
        } else {
            done += stage == countedStage && d > countedDone ? d - countedDone : d;
            countedStage = stage;
            countedDone = d;
            partial = 0;
        }
        return done + partial;
    }
    // One line per ~10% of a stage (a stage that starts again, starts its tenths again).
    bool due(const std::string& stage, int d, int total)
    {
        if (stage != printedStage || d < printedDone) lastTenth = -1;
        printedStage = stage;
        printedDone = d;
        const int tenth = total > 0 ? 10 * d / total : 10;
        if (tenth == lastTenth && d != total) return false;
        lastTenth = tenth;
        return true;
    }
};

SuiteMeter::SuiteMeter(double plannedSteps) : st_(std::make_shared<State>())
{
    st_->planned = plannedSteps;
    st_->start = nowSeconds();
    auto st = st_;
    progress_ = [st](const std::string& stage, int d, int total) {
        const double units = st->count(stage, d, total);
        if (!st->due(stage, d, total)) return true;
        const double elapsed = nowSeconds() - st->start;
        const double left = std::max(0.0, st->planned - units);
        if (units > 0)
            std::fprintf(stderr, "  %s %d/%d (%.0f s, ETA %.0f s)\n", stage.c_str(), d, total, elapsed, elapsed * left / units);
        else
            std::fprintf(stderr, "  %s %d/%d (%.0f s)\n", stage.c_str(), d, total, elapsed);
        return true;
    };
}

void SuiteMeter::replan(double plannedSteps) { st_->planned = plannedSteps; }

json isoQualityJson()
{
    return {{"rule", isoQualityRule()},
            {"max_abs_delta_ppl_pct", kIsoMaxDeltaPplPct},
            {"max_accuracy_drop", kIsoMaxAccuracyDrop},
            {"mcnemar_alpha", kIsoMcnemarAlpha}};
}

json suiteResultJson(const SuiteResult& q, const SuiteResult& fp16)
{
    json kinds = json::object();
    for (const auto& [name, k] : q.kinds)
        kinds[name.empty() ? "untagged" : name] = {{"questions", k.questions},
                                                   {"accuracy", k.questions ? double(k.correct) / k.questions : 0.0},
                                                   {"fp16_accuracy", k.questions ? double(k.fp16Correct) / k.questions : 0.0},
                                                   {"exact_match", k.questions ? double(k.exactMatches) / k.questions : 0.0}};
    return {{"ppl", number(q.ppl)},
            {"delta_ppl_pct", number(q.deltaPplPct)},
            {"delta_ppl_pct_ci", interval(q.deltaPplPctCi)},
            {"kl", number(q.kl)},
            {"kl_ci", interval(q.klCi)},
            {"token_agreement", q.tokenAgreement},
            {"accuracy", number(q.accuracy)},
            {"accuracy_ci", interval(q.accuracyCi)},
            {"accuracy_norm", number(q.accuracyNorm)},
            {"exact_match", number(q.exactMatch)},
            {"exact_match_ci", interval(q.exactMatchCi)},
            {"answer_logprob_delta", number(q.answerLogprobDelta)},
            {"answer_logprob_delta_ci", interval(q.answerLogprobDeltaCi)},
            {"answer_agreement", q.answerAgreement},
            {"mcnemar_p", q.mcnemarP},
            {"mcnemar_b", q.mcnemarB},
            {"mcnemar_c", q.mcnemarC},
            {"continuation_tokens", q.continuationTokens},
            {"meets_iso_quality", meetsIsoQuality(q, fp16)},
            {"iso_quality_fails", isoQuality(q, fp16).reason},
            {"kinds", kinds},
            {"exact", q.exact},
            {"score_s", q.seconds}};
}

json suiteRowJson(const SuiteCodecRow& r, const SuiteResult& fp16)
{
    json j = {{"codec", r.codec},
              {"level", r.level},
              {"level_name", r.levelName},
              {"bytes", r.bytes},
              {"bits_per_value", r.bitsPerValue},
              {"ratio_vs_fp16", r.ratioVsFp16},
              {"ratio_vs_int8", r.ratioVsInt8},
              {"encode_s", r.encodeSeconds},
              {"decode_s", r.decodeSeconds}};
    j.update(suiteResultJson(r.quality, fp16));
    return j;
}

void printSuiteRows(const json& rows)
{
    std::printf("%-9s %5s %8s %7s %8s %16s %8s %9s %17s %6s %6s %8s %8s %s\n", "codec", "level", "bits/val", "x int8", "acc",
                "acc 95% CI", "McNemar", "dPPL %", "dPPL 95% CI", "KL", "agree", "EM", "dLL", "iso");
    for (const json& r : rows) {
        auto num = [&](const char* k) { return r[k].is_null() ? NAN : r[k].get<double>(); };
        const json& ci = r["accuracy_ci"];
        const json& pci = r["delta_ppl_pct_ci"];
        std::printf("%-9s %5d %8.3f %7.2f %8.3f   [%.3f, %.3f] %8.3f %9.3f  [%6.2f, %6.2f] %6.4f %6.3f %8.3f %8.3f %s\n",
                    r["codec"].get<std::string>().c_str(), r["level"].get<int>(), r["bits_per_value"].get<double>(),
                    r["ratio_vs_int8"].get<double>(), num("accuracy"), ci[0].is_null() ? NAN : ci[0].get<double>(),
                    ci[1].is_null() ? NAN : ci[1].get<double>(), r["mcnemar_p"].get<double>(), num("delta_ppl_pct"),
                    pci[0].is_null() ? NAN : pci[0].get<double>(), pci[1].is_null() ? NAN : pci[1].get<double>(), num("kl"),
                    r["token_agreement"].get<double>(), num("exact_match"), num("answer_logprob_delta"),
                    r["meets_iso_quality"].get<bool>() ? "yes" : ("no: " + r["iso_quality_fails"].get<std::string>()).c_str());
    }
}

namespace {

void printSuiteTable(const json& j)
{
    std::printf("suite %s: %d items, %d questions, %d continuation tokens (%s)\n", j["suite"].get<std::string>().c_str(),
                int(j["items"].size()), j["questions"].get<int>(), j["continuation_tokens"].get<int>(),
                j["model"].get<std::string>().c_str());
    const json& f = j["fp16"];
    std::printf("fp16: accuracy %.3f (norm %.3f), exact match %.3f, perplexity %.4f\n", f["accuracy"].get<double>(),
                f["accuracy_norm"].get<double>(), f["exact_match"].get<double>(), f["ppl"].is_null() ? NAN : f["ppl"].get<double>());
    for (const auto& [kind, k] : f["kinds"].items())
        std::printf("  %-16s %4d questions, accuracy %.3f, exact match %.3f\n", kind.c_str(), k["questions"].get<int>(),
                    k["accuracy"].get<double>(), k["exact_match"].get<double>());
    printSuiteRows(j["results"]);
    std::printf("%s\n", isoQualityRule().c_str());
}

}  // namespace

namespace {

// fp16 (the bar) and the --baselines rows, each once.
std::vector<CodecId> suiteBaselines(const SuiteCliOpts& so)
{
    std::vector<CodecId> baselines = {CodecId::Fp16};
    for (const std::string& b : commaList(so.baselines)) {
        if (b == "none") continue;
        CodecId id;
        if (!parseCodecName(b, &id)) throw Error("--baselines: unknown codec '" + b + "'");
        if (std::find(baselines.begin(), baselines.end(), id) == baselines.end()) baselines.push_back(id);
    }
    return baselines;
}

// The levels `eval --suite` will measure, before the profile is prepared on a cache (for the
// progress plan; the exact list follows once it is).
size_t plannedLevels(const EvalOpts& o, const SuiteCliOpts& so, const Model& model)
{
    if (so.levels == "none") return 0;
    if (so.levels != "all") return commaList(so.levels).size();
    const ProfileOptions& po = o.profile;
    if (po.codec != "cachegen" && po.codec != "transform") return 1;
    const CodecProfile p = po.profilePath.empty() ? defaultProfile(model.spec().config.numLayers) : loadProfile(po.profilePath);
    if (po.codec == "cachegen") return p.levels.size();
    return p.hasTransform() ? p.transformLevels.size() : defaultTransformLevels().size();
}

}  // namespace

json runSuiteEval(const EvalOpts& o, const SuiteCliOpts& so)
{
    const Suite suite = so.load();
    const std::unique_ptr<Model> model = openEvalModel(o);
    std::fprintf(stderr, "suite %s: %zu items, %zu questions\n", suite.name.c_str(), suite.items.size(), suite.questionCount());
    const std::vector<CodecId> baselines = suiteBaselines(so);
    const double items = double(suite.items.size());
    SuiteMeter meter(items * double(1 + baselines.size() + plannedLevels(o, so, *model)));
    const SuiteProgress& progress = meter.progress();
    const SuiteReference ref(*model, suite, so.options(o), progress);
    const KvSet& first = ref.items().front().original;
    const ProfileOptions profile = withDefaultTransform(o.profile, model.get(), first.modelFingerprint);
    const CodecParams base = profile.params(first);

    std::vector<int> levels;
    if (so.levels == "all") {
        for (int l = 1; l <= base.numLevels(); ++l) levels.push_back(l);
    } else if (so.levels != "none") {
        for (const std::string& s : commaList(so.levels)) {
            char* end = nullptr;
            const long l = std::strtol(s.c_str(), &end, 10);
            if (*end || l < 1 || l > base.numLevels())
                throw Error("--levels: '" + s + "' is not a level of " + codecName(base.codec) + " (1.." +
                            std::to_string(base.numLevels()) + ")");
            levels.push_back(int(l));
        }
    }
    const bool levelRows = std::find(baselines.begin(), baselines.end(), base.codec) == baselines.end() || base.numLevels() > 1;
    meter.replan(items * double(1 + baselines.size() + (levelRows ? levels.size() : 0)));
    const double t0 = nowSeconds();
    std::vector<SuiteCodecRow> rows;
    auto measure = [&](const CodecParams& p, int level) {
        std::fprintf(stderr, "%s level %d\n", codecName(p.codec), level);
        rows.push_back(evaluateSuiteCodec(ref, p, level, {}, progress));
    };
    for (CodecId id : baselines) {
        CodecParams p = base;
        p.codec = id;
        measure(p, 1);
    }
    if (levelRows)
        for (int l : levels) measure(base, l);
    const SuiteResult& fp16 = rows.front().quality;
    json results = json::array();
    for (const SuiteCodecRow& r : rows) results.push_back(suiteRowJson(r, fp16));
    json ids = json::array();
    for (const SuitePreparedItem& it : ref.items()) ids.push_back(it.id);
    json fp16Json = suiteResultJson(fp16, fp16);
    return {{"model", model->spec().name},
            {"fingerprint", model->runtime().fingerprint()},
            {"suite", suite.name},
            {"suite_file", so.suite},
            {"split", so.items.empty() ? so.split : "items"},
            {"items", ids},
            {"questions", int(suite.questionCount())},
            {"continuation_tokens", fp16.continuationTokens},
            {"profile", profile.source()},
            {"default_level", base.profile.defaultLevel},
            {"iso_quality", isoQualityJson()},
            {"fp16", fp16Json},
            {"results", results},
            {"reference_cache", {{"key", ref.key()}, {"prefills", ref.prefills()}, {"reference_passes", ref.referencePasses()}}},
            {"timings", {{"load_s", model->loadSeconds()},
                         {"prepare_s", ref.prepareSeconds()},
                         {"eval_s", nowSeconds() - t0},
                         {"runtime", model->runtime().describe()}}}};
}

void emitSuiteEval(const json& j, Output& out) { out.emit(j, printSuiteTable); }

}  // namespace kvscope::cli

namespace kvscope::cli {

namespace {

json splitJson(const Suite& suite)
{
    json tune = json::array(), eval = json::array();
    for (const SuiteItem& i : selectSplit(suite, SuiteSplit::Tune).items) tune.push_back(i.id);
    for (const SuiteItem& i : selectSplit(suite, SuiteSplit::Eval).items) eval.push_back(i.id);
    return {{"rule", "items at even positions (0, 2, ...) tune, items at odd positions judge"}, {"tune", tune}, {"eval", eval}};
}

// fp16 first (the bar), then int8, KIVI-2 and KIVI-4 on `ref`.
std::vector<SuiteCodecRow> baselineRows(const SuiteReference& ref, const CodecParams& base, const SuiteProgress& progress)
{
    std::vector<SuiteCodecRow> rows;
    for (CodecId id : {CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4}) {
        CodecParams p = base;
        p.codec = id;
        std::fprintf(stderr, "%s\n", codecName(id));
        rows.push_back(evaluateSuiteCodec(ref, p, 1, {}, progress));
    }
    return rows;
}

}  // namespace

json judgeTunedOnSuite(const Model& model, const EvalOpts& o, const SuiteCliOpts& so, const Suite& suite, const CodecProfile& tuned)
{
    const Suite held = selectSplit(suite, SuiteSplit::Eval);
    // The reference, fp16, int8, KIVI-2/4, the default profile's default level and every tuned level.
    const SuiteMeter meter(double(held.items.size()) * double(6 + tuned.levels.size()));
    const SuiteProgress& progress = meter.progress();
    std::fprintf(stderr, "judging on the held-out half: %zu items, %zu questions\n", held.items.size(), held.questionCount());
    const SuiteReference ref(model, held, so.options(o), progress);
    CodecParams base;
    base.codec = CodecId::CacheGen;
    base.profile = defaultProfile(model.spec().config.numLayers);
    base.profile.chunkTokens = tuned.chunkTokens;
    std::vector<SuiteCodecRow> rows = baselineRows(ref, base, progress);
    const SuiteResult fp16 = rows.front().quality;
    json results = json::array();
    for (const SuiteCodecRow& r : rows) results.push_back(suiteRowJson(r, fp16));
    std::fprintf(stderr, "default profile, level %d\n", base.profile.defaultLevel);
    json d = suiteRowJson(evaluateSuiteCodec(ref, base, base.profile.defaultLevel, {}, progress), fp16);
    d["profile"] = "default";
    results.push_back(d);
    CodecParams t = base;
    t.profile = tuned;
    json goal = {{"criterion", isoQualityRule() + " on the held-out items"},
                 {"met", false}};
    for (int l = 1; l <= t.numLevels(); ++l) {
        std::fprintf(stderr, "tuned profile, level %d\n", l);
        const SuiteCodecRow r = evaluateSuiteCodec(ref, t, l, {}, progress);
        json j = suiteRowJson(r, fp16);
        j["profile"] = "tuned";
        results.push_back(j);
        if (!goal["met"].get<bool>() && meetsIsoQuality(r.quality, fp16))
            goal = {{"criterion", goal["criterion"]}, {"met", true}, {"level", l}, {"level_name", r.levelName},
                    {"bits_per_value", r.bitsPerValue}, {"ratio_vs_int8", r.ratioVsInt8}};
    }
    return {{"split", splitJson(suite)}, {"questions", int(held.questionCount())}, {"results", results}, {"goal", goal}};
}

json sweepSuite(const EvalOpts& o, const SuiteCliOpts& so, SweepGrid grid)
{
    if (!so.items.empty() || so.split != "all") throw Error("sweep --suite: the split is fixed (even items sweep, odd items judge)");
    const Suite suite = loadSuite(so.suite);
    const std::unique_ptr<Model> model = openEvalModel(o);
    const Suite tuneHalf = selectSplit(suite, SuiteSplit::Tune);
    // The tune half's reference, fp16 and every point; the held-out judging is planned when it is due.
    SuiteMeter meter(double(tuneHalf.items.size()) * double(2 + grid.points()));
    const SuiteProgress& progress = meter.progress();
    const SuiteReference tuneRef(*model, tuneHalf, so.options(o), progress);
    const CodecParams base = o.profile.params(tuneRef.items().front().original);
    grid.base = base.profile;
    if (grid.chunkTokens.empty()) grid.chunkTokens = {base.profile.chunkTokens};
    if (grid.deltaGroups.empty()) grid.deltaGroups = {base.profile.deltaGroup};
    const double t0 = nowSeconds();

    CodecParams f = base;
    f.codec = CodecId::Fp16;
    const SuiteResult fp16 = evaluateSuiteCodec(tuneRef, f, 1, {}, progress).quality;
    json points = json::array();
    int best = -1;
    double bestBits = INFINITY;
    std::vector<CodecParams> pointParams;
    const size_t total = grid.points();
    for (const std::vector<int>& kb : grid.keyBins)
        for (const std::vector<int>& vb : grid.valueBins)
            for (int chunk : grid.chunkTokens)
                for (int delta : grid.deltaGroups)
                    for (Quantizer kq : grid.keyQuantizers)
                        for (Quantizer vq : grid.valueQuantizers) {
                            const CodecParams p = sweepPointParams(base, chunk, delta, kq, vq, kb, vb);
                            std::fprintf(stderr, "point %zu/%zu: K %s V %s chunk %d delta %d\n", pointParams.size() + 1, total,
                                         groupBinsText(kb).c_str(), groupBinsText(vb).c_str(), chunk, delta);
                            const SuiteCodecRow r = evaluateSuiteCodec(tuneRef, p, 1, {}, progress);
                            json j = suiteRowJson(r, fp16);
                            j.update({{"key_bins", groupBinsText(kb)},
                                      {"value_bins", groupBinsText(vb)},
                                      {"chunk_tokens", chunk},
                                      {"delta_group", delta},
                                      {"key_quantizer", quantizerName(kq)},
                                      {"value_quantizer", quantizerName(vq)}});
                            if (meetsIsoQuality(r.quality, fp16) && r.bitsPerValue < bestBits) {
                                bestBits = r.bitsPerValue;
                                best = int(pointParams.size());
                            }
                            pointParams.push_back(p);
                            points.push_back(j);
                        }
    json j = {{"model", model->spec().name},
              {"fingerprint", model->runtime().fingerprint()},
              {"suite", suite.name},
              {"split", splitJson(suite)},
              {"tune_questions", int(tuneRef.suite().questionCount())},
              {"fp16_tune", suiteResultJson(fp16, fp16)},
              {"points", points}};
    if (best >= 0) {
        points[size_t(best)]["best"] = true;
        j["points"] = points;
        const Suite held = selectSplit(suite, SuiteSplit::Eval);
        // Its reference, the four baselines and the point.
        meter.replan(double(tuneHalf.items.size()) * double(2 + grid.points()) + double(held.items.size()) * 6);
        std::fprintf(stderr, "judging the smallest iso-quality point on the held-out half (%zu items)\n", held.items.size());
        const SuiteReference evalRef(*model, held, so.options(o), progress);
        std::vector<SuiteCodecRow> rows = baselineRows(evalRef, base, progress);
        rows.push_back(evaluateSuiteCodec(evalRef, pointParams[size_t(best)], 1, {}, progress));
        json results = json::array();
        for (const SuiteCodecRow& r : rows) results.push_back(suiteRowJson(r, rows.front().quality));
        results.back()["point"] = best;
        j["held_out"] = {{"questions", int(held.questionCount())}, {"results", results}};
    } else {
        j["held_out"] = nullptr;
    }
    j["seconds"] = nowSeconds() - t0;
    return j;
}

void printSuiteSweep(const json& j)
{
    std::printf("sweep on the tune half %s of suite %s (%d questions)\n", j["split"]["tune"].dump().c_str(),
                j["suite"].get<std::string>().c_str(), j["tune_questions"].get<int>());
    std::printf("%-9s %-6s %8s %7s %8s %16s %8s %9s %6s\n", "K bins", "V bins", "bits/val", "x int8", "acc", "acc 95% CI",
                "McNemar", "dPPL %", "KL");
    for (const json& r : j["points"]) {
        const json& ci = r["accuracy_ci"];
        std::printf("%-9s %-6s %8.3f %7.2f %8.3f   [%.3f, %.3f] %8.3f %9.3f %6.4f %s%s\n", r["key_bins"].get<std::string>().c_str(),
                    r["value_bins"].get<std::string>().c_str(), r["bits_per_value"].get<double>(), r["ratio_vs_int8"].get<double>(),
                    r["accuracy"].is_null() ? NAN : r["accuracy"].get<double>(), ci[0].is_null() ? NAN : ci[0].get<double>(),
                    ci[1].is_null() ? NAN : ci[1].get<double>(), r["mcnemar_p"].get<double>(),
                    r["delta_ppl_pct"].is_null() ? NAN : r["delta_ppl_pct"].get<double>(),
                    r["kl"].is_null() ? NAN : r["kl"].get<double>(), r["meets_iso_quality"].get<bool>() ? "iso" : "",
                    r.contains("best") ? " (smallest iso-quality point)" : "");
    }
    if (j["held_out"].is_null()) {
        std::printf("no point meets the iso-quality bar on the tune half\n");
        return;
    }
    std::printf("judged on the held-out half %s (%d questions):\n", j["split"]["eval"].dump().c_str(),
                j["held_out"]["questions"].get<int>());
    printSuiteRows(j["held_out"]["results"]);
}

}  // namespace kvscope::cli
