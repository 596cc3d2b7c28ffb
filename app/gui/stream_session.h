// StreamSession: the Stream page's runs, on a JobLane, as `kvscope-cli stream` does them: a chunk
// server in-process on 127.0.0.1 whose sending side shapes the link, and a Streamer that fetches,
// decodes and answers. The store is the cache encoded now (cachegen with the tuner's profile, plus
// int8) into a temporary folder, or .kvc files / a Redis URL the user named.
// A start() is a race: every policy of the config runs back to back on the same link schedule
// (the pacer is reset to the schedule's start before each), so their timelines compare directly.
// The server and the prepared Streamer are kept between races while the cache, profile, store and
// RTT stay the same (only the link schedule or the policies change), so a second race starts at
// once. Chunks are reported live (StreamOptions::onChunk), tagged with their lane; stop() ends the
// race after the chunk in flight and leaves the session ready for the next one.
#pragma once

#include "view_data.h"

#include "codec/profile.h"
#include "kv/kv_set.h"

#include <QObject>

#include <memory>

namespace kvscope {

class JobLane;
class Model;

class StreamSession : public QObject {
    Q_OBJECT
public:
    explicit StreamSession(QObject* parent = nullptr);
    ~StreamSession() override;  // stops the race and waits for it

    // question: asked after the context ("" = a generic summary request).
    void setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv, const QString& question);
    bool isReady() const { return m_model && m_kv; }
    bool isRunning() const;
    // The available rate of config's link over [0, seconds] as the plots draw it.
    // Throws kvscope::Error for a bad rate or trace.
    static LinkSeries availableSeries(const StreamConfig& config, double seconds);

public slots:
    void start(const kvscope::StreamConfig& config, const kvscope::CodecProfile& profile);
    void stop();

signals:
    void phaseChanged(const QString& text, int maximum);
    void progressChanged(int value);  // lanes finished
    // A race begins: the policies in lane order and the link's available rate.
    void raceStarted(const QStringList& policies, const kvscope::LinkSeries& available);
    void laneStarted(int lane);
    void chunkArrived(const kvscope::StreamChunkPoint& chunk);
    void runFinished(const kvscope::StreamRunResult& result);  // one lane
    void raceFinished(const kvscope::RaceRecord& race);
    void failed(const QString& message);
    void cancelled();

private:
    struct Rig;  // server + prepared streamer, reused across races; touched only on the worker

    JobLane* m_lane;
    std::shared_ptr<const Model> m_model;
    std::shared_ptr<const KvSet> m_kv;
    std::string m_question;
    std::shared_ptr<Rig> m_rig;
    int m_runs = 0;
};

}  // namespace kvscope
