#include "tuner_session.h"

#include <QCoreApplication>

#include "background_job.h"

#include "codec/chunk_codec.h"
#include "eval/codec_trial.h"
#include "eval/evaluate.h"
#include "eval/quality.h"
#include "eval/sensitivity.h"
#include "eval/suite.h"
#include "eval/transform_default.h"
#include "eval/tune.h"
#include "kv/kv_compare.h"
#include "model/model.h"

#include <QFile>

#include <mutex>
#include <stdexcept>

namespace kvscope {

namespace {

// Continuation tokens scored for ΔPPL and KL: enough for a stable figure, few enough that one
// scoring pass stays well under a second on the default model.
constexpr int kMaxContinuation = 128;
constexpr int kAnswerTokens = 32;

CodecParams paramsFor(const KvSet& kv, const CodecProfile& profile)
{
    CodecParams p;
    p.codec = CodecId::CacheGen;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    p.profile = profile;
    p.profile.numLayers = kv.shape().numLayers;
    return p;
}

// The transform codec's parameters for a cache of this shape (profile.transform already set).
CodecParams transformParamsFor(const KvShape& shape, DType dtype, const CodecProfile& profile)
{
    CodecParams p;
    p.codec = CodecId::Transform;
    p.shape = shape;
    p.dtype = dtype;
    p.profile = profile;
    p.profile.numLayers = shape.numLayers;
    return p;
}

RdPoint pointOf(const std::string& codec, const std::string& levelName, double bits, double dppl, double kl)
{
    RdPoint p;
    p.codec = QString::fromStdString(codec);
    p.label = codec == "cachegen" ? QString::fromStdString(levelName)
              : codec == "transform" ? QStringLiteral("T ") + QString::fromStdString(levelName)
                                     : p.codec;
    p.bitsPerValue = bits;
    p.deltaPplPct = dppl;
    p.kl = kl;
    return p;
}

}  // namespace

std::vector<CodecStage> TunerSession::transformStages(const CodecProfile& profile, const KvSet* kv)
{
    const TransformSettings& t = profile.transform;
    const bool rope = !kv || !kv->ropeInvFreq.empty();
    const bool stats = !kv || (!kv->querySq.empty() && !kv->valueWeight.empty());
    const bool mass = !kv || !kv->attnMass.empty();
    const bool calibrated = !profile.transformModel.empty();
    auto tr = [](const char* s) { return QCoreApplication::translate("kvscope::TunerSession", s); };
    return {
        {QStringLiteral("transform"), tr("Transform codec"),
         tr("Evaluate the transform codec's levels (codec/transform.h) next to CacheGen's in the rate-distortion plot"),
         true, true},
        {QStringLiteral("rope_undo"), tr("Pre-RoPE keys"),
         rope ? tr("Undo RoPE on the keys before the transform (rope_undo)")
              : tr("This cache carries no RoPE parameters: recapture it"),
         rope, rope && t.ropeUndo},
        {QStringLiteral("pca"), tr("PCA basis"),
         calibrated ? tr("PCA basis calibrated offline (basis pca); off: randomized Hadamard rotation")
                    : tr("PCA needs a profile calibrated with `kvscope-cli calibrate --codec transform`; without one the "
                         "codec fits itself on the cache with a randomized Hadamard rotation"),
         calibrated, calibrated && t.basis == TransformBasis::Pca},
        {QStringLiteral("across_heads"), tr("Across heads"), tr("One PCA over all KV heads of a layer (across_heads)"),
         calibrated, t.acrossHeads},
        {QStringLiteral("weighting"), tr("Attention weighting"),
         stats ? tr("Weight errors by what attention sees: query second moments for K, W_o for V (weighting attention); "
                    "off: plain MSE")
               : tr("This cache carries no query statistics: recapture it"),
         stats, stats && t.weighting == TransformWeighting::Attention},
        {QStringLiteral("waterfill"), tr("Water-filling bits"),
         tr("Reverse water-filling: components under the water level take 0 bits (allocation waterfill); off: uniform"),
         true, t.allocation == TransformAllocation::Waterfill},
        {QStringLiteral("rans"), tr("rANS entropy"), tr("Entropy-code the symbols (entropy rans); off: fixed-width bits"),
         true, entropyUsesTables(t.entropy)},
        {QStringLiteral("sinks"), tr("Sinks in fp16"), tr("Keep the first 4 tokens (attention sinks) in fp16 (sink_tokens 4)"),
         true, t.sinkTokens > 0},
        {QStringLiteral("token_importance"), tr("Token importance"),
         mass ? tr("Coarser steps for tokens that receive little attention (token_importance)")
              : tr("This cache carries no attention mass: recapture it"),
         mass, mass && t.tokenImportance},
    };
}

bool TunerSession::applyStages(const std::vector<CodecStage>& stages, CodecProfile* profile, QString* note)
{
    TransformSettings t = profile->transform;
    bool on = false;
    const int sinks = t.sinkTokens > 0 ? t.sinkTokens : 4;
    for (const CodecStage& s : stages) {
        const bool v = s.on && s.enabled;
        if (s.id == QLatin1String("transform")) on = v;
        else if (s.id == QLatin1String("rope_undo")) t.ropeUndo = v;
        else if (s.id == QLatin1String("pca")) { if (s.enabled) t.basis = v ? TransformBasis::Pca : TransformBasis::Hadamard; }
        else if (s.id == QLatin1String("across_heads")) t.acrossHeads = s.on;
        else if (s.id == QLatin1String("weighting")) t.weighting = v ? TransformWeighting::Attention : TransformWeighting::Mse;
        else if (s.id == QLatin1String("waterfill")) t.allocation = v ? TransformAllocation::Waterfill : TransformAllocation::Uniform;
        else if (s.id == QLatin1String("rans"))  // on keeps the profile's layout (rans or rans32)
            t.entropy = !v ? TransformEntropy::Fixed : entropyUsesTables(t.entropy) ? t.entropy : TransformEntropy::Rans;
        else if (s.id == QLatin1String("sinks")) t.sinkTokens = v ? sinks : 0;
        else if (s.id == QLatin1String("token_importance")) t.tokenImportance = v;
    }
    if (!profile->transformModel.empty() && !(t == profile->transform)) {
        profile->transformModel.clear();
        if (note) *note = QCoreApplication::translate("kvscope::TunerSession",
                                                      "The switches differ from the profile's calibration: the transform "
                                                      "codec fits itself on this cache (its model bytes counted).");
    }
    profile->transform = t;
    if (profile->transformLevels.empty()) profile->transformLevels = defaultTransformLevels();
    return on;
}

struct TunerSession::Shared {
    std::shared_ptr<const Model> model;
    std::shared_ptr<const KvSet> kv;
    EvalTask task;
    std::mutex mutex;
    std::unique_ptr<QualityReference> ref;

