#include "stream_session.h"

#include "background_job.h"

#include "codec/chunk_codec.h"
#include "codec/container.h"
#include "model/model.h"
#include "stream/link.h"
#include "stream/server.h"
#include "stream/store.h"
#include "stream/streamer.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>

#include <algorithm>

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

struct StreamSession::Rig {
    std::string key;  // what the rig was built for
    std::shared_ptr<const Model> model;
    std::shared_ptr<const KvSet> kv;
    std::unique_ptr<QTemporaryDir> dir;
    std::unique_ptr<ChunkServer> server;
    std::unique_ptr<Streamer> streamer;
    int levels = 0;
};

StreamSession::StreamSession(QObject* parent) : QObject(parent), m_lane(new JobLane(tr("stream"), this))
{
    connect(m_lane, &JobLane::phaseChanged, this, &StreamSession::phaseChanged);
    connect(m_lane, &JobLane::progressChanged, this, &StreamSession::progressChanged);
    connect(m_lane, &JobLane::failed, this, &StreamSession::failed);
    connect(m_lane, &JobLane::cancelled, this, &StreamSession::cancelled);
}

StreamSession::~StreamSession()
{
    delete m_lane;  // stops and waits; the rig (server thread, streamer) goes with its last reference
}

bool StreamSession::isRunning() const
{
    return m_lane->isBusy();
}

LinkSeries StreamSession::availableSeries(const StreamConfig& config, double seconds)
{
    return seriesOf(scheduleFor(config), seconds);
}

void StreamSession::setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv,
                              const QString& question)
{
    stop();
    m_model = std::move(model);
    m_kv = std::move(kv);
    m_question = question.isEmpty() ? "Summarize the text above in one sentence." : question.toStdString();
}

