#include "eval/tune.h"

#include "common/error.h"
#include "eval/codec_trial.h"
#include "kv/kv_compare.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>

namespace kvscope {

namespace {

// One candidate: bins per tensor, tensors in block order (key layers, then value layers).
using Assignment = std::vector<int>;

CodecLevel levelOf(const Assignment& a, int numLayers, const std::string& name)
{
    CodecLevel l;
    l.name = name;
    l.keyBins.assign(a.begin(), a.begin() + numLayers);
    l.valueBins.assign(a.begin() + numLayers, a.end());
    return l;
}

// The whole profile around one level, for a trial on `kv` (tables computed from kv itself when
// the base profile shares tables: quality does not depend on them, and sizes stay comparable).
CodecParams trialParams(const CodecProfile& base, const KvSet& kv, const CodecLevel& level)
{
    CodecParams p;
    p.codec = CodecId::CacheGen;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    p.profile = base;
    p.profile.levels = {level};
    p.profile.defaultLevel = 1;
    p.profile.levelTables.clear();
    p.profile.tableChannels = 0;
    return p;
}

// Size and quality of one configuration summed over the tuning contexts.
struct Measured {
    uint64_t bytes = 0;
    // maxAbsDeltaPplPct: the worst context's |delta PPL| (the bar is two-sided, suite.h).
    double meanDeltaPplPct = 0, maxDeltaPplPct = -INFINITY, maxAbsDeltaPplPct = 0, meanKl = 0, maxKl = 0, meanAgreement = 0;

    void add(uint64_t trialBytes, const Quality& q, size_t contexts)
    {
        bytes += trialBytes;
        meanDeltaPplPct += q.deltaPplPct / double(contexts);
        maxDeltaPplPct = std::max(maxDeltaPplPct, q.deltaPplPct);
        maxAbsDeltaPplPct = std::max(maxAbsDeltaPplPct, std::fabs(q.deltaPplPct));
        meanKl += q.kl / double(contexts);
        maxKl = std::max(maxKl, q.kl);
        meanAgreement += q.tokenAgreement / double(contexts);
    }
};

}  // namespace

void checkTuneContexts(const std::vector<TuneContext>& contexts)
{
    if (contexts.empty()) throw Error("tune: no tuning contexts");
    const KvShape& s0 = contexts.front().kv->shape();
    for (const TuneContext& c : contexts) {
        if (!c.ref || !c.kv) throw Error("tune: context '" + c.name + "' has no cache or reference");
        if (c.ref->task().continuation.empty())
            throw Error("tune: context '" + c.name + "' has no continuation to score (perplexity needs held-out text)");
        const KvShape& s = c.kv->shape();
        if (s.numLayers != s0.numLayers || s.numKvHeads != s0.numKvHeads || s.headDim != s0.headDim)
            throw Error("tune: context '" + c.name + "' comes from a model of another shape than '" + contexts.front().name + "'");
    }
}

namespace {

void validate(const std::vector<TuneContext>& contexts, const TuneOptions& o)
{
    checkTuneContexts(contexts);
    for (const TuneContext& c : contexts) {
        const KvShape& s = c.kv->shape();
        if (s.numTokens < o.base.chunkTokens)
            throw Error("tune: context '" + c.name + "' has " + std::to_string(s.numTokens) +
                        " tokens, fewer than one chunk of " + std::to_string(o.base.chunkTokens));
    }
    if (o.budgets.empty()) throw Error("tune: no quality budgets");
    for (double b : o.budgets)
        if (!(b > 0)) throw Error("tune: budget " + std::to_string(b) + " is not a positive " + tuneMetricName(o.metric));
    std::vector<int> bins = o.binChoices;
    bins.push_back(o.probeBins);
    for (int b : bins)
        if (b < 4 || b > 256 || b % 2 != 0)
            throw Error("tune: bins " + std::to_string(b) + " outside 4..256 or odd (CacheGen bins are even: 2*MAX+2)");
    if (o.minAgreement < 0 || o.minAgreement > 1) throw Error("tune: minimum agreement must lie in [0, 1]");
}

}  // namespace

const char* tuneMetricName(TuneMetric m) { return m == TuneMetric::Kl ? "kl" : "delta_ppl_pct"; }

namespace {

// The tuner's search (tune.h) as a class: what each step measures for the next is a member, and
// run() takes the steps in order. One ProfileTuner per tuneProfile call.
class ProfileTuner {
public:
    ProfileTuner(const std::vector<TuneContext>& contexts, const TuneOptions& options, const TuneProgress& progress);
    TuneResult run(const std::string& modelFingerprint);

private:
    // A chain entry picked for a budget, and whether its measured quality met it.
    struct Pick {
        size_t idx;
        double budget;
        bool met;
    };