    // Built on first use by whichever worker needs it first; the others wait for it.
    const QualityReference& reference()
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (!ref) ref = std::make_unique<QualityReference>(model->runtime(), task, *kv);
        return *ref;
    }
    QString decode(const std::vector<int32_t>& tokens) const
    {
        return QString::fromStdString(model->tokenizer().decode(tokens, true));
    }
};

TunerSession::TunerSession(QObject* parent)
    : QObject(parent),
      m_trials(new JobLane(tr("codec tuner"), this)),
      m_quality(new JobLane(tr("codec tuner"), this)),
      m_long(new JobLane(tr("codec tuner"), this)),
      m_ladder(new JobLane(tr("transform calibration"), this))
{
    for (JobLane* lane : {m_trials, m_quality, m_long}) connect(lane, &JobLane::failed, this, &TunerSession::failed);
    connect(m_long, &JobLane::phaseChanged, this, &TunerSession::phaseChanged);
    connect(m_long, &JobLane::progressChanged, this, &TunerSession::progressChanged);
    connect(m_long, &JobLane::cancelled, this, &TunerSession::cancelled);
    connect(m_long, &JobLane::finished, this, [this] {
        emit longTaskDone(tr("%1: done in %2 s.").arg(m_longTitle).arg(m_long->lastSeconds(), 0, 'f', 1));
    });
    // The status bar shows one task: a calibration's steps while no long task runs.
    connect(m_ladder, &JobLane::phaseChanged, this, [this](const QString& text, int maximum) {
        if (!m_long->isBusy()) emit phaseChanged(text, maximum);
    });
    connect(m_ladder, &JobLane::progressChanged, this, [this](int value) {
        if (!m_long->isBusy()) emit progressChanged(value);
    });
    connect(m_ladder, &JobLane::failed, this, [this](const QString& message) {
        ladderSettled(nullptr, tr("its calibration failed: %1").arg(message));
        emit longTaskDone(tr("Transform codec: calibration failed: %1").arg(message));
    });
}

TunerSession::~TunerSession()
{
    delete m_trials;
    delete m_quality;
    delete m_long;
    delete m_ladder;
}

bool TunerSession::isBusy() const
{
    return m_long->isBusy();
}

