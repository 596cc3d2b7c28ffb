#include "stream_rig.h"

#include "background_job.h"

#include "codec/container.h"
#include "codec/transform.h"
#include "eval/quality.h"
#include "model/model.h"
#include "transport/link.h"
#include "transport/protocol.h"
#include "transport/store.h"
#include "stream/streamer.h"

#include <QDir>
#include <QFile>
#include <QTemporaryDir>

#include <algorithm>

namespace kvscope {

std::string StreamRig::Recipe::key() const
{
    return std::to_string(reinterpret_cast<uintptr_t>(kv.get())) + "|" +
           std::to_string(reinterpret_cast<uintptr_t>(model.get())) + "|" + store + "|" + std::to_string(rttMs) + "|" +
           std::to_string(int(mode)) + "|" + question + "|" + continuation + "|" +
           (store.empty() ? profileToJson(transform ? *transform : profile) : std::string()) +
           (transform ? "|transform" : "|cachegen");
}

StreamRig::StreamRig() = default;
StreamRig::~StreamRig() = default;

bool StreamRig::alive() const
{
    for (const auto& s : servers)
        if (!s || s->dead()) return false;
    return !servers.empty();
}

ChunkServer& StreamRig::addServer(const LinkSchedule& schedule)
{
    ServerOptions so = serverOptions;
    so.link = schedule;
    servers.push_back(std::make_unique<ChunkServer>(std::shared_ptr<ChunkStore>(openStore(store)), so));
    servers.back()->start();
    return *servers.back();
}

Streamer& StreamRig::addStreamer(ChunkServer& server)
{
    streamers.push_back(std::make_unique<Streamer>(*model, "127.0.0.1", server.port(), kv->tokens, question, *kv));
    streamers.back()->setCodec(codec);
    if (!levelKl.empty()) streamers.back()->setLevelKl(levelKl);
    streamers.back()->prepare(StreamOptions{}, "stream lab");
    return *streamers.back();
}

void StreamRig::prepare(const Recipe& recipe, const LinkSchedule& schedule, int lanes, JobControl& control)
{
    const std::string want = recipe.key();
    if (key != want || !alive()) {
        rebuild(recipe, schedule, control);
        key = want;
    }
    // Servers and streamers this mode needs for this many lanes (kept for the next race).
    const StreamConfig::Mode mode = recipe.mode;
    const size_t needServers = mode == StreamConfig::AtOnce ? size_t(lanes) : 1;
    const size_t needStreamers = mode == StreamConfig::BackToBack ? 1 : size_t(lanes);
    while (servers.size() < needServers) {
        if (control.stopped()) throw Error("stream: cancelled");
        control.phase(QObject::tr("Stream: server %1 of %2…").arg(servers.size() + 1).arg(needServers));
        addServer(schedule);
    }
    while (streamers.size() < needStreamers) {
        if (control.stopped()) throw Error("stream: cancelled");
        const size_t i = streamers.size();
        control.phase(QObject::tr("Stream: client %1 of %2 (reference answer)…").arg(i + 1).arg(needStreamers));
        addStreamer(*servers[mode == StreamConfig::AtOnce ? i : 0]);
    }
    if (control.stopped()) throw Error("stream: cancelled");
}

// A fresh rig: the store (encoded now, or the user's), one server and one prepared streamer (its
// reference answer), and the quality reference.
void StreamRig::rebuild(const Recipe& recipe, const LinkSchedule& schedule, JobControl& control)
{
    streamers.clear();
    servers.clear();
    quality.reset();
    dir.reset();
    key.clear();
    model = recipe.model;
    kv = recipe.kv;
    // The transform ladder needs the keys' RoPE table to undo it; a cache without one
    // (written by another stack) streams CacheGen's levels.
    const std::shared_ptr<const CodecProfile>& transform = recipe.transform;
    const bool useTransform = transform && !(transform->transform.ropeUndo &&
                                             int(kv->ropeInvFreq.size()) != kv->shape().headDim / 2);
    codec = useTransform ? CodecId::Transform : CodecId::CacheGen;
    levelKl = useTransform ? measuredLevelKl(*transform, CodecId::Transform) : measuredLevelKl(recipe.profile, CodecId::CacheGen);
    if (recipe.store.empty()) {
        encodeStore(recipe, useTransform, control);
    } else {
        // The user's store: its transform encoding of this context when it holds one.
        store = recipe.store;
        const std::string want = contextKey(model->runtime().fingerprint(), kv->tokens) + ":" + codecName(CodecId::Transform);
        const std::vector<std::string> held = openStore(store)->contents();
        codec = std::find(held.begin(), held.end(), want) != held.end() ? CodecId::Transform : CodecId::CacheGen;
        if (codec != CodecId::Transform || !useTransform) levelKl.clear();
    }
    if (control.stopped()) throw Error("stream: cancelled");
    serverOptions = ServerOptions{};
    serverOptions.rttSeconds = recipe.rttMs / 1000.0;
    question = model->questionTokens(recipe.question);
    control.phase(QObject::tr("Stream: reference answer from the original cache…"));
    addStreamer(addServer(schedule));
    levels = streamers.front()->cachegen().params().numLevels();
    control.phase(QObject::tr("Stream: quality reference (KL, ΔPPL)…"));
    buildQuality(recipe);
}

// The cache encoded into a temporary folder: the level-coded encoding (the transform ladder, or
// cachegen with the profile's levels) and int8.
void StreamRig::encodeStore(const Recipe& recipe, bool useTransform, JobControl& control)
{
    const CodecProfile& profile = recipe.profile;
    control.phase(useTransform ? QObject::tr("Stream: encoding the cache (transform ladder and int8)…")
                               : QObject::tr("Stream: encoding the cache (cachegen and int8)…"));
    dir = std::make_unique<QTemporaryDir>(QDir::temp().filePath(QStringLiteral("kvscope-lab-XXXXXX")));
    if (!dir->isValid()) throw Error("stream lab: cannot create a temporary folder");
    CodecParams p;
    p.codec = codec;
    p.shape = kv->shape();
    p.dtype = kv->dtype();
    p.profile = useTransform ? *recipe.transform : profile;
    p.profile.numLayers = kv->shape().numLayers;
    if (useTransform) {
        prepareTransform(p, *kv, "the calibrated transform ladder");
    } else {
        p.profile.tables = TableMode::InBand;  // calibrated tables travel with profiles, not here
    }
    const std::string cg = QFile::encodeName(dir->filePath(useTransform ? QStringLiteral("context.transform.kvc")
                                                                        : QStringLiteral("context.cachegen.kvc")))
                               .toStdString();
    const std::string i8 = QFile::encodeName(dir->filePath(QStringLiteral("context.int8.kvc"))).toStdString();
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
}

// Scored on the context's held-out continuation when there is one, else on the question and the
// reference answer (as `kvscope-cli stream --quality kl`).
void StreamRig::buildQuality(const Recipe& recipe)
{
    EvalTask task;
    task.context = kv->tokens;
    if (!recipe.continuation.empty()) {
        task.continuation = model->tokenizer().encode(recipe.continuation, false);
        if (task.continuation.size() > 128) task.continuation.resize(128);
        qualitySource = "continuation text";
    } else {
        const Streamer& s = *streamers.front();
        task.continuation = question;
        task.continuation.insert(task.continuation.end(), s.referenceTokens().begin(), s.referenceTokens().end());
        qualitySource = "question + reference answer";
    }
    task.stopIds = model->stopIds();
    if (task.context.size() >= 2 && !task.continuation.empty())
        quality = std::make_unique<QualityReference>(model->runtime(), task, *kv);
}

}  // namespace kvscope
