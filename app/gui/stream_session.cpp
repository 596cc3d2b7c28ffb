#include "stream_session.h"

#include "background_job.h"

#include "codec/chunk_codec.h"
#include "codec/container.h"
#include "codec/transform.h"
#include "eval/quality.h"
#include "model/model.h"
#include "transport/link.h"
#include "transport/protocol.h"
#include "transport/server.h"
#include "transport/store.h"
#include "stream/streamer.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>

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

struct StreamSession::Rig {
    std::string key;  // what the rig was built for
    std::shared_ptr<const Model> model;
    std::shared_ptr<const KvSet> kv;
    std::unique_ptr<QTemporaryDir> dir;
    std::string store;  // what the servers serve
    ServerOptions serverOptions;
    // Back to back and shared link: one server; at once: one per lane.
    std::vector<std::unique_ptr<ChunkServer>> servers;
    // Back to back: one streamer; otherwise one per lane, streamers[i] on servers[i] (at once) or
    // on servers[0] (shared link).
    std::vector<std::unique_ptr<Streamer>> streamers;
    std::vector<int32_t> question;
    std::unique_ptr<QualityReference> quality;  // built once per rig, after the first prepare
    std::string qualitySource;
    int levels = 0;
    CodecId codec = CodecId::CacheGen;  // the level-coded encoding the streamers fetch
    std::vector<double> levelKl;        // its levels' measured KL for the planner (NaN: none)

