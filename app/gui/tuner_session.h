// TunerSession: the codec tuner's work, off the UI thread, for one cache (and the model it came
// from, when open):
//   trial:        runCodecTrial of the edited level + compareKv, latest request wins;
//   quality:      QualityReference::measure of that trial's decoded cache (ΔPPL, KL, answers),
//                 in the background after each trial, latest wins; the reference (one prefill of
//                 the continuation and one answer from the original cache) is built once;
//   long tasks:   per-layer sensitivity, evaluateCodecs (levels, the transform codec's levels with
//                 the stages switched on, baselines), the same on a quality suite (eval/suite.h:
//                 every item prefilled once, cached on disk by core), tuneProfile: one at a time,
//                 with progress and cancel through the status bar. A new evaluation supersedes the
//                 one in flight (stage toggles re-evaluate as the user clicks).
// The transform codec's stages map onto the profile's TransformSettings (codec/transform.h):
// transformStages() lists them for a cache, applyStages() writes the toggles into a profile.
// The transform codec's default: the open model's shipped ladder, calibrated
// (eval/transform_default.h): read from the profile cache, else fitted once on the ladder's sample
// contexts, on a lane of its own so that trials and evaluations go on meanwhile.
// Each kind of work runs on its own JobLane (background_job.h); results reach the UI thread as
// the value structs of view_data.h.
#pragma once

#include "view_data.h"

#include "eval/samples.h"
#include "kv/kv_set.h"

#include <QObject>
#include <functional>
#include <memory>
#include <string>

namespace kvscope {

class JobControl;
class JobLane;
class Model;

class TunerSession : public QObject {
    Q_OBJECT
public:
    explicit TunerSession(QObject* parent = nullptr);
    ~TunerSession() override;  // stops and waits for the workers

    // A new cache; model may be null or another model's (then only size and error are measured).
    // sample: the context's continuation and question, when known.
    void setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv, const SampleContext& sample);
    bool hasCache() const { return bool(m_kv); }
    bool canMeasureQuality() const { return m_qualityOk; }
    // Per-layer sensitivity scores a held-out continuation: a sample context has one.
    bool canMeasureSensitivity() const { return m_qualityOk && m_hasContinuation; }
    QString qualityNote() const { return m_qualityNote; }
    bool isBusy() const;  // a long task runs
    bool isTrialRunning() const;
    bool isEvaluating() const { return isBusy() && m_evaluating; }  // the long task is an evaluation

    // The calibrated default ladder of the model the cache came from (a complete profile: switches,
    // levels, calibrated model), or null: none yet (see isCalibrating) or none to be had (see
    // defaultTransformNote). setSource starts finding or calibrating it for the open model.
    const CodecProfile* defaultTransform() const;
    bool isCalibrating() const;
    QString defaultTransformNote() const { return m_ladderNote; }  // why there is none

    // The transform codec's switches as toggles, for this cache (a stage the cache cannot feed,
    // e.g. token importance without attention mass, is listed but disabled) and this profile
    // (PCA needs a calibrated transform model in the profile).
    static std::vector<CodecStage> transformStages(const CodecProfile& profile, const KvSet* kv);
    // Writes the toggles into profile.transform (and default transform levels when it has none).
    // Returns false when the transform codec is switched off. A calibrated model whose switches
    // no longer match is dropped (the codec then fits itself on the cache) and *note says so.
    static bool applyStages(const std::vector<CodecStage>& stages, CodecProfile* profile, QString* note = nullptr);

public slots:
    void requestTrial(const kvscope::CodecProfile& profile, int level);
    void measureSensitivity(const kvscope::CodecProfile& profile, int bins);
    // withTransform: profile.transform holds the stages to evaluate (applyStages).
    void evaluate(const kvscope::CodecProfile& profile, bool withTransform = false);
    // The same rows scored on a quality suite file (needs the model; not the captured cache).
    void evaluateSuite(const kvscope::CodecProfile& profile, bool withTransform, const QString& suitePath);
    void autoTune(const kvscope::CodecProfile& profile);
    void cancel();  // the long task only

signals:
    void trialReady(const kvscope::TrialFigures& trial);
    void qualityReady(const kvscope::QualityFigures& quality);
    void sensitivityReady(const std::vector<kvscope::LayerSensitivity>& sensitivity);
    // source: "continuation" or "suite NAME (N items, M questions)".
    void evaluated(const std::vector<kvscope::RdPoint>& points, const QString& source = QString());
    void tuned(const kvscope::CodecProfile& profile, const QString& summary);
    void phaseChanged(const QString& text, int maximum);
    void progressChanged(int value);
    void longTaskDone(const QString& message);
    void failed(const QString& message);
    void cancelled();
    // The default ladder landed, failed or was cancelled (defaultTransform() tells which).
    void defaultTransformChanged();

private:
    struct Shared;  // the cache, the model and the lazily built reference, shared with workers
    using LongWork = std::function<std::function<void()>(Shared&, JobControl&)>;
    void runLong(const QString& title, LongWork work, bool supersede = false);
    void startQuality(std::shared_ptr<const KvSet> decoded, int level, double bits);
    void prepareDefaultTransform(std::shared_ptr<const Model> model);
    void ladderSettled(std::shared_ptr<const CodecProfile> ladder, const QString& note);

    JobLane* m_trials;   // latest trial wins
    JobLane* m_quality;  // latest quality measurement wins
    JobLane* m_long;     // sensitivity, evaluation, tuning: one at a time, cancellable
    JobLane* m_ladder;   // the default transform ladder: found or calibrated once per model
    std::shared_ptr<Shared> m_shared;
    std::shared_ptr<const KvSet> m_kv;
    std::shared_ptr<const Model> m_model;  // the open model, whatever cache is shown (suites need only it)
    bool m_qualityOk = false;
    bool m_hasContinuation = false;
    QString m_qualityNote;
    QString m_longTitle;
    bool m_evaluating = false;
    std::shared_ptr<const CodecProfile> m_ladderProfile;
    std::string m_ladderFingerprint;  // of the model the ladder is (being) made for
    QString m_ladderNote;
};

}  // namespace kvscope
