// What the model-quality commands share (eval, demo, sensitivity, sweep, tune): their options,
// opening the model, and capturing a context's original cache with its quality reference.
#pragma once

#include "cli_codec.h"
#include "cli_common.h"
#include "cli_grammar.h"

#include "eval/quality.h"
#include "eval/samples.h"
#include "eval/suite.h"
#include "eval/sweep.h"
#include "model/model.h"

#include <memory>
#include <string>
#include <vector>

namespace kvscope::cli {

struct EvalOpts {
    ModelOpts model;  // --attn-mass is also on when a profile needs the attention mass
    std::string context, continuationFile, question;
    int answerTokens = 32;
    int maxContinuation = 256;
    int holdoutTokens = 0;  // contexts without a continuation: hold out their last tokens
    bool noText = false, perLayer = false, onlyTransform = false;
    std::vector<std::string> compareProfiles;  // eval --transform-profile
    ProfileOptions profile;

    // contextOption false: the command names its contexts some other way (tune's --contexts).
    // quantizers false: the command takes --key-quantizer/--value-quantizer itself (sweep's lists).
    void add(CLI::App* sub, bool contextRequired, bool contextOption = true, bool quantizers = true)
    {
        model.add(sub);
        if (contextOption) {
            addContextOption(sub, context, contextRequired);
            addContinuationOption(sub, continuationFile);
            addQuestionOption(sub, question);
        }
        sub->add_option("--answer-tokens", answerTokens, "greedy tokens of each answer")->capture_default_str();
        sub->add_option("--max-continuation", maxContinuation, "continuation tokens scored at most")->capture_default_str();
        sub->add_option("--holdout-tokens", holdoutTokens,
                        "for a context without continuation, score its last N tokens as one (0 = off)")
            ->capture_default_str();
        profile.add(sub, quantizers);
    }
    // Whether the captures need KvSet::attnMass: asked for, or a profile with token_importance.
    bool needsAttnMass() const
    {
        if (model.attnMass) return true;
        std::vector<std::string> paths = compareProfiles;
        if (!profile.profilePath.empty()) paths.push_back(profile.profilePath);
        for (const std::string& p : paths)
            if (loadProfile(p).transform.tokenImportance) return true;
        return false;
    }
};

// A context's original cache and its quality reference (the reference owns the task).
struct PreparedContext {
    KvSet original;
    std::unique_ptr<QualityReference> ref;
    bool heldOut = false;  // the continuation is the context's own last tokens
    double captureSeconds = 0, refSeconds = 0;
};

std::unique_ptr<Model> openEvalModel(const EvalOpts& o);
// Tokenizes the sample (ChatML for chat models), captures the cache, runs the reference pass.
PreparedContext prepareContext(const Model& m, const EvalOpts& o, const SampleContext& sample, bool withQuestion);

// Options of the commands that take a quality suite (eval, tune, sweep).
struct SuiteCliOpts {
    std::string suite, items, split = "all", baselines = "fp16,int8,kivi2,kivi4", levels = "all", cacheDir;
    bool noCache = false;
    // evalOptions: also --baselines and --levels (eval only).
    void add(CLI::App* sub, bool evalOptions);
    // The suite file with --items or --split applied.
    Suite load() const;
    SuiteOptions options(const EvalOpts& o) const;
};

// Progress lines on stderr over a list of suite steps planned ahead: one step is one item's
// reference pass (its prefill included, as a fraction of the step) or one item scored for one row.
// One line per ~10% of each stage, with the elapsed time and the ETA of the whole list at its pace
// so far (elapsed / steps done x steps left).
class SuiteMeter {
public:
    explicit SuiteMeter(double plannedSteps);
    // The whole list's steps, once its length is known.
    void replan(double plannedSteps);
    const SuiteProgress& progress() const { return progress_; }
    struct State;

private:
    std::shared_ptr<State> st_;
    SuiteProgress progress_;
};
// A suite row's JSON: the eval row keys plus accuracy, accuracy_ci, exact_match,
// answer_logprob_delta, mcnemar_p, intervals and meets_iso_quality (against fp16).
json suiteResultJson(const SuiteResult& q, const SuiteResult& fp16);
// The iso-quality bar's parameters and its one-line rule (core/eval/suite.h isoQuality).
json isoQualityJson();
json suiteRowJson(const SuiteCodecRow& r, const SuiteResult& fp16);
void printSuiteRows(const json& rows);
// `eval --suite`: fp16, the baselines and the levels of --codec on the suite.
json runSuiteEval(const EvalOpts& o, const SuiteCliOpts& so);
// `tune --suite`: the tuned profile's levels next to fp16, int8, KIVI-2/4 and the default profile's
// default level, judged on the suite's eval half; `goal` is the smallest tuned level meeting the
// iso-quality bar there.
json judgeTunedOnSuite(const Model& model, const EvalOpts& o, const SuiteCliOpts& so, const Suite& suite,
                       const CodecProfile& tuned);
// `sweep --suite`: every grid point on the tune half; the smallest point meeting the bar there is
// judged again on the eval half next to the baselines. Empty chunk/delta axes take the profile's.
json sweepSuite(const EvalOpts& o, const SuiteCliOpts& so, SweepGrid grid);
void printSuiteSweep(const json& j);
void emitSuiteEval(const json& j, Output& out);

}  // namespace kvscope::cli