bool TunerSession::isTrialRunning() const
{
    return m_trials->isBusy();
}

const CodecProfile* TunerSession::defaultTransform() const
{
    const bool ours = m_ladderProfile && m_kv && m_kv->modelFingerprint == m_ladderProfile->modelFingerprint &&
                      m_ladderProfile->numLayers == m_kv->shape().numLayers;
    return ours ? m_ladderProfile.get() : nullptr;
}

bool TunerSession::isCalibrating() const
{
    return m_ladder->isBusy();
}

// The open model's calibrated ladder: the profile cache's copy, else a fit on the ladder's sample
// contexts (ensureDefaultTransform), once per model. Its log lines are the status bar's phases,
// its prefills the progress; a cancel stops a prefill (not the fit, a few seconds, that follows).
void TunerSession::prepareDefaultTransform(std::shared_ptr<const Model> model)
{
    const std::string fp = model->runtime().fingerprint();
    if (fp == m_ladderFingerprint) return;  // ready, in flight, or none to be had for this model
    m_ladderFingerprint = fp;
    m_ladderProfile.reset();
    m_ladderNote = tr("its default ladder is being calibrated");
    m_ladder->start(tr("Transform codec: reading its calibrated default ladder…"),
                    [this, model](JobControl& control) -> std::function<void()> {
                        const auto log = [&control](const std::string& line) {
                            control.phase(tr("Transform codec: %1").arg(QString::fromStdString(line).trimmed()));
                        };
                        const auto prefill = [&control](int done, int total) { return control.progress(done, total); };
                        const std::string path = ensureDefaultTransform(*model, log, prefill);
                        auto ladder = std::make_shared<const CodecProfile>(loadProfile(path));
                        return [this, ladder] {
                            ladderSettled(ladder, QString());
                            emit longTaskDone(tr("Transform codec: calibrated default ladder ready (%1 levels, %2 s).")
                                                  .arg(ladder->transformLevels.size())
                                                  .arg(m_ladder->lastSeconds(), 0, 'f', 1));
                        };
                    });
}

void TunerSession::ladderSettled(std::shared_ptr<const CodecProfile> ladder, const QString& note)
{
    m_ladderProfile = std::move(ladder);
    m_ladderNote = note;
    emit defaultTransformChanged();
}

void TunerSession::setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv,
                             const SampleContext& sample)
{
    m_long->cancel();  // a calibration of the same model goes on
    m_trials->cancel(true);
    m_quality->cancel(true);
    m_kv = kv;
    m_model = model;
    m_shared = std::make_shared<Shared>();
    m_shared->kv = kv;
    m_qualityOk = false;
    m_hasContinuation = false;
    if (!kv) {
        m_qualityNote = tr("No cache.");
        return;
    }
    if (!model || model->runtime().fingerprint() != kv->modelFingerprint) {
        m_qualityNote = tr("Size and error only: open the model this cache came from to measure quality.");
        return;
    }
    if (int(kv->tokens.size()) != kv->shape().numTokens || kv->tokens.size() < 2) {
        m_qualityNote = tr("Size and error only: the cache carries no tokens to score quality with.");
        return;
    }
    m_shared->model = model;
    prepareDefaultTransform(model);
    EvalTask& task = m_shared->task;
    task.context = kv->tokens;
    try {
        if (!sample.continuation.empty()) {
            task.continuation = model->tokenizer().encode(sample.continuation, false);
            if (int(task.continuation.size()) > kMaxContinuation) task.continuation.resize(kMaxContinuation);
        }
        task.question = model->questionTokens(sample.question.empty() ? "Summarize the text above in one sentence."
                                                                      : sample.question);
        task.answerTokens = kAnswerTokens;
        task.stopIds = model->stopIds();
    } catch (const std::exception& e) {
        m_qualityNote = tr("Size and error only: %1").arg(QString::fromStdString(e.what()));
        return;
    }
    m_qualityOk = true;
    m_hasContinuation = !task.continuation.empty();
    m_qualityNote = task.continuation.empty()
                        ? tr("Quality: answers compared; no held-out continuation, so no ΔPPL or KL (use a sample "
                             "context).")
                        : tr("Quality on %1 continuation tokens and a %2-token answer.")
                              .arg(task.continuation.size())
                              .arg(kAnswerTokens);
}

