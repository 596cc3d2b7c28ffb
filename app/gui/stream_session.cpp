#include "stream_session.h"

#include "background_job.h"
#include "stream_rig.h"

#include "codec/chunk_codec.h"
#include "eval/quality.h"
#include "model/model.h"
#include "transport/link.h"
#include "transport/server.h"
#include "stream/streamer.h"

#include <QFile>

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

namespace kvscope {

namespace {

// Points of the available-rate curve: fine enough to show a trace's texture.
constexpr double kLinkStepSeconds = 0.02;

LinkSchedule scheduleFor(const StreamConfig& c)
{
    switch (c.link) {
    case StreamConfig::Trace:
        if (c.tracePath.isEmpty()) throw Error("stream lab: choose a Mahimahi trace file");
        return LinkSchedule::loadTrace(QFile::encodeName(c.tracePath).toStdString(), c.traceScale);
    case StreamConfig::Steps:
    case StreamConfig::Constant:
        break;
    }
    return LinkSchedule::parse(c.rate.toStdString(), "link rate");
}

// One chunk's timeline as the plots take it (the job and decode times are known only at the end).
StreamChunkPoint chunkPoint(const ChunkEvent& e, int lane)
{
    StreamChunkPoint c;
    c.lane = lane;
    c.index = e.index;
    c.level = e.level;
    c.local = e.local;
    c.bytes = e.bytes;
    c.sentS = e.sentS;
    c.firstByteS = e.firstByteS;
    c.arrivedS = e.arrivedS;
    c.jobStartS = e.jobStartS;
    c.decodedS = e.decodedS;
    return c;
}

LinkSeries seriesOf(const LinkSchedule& s, double seconds)
{
    LinkSeries out;
    for (double t = 0; t <= seconds; t += kLinkStepSeconds) {
        out.seconds.push_back(t);
        out.mbps.push_back(s.capacityBytes(t, t + kLinkStepSeconds) * 8e-6 / kLinkStepSeconds);
    }
    return out;
}

}  // namespace

StreamSession::StreamSession(QObject* parent) : QObject(parent), m_lane(new JobLane(tr("stream"), this))
{
    connect(m_lane, &JobLane::phaseChanged, this, &StreamSession::phaseChanged);
    connect(m_lane, &JobLane::progressChanged, this, &StreamSession::progressChanged);
    connect(m_lane, &JobLane::failed, this, &StreamSession::failed);
    connect(m_lane, &JobLane::cancelled, this, &StreamSession::cancelled);
}

StreamSession::~StreamSession()
{
    delete m_lane;  // stops and waits; the rig (server threads, streamers) goes with its last reference
}

bool StreamSession::isRunning() const
{
    return m_lane->isBusy();
}

LinkSeries StreamSession::availableSeries(const StreamConfig& config, double seconds)
{
    return seriesOf(scheduleFor(config), seconds);
}

std::vector<HardwarePreset> StreamSession::hardwarePresets()
{
    std::vector<HardwarePreset> out;
    out.push_back({QStringLiteral("measured"), tr("This machine (measured)"), 0, 0, -1, QString()});
    for (const std::string& name : targetPresetNames()) {
        const TargetHardware t = targetPreset(name);
        HardwarePreset p;
        p.id = QString::fromStdString(name);
        p.prefillTokensPerSecond = t.prefillTokensPerSecond;
        p.decodeGBps = t.decodeGBps;
        p.weightPassSeconds = t.weightPassSeconds;
        p.citation = QString::fromStdString(t.citation);
        p.label = tr("%1 (modelled: prefill %2k tok/s, decode %3 GB/s, weight pass %4 ms)")
                      .arg(p.id)
                      .arg(t.prefillTokensPerSecond / 1000.0, 0, 'f', 1)
                      .arg(t.decodeGBps, 0, 'f', 0)
                      .arg(t.weightPassSeconds * 1e3, 0, 'f', 1);
        out.push_back(p);
    }
    return out;
}

void StreamSession::setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv,
                              const QString& question, const QString& continuation)
{
    stop();
    m_model = std::move(model);
    m_kv = std::move(kv);
    m_question = question.isEmpty() ? "Summarize the text above in one sentence." : question.toStdString();
    m_continuation = continuation.toStdString();
}

