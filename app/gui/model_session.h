// ModelSession: the open model and the work done with it, off the UI thread.
//   openModel: Model::open (weights + tokenizer) on the job pool;
//   tokenize:  the context's capture tokens and their decoded pieces, on a pool of its own so
//              typing stays live while a capture runs (latest request wins);
//   capture:   prefill of the context in an InferenceSession on the job pool, progress per block of
//              RuntimeOptions::prefillBlock tokens, then exportKv().
// Results reach the UI thread as plain values through queued signals. cancel() takes effect at
// once for the UI (results of a cancelled job are dropped by generation number) and stops the
// worker at its next progress tick. Only public, torch-free core headers are included here.
#pragma once

#include "model_context_view.h"

#include "kv/kv_set.h"

#include <QObject>
#include <QString>
#include <QThreadPool>

#include <atomic>
#include <memory>

namespace kvscope {

class Model;

class ModelSession : public QObject {
    Q_OBJECT
public:
    explicit ModelSession(QObject* parent = nullptr);
    // Waits for a job in flight (after asking it to stop): the model must outlive it.
    ~ModelSession() override;

    bool hasModel() const { return bool(m_model); }
    bool isBusy() const { return m_busy; }
    const ModelInfo& modelInfo() const { return m_info; }
    // The open model, for the tuner and the stream lab (null before one opened).
    std::shared_ptr<const Model> model() const { return m_model; }

    // Tokens per forward during capture: smaller blocks give finer progress and quicker cancel.
    static constexpr int kPrefillBlock = 64;

public slots:
    // path "" opens the embedded default (Model::open's aliases); tokenizerPath is required for
    // llama2.c checkpoints. Replaces the open model once the new one has loaded.
    void openModel(const QString& path, const QString& tokenizerPath = QString());
    void tokenize(const QString& text);
    // Captures the KV of `text` (Model::contextTokens: template and BOS included).
    void capture(const QString& text);
    void cancel();

signals:
    // maximum == 0: no measurable progress (busy indicator); else progress counts tokens.
    void phaseChanged(const QString& text, int maximum);
    void progressChanged(int value);
    void modelOpened(const kvscope::ModelInfo& info);
    void tokenized(const kvscope::TokenPieces& pieces);
    // Tokenizing the edited context failed; nothing else is affected (no job was running for it).
    void tokenizeFailed(const QString& message);
    // kv carries tokens, context, model name and fingerprint.
    void captured(std::shared_ptr<const kvscope::KvSet> kv, double seconds);
    void failed(const QString& message);
    void cancelled();

private:
    void begin();
    void end();

    QThreadPool m_jobPool;       // open and capture, one at a time
    QThreadPool m_tokenizePool;  // tokenization, one at a time
    std::shared_ptr<const Model> m_model;
    ModelInfo m_info;
    quint64 m_generation = 0;          // bumped per job and by cancel(); older results are dropped
    // Bumped per tokenize request and per model; workers read it to skip superseded requests.
    std::atomic<quint64> m_tokenizeGeneration{0};
    std::shared_ptr<std::atomic<bool>> m_stop;  // the running job's stop flag
    bool m_busy = false;
};

}  // namespace kvscope

Q_DECLARE_METATYPE(std::shared_ptr<const kvscope::KvSet>)
