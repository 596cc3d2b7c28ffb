#include "eval/tune_transform.h"

#include "codec/transform.h"
#include "common/error.h"
#include "eval/codec_trial.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

namespace kvscope {

namespace {

// theta_u = t_kind * scale_u * lambda_bar_kind of a level (READ ME FIRST in codec/transform.h, 4).
double blockTheta(const TransformFit& fit, const TransformLevel& lev, int u)
{
    const int L = fit.model.numLayers;
    const bool key = u < L;
    const std::vector<double>& sc = key ? lev.keyLayerScale : lev.valueLayerScale;
    return (key ? lev.keyTheta : lev.valueTheta) * (sc.empty() ? 1.0 : sc[size_t(u % L)]) * fit.meanVariance[key ? 0 : 1];
}

// Weighted distortion per token of block u at water level theta: sum_j min(lambda_j, theta).
double blockDistortion(const TransformFit& fit, int u, double theta)
{
    const int L = fit.model.numLayers;
    double d = 0;
    for (float v : fit.model.block(u < L ? KvKind::Key : KvKind::Value, u % L).variance) d += std::min(double(v), theta);
    return d;
}

// The model with exactly one level, ready for encoding `kv` (its RoPE parameters).
std::shared_ptr<const TransformModel> oneLevelModel(const TransformFit& fit, const TransformLevel& lev,
                                                    const std::vector<TransformLevelBlock>& lbs, const KvSet& kv)
{
    auto m = std::make_shared<TransformModel>(fit.model);
    m->keyTheta = {lev.keyTheta};
    m->valueTheta = {lev.valueTheta};
    m->levels = {lbs};
    if (m->settings.ropeUndo) {
        m->ropeInvFreq = kv.ropeInvFreq;
        m->ropePosition0 = kv.ropePosition0;
    }
    return m;
}

CodecParams trialParams(const CodecProfile& base, const KvSet& kv, const TransformLevel& lev,
                        std::shared_ptr<const TransformModel> model)
{
    CodecParams p;
    p.codec = CodecId::Transform;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    p.profile = base;
    p.profile.transformLevels = {lev};
    p.profile.transformDefaultLevel = 1;
    p.profile.transformModel.clear();
    p.transform = std::move(model);
    return p;
}

// Pooled quality over contexts: continuation tokens weight every context.
struct Pooled {
    double nll = 0, nll0 = 0, kl = 0, tokens = 0;
    void add(const QualityReference& ref, const Quality& q)
    {
        const double n = double(ref.task().continuation.size());
        nll += n * q.nll;
        nll0 += n * ref.original().nll;
        kl += n * q.kl;
        tokens += n;
    }
    double deltaPplPct() const { return tokens > 0 ? 100.0 * (std::exp((nll - nll0) / tokens) - 1.0) : 0.0; }
    double meanKl() const { return tokens > 0 ? kl / tokens : 0.0; }
};

void validate(const std::vector<TuneContext>& contexts, const TransformTuneOptions& o)
{
    checkTuneContexts(contexts);
    if (o.budgets.empty()) throw Error("tune: no quality budgets");
    for (double b : o.budgets)
        if (!(b > 0)) throw Error("tune: budget " + std::to_string(b) + " is not a positive " + tuneMetricName(o.metric));
    if (!(o.keyTheta > 0) || !(o.valueTheta > 0) || !(o.probe > 0)) throw Error("tune: base thetas and probe must be positive");
    if (!(o.sensitivityFloor > 0) || !(o.sensitivityFloor <= 1)) throw Error("tune: --sensitivity-floor must be in (0, 1]");
    if (o.exponents.empty() || o.multipliers.empty()) throw Error("tune: empty exponent or multiplier grid");
    for (double m : o.multipliers)
        if (!(m > 0)) throw Error("tune: multiplier " + std::to_string(m) + " is not positive");
    for (double a : o.exponents)
        if (!(a >= 0 && a <= 2)) throw Error("tune: exponent " + std::to_string(a) + " is outside 0..2");
    if (o.refine < 0 || o.refine > 8) throw Error("tune: refine steps outside 0..8");
}

}  // namespace

TransformLevel transformLevelFor(const TransformFit& fit, const std::vector<double>& s, double keyTheta, double valueTheta,
                                 double alpha, double multiplier)
{
    const int L = fit.model.numLayers, N = 2 * L;
    KVSCOPE_ASSERT(int(s.size()) == N);
    std::vector<double> theta0(static_cast<size_t>(N)), inv(static_cast<size_t>(N));
    double logMean0 = 0, logMeanInv = 0;
    for (int u = 0; u < N; ++u) {
        theta0[size_t(u)] = (u < L ? keyTheta : valueTheta) * fit.meanVariance[u < L ? 0 : 1];
        inv[size_t(u)] = 1.0 / s[size_t(u)];
        logMean0 += std::log(theta0[size_t(u)]) / N;
        logMeanInv += std::log(inv[size_t(u)]) / N;
    }
    const double kappa = std::exp(logMean0 - logMeanInv);
    TransformLevel lev;
    lev.keyLayerScale.resize(size_t(L));
    lev.valueLayerScale.resize(size_t(L));
    for (int kind = 0; kind < 2; ++kind) {
        std::vector<double> th(static_cast<size_t>(L));
        double logMean = 0;
        for (int l = 0; l < L; ++l) {
            const int u = kind * L + l;
            th[size_t(l)] = multiplier * std::pow(theta0[size_t(u)], 1 - alpha) * std::pow(kappa * inv[size_t(u)], alpha);
            logMean += std::log(th[size_t(l)]) / L;
        }
        const double t = std::exp(logMean) / fit.meanVariance[kind];
        (kind == 0 ? lev.keyTheta : lev.valueTheta) = t;
        std::vector<double>& sc = kind == 0 ? lev.keyLayerScale : lev.valueLayerScale;
        for (int l = 0; l < L; ++l) sc[size_t(l)] = th[size_t(l)] / (t * fit.meanVariance[kind]);
    }
    char name[96];
    std::snprintf(name, sizeof name, "t %.3g/%.3g a %g", lev.keyTheta, lev.valueTheta, alpha);
    lev.name = name;
    return lev;
}

namespace {

// The transform tuner's search (tune_transform.h) as a class: the fit, the blocks' sensitivities
// and the measured candidates are members, and run() takes the steps in order. One per call.
class TransformTuner {
public:
    TransformTuner(const std::vector<TuneContext>& contexts, const TransformTuneOptions& options,
                   const TuneProgress& progress);
    TransformTuneResult run(const std::string& modelFingerprint);

private:
    void tick(const char* stage, int done, int total) const
    {
        if (m_progress && !m_progress(stage, done, total)) throw Error("cancelled");
    }
    // |delta PPL|: the bar is two-sided (suite.h); a level that lowers perplexity changed the model too.
    double metricOf(const TransformTuneCandidate& c) const
    {
        return m_options.metric == TuneMetric::Kl ? c.kl : std::fabs(c.deltaPplPct);
    }
    void measureSensitivity();
    TransformTuneCandidate measure(double alpha, double mult);
    void searchGrid();
    TransformTunedLevel pickFor(double budget);
    std::vector<TransformTunedLevel> pickLevels();
    CodecProfile profileOf(std::vector<TransformTunedLevel>& levels, const std::string& modelFingerprint) const;

