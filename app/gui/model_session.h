// ModelSession: the open model and the work done with it, off the UI thread.
//   openModel: Model::open (weights + tokenizer) on the job pool;
//   tokenize:  the context's capture tokens and their decoded pieces, on a pool of its own so
//              typing stays live while a capture runs (latest request wins);
//   capture:   prefill of the context in an InferenceSession on the job pool, progress per block of
//              RuntimeOptions::prefillBlock tokens, then exportKv().
// Each runs on a JobLane (background_job.h): results, progress and errors reach the UI thread as
// plain values through signals; cancel() takes effect at once for the UI and stops the worker at
// its next progress tick. Only public, torch-free core headers are included here.
#pragma once

#include "view_data.h"

#include "kv/kv_set.h"

#include <QObject>
#include <QString>
#include <memory>

namespace kvscope {

class JobLane;
class Model;

class ModelSession : public QObject {
    Q_OBJECT
public:
    explicit ModelSession(QObject* parent = nullptr);
    // Waits for a job in flight (after asking it to stop): the model must outlive it.
    ~ModelSession() override;

    bool hasModel() const { return bool(m_model); }
    bool isBusy() const;
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
    JobLane* m_job;       // open and capture, one at a time
    JobLane* m_tokenize;  // tokenization, latest request wins, never blocks a capture
    std::shared_ptr<const Model> m_model;
    ModelInfo m_info;
};

}  // namespace kvscope

Q_DECLARE_METATYPE(std::shared_ptr<const kvscope::KvSet>)
