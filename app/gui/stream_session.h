// StreamSession: the Stream page's runs, on a JobLane, as `kvscope-cli stream` does them: a chunk
// server in-process on 127.0.0.1 whose sending side shapes the link, and a Streamer that fetches,
// decodes and answers. The store is the cache encoded now (cachegen with the tuner's profile, plus
// int8) into a temporary folder, or .kvc files / a Redis URL the user named.
// A start() is a race of the config's policies on one link schedule, in the config's mode:
//   back to back  one server, one Streamer; the pacer is reset to the schedule's start before
//                 each policy, so their timelines compare directly;
//   at once       one server (own pacer, same schedule) and one Streamer per policy, all running
//                 concurrently on their own threads: the same comparison at the same time;
//   shared link   one server, one Streamer per policy, concurrently: they compete for the link.
// Running at once, the compute parts contend for this machine's cores unless they are modelled
// on target hardware (the transfer is measured either way).
// Servers and prepared Streamers are kept between races while the cache, profile, store, RTT and
// mode stay the same (only the link schedule or the policies change), so a second race starts at
// once. Chunks are reported live (StreamOptions::onChunk), tagged with their lane; stop() ends the
// race after the chunks in flight and leaves the session ready for the next one. After each run
// the assembled cache is scored against the original (KL, delta PPL: eval/quality.h), on the
// context's held-out continuation when there is one, else on the question and the reference
// answer, as `kvscope-cli stream --quality kl` does.
#pragma once

#include "view_data.h"

#include "codec/profile.h"
#include "kv/kv_set.h"

#include <QObject>

#include <memory>

namespace kvscope {

class JobLane;
class Model;
struct StreamRig;

class StreamSession : public QObject {
    Q_OBJECT
public:
    explicit StreamSession(QObject* parent = nullptr);
    ~StreamSession() override;  // stops the race and waits for it

    // question: asked after the context ("" = a generic summary request); continuation: held-out
    // text after the context, scored for KL and delta PPL ("" = the question and the answer).
    void setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv, const QString& question,
                   const QString& continuation = QString());
    bool isReady() const { return m_model && m_kv; }
    bool isRunning() const;
    // The available rate of config's link over [0, seconds] as the plots draw it.
    // Throws kvscope::Error for a bad rate or trace.
    static LinkSeries availableSeries(const StreamConfig& config, double seconds);
    // "measured" first, then core/stream's target presets (targetPreset: the CLI's --target).
    static std::vector<HardwarePreset> hardwarePresets();

public slots:
    // transform: stream its calibrated transform levels instead of profile's CacheGen levels
    // (the Stream page passes the model's ladder where there is one: CodecPage::streamTransform).
    void start(const kvscope::StreamConfig& config, const kvscope::CodecProfile& profile,
               std::shared_ptr<const kvscope::CodecProfile> transform = nullptr);
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

    JobLane* m_lane;
    std::shared_ptr<const Model> m_model;
    std::shared_ptr<const KvSet> m_kv;
    std::string m_question, m_continuation;
    std::shared_ptr<StreamRig> m_rig;  // servers and prepared streamers, reused across races (stream_rig.h)
    int m_runs = 0;
};

}  // namespace kvscope