    const std::vector<TuneContext>& m_contexts;
    const TransformTuneOptions& m_options;
    const TuneProgress& m_progress;
    int m_L = 0, m_N = 0;  // layers, blocks (key layers, then value layers)
    CodecProfile m_base;
    std::vector<const KvSet*> m_caches;
    TransformFit m_fit;      // one fit for every candidate
    std::vector<double> m_s;  // per block: KL per unit of distortion at the probe level
    uint64_t m_int8Total = 0, m_values = 0;
    int m_measured = 0, m_planned = 0;
    TransformTuneResult m_result;
};

TransformTuner::TransformTuner(const std::vector<TuneContext>& contexts, const TransformTuneOptions& options,
                               const TuneProgress& progress)
    : m_contexts(contexts), m_options(options), m_progress(progress)
{
    const KvShape shape = contexts.front().kv->shape();
    m_L = shape.numLayers;
    m_N = 2 * m_L;
    m_base = options.base;
    m_base.numLayers = m_L;
    m_base.transformModel.clear();
    for (const TuneContext& c : contexts) m_caches.push_back(c.kv);
    for (const KvSet* kv : m_caches) {
        m_int8Total += int8Bytes(kv->shape());
        m_values += kv->shape().totalValues();
    }
    m_planned = int(options.exponents.size() * (options.multipliers.size() + size_t(options.refine) * options.budgets.size()));
}

TransformTuneResult TransformTuner::run(const std::string& modelFingerprint)
{
    // 1. One fit for every candidate.
    m_fit = fitTransformBlocks(m_base.transform, m_caches);
    // 2. Sensitivity at the probe level.
    measureSensitivity();
    // 3-4. Candidates, then the levels that meet the budgets.
    searchGrid();
    std::vector<TransformTunedLevel> levels = pickLevels();
    m_result.profile = profileOf(levels, modelFingerprint);
    m_result.levels = levels;
    return m_result;
}

// Each block's KL at the probe level (that block decoded, the rest original), per unit of its
// modelled distortion.
void TransformTuner::measureSensitivity()
{
    const int L = m_L, N = m_N;
    const std::vector<TuneContext>& contexts = m_contexts;
    const TransformFit& fit = m_fit;
    TransformLevel probe;
    probe.name = "probe";
    probe.keyTheta = m_options.keyTheta * m_options.probe;
    probe.valueTheta = m_options.valueTheta * m_options.probe;
    const std::vector<TransformLevelBlock> probeBlocks = fitTransformLevel(fit, probe);
    std::vector<double> klU(static_cast<size_t>(N), 0.0), dU(static_cast<size_t>(N), 0.0);
    size_t tokens = 0;
    for (size_t c = 0; c < contexts.size(); ++c) {
        const KvSet& kv = *contexts[c].kv;
        const CodecTrial t = runCodecTrial(kv, trialParams(m_base, kv, probe, oneLevelModel(fit, probe, probeBlocks, kv)), 1);
        KvSet cand = kv;
        const double n = double(contexts[c].ref->task().continuation.size());
        tokens += size_t(n);
        for (int u = 0; u < N; ++u) {
            const KvKind kind = u < L ? KvKind::Key : KvKind::Value;
            std::memcpy(cand.data(kind, u % L), t.decoded.data(kind, u % L), cand.tensorBytes());
            const Quality q = contexts[c].ref->measure(cand, false);
            std::memcpy(cand.data(kind, u % L), kv.data(kind, u % L), cand.tensorBytes());
            klU[size_t(u)] += n * std::max(q.kl, 0.0);
            tick("sensitivity", int(c) * N + u + 1, int(contexts.size()) * N);
        }
    }
    std::vector<double>& s = m_s;
    s.assign(static_cast<size_t>(N), 0.0);
    double sMax = 0;
    for (int u = 0; u < N; ++u) {
        klU[size_t(u)] /= double(std::max<size_t>(tokens, 1));
        dU[size_t(u)] = blockDistortion(fit, u, blockTheta(fit, probe, u));
        s[size_t(u)] = dU[size_t(u)] > 0 ? klU[size_t(u)] / dU[size_t(u)] : 0.0;
        sMax = std::max(sMax, s[size_t(u)]);
    }
    // A block whose KL the probe does not resolve still gets a finite (coarse) level.
    for (double& x : s) x = std::max(x, std::max(1e-300, m_options.sensitivityFloor * sMax));
    m_result.sensitivity.resize(size_t(L));
    for (int l = 0; l < L; ++l) {
        LayerSensitivity& ls = m_result.sensitivity[size_t(l)];
        ls.layer = l;
        ls.keyKl = klU[size_t(l)];
        ls.valueKl = klU[size_t(L + l)];
        ls.keyRms = s[size_t(l)];
        ls.valueRms = s[size_t(L + l)];
    }
}

// One candidate (exponent alpha, multiplier mult) encoded and scored on every context, pooled.
TransformTuneCandidate TransformTuner::measure(double alpha, double mult)
{
    const TransformLevel lev = transformLevelFor(m_fit, m_s, m_options.keyTheta, m_options.valueTheta, alpha, mult);
    const std::vector<TransformLevelBlock> lbs = fitTransformLevel(m_fit, lev);
    TransformTuneCandidate cand;
    cand.exponent = alpha;
    cand.multiplier = mult;
    Pooled pooled;
    for (const TuneContext& c : m_contexts) {
        const CodecTrial t = runCodecTrial(*c.kv, trialParams(m_base, *c.kv, lev, oneLevelModel(m_fit, lev, lbs, *c.kv)), 1);
        cand.bytes += t.bytes;
        pooled.add(*c.ref, c.ref->measure(t.decoded, false));
    }
    cand.bitsPerValue = 8.0 * double(cand.bytes) / double(m_values);
    cand.deltaPplPct = pooled.deltaPplPct();
    cand.kl = pooled.meanKl();
    m_result.candidates.push_back(cand);
    ++m_measured;
    tick("search", m_measured, std::max(m_planned, m_measured));
    return cand;
}

// Every exponent with its multipliers, coarsest first, until one meets the tightest budget.
void TransformTuner::searchGrid()
{
    const double tightest = *std::min_element(m_options.budgets.begin(), m_options.budgets.end());
    std::vector<double> mults = m_options.multipliers;
    std::sort(mults.begin(), mults.end(), std::greater<double>());  // coarsest first
    mults.erase(std::unique(mults.begin(), mults.end()), mults.end());
    for (double alpha : m_options.exponents)
        for (double m : mults)
            if (metricOf(measure(alpha, m)) <= tightest) break;
}

// The smallest candidate that meets the budget, refined by bisection toward the next coarser
// multiplier of its exponent; the best-quality candidate when none meets it.
TransformTunedLevel TransformTuner::pickFor(double budget)
{
    auto best = [&]() {
        const TransformTuneCandidate* b = nullptr;
        for (const TransformTuneCandidate& c : m_result.candidates)
            if (metricOf(c) <= budget && (!b || c.bytes < b->bytes)) b = &c;
        return b;
    };
    const TransformTuneCandidate* b = best();
    TransformTunedLevel t;
    t.budget = budget;
    if (!b) {  // even the finest candidate misses: keep the best-quality one
        const TransformTuneCandidate* q = &m_result.candidates.front();
        for (const TransformTuneCandidate& c : m_result.candidates)
            if (metricOf(c) < metricOf(*q)) q = &c;
        t.figures = *q;
        return t;
    }
    t.met = true;
    // Bisection toward the next coarser multiplier of the same exponent.
    const double alpha = b->exponent;
    double lo = b->multiplier, hi = INFINITY;
    for (const TransformTuneCandidate& c : m_result.candidates)
        if (c.exponent == alpha && c.multiplier > lo && metricOf(c) > budget) hi = std::min(hi, c.multiplier);
    if (std::isfinite(hi))
        for (int r = 0; r < m_options.refine; ++r) {
            const double mid = std::sqrt(lo * hi);
            const TransformTuneCandidate c = measure(alpha, mid);
            if (metricOf(c) <= budget) lo = mid;
            else hi = mid;
        }
    t.figures = *best();
    return t;
}

// One level per distinct configuration, smallest first; each keeps the tightest budget it meets.
std::vector<TransformTunedLevel> TransformTuner::pickLevels()
{
    std::vector<double> budgets = m_options.budgets;
    std::sort(budgets.begin(), budgets.end(), std::greater<double>());  // loosest first = smallest level first
    budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
    std::vector<TransformTunedLevel> picked;
    for (double budget : budgets) picked.push_back(pickFor(budget));
    std::vector<TransformTunedLevel> levels;
    for (const TransformTunedLevel& t : picked) {
        if (!levels.empty() && levels.back().figures.exponent == t.figures.exponent &&
            levels.back().figures.multiplier == t.figures.multiplier)
            levels.back() = t;
        else
            levels.push_back(t);
    }
    std::stable_sort(levels.begin(), levels.end(),
                     [](const TransformTunedLevel& a, const TransformTunedLevel& b) { return a.figures.bytes < b.figures.bytes; });
    return levels;
}

// The profile of the picked levels (named by their budgets, with their measured figures) and the
// shipped model: the same fit with the chosen levels (identical to `calibrate` with them).
CodecProfile TransformTuner::profileOf(std::vector<TransformTunedLevel>& levels, const std::string& modelFingerprint) const
{
    const TransformTuneOptions& options = m_options;
    CodecProfile profile = m_base;
    profile.modelFingerprint = modelFingerprint;
    profile.transformLevels.clear();
    for (TransformTunedLevel& t : levels) {
        t.level = transformLevelFor(m_fit, m_s, options.keyTheta, options.valueTheta, t.figures.exponent, t.figures.multiplier);
        char name[96];
        if (options.metric == TuneMetric::Kl) std::snprintf(name, sizeof name, "KL <= %g", t.budget);
        else std::snprintf(name, sizeof name, "dPPL <= %g%%", t.budget);
        t.level.name = name;
        t.ratioVsInt8 = double(m_int8Total) / double(std::max<uint64_t>(t.figures.bytes, 1));
        const nlohmann::json measuredJson = {{"budget_metric", tuneMetricName(options.metric)},
                                             {"budget", t.budget},
                                             {"budget_met", t.met},
                                             {"exponent", t.figures.exponent},
                                             {"multiplier", t.figures.multiplier},
                                             {"bits_per_value", t.figures.bitsPerValue},
                                             {"ratio_vs_int8", t.ratioVsInt8},
                                             {"pooled_delta_ppl_pct", t.figures.deltaPplPct},
                                             {"pooled_kl", t.figures.kl}};
        t.level.measuredJson = measuredJson.dump();
        profile.transformLevels.push_back(t.level);
    }
    profile.transformDefaultLevel = int(profile.transformLevels.size());
    for (size_t i = 0; i < levels.size(); ++i)
        if (levels[i].met && levels[i].budget <= (options.metric == TuneMetric::Kl ? 0.01 : 1.0)) {
            profile.transformDefaultLevel = int(i) + 1;
            break;
        }
    // The shipped model: the same fit with the chosen levels (identical to `calibrate` with them).
    TransformModel m = m_fit.model;
    for (const TransformLevel& lev : profile.transformLevels) {
        m.keyTheta.push_back(lev.keyTheta);
        m.valueTheta.push_back(lev.valueTheta);
        m.levels.push_back(fitTransformLevel(m_fit, lev));
    }
    serializeTransformModel(m, profile.transformModel);
    validateProfile(profile, "tuned profile");
    return profile;
}

}  // namespace

TransformTuneResult tuneTransformProfile(const std::string& modelFingerprint, const std::vector<TuneContext>& contexts,
                                         const TransformTuneOptions& options, const TuneProgress& progress)
{
    validate(contexts, options);
    return TransformTuner(contexts, options, progress).run(modelFingerprint);
}

}  // namespace kvscope