    void tick(const char* stage, int done, int total) const
    {
        if (m_progress && !m_progress(stage, done, total)) throw Error("cancelled");
    }
    void measureSensitivity();
    void measureRates();
    void predictKl(const std::vector<std::vector<std::vector<double>>>& rms);
    Assignment allocate(double lambda) const;
    double predictedBytes(const Assignment& a) const;
    void buildChain();
    Measured measureAt(size_t idx, bool withAnswer) const;
    bool meets(size_t idx, double budget);
    std::vector<Pick> search();
    CodecProfile profileOf(const std::vector<Pick>& levels, const std::string& modelFingerprint) const;
    void measureLevels(CodecProfile& profile, const std::vector<Pick>& levels);

    const std::vector<TuneContext>& m_contexts;
    const TuneOptions& m_options;
    const TuneProgress& m_progress;
    KvShape m_shape;
    int m_L = 0, m_N = 0;  // layers, tensors (key layers, then value layers)
    size_t m_C = 0;        // contexts
    CodecProfile m_base;
    std::vector<int> m_choices;  // bins choices, ascending, the probe's among them
    size_t m_B = 0, m_probe = 0;
    TuneResult m_result;
    std::vector<std::vector<double>> m_bytes;  // [tensor][choice], summed over contexts
    std::vector<std::vector<double>> m_kl;     // [tensor][choice], predicted, summed over contexts
    std::vector<Assignment> m_chain;           // Lagrangian allocations, smallest first
    std::vector<double> m_budgets;             // distinct, loosest first
    bool m_checkAgreement = false;
    std::map<size_t, Measured> m_memo;  // chain index -> measured quality
    int m_searched = 0;
};

ProfileTuner::ProfileTuner(const std::vector<TuneContext>& contexts, const TuneOptions& options,
                           const TuneProgress& progress)
    : m_contexts(contexts), m_options(options), m_progress(progress)
{
    m_shape = contexts.front().kv->shape();
    m_L = m_shape.numLayers;
    m_N = 2 * m_L;
    m_C = contexts.size();
    m_base = options.base;
    m_base.numLayers = m_L;
    m_base.levelTables.clear();
    m_base.tableChannels = 0;
    m_choices = options.binChoices;
    m_choices.push_back(options.probeBins);
    std::sort(m_choices.begin(), m_choices.end());
    m_choices.erase(std::unique(m_choices.begin(), m_choices.end()), m_choices.end());
    m_B = m_choices.size();
    m_probe = size_t(std::find(m_choices.begin(), m_choices.end(), options.probeBins) - m_choices.begin());
}

TuneResult ProfileTuner::run(const std::string& modelFingerprint)
{
    measureSensitivity();
    measureRates();
    buildChain();
    const std::vector<Pick> picks = search();
    // Levels: one per distinct configuration, smallest first; each keeps the tightest budget it meets.
    std::vector<Pick> levels;
    for (const Pick& p : picks) {
        if (!levels.empty() && levels.back().idx == p.idx) levels.back() = p;
        else levels.push_back(p);
    }
    CodecProfile profile = profileOf(levels, modelFingerprint);
    measureLevels(profile, levels);
    m_result.profile = profile;
    return m_result;
}

// 1. Sensitivity of every tensor at the probe bins, per context.
void ProfileTuner::measureSensitivity()
{
    const int L = m_L, N = m_N;
    const size_t C = m_C;
    CodecLevel probeLevel = levelOf(Assignment(size_t(N), m_options.probeBins), L, "probe");
    for (size_t c = 0; c < C; ++c) {
        const TuneContext& ctx = m_contexts[c];
        m_result.sensitivity.push_back(measureLayerSensitivity(
            *ctx.ref, *ctx.kv, trialParams(m_base, *ctx.kv, probeLevel), m_options.probeBins,
            [&](int done, int total) { return !m_progress || m_progress("sensitivity", int(c) * total + done, int(C) * total); }));
    }
}

// 2. Bytes and RMS error of every tensor at every bins choice (all layers at b, per context).
void ProfileTuner::measureRates()
{
    const int L = m_L, N = m_N;
    const size_t C = m_C, B = m_B;
    m_bytes.assign(size_t(N), std::vector<double>(B, 0.0));
    std::vector<std::vector<std::vector<double>>> rms(C, m_bytes);  // [context][tensor][choice]
    for (size_t k = 0; k < B; ++k) {
        for (size_t c = 0; c < C; ++c) {
            const KvSet& kv = *m_contexts[c].kv;
            const CodecTrial t =
                runCodecTrial(kv, trialParams(m_base, kv, levelOf(Assignment(size_t(N), m_choices[k]), L, "uniform")), 1);
            const KvError e = compareKv(kv, t.decoded);
            for (int i = 0; i < N; ++i) {
                m_bytes[size_t(i)][k] += double(t.blockBytes[size_t(i)]);
                const LayerError& le = e.layers[size_t(i % L)];
                rms[c][size_t(i)][k] = i < L ? le.key.rms : le.value.rms;
            }
            tick("rates", int(k * C + c + 1), int(B * C));
        }
    }
    predictKl(rms);
}

// Predicted KL of each tensor at each choice, summed over contexts: the probe's KL scaled by the
// square of the RMS error's ratio to the probe's.
void ProfileTuner::predictKl(const std::vector<std::vector<std::vector<double>>>& rms)
{
    const int L = m_L, N = m_N;
    m_kl.assign(size_t(N), std::vector<double>(m_B, 0.0));
    for (size_t c = 0; c < m_C; ++c)
        for (int i = 0; i < N; ++i) {
            const LayerSensitivity& s = m_result.sensitivity[c][size_t(i % L)];
            const double klProbe = std::max(i < L ? s.keyKl : s.valueKl, 0.0);
            const double r0 = rms[c][size_t(i)][m_probe];
            for (size_t k = 0; k < m_B; ++k) {
                const double ratio = r0 > 0 ? rms[c][size_t(i)][k] / r0 : 0.0;
                m_kl[size_t(i)][k] += klProbe * ratio * ratio;
            }
        }
}

// Each tensor's choice minimising bytes + lambda * predicted KL.
Assignment ProfileTuner::allocate(double lambda) const
{
    const int N = m_N;
    Assignment a(static_cast<size_t>(N));
    for (int i = 0; i < N; ++i) {
        size_t best = 0;
        for (size_t k = 1; k < m_B; ++k)
            if (m_bytes[size_t(i)][k] + lambda * m_kl[size_t(i)][k] < m_bytes[size_t(i)][best] + lambda * m_kl[size_t(i)][best]) best = k;
        a[size_t(i)] = m_choices[best];
    }
    return a;
}

double ProfileTuner::predictedBytes(const Assignment& a) const
{
    double sum = 0;
    for (int i = 0; i < m_N; ++i)
        sum += m_bytes[size_t(i)][size_t(std::find(m_choices.begin(), m_choices.end(), a[size_t(i)]) - m_choices.begin())];
    return sum;
}

// 3. The chain of Lagrangian allocations, smallest first.
void ProfileTuner::buildChain()
{
    const int N = m_N;
    const size_t B = m_B;
    std::vector<double> slopes;
    for (int i = 0; i < N; ++i)
        for (size_t a = 0; a < B; ++a)
            for (size_t b = a + 1; b < B; ++b) {
                const double dBytes = m_bytes[size_t(i)][b] - m_bytes[size_t(i)][a];
                const double dKl = m_kl[size_t(i)][a] - m_kl[size_t(i)][b];
                if (dBytes > 0 && dKl > 0) slopes.push_back(dBytes / dKl);
            }
    std::vector<Assignment>& chain = m_chain;
    chain.push_back(allocate(0.0));
    if (!slopes.empty()) {
        const double lo = *std::min_element(slopes.begin(), slopes.end()) / 2;
        const double hi = *std::max_element(slopes.begin(), slopes.end()) * 2;
        const int steps = std::max(m_options.lambdaSteps, 2);
        for (int s = 0; s < steps; ++s) chain.push_back(allocate(lo * std::pow(hi / lo, double(s) / (steps - 1))));
    }
    chain.push_back(Assignment(size_t(N), m_choices.back()));
    std::stable_sort(chain.begin(), chain.end(),
                     [&](const Assignment& a, const Assignment& b) { return predictedBytes(a) < predictedBytes(b); });
    chain.erase(std::unique(chain.begin(), chain.end()), chain.end());
}

Measured ProfileTuner::measureAt(size_t idx, bool withAnswer) const
{
    Measured m;
    for (size_t c = 0; c < m_C; ++c) {
        const KvSet& kv = *m_contexts[c].kv;
        const CodecTrial t = runCodecTrial(kv, trialParams(m_base, kv, levelOf(m_chain[idx], m_L, "candidate")), 1);
        m.add(t.bytes, m_contexts[c].ref->measure(t.decoded, withAnswer), m_C);
    }
    return m;
}

// Whether chain entry idx meets the budget, measured once per entry.
bool ProfileTuner::meets(size_t idx, double budget)
{
    auto it = m_memo.find(idx);
    if (it == m_memo.end()) {
        it = m_memo.emplace(idx, measureAt(idx, m_checkAgreement)).first;
        ++m_result.measuredCandidates;
    }
    tick("search", ++m_searched, int(m_budgets.size()) * int(std::ceil(std::log2(double(m_chain.size()) + 1)) + 1));
    const double worst = m_options.metric == TuneMetric::Kl ? it->second.maxKl : it->second.maxAbsDeltaPplPct;
    return worst <= budget && (!m_checkAgreement || it->second.meanAgreement >= m_options.minAgreement);
}

// 4. Per budget, the smallest chain entry whose measured quality meets it (a bisection of the
// chain; a tighter budget starts where the looser one ended).
std::vector<ProfileTuner::Pick> ProfileTuner::search()
{
    m_budgets = m_options.budgets;
    std::sort(m_budgets.begin(), m_budgets.end(), std::greater<double>());  // loosest first
    m_budgets.erase(std::unique(m_budgets.begin(), m_budgets.end()), m_budgets.end());
    m_checkAgreement = m_options.minAgreement > 0;
    std::vector<Pick> picks;
    size_t lo = 0;
    for (double budget : m_budgets) {
        const size_t last = m_chain.size() - 1;
        if (!meets(last, budget)) {
            picks.push_back({last, budget, false});
            lo = last;
            continue;
        }
        size_t hi = last;
        while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            if (meets(mid, budget)) hi = mid;
            else lo = mid + 1;
        }
        picks.push_back({lo, budget, true});
    }
    return picks;
}

// The profile of the picked levels: named by their budgets, the default the first that meets a
// usual bar, tables calibrated on the tuning contexts when the profile shares them.
CodecProfile ProfileTuner::profileOf(const std::vector<Pick>& levels, const std::string& modelFingerprint) const
{
    CodecProfile profile = m_base;
    profile.modelFingerprint = modelFingerprint;
    profile.levels.clear();
    for (const Pick& p : levels) {
        char name[64];
        if (m_options.metric == TuneMetric::Kl) std::snprintf(name, sizeof name, "KL <= %g", p.budget);
        else std::snprintf(name, sizeof name, "dPPL <= %g%%", p.budget);
        profile.levels.push_back(levelOf(m_chain[p.idx], m_L, name));
    }
    profile.defaultLevel = int(profile.levels.size());
    for (size_t i = 0; i < levels.size(); ++i)
        if (levels[i].met && levels[i].budget <= (m_options.metric == TuneMetric::Kl ? 0.01 : 1.0)) {
            profile.defaultLevel = int(i) + 1;
            break;
        }
    if (profile.tables == TableMode::Shared) {
        CodecParams p;
        p.codec = CodecId::CacheGen;
        p.shape = m_shape;
        p.dtype = m_contexts.front().kv->dtype();
        p.profile = profile;
        std::vector<const KvSet*> caches;
        for (const TuneContext& c : m_contexts) caches.push_back(c.kv);
        calibrateProfile(p, caches);
        profile = p.profile;
    }
    validateProfile(profile, "tuned profile");
    return profile;
}

// Final measurement of every level with the profile as shipped (calibrated tables included)
// and with answers, so the recorded figures are what a user of the profile gets.
void ProfileTuner::measureLevels(CodecProfile& profile, const std::vector<Pick>& levels)
{
    const size_t C = m_C;
    const std::vector<TuneContext>& contexts = m_contexts;
    uint64_t int8Total = 0, values = 0;
    for (const TuneContext& c : contexts) {
        int8Total += int8Bytes(c.kv->shape());
        values += c.kv->shape().totalValues();
    }
    for (size_t l = 0; l < profile.levels.size(); ++l) {
        TunedLevel t;
        t.budget = levels[l].budget;
        t.met = levels[l].met;
        Measured m;
        nlohmann::json perContext = nlohmann::json::array();
        for (size_t c = 0; c < C; ++c) {
            const KvSet& kv = *contexts[c].kv;
            CodecParams p;
            p.codec = CodecId::CacheGen;
            p.shape = kv.shape();
            p.dtype = kv.dtype();
            p.profile = profile;
            const CodecTrial trial = runCodecTrial(kv, p, int(l) + 1);
            const Quality q = contexts[c].ref->measure(trial.decoded, true);
            m.add(trial.bytes, q, C);
            perContext.push_back({{"context", contexts[c].name},
                                  {"bits_per_value", trial.bitsPerValue},
                                  {"delta_ppl_pct", q.deltaPplPct},
                                  {"kl", q.kl},
                                  {"token_agreement", q.tokenAgreement}});
            tick("final", int(l * C + c + 1), int(profile.levels.size() * C));
        }
        t.bytes = m.bytes;
        t.meanDeltaPplPct = m.meanDeltaPplPct;
        t.maxDeltaPplPct = m.maxDeltaPplPct;
        t.maxAbsDeltaPplPct = m.maxAbsDeltaPplPct;
        t.meanKl = m.meanKl;
        t.maxKl = m.maxKl;
        t.meanAgreement = m.meanAgreement;
        t.bitsPerValue = 8.0 * double(t.bytes) / double(values);
        t.ratioVsInt8 = double(int8Total) / double(t.bytes);
        const nlohmann::json measured = {{"budget_metric", tuneMetricName(m_options.metric)},
                                         {"budget", t.budget},
                                         {"budget_met", t.met},
                                         {"bits_per_value", t.bitsPerValue},
                                         {"ratio_vs_int8", t.ratioVsInt8},
                                         {"mean_delta_ppl_pct", t.meanDeltaPplPct},
                                         {"max_delta_ppl_pct", t.maxDeltaPplPct},
                                         {"max_abs_delta_ppl_pct", t.maxAbsDeltaPplPct},
                                         {"mean_kl", t.meanKl},
                                         {"max_kl", t.maxKl},
                                         {"mean_token_agreement", t.meanAgreement},
                                         {"contexts", perContext}};
        profile.levels[l].measuredJson = measured.dump();
        t.level = profile.levels[l];
        m_result.levels.push_back(t);
    }
}

}  // namespace

TuneResult tuneProfile(const std::string& modelFingerprint, const std::vector<TuneContext>& contexts,
                       const TuneOptions& options, const TuneProgress& progress)
{
    validate(contexts, options);
    return ProfileTuner(contexts, options, progress).run(modelFingerprint);
}

}  // namespace kvscope
