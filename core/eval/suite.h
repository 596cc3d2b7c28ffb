// A quality suite: many questions over several contexts, scored the way lm-evaluation-harness
// scores multiple choice, so that codecs can be told apart with intervals and a paired test.
//
// READ ME FIRST
//  - Format (the `--suite` file of eval, sweep and tune): {"name", "items": [{"id", "context",
//    "continuation"?, "questions": [{"question", "answer", "choices"?, "kind"?}]}]}. "kind" is an
//    optional tag (accuracy is broken down by it); any other key is refused, so a typo such as
//    "choice" is an error rather than a silently different suite.
//  - Options of a question: its "choices" plus the answer when the list lacks it (appended last);
//    without "choices", every distinct answer of the same item in item order. Ties of the score
//    go to the first option, so the order the suite gives is the order that counts.
//  - Prompt layout, the same for the reference and every candidate:
//      context   Model::contextTokens(context)  (BOS; ChatML models open the user turn)
//      then      continuation tokens, scored for perplexity (the context's last token is run
//                again first, as in quality.h, so the first continuation token is scored)
//      or        "\n\n" + question, then each option as " " + option (no space when the question
//                ends in whitespace), scored token by token given context + question.
//    Every question starts again from the context (the session is truncated back), never from
//    an earlier question or from the continuation.
//  - Scores per question: (a) multiple choice by the summed log-likelihood of the option's tokens
//    (and the per-token mean, "accuracy_norm"); (b) the greedy answer, exact match when its
//    normalised text (ASCII lower case, punctuation and whitespace runs -> one space) equals the
//    normalised answer or continues it after a word boundary; generation stops as soon as the
//    outcome is decided, at most answer tokens + 2; (c) the gold option's log-likelihood.
//    Per item: continuation NLL, KL(fp16 || candidate) per token and teacher-forced top-1
//    agreement with fp16 (token_agreement), pooled over items.
//  - The fp16 reference of each item (its scores above plus the continuation's log-probs) and the
//    item's prefill KV are cached on disk, keyed by the model fingerprint, the runtime (libtorch,
//    threads, compute and KV precision, prefill block), the scoring version and the item's
//    content, so a second run or another subset of the same items does no prefill and no
//    reference pass. Results are exact only against a reference from the same runtime settings,
//    hence the threads in the key.
#pragma once

#include "codec/chunk_codec.h"
#include "eval/stats.h"
#include "kv/kv_set.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

class Model;

struct SuiteQuestion {
    std::string question, answer;
    std::vector<std::string> choices;  // as written; empty = the item's other answers
    std::string kind;                  // optional tag
};

struct SuiteItem {
    std::string id, context, continuation;
    std::vector<SuiteQuestion> questions;
};

struct Suite {
    std::string name;
    std::string source;  // file it came from, for messages
    std::vector<SuiteItem> items;
    size_t questionCount() const;
};

// Throws kvscope::Error "file: items[3].questions[1].answer: reason" for malformed JSON, a
// missing or mistyped key, an unknown key, an empty string where text is needed, duplicate item
// ids, or a question with fewer than 2 distinct options. Limits: 64 MiB of text, 4096 items,
// 4096 questions per item, 64 options per question.
Suite parseSuite(const std::string& text, const std::string& file);
Suite loadSuite(const std::string& path);

// The options of question `q` of `item` as scored (see READ ME FIRST); *gold receives the index of
// its answer among them.
std::vector<std::string> suiteOptions(const SuiteItem& item, const SuiteQuestion& q, int* gold);

// The deterministic halves `tune` and `sweep` use: items at even positions tune, items at odd
// positions judge (never the same item). Needs at least 2 items.
enum class SuiteSplit { All, Tune, Eval };
// "all", "tune" or "eval"; throws on anything else.
SuiteSplit parseSuiteSplit(const std::string& s);
const char* suiteSplitName(SuiteSplit s);
Suite selectSplit(const Suite& suite, SuiteSplit split);
// The items with these ids, in the suite's order; throws naming an unknown id.
Suite selectItems(const Suite& suite, const std::vector<std::string>& ids);

struct SuiteOptions {
    int maxContinuation = 128;  // continuation tokens scored per item at most
    std::string cacheDir;       // "" = $XDG_CACHE_HOME/kvscope/suite-ref (~/.cache when unset)
    bool useCache = true;       // false: neither read nor write the disk cache
};

