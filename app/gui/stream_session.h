// StreamSession: the stream lab's runs, on a worker thread, as `kvscope-cli stream` does them: a
// chunk server in-process on 127.0.0.1 whose sending side shapes the link, and a Streamer that
// fetches, decodes and answers. The store is the cache encoded now (cachegen with the tuner's
// profile, plus int8) into a temporary folder, or .kvc files / a Redis URL the user named.
// The server and the prepared Streamer are kept between runs while the cache, profile, store and
// RTT stay the same (only the link schedule changes), so a second run starts at once.
// Chunks are reported live (StreamOptions::onChunk); stop() ends the run after the chunk in
// flight and leaves the session ready for the next one.
#pragma once

#include "kv_metatypes.h"
#include "stream_lab_view.h"

#include "codec/profile.h"
#include "kv/kv_set.h"

#include <QObject>
#include <QThreadPool>

#include <atomic>
#include <memory>

namespace kvscope {

class Model;

class StreamSession : public QObject {
    Q_OBJECT
public:
    explicit StreamSession(QObject* parent = nullptr);
    ~StreamSession() override;  // stops the run and waits for it

    // question: asked after the context ("" = a generic summary request).
    void setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv, const QString& question);
    bool isReady() const { return m_model && m_kv; }
    bool isRunning() const { return m_running; }

public slots:
    void start(const kvscope::StreamConfig& config, const kvscope::CodecProfile& profile);
    void stop();

signals:
    void phaseChanged(const QString& text, int maximum);
    void runStarted(const kvscope::LinkSeries& available);
    void chunkArrived(const kvscope::StreamChunkPoint& chunk);
    void runFinished(const kvscope::StreamRunResult& result);
    void failed(const QString& message);
    void cancelled();

private:
    struct Rig;  // server + prepared streamer, reused across runs; touched only on the worker

    QThreadPool m_pool;
    std::shared_ptr<const Model> m_model;
    std::shared_ptr<const KvSet> m_kv;
    std::string m_question;
    std::shared_ptr<Rig> m_rig;
    std::shared_ptr<std::atomic<bool>> m_stop;
    quint64 m_generation = 0;
    bool m_running = false;
    int m_runs = 0;
};

}  // namespace kvscope
