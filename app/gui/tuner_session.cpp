#include "tuner_session.h"

#include "background_job.h"

#include "codec/chunk_codec.h"
#include "eval/codec_trial.h"
#include "eval/evaluate.h"
#include "eval/quality.h"
#include "eval/sensitivity.h"
#include "eval/tune.h"
#include "kv/kv_compare.h"
#include "model/model.h"

#include <mutex>

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

}  // namespace

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
      m_long(new JobLane(tr("codec tuner"), this))
{
    for (JobLane* lane : {m_trials, m_quality, m_long}) connect(lane, &JobLane::failed, this, &TunerSession::failed);
    connect(m_long, &JobLane::phaseChanged, this, &TunerSession::phaseChanged);
    connect(m_long, &JobLane::progressChanged, this, &TunerSession::progressChanged);
    connect(m_long, &JobLane::cancelled, this, &TunerSession::cancelled);
    connect(m_long, &JobLane::finished, this, [this] {
        emit longTaskDone(tr("%1: done in %2 s.").arg(m_longTitle).arg(m_long->lastSeconds(), 0, 'f', 1));
    });
}

TunerSession::~TunerSession()
{
    delete m_trials;
    delete m_quality;
    delete m_long;
}

bool TunerSession::isBusy() const
{
    return m_long->isBusy();
}

bool TunerSession::isTrialRunning() const
{
    return m_trials->isBusy();
}

void TunerSession::setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv,
                             const SampleContext& sample)
{
    cancel();
    m_trials->cancel(true);
    m_quality->cancel(true);
    m_kv = kv;
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
void TunerSession::runLong(const QString& title, LongWork work)
{
    if (!m_qualityOk || m_long->isBusy()) return;
    m_longTitle = title;
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

void TunerSession::evaluate(const CodecProfile& profile)
{
    runLong(tr("Evaluating the levels and the baselines"),
            [this, profile](Shared& s, JobControl& control) -> std::function<void()> {
                auto progress = [&control](int done, int total) { return control.progress(done, total); };
                EvalPlan plan;
                plan.cachegen = paramsFor(*s.kv, profile);
                plan.textRecompute = false;  // exact by construction; its cost is a prefill, not a size
                const std::vector<EvalRow> rows =
                    evaluateCodecs(s.model->runtime(), s.reference(), *s.kv, plan, progress);
                std::vector<RdPoint> points;
                for (const EvalRow& r : rows) {
                    RdPoint p;
                    p.codec = QString::fromStdString(r.codec);
                    p.label = r.codec == "cachegen" ? QString::fromStdString(r.levelName) : p.codec;
                    p.bitsPerValue = r.bitsPerValue;
                    p.deltaPplPct = r.quality.deltaPplPct;
                    p.kl = r.quality.kl;
                    points.push_back(p);
                }
                return [this, points] { emit evaluated(points); };
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
}

}  // namespace kvscope