void StreamSession::start(const StreamConfig& config, const CodecProfile& profile)
{
    if (isRunning() || !isReady()) return;
    const int firstRun = m_runs + 1;
    m_runs += int(std::max<qsizetype>(1, config.policies.size()));
    const std::shared_ptr<const Model> model = m_model;
    const std::shared_ptr<const KvSet> kv = m_kv;
    const std::string question = m_question;
    if (!m_rig) m_rig = std::make_shared<Rig>();
    const std::shared_ptr<Rig> rig = m_rig;

    m_lane->start(tr("Stream: preparing…"), [this, firstRun, model, kv, question, rig, config,
                                               profile](JobControl& control) -> std::function<void()> {
        QStringList policies = config.policies;
        if (policies.isEmpty()) policies << QStringLiteral("adaptive");
        std::vector<Policy> parsed;
        for (const QString& p : policies) parsed.push_back(parsePolicy(p.toStdString()));
        const LinkSchedule schedule = scheduleFor(config);
        const std::string key = std::to_string(reinterpret_cast<uintptr_t>(kv.get())) + "|" +
                                std::to_string(reinterpret_cast<uintptr_t>(model.get())) + "|" +
                                config.store.toStdString() + "|" + std::to_string(config.rttMs) + "|" +
                                (config.store.isEmpty() ? profileToJson(profile) : std::string());
        if (rig->key != key || !rig->server || rig->server->dead()) {
            rig->streamer.reset();
            rig->server.reset();
            rig->dir.reset();
            rig->key.clear();
            rig->model = model;
            rig->kv = kv;
            std::string store = config.store.toStdString();
            if (store.empty()) {
                control.phase(tr("Stream: encoding the cache (cachegen and int8)…"));
                rig->dir = std::make_unique<QTemporaryDir>(QDir::temp().filePath(QStringLiteral("kvscope-lab-XXXXXX")));
                if (!rig->dir->isValid()) throw Error("stream lab: cannot create a temporary folder");
                CodecParams p;
                p.codec = CodecId::CacheGen;
                p.shape = kv->shape();
                p.dtype = kv->dtype();
                p.profile = profile;
                p.profile.numLayers = kv->shape().numLayers;
                p.profile.tables = TableMode::InBand;  // calibrated tables travel with profiles, not here
                const std::string cg = QFile::encodeName(rig->dir->filePath(QStringLiteral("context.cachegen.kvc"))).toStdString();
                const std::string i8 = QFile::encodeName(rig->dir->filePath(QStringLiteral("context.int8.kvc"))).toStdString();
                writeKvc(*kv, p, cg);
                CodecParams q = p;
                q.codec = CodecId::Int8;
                writeKvc(*kv, q, i8);
                store = cg + "," + i8;
            }
            if (control.stopped()) throw Error("stream: cancelled");
            ServerOptions so;
            so.link = schedule;
            so.rttSeconds = config.rttMs / 1000.0;
            rig->server = std::make_unique<ChunkServer>(std::shared_ptr<ChunkStore>(openStore(store)), so);
            rig->server->start();
            control.phase(tr("Stream: reference answer from the original cache…"));
            rig->streamer = std::make_unique<Streamer>(*model, "127.0.0.1", rig->server->port(), kv->tokens,
                                                       model->questionTokens(question), *kv);
            rig->streamer->prepare(StreamOptions{}, "stream lab");
            rig->levels = rig->streamer->cachegen().params().numLevels();
            rig->key = key;
        }
        if (control.stopped()) throw Error("stream: cancelled");

        RaceRecord race;
        race.config = config;
        race.config.policies = policies;
        race.cache = QStringLiteral("%1 tokens of %2").arg(kv->shape().numTokens).arg(QString::fromStdString(kv->modelName));
        race.available = seriesOf(schedule, std::max(2.0 * config.sloSeconds, 1.0));
        control.post([this, policies, available = race.available] { emit raceStarted(policies, available); });
        TargetHardware target;
        target.prefillTokensPerSecond = config.prefillTokensPerSecond;
        target.decodeGBps = config.decodeGBps;
        const QString link = QString::fromStdString(schedule.describe()) +
                             (config.rttMs > 0 ? QStringLiteral(", RTT %1 ms").arg(config.rttMs) : QString());
        const QString hardware =
            target.enabled() ? tr("modelled: prefill %1 tok/s, decode %2 GB/s")
                                   .arg(config.prefillTokensPerSecond, 0, 'f', 0)
                                   .arg(config.decodeGBps, 0, 'g', 3)
                             : tr("measured on this machine");
        for (int lane = 0; lane < int(parsed.size()); ++lane) {
            control.phase(tr("Stream: %1 (%2 of %3)…").arg(policies[lane]).arg(lane + 1).arg(parsed.size()),
                          int(parsed.size()));
            control.progress(lane, int(parsed.size()));
            control.post([this, lane] { emit laneStarted(lane); });
            rig->server->pacer().setSchedule(schedule);  // every lane sees the schedule from its start
            StreamOptions options;
            options.policy = parsed[size_t(lane)];
            options.sloSeconds = config.sloSeconds;
            options.target = target;
            options.onChunk = [this, &control, lane](const ChunkEvent& e) {
                const StreamChunkPoint c = chunkPoint(e, lane);
                control.post([this, c] { emit chunkArrived(c); });
                return !control.stopped();
            };
            const StreamResult r = rig->streamer->run(options, &rig->server->pacer(), 0.0);
            StreamRunResult out;
            out.run = firstRun + lane;
            out.lane = lane;
            out.policy = QString::fromStdString(r.policy);
            out.link = link;
            out.hardware = hardware;
            out.modelled = target.enabled();
            out.sloSeconds = r.sloSeconds;
            out.ttftSeconds = r.ttftSeconds;
            out.sloMet = r.sloMet;
            const TtftPart* parts[StreamRunResult::kParts] = {&r.transfer, &r.decode,  &r.recompute,
                                                              &r.kvLoad,   &r.prefill, &r.firstToken};
            for (int i = 0; i < StreamRunResult::kParts; ++i) out.parts[i] = parts[i]->seconds;
            for (const ChunkEvent& e : r.chunks) out.chunks.push_back(chunkPoint(e, lane));
            out.deliveredBytes = r.deliveredBytes;
            out.capacityBytes = r.capacityBytes;
            out.linkSeconds = r.linkSeconds;
            out.tokenAgreement = r.tokenAgreement;
            out.text = QString::fromStdString(r.text);
            out.referenceText = QString::fromStdString(rig->streamer->referenceText());
            for (const std::string& line : r.log) out.log << QString::fromStdString(line);
            race.results.push_back(out);
            control.post([this, out] { emit runFinished(out); });
        }
        control.progress(int(parsed.size()), int(parsed.size()));
        return [this, race] { emit raceFinished(race); };
    });
}

void StreamSession::stop()
{
    m_lane->cancel();
}

}  // namespace kvscope