// Called with a stage ("prefill", "reference", "score"), the unit done and the units planned;
// returning false cancels (throws kvscope::Error "cancelled").
using SuiteProgress = std::function<bool(const std::string& stage, int done, int total)>;

// Scores of one question from one cache.
struct QuestionScore {
    std::vector<double> optionLogLik;  // summed log-likelihood of each option
    std::vector<int> optionTokens;     // tokens of each option
    int predicted = -1;                // arg-max of optionLogLik (first on ties)
    int predictedNorm = -1;            // arg-max of optionLogLik / optionTokens
    std::vector<int32_t> greedy;       // greedy answer tokens (stopped once decided)
    bool exactMatch = false;
};

// Scores of one item from one cache.
struct ItemScore {
    double nllSum = 0.0;  // continuation, nats
    double klSum = 0.0;   // sum over continuation positions of KL(fp16 || this), 0 for fp16
    int tokens = 0;       // continuation tokens scored
    int agree = 0;        // positions whose arg-max equals fp16's
    std::vector<QuestionScore> questions;
};

// One item ready to score: its tokens, options and the fp16 reference.
struct SuitePreparedItem {
    std::string id;
    std::vector<int32_t> context, continuation;
    struct Question {
        std::vector<int32_t> prompt;                // "\n\n" + question
        std::vector<std::vector<int32_t>> options;  // delimiter + option
        int gold = 0;                               // index of the answer in options
        std::string answer;
        std::string kind;
        int maxAnswerTokens = 0;
    };
    std::vector<Question> questions;
    KvSet original;  // the context's prefill KV (fp16)
    ItemScore reference;
    std::vector<int32_t> referenceArgmax;  // (continuation) fp16's arg-max per position
    // fp16 log-softmax of each continuation position, (continuation, vocab), for the KL.
    std::vector<float> referenceLogProbs;
};

class SuiteReference {
public:
    // Tokenizes every item, then reads its prefill KV and fp16 reference from the disk cache or
    // computes (and caches) them. Throws kvscope::Error for a context of fewer than 2 tokens, a
    // prompt past the model's position limit (context + continuation, or context + question +
    // longest option, past max_position_embeddings: "file: items.ID: ... reach position N, past
    // the model's M positions", before any prefill), an unreadable cache directory, or cancellation.
    // A cache file that fails validation is recomputed and replaced, with a warning on stderr.
    SuiteReference(const Model& model, Suite suite, const SuiteOptions& options = {}, const SuiteProgress& progress = {});
    ~SuiteReference();

    const Model& model() const { return *model_; }
    const Suite& suite() const { return suite_; }
    const std::vector<SuitePreparedItem>& items() const { return items_; }
    const std::string& key() const { return key_; }  // hex, covers every item's key
    // What this object had to compute (the rest came from the disk cache).
    int prefills() const { return prefills_; }
    int referencePasses() const { return referencePasses_; }
    double prepareSeconds() const { return prepareSeconds_; }

private:
    const Model* model_;
    Suite suite_;
    SuiteOptions options_;
    std::vector<SuitePreparedItem> items_;
    std::string key_;
    int prefills_ = 0, referencePasses_ = 0;
    double prepareSeconds_ = 0.0;
};

// Figures of one candidate against the fp16 reference, pooled over the items scored.
struct SuiteResult {
    int items = 0, questions = 0;
    int correct = 0, correctNorm = 0, exactMatches = 0;
    double accuracy = 0.0, accuracyNorm = 0.0, exactMatch = 0.0;
    Interval accuracyCi, exactMatchCi;  // Wilson 95%
    // Paired with fp16 per question: b = fp16 right and this wrong, c = the reverse.
    int mcnemarB = 0, mcnemarC = 0;
    double mcnemarP = 1.0;
    double answerLogprobDelta = 0.0;  // mean over questions of this - fp16 gold log-likelihood
    Interval answerLogprobDeltaCi;    // bootstrap over questions
    double answerAgreement = 1.0;     // fraction of questions whose greedy answer equals fp16's
    int continuationTokens = 0;
    double nll = 0.0, ppl = 0.0;      // pooled over every continuation token
    double deltaPplPct = 0.0;         // 100 (ppl / fp16 ppl - 1)
    Interval deltaPplPctCi;           // bootstrap over items
    double kl = 0.0;                  // pooled per token, nats
    Interval klCi;                    // bootstrap over items
    double tokenAgreement = 1.0;      // pooled teacher-forced top-1 agreement with fp16
    struct Kind {
        int questions = 0, correct = 0, fp16Correct = 0, exactMatches = 0;
    };
    std::map<std::string, Kind> kinds;  // by question kind ("" when untagged)
    std::vector<ItemScore> perItem;
    double seconds = 0.0;
    bool exact = false;  // every candidate cache was bit-identical to the original
};

