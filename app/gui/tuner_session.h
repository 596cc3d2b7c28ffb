// TunerSession: the codec tuner's work, off the UI thread, for one cache (and the model it came
// from, when open):
//   trial:        runCodecTrial of the edited level + compareKv, latest request wins;
//   quality:      QualityReference::measure of that trial's decoded cache (ΔPPL, KL, answers),
//                 in the background after each trial, latest wins; the reference (one prefill of
//                 the continuation and one answer from the original cache) is built once;
//   long tasks:   per-layer sensitivity, evaluateCodecs (levels + baselines), tuneProfile: one at a
//                 time, with progress and cancel through the status bar.
// Results reach the UI thread as value structs through queued calls.
#pragma once

#include "codec_tuner_view.h"

#include "eval/samples.h"
#include "kv/kv_set.h"

#include <QObject>
#include <QThreadPool>

#include <atomic>
#include <memory>
#include <mutex>

namespace kvscope {

class Model;
class QualityReference;

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
    QString qualityNote() const { return m_qualityNote; }
    bool isBusy() const { return m_longBusy; }
    bool isTrialRunning() const { return m_trialsInFlight > 0; }

public slots:
    void requestTrial(const kvscope::CodecProfile& profile, int level);
    void measureSensitivity(const kvscope::CodecProfile& profile, int bins);
    void evaluate(const kvscope::CodecProfile& profile);
    void autoTune(const kvscope::CodecProfile& profile);
    void cancel();  // the long task only

signals:
    void trialReady(const kvscope::TrialFigures& trial);
    void qualityReady(const kvscope::QualityFigures& quality);
    void sensitivityReady(const std::vector<kvscope::LayerSensitivity>& sensitivity);
    void evaluated(const std::vector<kvscope::RdPoint>& points);
    void tuned(const kvscope::CodecProfile& profile, const QString& summary);
    void phaseChanged(const QString& text, int maximum);
    void progressChanged(int value);
    void longTaskDone(const QString& message);
    void failed(const QString& message);
    void cancelled();

private:
    struct Shared;  // the cache, the model and the lazily built reference, shared with workers
    template <typename Work>
    void runLong(const QString& title, Work work);
    void startQuality(std::shared_ptr<const KvSet> decoded, int level, double bits);

    QThreadPool m_trialPool, m_qualityPool, m_longPool;
    std::shared_ptr<Shared> m_shared;
    std::shared_ptr<const KvSet> m_kv;
    bool m_qualityOk = false;
    QString m_qualityNote;
    std::atomic<quint64> m_trialGeneration{0}, m_qualityGeneration{0};
    quint64 m_longGeneration = 0;
    std::shared_ptr<std::atomic<bool>> m_stop;
    bool m_longBusy = false;
    int m_trialsInFlight = 0;
};

}  // namespace kvscope
