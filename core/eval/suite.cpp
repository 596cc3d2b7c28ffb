#include "eval/suite.h"

#include "common/error.h"
#include "common/file_io.h"
#include "eval/codec_trial.h"
#include "kvio/kv_h5.h"
#include "model/generate.h"
#include "model/model.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace kvscope {

using json = nlohmann::json;

namespace {

// Bump when anything that changes a cached reference changes: prompt layout, scoring, greedy rule.
constexpr int kScoringVersion = 2;

double secondsSince(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t fnv1a(uint64_t h, const std::string& s)
{
    // Length first, so ("ab", "c") and ("a", "bc") hash differently.
    const uint64_t n = s.size();
    for (int i = 0; i < 8; ++i) h = (h ^ ((n >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

// 128-bit hex digest of a list of strings (two FNV-1a lanes): a cache key, not a security claim.
std::string digest(const std::vector<std::string>& parts)
{
    uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
    for (const std::string& p : parts) {
        a = fnv1a(a, p);
        b = fnv1a(b, p + "\x01");
    }
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
    return buf;
}

std::string tokensText(const std::vector<int32_t>& t)
{
    std::string s(t.size() * 4, '\0');
    if (!t.empty()) std::memcpy(&s[0], t.data(), s.size());
    return s;
}

}  // namespace

// ---- scoring ---------------------------------------------------------------------------------

namespace {

// Scores the options of question q from its branch group's logits; goldArgmax receives the
// arg-max after each of the gold option's tokens but its last (what the greedy answer follows).
QuestionScore scoreOptions(const SuitePreparedItem::Question& q, const InferenceSession::BranchGroupLogits& logits,
                           std::vector<int32_t>& goldArgmax)
{
    const std::vector<float>& last = logits.trunkLast;
    QuestionScore qs;
    const size_t vocab = last.size();
    std::vector<double> lp0;
    logSoftmax(last.data(), vocab, lp0);
    for (size_t o = 0; o < q.options.size(); ++o) {
        const std::vector<int32_t>& t = q.options[o];
        double ll = lp0[size_t(t[0])];
        for (size_t j = 1; j < t.size(); ++j) {
            const float* lg = logits.branches[o].data() + (j - 1) * vocab;
            ll += logSoftmaxAt(lg, vocab, t[j]);
            if (int(o) == q.gold) goldArgmax.push_back(argmax(lg, vocab));
        }
        qs.optionLogLik.push_back(ll);
        qs.optionTokens.push_back(int(t.size()));
    }
    for (size_t o = 0; o < q.options.size(); ++o) {
        if (qs.predicted < 0 || qs.optionLogLik[o] > qs.optionLogLik[size_t(qs.predicted)]) qs.predicted = int(o);
        const double norm = qs.optionLogLik[o] / qs.optionTokens[o];
        if (qs.predictedNorm < 0 ||
            norm > qs.optionLogLik[size_t(qs.predictedNorm)] / qs.optionTokens[size_t(qs.predictedNorm)])
            qs.predictedNorm = int(o);
    }
    return qs;
}

// The greedy answer of one question, token by token: it follows the gold option's logits while it
// agrees with them (already computed), then needs a forward after the question's trunk per token;
// it stops once the match is decided. take() is handed each next token and says what to run
// next, so that the caller can run the forwards of every question of an item together.
class GreedyAnswer {
public:
    GreedyAnswer(const Tokenizer& tok, const std::vector<int32_t>& stops, const SuitePreparedItem::Question& q,
                 std::vector<int32_t> goldArgmax, QuestionScore& score)
        : tok_(&tok), stops_(&stops), q_(&q), goldArgmax_(std::move(goldArgmax)), score_(&score),
          answer_(normalizeAnswer(q.answer))
    {
    }

    // Records `next` and follows the gold option as far as it can: returns the tokens to run
    // after the trunk (and what earlier calls ran after it) for the next token, or nothing once
    // the answer is decided (score.exactMatch is then final).
    std::vector<int32_t> take(int32_t next)
    {
        const std::vector<int32_t>& gold = q_->options[size_t(q_->gold)];
        std::vector<int32_t>& greedy = score_->greedy;
        for (;;) {
            greedy.push_back(next);
            const bool stop = std::find(stops_->begin(), stops_->end(), next) != stops_->end();
            const std::string generated = tok_->decode(greedy, true);
            const std::string g = normalizeAnswer(generated, true);
            if (g.compare(0, answer_.size() + 1, answer_ + " ") == 0) {
                score_->exactMatch = true;
                return {};
            }
            const bool compatible = answer_.compare(0, g.size(), g) == 0 ||
                                    (g.compare(0, answer_.size(), answer_) == 0 && g.size() == answer_.size());
            if (!compatible || stop || int(greedy.size()) >= q_->maxAnswerTokens) {
                score_->exactMatch = answerExactMatch(generated, q_->answer);
                return {};
            }
            const size_t j = greedy.size() - 1;
            onGold_ = onGold_ && j + 1 < gold.size() && greedy[j] == gold[j];
            if (onGold_) {
                next = goldArgmax_[j];
                continue;
            }
            if (synced_) return {greedy.back()};
            synced_ = true;
            return greedy;  // the trunk's stash holds none of the answer yet
        }
    }

private:
    const Tokenizer* tok_;
    const std::vector<int32_t>* stops_;
    const SuitePreparedItem::Question* q_;
    std::vector<int32_t> goldArgmax_;
    QuestionScore* score_;
    std::string answer_;
    bool onGold_ = true, synced_ = false;
};

// Scores one item from `kv`. With refLogProbs null this is the reference pass: the continuation's
// log-probs go to keepLogProbs and its arg-max to keepArgmax. Otherwise the KL and the agreement
// are measured against them.
ItemScore scoreItem(const Model& model, const SuitePreparedItem& item, const KvSet& kv, const float* refLogProbs,
                    const std::vector<int32_t>* refArgmax, std::vector<float>* keepLogProbs, std::vector<int32_t>* keepArgmax)
{
    const LlamaRuntime& rt = model.runtime();
    const Tokenizer& tok = model.tokenizer();
    if (!(kv.shape() == rt.kvShape(int(item.context.size()))))
        throw Error(item.id + ": the candidate KV cache does not have the original's shape");
    ItemScore sc;
    InferenceSession s(rt);
    s.loadKv(kv);
    const int n = int(item.context.size());
    const size_t m = item.continuation.size();
    std::vector<double> row;
    if (m > 0) {
        s.truncate(n - 1);
        std::vector<int32_t> input = {item.context.back()};
        input.insert(input.end(), item.continuation.begin(), item.continuation.end() - 1);
        std::vector<float> logits;
        s.append(input, nullptr, &logits);
        const size_t vocab = logits.size() / m;
        if (keepLogProbs) keepLogProbs->resize(m * vocab);
        for (size_t i = 0; i < m; ++i) {
            const float* lg = logits.data() + i * vocab;
            logSoftmax(lg, vocab, row);
            sc.nllSum -= row[size_t(item.continuation[i])];
            const int32_t top = argmax(lg, vocab);
            if (keepLogProbs) {
                for (size_t v = 0; v < vocab; ++v) (*keepLogProbs)[i * vocab + v] = float(row[v]);
                keepArgmax->push_back(top);
            } else {
                const float* r = refLogProbs + i * vocab;
                double sum = 0.0;
                for (size_t v = 0; v < vocab; ++v) sum += std::exp(double(r[v])) * (double(r[v]) - double(float(row[v])));
                sc.klSum += std::max(0.0, sum);
                sc.agree += top == (*refArgmax)[i] ? 1 : 0;
            }
        }
        sc.tokens = int(m);
        if (keepLogProbs) sc.agree = int(m);
    }
    const std::vector<int32_t> stops = model.stopIds();
    // Every question in one batch of branch groups (the question as the trunk, each option less
    // its last token as a branch after it): the same logits as one appendBranches per question,
    // to the bit, with the weights read once per batch instead of once per question.
    s.truncate(n);
    std::vector<InferenceSession::BranchGroup> groups;
    for (const SuitePreparedItem::Question& q : item.questions) {
        InferenceSession::BranchGroup g;
        g.trunk = q.prompt;
        for (const std::vector<int32_t>& t : q.options) g.branches.emplace_back(t.begin(), t.end() - 1);
        groups.push_back(std::move(g));
    }
    if (groups.empty()) return sc;
    const std::vector<InferenceSession::BranchGroupLogits> logits = s.appendBranchGroups(groups);
    // The greedy answers: each round runs the next forward of every question still generating in
    // one extendGroups pass, with the same logits as one question at a time.
    sc.questions.resize(item.questions.size());
    std::vector<GreedyAnswer> answers;
    std::vector<int> pending;
    std::vector<std::vector<int32_t>> run;
    for (size_t k = 0; k < item.questions.size(); ++k) {
        std::vector<int32_t> goldArgmax;
        sc.questions[k] = scoreOptions(item.questions[k], logits[k], goldArgmax);
        answers.emplace_back(tok, stops, item.questions[k], std::move(goldArgmax), sc.questions[k]);
        const std::vector<float>& last = logits[k].trunkLast;
        std::vector<int32_t> next = answers[k].take(argmax(last.data(), last.size()));
        if (next.empty()) continue;
        pending.push_back(int(k));
        run.push_back(std::move(next));
    }
    while (!pending.empty()) {
        const std::vector<std::vector<float>> lg = s.extendGroups(pending, run);
        std::vector<int> still;
        std::vector<std::vector<int32_t>> again;
        for (size_t i = 0; i < pending.size(); ++i) {
            std::vector<int32_t> next = answers[size_t(pending[i])].take(argmax(lg[i].data(), lg[i].size()));
            if (next.empty()) continue;
            still.push_back(pending[i]);
            again.push_back(std::move(next));
        }
        pending = std::move(still);
        run = std::move(again);
    }
    return sc;
}

json scoresJson(const ItemScore& sc)
{
    json qs = json::array();
    for (const QuestionScore& q : sc.questions)
        qs.push_back({{"ll", q.optionLogLik},
                      {"tokens", q.optionTokens},
                      {"predicted", q.predicted},
                      {"predicted_norm", q.predictedNorm},
                      {"greedy", q.greedy},
                      {"exact_match", q.exactMatch}});
    return {{"nll_sum", sc.nllSum}, {"tokens", sc.tokens}, {"questions", qs}};
}

// Reads a cached reference; throws kvscope::Error (with the file) when it does not match `item`.
void readReference(const std::string& jsonPath, const std::string& binPath, const std::string& key, SuitePreparedItem& item,
                   size_t vocab)
{
    const std::string text = readSmallFile(jsonPath, 64u << 20);
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception&) {
        throw inputError(jsonPath, "json", "not valid JSON");
    }
    try {
        if (j.value("format", "") != "kvscope-suite-ref" || j.value("key", "") != key)
            throw inputError(jsonPath, "format", "not this item's reference");
        ItemScore sc;
        sc.nllSum = j.at("nll_sum").get<double>();
        sc.tokens = j.at("tokens").get<int>();
        if (sc.tokens != int(item.continuation.size())) throw inputError(jsonPath, "tokens", "continuation length differs");
        sc.agree = sc.tokens;
        const json& qs = j.at("questions");
        if (qs.size() != item.questions.size()) throw inputError(jsonPath, "questions", "count differs");
        for (size_t k = 0; k < qs.size(); ++k) {
            QuestionScore q;
            q.optionLogLik = qs[k].at("ll").get<std::vector<double>>();
            q.optionTokens = qs[k].at("tokens").get<std::vector<int>>();
            q.predicted = qs[k].at("predicted").get<int>();
            q.predictedNorm = qs[k].at("predicted_norm").get<int>();
            q.greedy = qs[k].at("greedy").get<std::vector<int32_t>>();
            q.exactMatch = qs[k].at("exact_match").get<bool>();
            const size_t opts = item.questions[k].options.size();
            if (q.optionLogLik.size() != opts || q.optionTokens.size() != opts || q.predicted < 0 || size_t(q.predicted) >= opts ||
                q.predictedNorm < 0 || size_t(q.predictedNorm) >= opts)
                throw inputError(jsonPath, "questions[" + std::to_string(k) + "]", "does not match the question");
            sc.questions.push_back(std::move(q));
        }
        item.referenceArgmax = j.at("argmax").get<std::vector<int32_t>>();
        if (item.referenceArgmax.size() != item.continuation.size()) throw inputError(jsonPath, "argmax", "length differs");
        item.reference = std::move(sc);
    } catch (const json::exception& e) {
        throw inputError(jsonPath, "", std::string("malformed: ") + e.what());
    }
    const size_t want = item.continuation.size() * vocab;
    if (want == 0) {
        item.referenceLogProbs.clear();
        return;
    }
    const std::string bin = readSmallFile(binPath, uint64_t(want) * 4 + 1);
    if (bin.size() != want * 4) throw inputError(binPath, "", "size differs from the continuation's log-probs");
    item.referenceLogProbs.resize(want);
    std::memcpy(item.referenceLogProbs.data(), bin.data(), bin.size());
}

}  // namespace

// ---- the reference -----------------------------------------------------------------------------

SuiteReference::SuiteReference(const Model& model, Suite suite, const SuiteOptions& options, const SuiteProgress& progress)
    : model_(&model), suite_(std::move(suite)), options_(options)
{
    const auto t0 = std::chrono::steady_clock::now();
    const LlamaRuntime& rt = model.runtime();
    const Tokenizer& tok = model.tokenizer();
    const size_t vocab = size_t(model.spec().config.vocabSize);
    const std::string dir = options_.cacheDir.empty() ? userCacheDir("suite-ref") : options_.cacheDir;
    if (options_.useCache) makeDirs(dir, "suite cache");
    const std::string runtimeKey = rt.fingerprint() + "|" + rt.describe() + "|block " + std::to_string(rt.options().prefillBlock);

    std::vector<std::string> itemKeys;
    for (const SuiteItem& si : suite_.items) {
        SuitePreparedItem it;
        it.id = si.id;
        it.context = model.contextTokens(si.context);
        if (it.context.size() < 2) throw inputError(suite_.source, "items." + si.id + ".context", "fewer than 2 tokens");
        if (!si.continuation.empty()) {
            it.continuation = tok.encode(si.continuation, false);
            if (int(it.continuation.size()) > options_.maxContinuation) it.continuation.resize(size_t(std::max(0, options_.maxContinuation)));
        }
        std::vector<std::string> keyParts = {"kvscope-suite-ref", std::to_string(kScoringVersion), runtimeKey,
                                             tokensText(it.context), tokensText(it.continuation)};
        for (const SuiteQuestion& sq : si.questions) {
            SuitePreparedItem::Question q;
            q.prompt = tok.encode("\n\n" + sq.question, false);
            const bool spaced = !sq.question.empty() && std::isspace((unsigned char)sq.question.back());
            const std::vector<std::string> opts = suiteOptions(si, sq, &q.gold);
            for (const std::string& o : opts) {
                q.options.push_back(tok.encode((spaced ? "" : " ") + o, false));
                if (q.options.back().empty()) throw inputError(suite_.source, "items." + si.id, "option '" + o + "' has no tokens");
            }
            q.answer = sq.answer;
            q.kind = sq.kind;
            q.maxAnswerTokens = int(q.options[size_t(q.gold)].size()) + 2;
            keyParts.push_back(tokensText(q.prompt));
            for (const auto& o : q.options) keyParts.push_back(tokensText(o));
            keyParts.push_back(std::to_string(q.gold) + "|" + sq.answer);
            it.questions.push_back(std::move(q));
        }
        // Every position a scoring pass reaches must be one the model was trained for: the
        // continuation pass ends at context + continuation - 1, a question's branches and its
        // greedy answer at context + prompt + the longest option (or the gold one + 2).
        size_t reach = it.context.size() + (it.continuation.empty() ? 0 : it.continuation.size() - 1);
        for (const SuitePreparedItem::Question& q : it.questions) {
            size_t longest = size_t(q.maxAnswerTokens);
            for (const auto& o : q.options) longest = std::max(longest, o.size());
            reach = std::max(reach, it.context.size() + q.prompt.size() + longest);
        }
        const int maxPositions = model.spec().config.maxPositionEmbeddings;
        if (maxPositions > 0 && reach > size_t(maxPositions))
            throw inputError(suite_.source, "items." + si.id,
                             "context, question and answer reach position " + std::to_string(reach) + ", past the model's " +
                                 std::to_string(maxPositions) + " positions");
        itemKeys.push_back(digest(keyParts));
        items_.push_back(std::move(it));
    }
    key_ = digest(itemKeys);

    const int total = int(items_.size());
    for (int i = 0; i < total; ++i) {
        SuitePreparedItem& it = items_[size_t(i)];
        const std::string kvKey = digest({"kvscope-suite-kv", runtimeKey, tokensText(it.context)});
        const std::string kvPath = dir + "/" + kvKey + ".kv.h5";
        const std::string refJson = dir + "/" + itemKeys[size_t(i)] + ".ref.json";
        const std::string refBin = dir + "/" + itemKeys[size_t(i)] + ".ref.bin";
        bool haveKv = false;
        if (options_.useCache && isRegularFile(kvPath)) {
            try {
                it.original = readKvH5(kvPath);
                haveKv = it.original.shape() == rt.kvShape(int(it.context.size())) && it.original.tokens == it.context &&
                         it.original.modelFingerprint == rt.fingerprint();
                if (!haveKv) std::fprintf(stderr, "warning: %s: not this item's KV; recomputing\n", kvPath.c_str());
            } catch (const Error& e) {
                std::fprintf(stderr, "warning: %s; recomputing\n", e.what());
            }
        }
        if (haveKv && ((rt.options().attnMass && it.original.attnMass.empty()) || !it.original.hasRope() ||
                       it.original.querySq.empty())) {
            // Cached without codec statistics this run needs (the RoPE table, query moments, or the
            // attention mass when the runtime records it): one prefill adds them, the K/V are
            // unchanged.
            InferenceSession s(rt);
            s.append(it.context, nullptr, nullptr, [&](int done, int all) {
                return !progress || progress("prefill " + it.id, done, all);
            });
            const KvSet fresh = s.exportKv();
            it.original.ropeInvFreq = fresh.ropeInvFreq;
            it.original.ropePosition0 = fresh.ropePosition0;
            it.original.querySq = fresh.querySq;
            it.original.valueWeight = fresh.valueWeight;
            it.original.attnMass = fresh.attnMass;
            ++prefills_;
            if (options_.useCache) writeKvH5(it.original, kvPath);
        }
        if (!haveKv) {
            InferenceSession s(rt);
            s.append(it.context, nullptr, nullptr, [&](int done, int all) {
                return !progress || progress("prefill " + it.id, done, all);
            });
            it.original = s.exportKv();
            ++prefills_;
            if (options_.useCache) writeKvH5(it.original, kvPath);
        }
        it.original.context = suite_.items[size_t(i)].context;

        bool haveRef = false;
        if (options_.useCache && haveKv && isRegularFile(refJson)) {
            try {
                readReference(refJson, refBin, itemKeys[size_t(i)], it, vocab);
                haveRef = true;
            } catch (const Error& e) {
                std::fprintf(stderr, "warning: %s; recomputing\n", e.what());
            }
        }
        if (!haveRef) {
            it.referenceArgmax.clear();
            it.reference = scoreItem(model, it, it.original, nullptr, nullptr, &it.referenceLogProbs, &it.referenceArgmax);
            ++referencePasses_;
            if (options_.useCache) {
                std::string bin(it.referenceLogProbs.size() * 4, '\0');
                if (!bin.empty()) std::memcpy(&bin[0], it.referenceLogProbs.data(), bin.size());
                writeFileAtomic(refBin, bin);
                json j = scoresJson(it.reference);
                j["format"] = "kvscope-suite-ref";
                j["version"] = kScoringVersion;
                j["key"] = itemKeys[size_t(i)];
                j["item"] = it.id;
                j["runtime"] = runtimeKey;
                j["argmax"] = it.referenceArgmax;
                writeFileAtomic(refJson, j.dump() + "\n");
            }
        }
        if (progress && !progress("reference", i + 1, total)) throw Error("cancelled");
    }
    prepareSeconds_ = secondsSince(t0);
}

SuiteReference::~SuiteReference() = default;

// ---- candidates --------------------------------------------------------------------------------

SuiteResult summarizeSuite(const SuiteReference& ref, std::vector<ItemScore> scores, const SuiteEvalOptions& options)
{
    const auto& items = ref.items();
    KVSCOPE_ASSERT(scores.size() == items.size());
    SuiteResult r;
    r.items = int(items.size());
    std::vector<double> lpDelta;
    int sameGreedy = 0;
    double nllSum = 0, refNllSum = 0, klSum = 0;
    int agree = 0;
    for (size_t i = 0; i < items.size(); ++i) {
        const SuitePreparedItem& it = items[i];
        const ItemScore& c = scores[i];
        nllSum += c.nllSum;
        refNllSum += it.reference.nllSum;
        klSum += c.klSum;
        agree += c.agree;
        r.continuationTokens += c.tokens;
        for (size_t k = 0; k < it.questions.size(); ++k) {
            const int gold = it.questions[k].gold;
            const QuestionScore& cq = c.questions[k];
            const QuestionScore& rq = it.reference.questions[k];
            const bool right = cq.predicted == gold, refRight = rq.predicted == gold;
            ++r.questions;
            r.correct += right;
            r.correctNorm += cq.predictedNorm == gold;
            r.exactMatches += cq.exactMatch;
            r.mcnemarB += refRight && !right;
            r.mcnemarC += !refRight && right;
            lpDelta.push_back(cq.optionLogLik[size_t(gold)] - rq.optionLogLik[size_t(gold)]);
            sameGreedy += cq.greedy == rq.greedy;
            SuiteResult::Kind& kind = r.kinds[it.questions[k].kind];
            ++kind.questions;
            kind.correct += right;
            kind.fp16Correct += refRight;
            kind.exactMatches += cq.exactMatch;
        }
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (r.questions > 0) {
        r.accuracy = double(r.correct) / r.questions;
        r.accuracyNorm = double(r.correctNorm) / r.questions;
        r.exactMatch = double(r.exactMatches) / r.questions;
        r.answerAgreement = double(sameGreedy) / r.questions;
        double s = 0;
        for (double d : lpDelta) s += d;
        r.answerLogprobDelta = s / double(lpDelta.size());
        r.answerLogprobDeltaCi = bootstrapMean(lpDelta, options.bootstrapResamples, options.seed);
    } else {
        r.accuracy = r.accuracyNorm = r.exactMatch = r.answerLogprobDelta = nan;
    }
    r.accuracyCi = wilsonInterval(uint64_t(r.correct), uint64_t(r.questions));
    r.exactMatchCi = wilsonInterval(uint64_t(r.exactMatches), uint64_t(r.questions));
    r.mcnemarP = mcnemarExactP(uint64_t(r.mcnemarB), uint64_t(r.mcnemarC));
    if (r.continuationTokens > 0) {
        const double T = r.continuationTokens;
        r.nll = nllSum / T;
        r.ppl = std::exp(r.nll);
        r.deltaPplPct = 100.0 * (r.ppl / std::exp(refNllSum / T) - 1.0);
        r.kl = klSum / T;
        r.tokenAgreement = double(agree) / T;
        // Items are the independent units: resample them, pool within each resample.
        auto pooled = [&](bool kl) {
            return [&, kl](const std::vector<size_t>& units) {
                double a = 0, b = 0, t = 0;
                for (size_t u : units) {
                    a += kl ? scores[u].klSum : scores[u].nllSum;
                    b += items[u].reference.nllSum;
                    t += scores[u].tokens;
                }
                if (t == 0) return nan;
                return kl ? a / t : 100.0 * (std::exp((a - b) / t) - 1.0);
            };
        };
        r.deltaPplPctCi = bootstrapInterval(items.size(), pooled(false), options.bootstrapResamples, options.seed);
        r.klCi = bootstrapInterval(items.size(), pooled(true), options.bootstrapResamples, options.seed);
    } else {
        r.nll = r.ppl = r.kl = nan;
        r.deltaPplPctCi = r.klCi = {nan, nan};
    }
    r.perItem = std::move(scores);
    return r;
}

SuiteResult evaluateSuite(const SuiteReference& ref, const SuiteCandidate& candidate, const SuiteEvalOptions& options,
                          const SuiteProgress& progress)
{
    const auto t0 = std::chrono::steady_clock::now();
    const auto& items = ref.items();
    std::vector<ItemScore> scores;
    bool allExact = true;
    for (size_t i = 0; i < items.size(); ++i) {
        const SuitePreparedItem& it = items[i];
        const KvSet kv = candidate(it.original, int(i));
        if (!(kv.shape() == it.original.shape()))
            throw Error(it.id + ": the candidate KV cache does not have the original's shape");
        const bool exact = sameBytes(kv, it.original);
        allExact = allExact && exact;
        if (exact && options.reuseExact) {
            scores.push_back(it.reference);
        } else {
            scores.push_back(scoreItem(ref.model(), it, kv, it.referenceLogProbs.data(), &it.referenceArgmax, nullptr, nullptr));
        }
        if (progress && !progress("score", int(i) + 1, int(items.size()))) throw Error("cancelled");
    }
    SuiteResult r = summarizeSuite(ref, std::move(scores), options);
    r.exact = allExact;
    r.seconds = secondsSince(t0);
    return r;
}

SuiteCodecRow evaluateSuiteCodec(const SuiteReference& ref, const CodecParams& params, int level, const SuiteEvalOptions& options,
                                 const SuiteProgress& progress)
{
    SuiteCodecRow row;
    row.codec = codecName(params.codec);
    row.level = level;
    if ((params.codec == CodecId::CacheGen || params.numLevels() > 1) && level >= 1 && size_t(level) <= params.profile.levels.size())
        row.levelName = params.profile.levels[size_t(level - 1)].name;
    uint64_t values = 0, int8Total = 0;
    row.quality = evaluateSuite(
        ref,
        [&](const KvSet& original, int) {
            CodecParams p = params;
            p.shape = original.shape();
            p.dtype = original.dtype();
            CodecTrial t = runCodecTrial(original, p, level);
            row.bytes += t.bytes;
            row.encodeSeconds += t.encodeSeconds;
            row.decodeSeconds += t.decodeSeconds;
            values += original.shape().totalValues();
            int8Total += int8Bytes(original.shape());
            return std::move(t.decoded);
        },
        options, progress);
    if (row.bytes > 0) {
        row.bitsPerValue = 8.0 * double(row.bytes) / double(values);
        row.ratioVsFp16 = 2.0 * double(values) / double(row.bytes);
        row.ratioVsInt8 = double(int8Total) / double(row.bytes);
    }
    return row;
}

bool withinDeltaPplBar(double deltaPplPct, double maxPct) { return !(std::fabs(deltaPplPct) > maxPct); }

IsoQualityVerdict isoQuality(const SuiteResult& row, const SuiteResult& fp16Row)
{
    IsoQualityVerdict v;
    v.ppl = withinDeltaPplBar(row.deltaPplPct);
    v.accuracy = fp16Row.questions == 0 || row.accuracy >= fp16Row.accuracy - kIsoMaxAccuracyDrop - 1e-12;
    v.mcnemar = !(row.mcnemarP < kIsoMcnemarAlpha);
    v.meets = v.ppl && v.accuracy && v.mcnemar;
    char buf[160];
    if (!v.ppl) {
        std::snprintf(buf, sizeof buf, "|delta PPL| %.2f%% > %g%%", std::fabs(row.deltaPplPct), kIsoMaxDeltaPplPct);
        v.reason = buf;
    } else if (!v.accuracy) {
        std::snprintf(buf, sizeof buf, "accuracy %.3f < fp16 %.3f - %g", row.accuracy, fp16Row.accuracy, kIsoMaxAccuracyDrop);
        v.reason = buf;
    } else if (!v.mcnemar) {
        std::snprintf(buf, sizeof buf, "McNemar p %.3f < %g", row.mcnemarP, kIsoMcnemarAlpha);
        v.reason = buf;
    }
    return v;
}

bool meetsIsoQuality(const SuiteResult& row, const SuiteResult& fp16Row) { return isoQuality(row, fp16Row).meets; }

std::string isoQualityRule()
{
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "iso-quality: |pooled delta PPL| <= %g%% (either sign), accuracy >= fp16 - %g points, "
                  "McNemar vs fp16 p >= %g (two-sided)",
                  kIsoMaxDeltaPplPct, 100 * kIsoMaxAccuracyDrop, kIsoMcnemarAlpha);
    return buf;
}

}  // namespace kvscope