// The candidate cache of item `item` (index into ref.items()) made from its original; it must
// have the original's shape.
using SuiteCandidate = std::function<KvSet(const KvSet& original, int item)>;

struct SuiteEvalOptions {
    // A candidate bit-identical to the original reuses the reference's scores instead of
    // scoring again (the result is the same by construction; tests turn this off to prove it).
    bool reuseExact = true;
    int bootstrapResamples = 1000;
    uint64_t seed = 20240601;
};

// Scores `candidate` on every item of `ref`. Throws kvscope::Error when a candidate has the
// wrong shape, on cancellation, and for what the candidate itself throws.
SuiteResult evaluateSuite(const SuiteReference& ref, const SuiteCandidate& candidate,
                          const SuiteEvalOptions& options = {}, const SuiteProgress& progress = {});
// The summary of per-item scores against the reference (what evaluateSuite ends with).
SuiteResult summarizeSuite(const SuiteReference& ref, std::vector<ItemScore> scores, const SuiteEvalOptions& options = {});

// A codec at one level on every item: encode -> decode in memory (codec_trial.h), with the
// byte counts summed over items. `params` gives the codec and profile; shape and dtype are
// taken from each item's cache. Works for any CodecId.
struct SuiteCodecRow {
    std::string codec;
    int level = 1;
    std::string levelName;
    uint64_t bytes = 0;
    double bitsPerValue = 0.0, ratioVsFp16 = 0.0, ratioVsInt8 = 0.0;
    double encodeSeconds = 0.0, decodeSeconds = 0.0;
    SuiteResult quality;
};
SuiteCodecRow evaluateSuiteCodec(const SuiteReference& ref, const CodecParams& params, int level,
                                 const SuiteEvalOptions& options = {}, const SuiteProgress& progress = {});

// The iso-quality bar, two-sided: a codec that moves perplexity either way has changed the model.
//  - |pooled delta PPL| <= 1% (either sign; NaN, no continuation, does not fail it);
//  - multiple-choice accuracy not lower than fp16's by more than 2 points;
//  - McNemar against fp16 (paired per question, exact, two-sided) not significant at 5%.
// Every caller (eval --suite, tune, the tables) takes its verdict from isoQuality(); the one
// reason it fails is named so a table can say which test a row missed.
constexpr double kIsoMaxDeltaPplPct = 1.0;
constexpr double kIsoMaxAccuracyDrop = 0.02;
constexpr double kIsoMcnemarAlpha = 0.05;
struct IsoQualityVerdict {
    bool meets = false;
    bool ppl = false, accuracy = false, mcnemar = false;
    std::string reason;  // "" when it meets the bar, else e.g. "|delta PPL| 1.68% > 1%"
};
IsoQualityVerdict isoQuality(const SuiteResult& row, const SuiteResult& fp16Row);
bool meetsIsoQuality(const SuiteResult& row, const SuiteResult& fp16Row);
// The perplexity half of the bar on its own, for quality measured without questions (tune on
// contexts): |deltaPplPct| <= maxPct, NaN passing.
bool withinDeltaPplBar(double deltaPplPct, double maxPct = kIsoMaxDeltaPplPct);
// The one-line statement of the bar, for --help, tables and JSON.
std::string isoQualityRule();

// ASCII lower case, every ASCII punctuation or whitespace run -> one space, leading spaces
// dropped; trailing ones kept when keepTrailing (generation needs to see a word boundary).
std::string normalizeAnswer(const std::string& s, bool keepTrailing = false);
// Exact match of a generated text against the answer (both normalised, see READ ME FIRST).
bool answerExactMatch(const std::string& generated, const std::string& answer);

}  // namespace kvscope