namespace {

// The hardware a config names: core's preset by its name (one source of truth with the CLI), or
// the config's own rates ("custom"), or nothing (measured).
TargetHardware targetFor(const StreamConfig& c)
{
    const std::string id = c.hardware.toStdString();
    for (const std::string& name : targetPresetNames())
        if (name == id) {
            // The race models the target's compute rates only: its link carries the served
            // model's bytes unscaled, so modelled decode is charged for those same bytes
            // (kvBytesPerToken 0). The CLI's stream also slows the link to the target's KV size.
            TargetHardware t = targetPreset(name);
            t.kvBytesPerToken = 0;
            return t;
        }
    TargetHardware t;
    if (c.prefillTokensPerSecond > 0 || c.decodeGBps > 0) {
        t.name = "custom";
        t.prefillTokensPerSecond = c.prefillTokensPerSecond;
        t.decodeGBps = c.decodeGBps;
        t.weightPassSeconds = c.weightPassSeconds;
    }
    return t;
}

const char* modeName(StreamConfig::Mode m)
{
    switch (m) {
    case StreamConfig::AtOnce: return "at once";
    case StreamConfig::SharedLink: return "at once, one shared link";
    case StreamConfig::BackToBack: break;
    }
    return "back to back";
}

}  // namespace

namespace {

// One race on the worker thread: the lanes' runs on a prepared rig, reported live to the session
// (its signals, posted through control). run() takes them back to back or all at once.
class LaneRace {
public:
    LaneRace(StreamSession* session, JobControl& control, StreamRig& rig, const StreamConfig& config,
             const QStringList& policies, std::vector<Policy> parsed, StreamConfig::Mode mode,
             const LinkSchedule& schedule, int firstRun);
    // Returns the race for the table, once every lane has finished; rethrows a lane's failure.
    RaceRecord run();

private:
    StreamRunResult runLane(int lane, LinkPacer* pacer);
    StreamRunResult resultOf(int lane, const StreamResult& r, const Streamer& streamer, bool sharedPacer, double startS) const;
    void runBackToBack(std::vector<StreamRunResult>& results);
    void runConcurrently(std::vector<StreamRunResult>& results);