void TunerSession::requestTrial(const CodecProfile& profile, int level)
{
    if (!m_kv) return;
    const std::shared_ptr<Shared> shared = m_shared;
    m_trials->start(QString(), [this, shared, profile, level](JobControl&) -> std::function<void()> {
        const KvSet& kv = *shared->kv;
        const CodecParams params = paramsFor(kv, profile);
        validateProfile(params.profile, "codec tuner");
        CodecTrial trial = runCodecTrial(kv, params, level);
        const KvError err = compareKv(kv, trial.decoded);
        const double values = double(kv.shape().totalValues());
        TrialFigures t;
        t.level = level;
        t.bytes = trial.bytes;
        t.bitsPerValue = trial.bitsPerValue;
        t.ratioVsFp16 = values * 2.0 / double(std::max<uint64_t>(1, trial.bytes));
        t.ratioVsInt8 = double(int8Bytes(kv.shape())) / double(std::max<uint64_t>(1, trial.bytes));
        t.encodeSeconds = trial.encodeSeconds;
        t.decodeSeconds = trial.decodeSeconds;
        t.rms = err.rms;
        t.layers = err.layers;
        auto decoded = std::make_shared<const KvSet>(std::move(trial.decoded));
        return [this, t, decoded] {
            emit trialReady(t);
            if (m_qualityOk) startQuality(decoded, t.level, t.bitsPerValue);
        };
    });
}

void TunerSession::startQuality(std::shared_ptr<const KvSet> decoded, int level, double bits)
{
    const std::shared_ptr<Shared> shared = m_shared;
    m_quality->start(QString(), [this, shared, decoded, level, bits](JobControl& control) -> std::function<void()> {
        const QualityReference& ref = shared->reference();
        if (control.stopped()) return {};
        const Quality m = ref.measure(*decoded);
        QualityFigures q;
        q.level = level;
        q.bitsPerValue = bits;
        q.hasContinuation = !ref.task().continuation.empty();
        q.deltaPplPct = m.deltaPplPct;
        q.kl = m.kl;
        q.tokenAgreement = m.tokenAgreement;
        q.originalAnswer = shared->decode(ref.original().answer);
        q.answer = shared->decode(m.answer);
        return [this, q] { emit qualityReady(q); };
    });
}

// Runs work(shared, control) on the long-task lane; control.progress(done, total) reports and
// returns false once cancel() was called. work returns a closure delivered on the UI thread.
void TunerSession::runLong(const QString& title, LongWork work, bool supersede)
{
    if (!m_qualityOk || (m_long->isBusy() && !supersede)) return;
    m_longTitle = title;
    m_evaluating = supersede;  // only an evaluation supersedes the long task in flight
    const std::shared_ptr<Shared> shared = m_shared;
    m_long->start(title, [shared, work](JobControl& control) { return work(*shared, control); });
}

void TunerSession::measureSensitivity(const CodecProfile& profile, int bins)
{
    runLong(tr("Measuring per-layer sensitivity at %1 bins").arg(bins),
            [this, profile, bins](Shared& s, JobControl& control) -> std::function<void()> {
                auto progress = [&control](int done, int total) { return control.progress(done, total); };
                const auto result =
                    measureLayerSensitivity(s.reference(), *s.kv, paramsFor(*s.kv, profile), bins, progress);
                return [this, result] { emit sensitivityReady(result); };
            });
}

void TunerSession::evaluate(const CodecProfile& profile, bool withTransform)
{
    runLong(tr("Evaluating the levels and the baselines"),
            [this, profile, withTransform](Shared& s, JobControl& control) -> std::function<void()> {
                auto progress = [&control](int done, int total) { return control.progress(done, total); };
                EvalPlan plan;
                plan.cachegen = paramsFor(*s.kv, profile);
                plan.textRecompute = false;  // exact by construction; its cost is a prefill, not a size
                if (withTransform) plan.transforms.push_back(transformParamsFor(s.kv->shape(), s.kv->dtype(), profile));
                const std::vector<EvalRow> rows =
                    evaluateCodecs(s.model->runtime(), s.reference(), *s.kv, plan, progress);
                std::vector<RdPoint> points;
                for (const EvalRow& r : rows)
                    points.push_back(pointOf(r.codec, r.levelName, r.bitsPerValue, r.quality.deltaPplPct, r.quality.kl));
                return [this, points] { emit evaluated(points, QStringLiteral("continuation")); };
            },
            true);
}

