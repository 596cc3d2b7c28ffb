#include "stream_session.h"

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
#include <QMetaObject>
#include <QTemporaryDir>

#include <exception>

namespace kvscope {

namespace {

// Points of the available-rate curve: fine enough to show a trace's texture.
constexpr double kLinkStepSeconds = 0.02;

QString messageOf(std::exception_ptr error)
{
    try {
        std::rethrow_exception(error);
    } catch (const std::exception& e) {
        return QString::fromStdString(e.what());
    } catch (...) {
        return QObject::tr("stream: unexpected error");
    }
}

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
StreamChunkPoint chunkPoint(const ChunkEvent& e)
{
    StreamChunkPoint c;
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

LinkSeries availableSeries(const LinkSchedule& s, double seconds)
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

StreamSession::StreamSession(QObject* parent) : QObject(parent)
{
    m_pool.setMaxThreadCount(1);
}

StreamSession::~StreamSession()
{
    if (m_stop) *m_stop = true;
    m_pool.waitForDone();
    // The rig (server thread, streamer) goes with the last reference, after the worker is done.
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
    if (m_running || !isReady()) return;
    m_running = true;
    const quint64 mine = ++m_generation;
    m_stop = std::make_shared<std::atomic<bool>>(false);
    const std::shared_ptr<std::atomic<bool>> stop = m_stop;
    const int run = ++m_runs;
    const std::shared_ptr<const Model> model = m_model;
    const std::shared_ptr<const KvSet> kv = m_kv;
    const std::string question = m_question;
    if (!m_rig) m_rig = std::make_shared<Rig>();
    const std::shared_ptr<Rig> rig = m_rig;
    emit phaseChanged(tr("Stream lab: preparing run %1…").arg(run), 0);

    // Posts `f` to the UI thread unless this run was stopped or superseded meanwhile.
    auto post = [this, mine](std::function<void()> f) {
        QMetaObject::invokeMethod(
            this,
            [this, mine, f] {
                if (mine == m_generation) f();
            },
            Qt::QueuedConnection);
    };

    m_pool.start([this, post, stop, run, model, kv, question, rig, config, profile] {
        StreamRunResult out;
        QString error;
        try {
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
                    post([this] { emit phaseChanged(tr("Stream lab: encoding the cache (cachegen and int8)…"), 0); });
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
                ServerOptions so;
                so.link = schedule;
                so.rttSeconds = config.rttMs / 1000.0;
                rig->server = std::make_unique<ChunkServer>(std::shared_ptr<ChunkStore>(openStore(store)), so);
                rig->server->start();
                post([this] { emit phaseChanged(tr("Stream lab: reference answer from the original cache…"), 0); });
                rig->streamer = std::make_unique<Streamer>(*model, "127.0.0.1", rig->server->port(), kv->tokens,
                                                           model->questionTokens(question), *kv);
                rig->streamer->prepare(StreamOptions{}, "stream lab");
                rig->levels = rig->streamer->cachegen().params().numLevels();
                rig->key = key;
            }
            if (*stop) throw Error("stream: cancelled");
            rig->server->pacer().setSchedule(schedule);
            StreamOptions options;
            options.policy = parsePolicy(config.policy.toStdString());
            options.sloSeconds = config.sloSeconds;
            options.onChunk = [post, stop, this](const ChunkEvent& e) {
                const StreamChunkPoint c = chunkPoint(e);
                post([this, c] { emit chunkArrived(c); });
                return !*stop;
            };
            const LinkSeries available = availableSeries(schedule, std::max(2.0 * config.sloSeconds, 1.0));
            post([this, available, run] {
                emit phaseChanged(tr("Stream lab: run %1 streaming…").arg(run), 0);
                emit runStarted(available);
            });
            const StreamResult r = rig->streamer->run(options, &rig->server->pacer(), 0.0);
            out.run = run;
            out.policy = QString::fromStdString(r.policy);
            out.link = QString::fromStdString(schedule.describe()) +
                       (config.rttMs > 0 ? QStringLiteral(", RTT %1 ms").arg(config.rttMs) : QString());
            out.sloSeconds = r.sloSeconds;
            out.ttftSeconds = r.ttftSeconds;
            out.sloMet = r.sloMet;
            const TtftPart* parts[6] = {&r.transfer, &r.decode, &r.recompute, &r.kvLoad, &r.prefill, &r.firstToken};
            for (int i = 0; i < 6; ++i) out.parts[i] = parts[i]->seconds;
            for (const ChunkEvent& e : r.chunks) out.chunks.push_back(chunkPoint(e));
            out.deliveredBytes = r.deliveredBytes;
            out.capacityBytes = r.capacityBytes;
            out.tokenAgreement = r.tokenAgreement;
            out.text = QString::fromStdString(r.text);
            out.referenceText = QString::fromStdString(rig->streamer->referenceText());
            for (const std::string& line : r.log) out.log << QString::fromStdString(line);
        } catch (...) {
            error = messageOf(std::current_exception());
        }
        post([this, out, error] {
            m_running = false;
            m_stop.reset();
            if (error.isEmpty())
                emit runFinished(out);
            else
                emit failed(error);
        });
    });
}

void StreamSession::stop()
{
    if (!m_running) return;
    if (m_stop) *m_stop = true;
    ++m_generation;  // what the worker still reports is dropped
    m_running = false;
    m_stop.reset();
    emit cancelled();
}

}  // namespace kvscope