    bool alive() const
    {
        for (const auto& s : servers)
            if (!s || s->dead()) return false;
        return !servers.empty();
    }
    ChunkServer& addServer(const LinkSchedule& schedule)
    {
        ServerOptions so = serverOptions;
        so.link = schedule;
        servers.push_back(std::make_unique<ChunkServer>(std::shared_ptr<ChunkStore>(openStore(store)), so));
        servers.back()->start();
        return *servers.back();
    }
    Streamer& addStreamer(ChunkServer& server)
    {
        streamers.push_back(
            std::make_unique<Streamer>(*model, "127.0.0.1", server.port(), kv->tokens, question, *kv));
        streamers.back()->setCodec(codec);
        if (!levelKl.empty()) streamers.back()->setLevelKl(levelKl);
        streamers.back()->prepare(StreamOptions{}, "stream lab");
        return *streamers.back();
    }
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

void StreamSession::start(const StreamConfig& config, const CodecProfile& profile, std::shared_ptr<const CodecProfile> transform)
{
    if (isRunning() || !isReady()) return;
    const int firstRun = m_runs + 1;
    m_runs += int(std::max<qsizetype>(1, config.policies.size()));
    const std::shared_ptr<const Model> model = m_model;
    const std::shared_ptr<const KvSet> kv = m_kv;
    const std::string question = m_question, continuation = m_continuation;
    if (!m_rig) m_rig = std::make_shared<Rig>();
    const std::shared_ptr<Rig> rig = m_rig;

    m_lane->start(tr("Stream: preparing…"), [this, firstRun, model, kv, question, continuation, rig, config,
                                               profile, transform](JobControl& control) -> std::function<void()> {
        QStringList policies = config.policies;
        if (policies.isEmpty()) policies << QStringLiteral("adaptive");
        std::vector<Policy> parsed;
        for (const QString& p : policies) parsed.push_back(parsePolicy(p.toStdString()));
        const int lanes = int(parsed.size());
        const StreamConfig::Mode mode = lanes > 1 ? config.mode : StreamConfig::BackToBack;
        const LinkSchedule schedule = scheduleFor(config);
        const std::string key = std::to_string(reinterpret_cast<uintptr_t>(kv.get())) + "|" +
                                std::to_string(reinterpret_cast<uintptr_t>(model.get())) + "|" +
                                config.store.toStdString() + "|" + std::to_string(config.rttMs) + "|" +
                                std::to_string(int(mode)) + "|" + question + "|" + continuation + "|" +
                                (config.store.isEmpty() ? profileToJson(transform ? *transform : profile) : std::string()) +
                                (transform ? "|transform" : "|cachegen");
        if (rig->key != key || !rig->alive()) {
            rig->streamers.clear();
            rig->servers.clear();
            rig->quality.reset();
            rig->dir.reset();
            rig->key.clear();
            rig->model = model;
            rig->kv = kv;
            // The transform ladder needs the keys' RoPE table to undo it; a cache without one
            // (written by another stack) streams CacheGen's levels.
            const bool useTransform = transform && !(transform->transform.ropeUndo &&
                                                     int(kv->ropeInvFreq.size()) != kv->shape().headDim / 2);
            rig->codec = useTransform ? CodecId::Transform : CodecId::CacheGen;
            rig->levelKl = useTransform ? measuredLevelKl(*transform, CodecId::Transform) : measuredLevelKl(profile, CodecId::CacheGen);
            std::string store = config.store.toStdString();
            if (store.empty()) {
                control.phase(useTransform ? tr("Stream: encoding the cache (transform ladder and int8)…")
                                           : tr("Stream: encoding the cache (cachegen and int8)…"));
                rig->dir = std::make_unique<QTemporaryDir>(QDir::temp().filePath(QStringLiteral("kvscope-lab-XXXXXX")));
                if (!rig->dir->isValid()) throw Error("stream lab: cannot create a temporary folder");
                CodecParams p;
                p.codec = rig->codec;
                p.shape = kv->shape();
                p.dtype = kv->dtype();
                p.profile = useTransform ? *transform : profile;
                p.profile.numLayers = kv->shape().numLayers;
                if (useTransform) {
                    prepareTransform(p, *kv, "the calibrated transform ladder");
                } else {
                    p.profile.tables = TableMode::InBand;  // calibrated tables travel with profiles, not here
                }
                const std::string cg = QFile::encodeName(rig->dir->filePath(
                                                             useTransform ? QStringLiteral("context.transform.kvc")
                                                                          : QStringLiteral("context.cachegen.kvc"))).toStdString();
                const std::string i8 = QFile::encodeName(rig->dir->filePath(QStringLiteral("context.int8.kvc"))).toStdString();
                writeKvc(*kv, p, cg);
                CodecParams q;
                q.codec = CodecId::Int8;
                q.shape = kv->shape();
                q.dtype = kv->dtype();
                q.profile = profile;
                q.profile.numLayers = kv->shape().numLayers;
                q.profile.chunkTokens = p.profile.chunkTokens;
                q.profile.tables = TableMode::InBand;
                writeKvc(*kv, q, i8);
                store = cg + "," + i8;
            } else {
                // The user's store: its transform encoding of this context when it holds one.
                const std::string want = contextKey(model->runtime().fingerprint(), kv->tokens) + ":" + codecName(CodecId::Transform);
                const std::vector<std::string> held = openStore(store)->contents();
                rig->codec = std::find(held.begin(), held.end(), want) != held.end() ? CodecId::Transform : CodecId::CacheGen;
                if (rig->codec != CodecId::Transform || !useTransform) rig->levelKl.clear();
            }
            if (control.stopped()) throw Error("stream: cancelled");
            rig->store = store;
            rig->serverOptions = ServerOptions{};
            rig->serverOptions.rttSeconds = config.rttMs / 1000.0;
            rig->question = model->questionTokens(question);
            control.phase(tr("Stream: reference answer from the original cache…"));
            rig->addStreamer(rig->addServer(schedule));
            rig->levels = rig->streamers.front()->cachegen().params().numLevels();
            control.phase(tr("Stream: quality reference (KL, ΔPPL)…"));
            EvalTask task;
            task.context = kv->tokens;
            if (!continuation.empty()) {
                task.continuation = model->tokenizer().encode(continuation, false);
                if (task.continuation.size() > 128) task.continuation.resize(128);
                rig->qualitySource = "continuation text";
            } else {
                const Streamer& s = *rig->streamers.front();
                task.continuation = rig->question;
                task.continuation.insert(task.continuation.end(), s.referenceTokens().begin(), s.referenceTokens().end());
                rig->qualitySource = "question + reference answer";
            }
            task.stopIds = model->stopIds();
            if (task.context.size() >= 2 && !task.continuation.empty())
                rig->quality = std::make_unique<QualityReference>(model->runtime(), task, *kv);
            rig->key = key;
        }
        // Servers and streamers this mode needs for this many lanes (kept for the next race).
        const size_t needServers = mode == StreamConfig::AtOnce ? size_t(lanes) : 1;
        const size_t needStreamers = mode == StreamConfig::BackToBack ? 1 : size_t(lanes);
        while (rig->servers.size() < needServers) {
            if (control.stopped()) throw Error("stream: cancelled");
            control.phase(tr("Stream: server %1 of %2…").arg(rig->servers.size() + 1).arg(needServers));
            rig->addServer(schedule);
        }
        while (rig->streamers.size() < needStreamers) {
            if (control.stopped()) throw Error("stream: cancelled");
            const size_t i = rig->streamers.size();
            control.phase(tr("Stream: client %1 of %2 (reference answer)…").arg(i + 1).arg(needStreamers));
            rig->addStreamer(*rig->servers[mode == StreamConfig::AtOnce ? i : 0]);
        }
        if (control.stopped()) throw Error("stream: cancelled");

        RaceRecord race;
        race.config = config;
        race.config.policies = policies;
        race.config.mode = mode;
        race.cache = QStringLiteral("%1 tokens of %2, %3 levels (%4)")
                         .arg(kv->shape().numTokens)
                         .arg(QString::fromStdString(kv->modelName))
                         .arg(rig->levels)
                         .arg(rig->codec == CodecId::Transform ? tr("transform ladder") : tr("CacheGen"));
        race.available = seriesOf(schedule, std::max(2.0 * config.sloSeconds, 1.0));
        race.qualitySource = QString::fromStdString(rig->qualitySource);
        control.post([this, policies, available = race.available] { emit raceStarted(policies, available); });
        const TargetHardware target = targetFor(config);
        const QString link = QString::fromStdString(schedule.describe()) +
                             (config.rttMs > 0 ? QStringLiteral(", RTT %1 ms").arg(config.rttMs) : QString()) +
                             (mode == StreamConfig::BackToBack ? QString() : QStringLiteral(", %1").arg(QLatin1String(modeName(mode))));
        const QString hardware = target.enabled() ? tr("modelled: %1 (prefill %2 tok/s, decode %3 GB/s)")
                                                        .arg(QString::fromStdString(target.name))
                                                        .arg(target.prefillTokensPerSecond, 0, 'f', 0)
                                                        .arg(target.decodeGBps, 0, 'g', 3)
                                                  : tr("measured on this machine");
        const double raceStart = monoSeconds();
        std::mutex qualityMutex;  // one quality pass at a time: they share the runtime's cores

        // One lane's run, on the thread that calls it; returns its result for the table.
        auto runLane = [&](int lane, LinkPacer* pacer) {
            Streamer& streamer = *rig->streamers[mode == StreamConfig::BackToBack ? 0 : size_t(lane)];
            StreamOptions options;
            options.policy = parsed[size_t(lane)];
            options.sloSeconds = config.sloSeconds;
            options.target = target;
            options.keepCache = rig->quality != nullptr;
            options.onChunk = [this, &control, lane](const ChunkEvent& e) {
                const StreamChunkPoint c = chunkPoint(e, lane);
                control.post([this, c] { emit chunkArrived(c); });
                return !control.stopped();
            };
            const double startS = monoSeconds() - raceStart;
            StreamResult r = streamer.run(options, pacer, 0.0);
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
            if (!pacer && mode == StreamConfig::SharedLink) {
                // One pacer for every lane: the link's capacity up to this lane's last arrival.
                double last = 0;
                for (const ChunkEvent& e : r.chunks) last = std::max(last, e.arrivedS);
                out.capacityBytes = schedule.capacityBytes(0, last);
                out.linkSeconds = last;
            }
            out.tokenAgreement = r.tokenAgreement;
            out.text = QString::fromStdString(r.text);
            out.referenceText = QString::fromStdString(streamer.referenceText());
            for (const std::string& line : r.log) out.log << QString::fromStdString(line);
            if (rig->quality && r.cache && !control.stopped()) {
                std::lock_guard<std::mutex> lock(qualityMutex);
                const Quality q = rig->quality->measure(*r.cache, false);
                out.hasQuality = true;
                out.kl = q.kl;
                out.deltaPplPct = q.deltaPplPct;
            }
            control.post([this, out] { emit runFinished(out); });
            return out;
        };

        std::vector<StreamRunResult> results(static_cast<size_t>(lanes));
        if (mode == StreamConfig::BackToBack) {
            for (int lane = 0; lane < lanes; ++lane) {
                control.phase(tr("Stream: %1 (%2 of %3)…").arg(policies[lane]).arg(lane + 1).arg(lanes), lanes);
                control.progress(lane, lanes);
                control.post([this, lane] { emit laneStarted(lane); });
                ChunkServer& server = *rig->servers.front();
                server.pacer().setSchedule(schedule);  // every lane sees the schedule from its start
                results[size_t(lane)] = runLane(lane, &server.pacer());
            }
        } else {
            control.phase(tr("Stream: %n policies %1…", nullptr, lanes).arg(QLatin1String(modeName(mode))), 0);
            for (size_t i = 0; i < needServers; ++i) rig->servers[i]->pacer().setSchedule(schedule);
            if (mode == StreamConfig::SharedLink) rig->servers.front()->pacer().reset(0.0);  // the lanes start now
            for (int lane = 0; lane < lanes; ++lane) control.post([this, lane] { emit laneStarted(lane); });
            std::vector<std::exception_ptr> errors(static_cast<size_t>(lanes));
            std::vector<std::thread> threads;
            for (int lane = 0; lane < lanes; ++lane) {
                LinkPacer* pacer = mode == StreamConfig::AtOnce ? &rig->servers[size_t(lane)]->pacer() : nullptr;
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
        race.results = results;
        control.progress(lanes, lanes);
        return [this, race] { emit raceFinished(race); };
    });
}

void StreamSession::stop()
{
    m_lane->cancel();
}

}  // namespace kvscope