void TunerSession::evaluateSuite(const CodecProfile& profile, bool withTransform, const QString& suitePath)
{
    if (!m_model) {
        emit failed(tr("quality suite: open a model first (page 1)"));
        return;
    }
    if (m_long->isBusy()) m_long->cancel(true);
    m_longTitle = tr("Scoring the levels and baselines on the quality suite");
    m_evaluating = true;
    const std::shared_ptr<const Model> model = m_model;
    const std::string path = QFile::encodeName(suitePath).toStdString();
    m_long->start(m_longTitle, [this, model, path, profile, withTransform](JobControl& control) -> std::function<void()> {
        const Suite suite = loadSuite(path);
        const Model& m = *model;
        std::string stage = "prefill";
        int row = 0, rows = 0;
        const SuiteProgress progress = [&](const std::string& what, int done, int total) {
            if (what != stage || done == 0) {
                stage = what;
                control.phase(tr("Suite %1: %2 (row %3 of %4)…")
                                  .arg(QString::fromStdString(suite.name), QString::fromStdString(what))
                                  .arg(row + 1)
                                  .arg(std::max(rows, 1)),
                              total);
            }
            return control.progress(done, total);
        };
        control.phase(tr("Suite %1: prefill and fp16 reference of %2 items…")
                          .arg(QString::fromStdString(suite.name))
                          .arg(suite.items.size()));
        SuiteReference ref(m, suite, SuiteOptions{}, progress);
        std::vector<CodecParams> plan;
        std::vector<int> levels;
        auto add = [&](CodecParams p, int level) {
            plan.push_back(std::move(p));
            levels.push_back(level);
        };
        CodecParams base;
        base.shape = ref.items().front().original.shape();
        base.dtype = ref.items().front().original.dtype();
        base.profile = profile;
        base.profile.numLayers = base.shape.numLayers;
        for (CodecId id : {CodecId::Fp16, CodecId::Int8, CodecId::Kivi2, CodecId::Kivi4}) {
            CodecParams p = base;
            p.codec = id;
            add(p, 1);
        }
        CodecParams cg = base;
        cg.codec = CodecId::CacheGen;
        for (int l = 1; l <= int(profile.levels.size()); ++l) add(cg, l);
        if (withTransform) {
            CodecParams t = base;
            t.codec = CodecId::Transform;
            for (int l = 1; l <= int(profile.transformLevels.size()); ++l) add(t, l);
        }
        rows = int(plan.size());
        std::vector<RdPoint> points;
        for (row = 0; row < rows; ++row) {
            if (control.stopped()) throw std::runtime_error("cancelled");
            const SuiteCodecRow r = evaluateSuiteCodec(ref, plan[size_t(row)], levels[size_t(row)], SuiteEvalOptions{}, progress);
            RdPoint p = pointOf(r.codec, r.levelName, r.bitsPerValue, r.quality.deltaPplPct, r.quality.kl);
            p.accuracy = r.quality.accuracy;
            points.push_back(p);
        }
        const QString source = tr("suite %1 (%2 items, %3 questions)")
                                   .arg(QString::fromStdString(suite.name))
                                   .arg(suite.items.size())
                                   .arg(suite.questionCount());
        return [this, points, source] { emit evaluated(points, source); };
    });
}

void TunerSession::autoTune(const CodecProfile& profile)
{
    runLong(tr("Auto-tuning bins per layer"),
            [this, profile](Shared& s, JobControl& control) -> std::function<void()> {
                auto progress = [&control](int done, int total) { return control.progress(done, total); };
                const QualityReference& ref = s.reference();
                if (ref.task().continuation.empty())
                    throw std::runtime_error("auto-tune needs a context with a held-out continuation (a sample context)");
                TuneOptions options;
                options.base = profile;
                options.base.numLayers = s.kv->shape().numLayers;
                const TuneResult r =
                    tuneProfile(s.kv->modelFingerprint, {TuneContext{"context", &ref, s.kv.get()}}, options,
                                [&progress](const std::string&, int done, int total) { return progress(done, total); });
                QString summary;
                for (const TunedLevel& l : r.levels)
                    summary += tr("budget %1 %: %2 bits/value, ΔPPL %3 %%4\n")
                                   .arg(l.budget)
                                   .arg(l.bitsPerValue, 0, 'f', 3)
                                   .arg(l.maxDeltaPplPct, 0, 'f', 3)
                                   .arg(l.met ? QString() : tr(" (budget missed)"));
                const CodecProfile result = r.profile;
                return [this, result, summary] { emit tuned(result, summary.trimmed()); };
            });
}

void TunerSession::cancel()
{
    m_long->cancel();
    if (!m_ladder->isBusy()) return;
    m_ladder->cancel(true);
    m_ladderFingerprint.clear();  // the next cache of this model tries again
    ladderSettled(nullptr, tr("its calibration was cancelled (the next capture starts it again)"));
    emit longTaskDone(tr("Transform codec: calibration cancelled."));
}

}  // namespace kvscope