    StreamSession* m_session;
    JobControl& m_control;
    StreamRig& m_rig;
    const StreamConfig& m_config;
    const QStringList& m_policies;
    std::vector<Policy> m_parsed;
    int m_lanes;
    StreamConfig::Mode m_mode;
    const LinkSchedule& m_schedule;
    int m_firstRun;
    TargetHardware m_target;
    QString m_link, m_hardware;  // as the results table shows them
    double m_raceStart = 0;
    std::mutex m_qualityMutex;  // one quality pass at a time: they share the runtime's cores
};

LaneRace::LaneRace(StreamSession* session, JobControl& control, StreamRig& rig, const StreamConfig& config,
                   const QStringList& policies, std::vector<Policy> parsed, StreamConfig::Mode mode,
                   const LinkSchedule& schedule, int firstRun)
    : m_session(session), m_control(control), m_rig(rig), m_config(config), m_policies(policies),
      m_parsed(std::move(parsed)), m_lanes(int(m_parsed.size())), m_mode(mode), m_schedule(schedule),
      m_firstRun(firstRun)
{
}

RaceRecord LaneRace::run()
{
    StreamSession* session = m_session;
    const StreamConfig::Mode mode = m_mode;
    RaceRecord race;
    race.config = m_config;
    race.config.policies = m_policies;
    race.config.mode = mode;
    race.cache = QStringLiteral("%1 tokens of %2, %3 levels (%4)")
                     .arg(m_rig.kv->shape().numTokens)
                     .arg(QString::fromStdString(m_rig.kv->modelName))
                     .arg(m_rig.levels)
                     .arg(m_rig.codec == CodecId::Transform ? StreamSession::tr("transform ladder") : StreamSession::tr("CacheGen"));
    race.available = seriesOf(m_schedule, std::max(2.0 * m_config.sloSeconds, 1.0));
    race.qualitySource = QString::fromStdString(m_rig.qualitySource);
    m_control.post([session, policies = m_policies, available = race.available] { emit session->raceStarted(policies, available); });
    m_target = targetFor(m_config);
    m_link = QString::fromStdString(m_schedule.describe()) +
             (m_config.rttMs > 0 ? QStringLiteral(", RTT %1 ms").arg(m_config.rttMs) : QString()) +
             (mode == StreamConfig::BackToBack ? QString() : QStringLiteral(", %1").arg(QLatin1String(modeName(mode))));
    m_hardware = m_target.enabled() ? StreamSession::tr("modelled: %1 (prefill %2 tok/s, decode %3 GB/s)")
                                          .arg(QString::fromStdString(m_target.name))
                                          .arg(m_target.prefillTokensPerSecond, 0, 'f', 0)
                                          .arg(m_target.decodeGBps, 0, 'g', 3)
                                    : StreamSession::tr("measured on this machine");
    m_raceStart = monoSeconds();
    std::vector<StreamRunResult> results(static_cast<size_t>(m_lanes));
    if (mode == StreamConfig::BackToBack) runBackToBack(results);
    else runConcurrently(results);
    race.results = results;
    m_control.progress(m_lanes, m_lanes);
    return race;
}

// One lane's run, on the thread that calls it; returns its result for the table.
StreamRunResult LaneRace::runLane(int lane, LinkPacer* pacer)
{
    StreamSession* session = m_session;
    JobControl& control = m_control;
    Streamer& streamer = *m_rig.streamers[m_mode == StreamConfig::BackToBack ? 0 : size_t(lane)];
    StreamOptions options;
    options.policy = m_parsed[size_t(lane)];
    options.sloSeconds = m_config.sloSeconds;
    options.target = m_target;
    options.keepCache = m_rig.quality != nullptr;
    options.onChunk = [session, &control, lane](const ChunkEvent& e) {
        const StreamChunkPoint c = chunkPoint(e, lane);
        control.post([session, c] { emit session->chunkArrived(c); });
        return !control.stopped();
    };
    const double startS = monoSeconds() - m_raceStart;
    StreamResult r = streamer.run(options, pacer, 0.0);
    StreamRunResult out = resultOf(lane, r, streamer, !pacer && m_mode == StreamConfig::SharedLink, startS);
    if (m_rig.quality && r.cache && !control.stopped()) {
        std::lock_guard<std::mutex> lock(m_qualityMutex);
        const Quality q = m_rig.quality->measure(*r.cache, false);
        out.hasQuality = true;
        out.kl = q.kl;
        out.deltaPplPct = q.deltaPplPct;
    }
    control.post([session, out] { emit session->runFinished(out); });
    return out;
}

// A run as the table and the plots take it.
StreamRunResult LaneRace::resultOf(int lane, const StreamResult& r, const Streamer& streamer, bool sharedPacer,
                                   double startS) const
{
    StreamRunResult out;
    out.run = m_firstRun + lane;
    out.lane = lane;
    out.policy = QString::fromStdString(r.policy);
    out.link = m_link;
    out.hardware = m_hardware;
    out.modelled = m_target.enabled();
    out.sloSeconds = r.sloSeconds;
    out.ttftSeconds = r.ttftSeconds;
    out.sloMet = r.sloMet;
    out.startS = startS;
    const TtftPart* parts[StreamRunResult::kParts] = {&r.transfer, &r.decode,  &r.recompute,
                                                      &r.kvLoad,   &r.prefill, &r.firstToken};
    for (int i = 0; i < StreamRunResult::kParts; ++i) {
        out.parts[i] = parts[i]->seconds;
        out.partModelled[i] = parts[i]->modelled;
    }
    for (const ChunkEvent& e : r.chunks) out.chunks.push_back(chunkPoint(e, lane));
    out.deliveredBytes = r.deliveredBytes;
    out.capacityBytes = r.capacityBytes;
    out.linkSeconds = r.linkSeconds;
    if (sharedPacer) {
        // One pacer for every lane: the link's capacity up to this lane's last arrival.
        double last = 0;
        for (const ChunkEvent& e : r.chunks) last = std::max(last, e.arrivedS);
        out.capacityBytes = m_schedule.capacityBytes(0, last);
        out.linkSeconds = last;
    }
    out.tokenAgreement = r.tokenAgreement;
    out.text = QString::fromStdString(r.text);
    out.referenceText = QString::fromStdString(streamer.referenceText());
    for (const std::string& line : r.log) out.log << QString::fromStdString(line);
    return out;
}

// One server, one streamer; the pacer restarts the schedule for every lane.
void LaneRace::runBackToBack(std::vector<StreamRunResult>& results)
{
    StreamSession* session = m_session;
    const int lanes = m_lanes;
    for (int lane = 0; lane < lanes; ++lane) {
        m_control.phase(StreamSession::tr("Stream: %1 (%2 of %3)…").arg(m_policies[lane]).arg(lane + 1).arg(lanes), lanes);
        m_control.progress(lane, lanes);
        m_control.post([session, lane] { emit session->laneStarted(lane); });
        ChunkServer& server = *m_rig.servers.front();
        server.pacer().setSchedule(m_schedule);  // every lane sees the schedule from its start
        results[size_t(lane)] = runLane(lane, &server.pacer());
    }
}

// Every lane on its own thread: at once (a server each) or on one shared link (one pacer).
void LaneRace::runConcurrently(std::vector<StreamRunResult>& results)
{
    StreamSession* session = m_session;
    const int lanes = m_lanes;
    const StreamConfig::Mode mode = m_mode;
    const size_t needServers = mode == StreamConfig::AtOnce ? size_t(lanes) : 1;
    m_control.phase(StreamSession::tr("Stream: %n policies %1…", nullptr, lanes).arg(QLatin1String(modeName(mode))), 0);
    for (size_t i = 0; i < needServers; ++i) m_rig.servers[i]->pacer().setSchedule(m_schedule);
    if (mode == StreamConfig::SharedLink) m_rig.servers.front()->pacer().reset(0.0);  // the lanes start now
    for (int lane = 0; lane < lanes; ++lane) m_control.post([session, lane] { emit session->laneStarted(lane); });
    std::vector<std::exception_ptr> errors(static_cast<size_t>(lanes));
    std::vector<std::thread> threads;
    for (int lane = 0; lane < lanes; ++lane) {
        LinkPacer* pacer = mode == StreamConfig::AtOnce ? &m_rig.servers[size_t(lane)]->pacer() : nullptr;
        threads.emplace_back([&, lane, pacer] {
            try {
                results[size_t(lane)] = runLane(lane, pacer);
            } catch (...) {
                errors[size_t(lane)] = std::current_exception();
            }
        });
    }
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace

void StreamSession::start(const StreamConfig& config, const CodecProfile& profile, std::shared_ptr<const CodecProfile> transform)
{
    if (isRunning() || !isReady()) return;
    const int firstRun = m_runs + 1;
    m_runs += int(std::max<qsizetype>(1, config.policies.size()));
    StreamRig::Recipe recipe;
    recipe.model = m_model;
    recipe.kv = m_kv;
    recipe.store = config.store.toStdString();
    recipe.rttMs = config.rttMs;
    recipe.question = m_question;
    recipe.continuation = m_continuation;
    recipe.profile = profile;
    recipe.transform = transform;
    if (!m_rig) m_rig = std::make_shared<StreamRig>();
    const std::shared_ptr<StreamRig> rig = m_rig;

    m_lane->start(tr("Stream: preparing…"), [this, firstRun, recipe, rig, config](JobControl& control) mutable -> std::function<void()> {
        QStringList policies = config.policies;
        if (policies.isEmpty()) policies << QStringLiteral("adaptive");
        std::vector<Policy> parsed;
        for (const QString& p : policies) parsed.push_back(parsePolicy(p.toStdString()));
        const int lanes = int(parsed.size());
        recipe.mode = lanes > 1 ? config.mode : StreamConfig::BackToBack;
        const LinkSchedule schedule = scheduleFor(config);
        rig->prepare(recipe, schedule, lanes, control);
        const RaceRecord race =
            LaneRace(this, control, *rig, config, policies, std::move(parsed), recipe.mode, schedule, firstRun).run();
        return [this, race] { emit raceFinished(race); };
    });
}

void StreamSession::stop()
{
    m_lane->cancel();
}

}  // namespace kvscope
