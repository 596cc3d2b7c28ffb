#include "race_file.h"

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSaveFile>

#include <cmath>

namespace kvscope {

namespace {

const char* const kRaceFormat = "kvscope-stream-run";
constexpr int kRaceVersion = 1;
constexpr int kMaxLanes = 64, kMaxChunks = 1 << 20;
constexpr qint64 kMaxFileBytes = qint64(256) << 20;

QJsonArray numbers(const std::vector<double>& v)
{
    QJsonArray a;
    for (double x : v) a.append(x);
    return a;
}

const char* const kModes[] = {"back_to_back", "at_once", "shared_link"};

QJsonObject configJson(const StreamConfig& c)
{
    static const char* const links[] = {"constant", "steps", "trace"};
    return {{"link", QLatin1String(links[int(c.link)])},
            {"mode", QLatin1String(kModes[int(c.mode)])},
            {"target_weight_pass_s", c.weightPassSeconds},
            {"rate", c.rate},
            {"trace", c.tracePath},
            {"trace_scale", c.traceScale},
            {"rtt_ms", c.rttMs},
            {"slo_s", c.sloSeconds},
            {"policies", QJsonArray::fromStringList(c.policies)},
            {"hardware", c.hardware},
            {"target_prefill_tok_s", c.prefillTokensPerSecond},
            {"target_decode_gb_s", c.decodeGBps},
            {"store", c.store}};
}

QJsonObject chunkJson(const StreamChunkPoint& c)
{
    return {{"index", c.index},         {"level", c.level},           {"local", c.local},
            {"bytes", double(c.bytes)}, {"sent_s", c.sentS},          {"first_byte_s", c.firstByteS},
            {"arrived_s", c.arrivedS},  {"job_start_s", c.jobStartS}, {"decoded_s", c.decodedS}};
}

QJsonObject resultJson(const StreamRunResult& r)
{
    QJsonObject parts;
    for (int i = 0; i < StreamRunResult::kParts; ++i) parts[QLatin1String(StreamRunResult::partName(i))] = r.parts[i];
    QJsonArray chunks;
    for (const StreamChunkPoint& c : r.chunks) chunks.append(chunkJson(c));
    QJsonArray modelled;
    for (int i = 0; i < StreamRunResult::kParts; ++i)
        if (r.partModelled[i]) modelled.append(QLatin1String(StreamRunResult::partName(i)));
    QJsonObject quality;
    if (r.hasQuality) quality = QJsonObject{{"kl", r.kl}, {"delta_ppl_pct", r.deltaPplPct}};
    return {{"run", r.run},
            {"modelled_parts", modelled},
            {"quality", r.hasQuality ? QJsonValue(quality) : QJsonValue()},
            {"lane", r.lane},
            {"policy", r.policy},
            {"link", r.link},
            {"hardware", r.hardware},
            {"modelled", r.modelled},
            {"slo_s", r.sloSeconds},
            {"ttft_s", r.ttftSeconds},
            {"slo_met", r.sloMet},
            {"start_s", r.startS},
            {"ttft_parts", parts},
            {"chunks", chunks},
            {"delivered_bytes", double(r.deliveredBytes)},
            {"capacity_bytes", r.capacityBytes},
            {"link_s", r.linkSeconds},
            {"token_agreement", r.tokenAgreement},
            {"text", r.text},
            {"reference_text", r.referenceText},
            {"log", QJsonArray::fromStringList(r.log)}};
}

// Reads fields with type checks; the first problem is kept, with its place.
struct Reader {
    QString file;
    QString error;
    bool ok() const { return error.isEmpty(); }
    void fail(const QString& place, const QString& reason)
    {
        if (error.isEmpty()) error = QStringLiteral("%1: %2: %3").arg(file, place, reason);
    }
    double number(const QJsonObject& o, const char* key, const QString& place, double lo = -1e300, double hi = 1e300)
    {
        const QJsonValue v = o.value(QLatin1String(key));
        if (v.isUndefined()) return 0;
        if (!v.isDouble() || !std::isfinite(v.toDouble()) || v.toDouble() < lo || v.toDouble() > hi) {
            fail(place + QLatin1Char('.') + QLatin1String(key), QStringLiteral("not a number in range"));
            return 0;
        }
        return v.toDouble();
    }
    QString string(const QJsonObject& o, const char* key, const QString& place)
    {
        const QJsonValue v = o.value(QLatin1String(key));
        if (v.isUndefined()) return {};
        if (!v.isString()) fail(place + QLatin1Char('.') + QLatin1String(key), QStringLiteral("not a string"));
        return v.toString();
    }
    QStringList strings(const QJsonObject& o, const char* key, const QString& place)
    {
        QStringList out;
        const QJsonValue v = o.value(QLatin1String(key));
        if (v.isUndefined()) return out;
        if (!v.isArray()) {
            fail(place + QLatin1Char('.') + QLatin1String(key), QStringLiteral("not an array"));
            return out;
        }
        for (const QJsonValue& s : v.toArray()) {
            if (!s.isString()) fail(place + QLatin1Char('.') + QLatin1String(key), QStringLiteral("not a string"));
            out << s.toString();
        }
        return out;
    }
    std::vector<double> doubles(const QJsonObject& o, const char* key, const QString& place)
    {
        std::vector<double> out;
        const QJsonValue v = o.value(QLatin1String(key));
        if (!v.isArray()) {
            if (!v.isUndefined()) fail(place + QLatin1Char('.') + QLatin1String(key), QStringLiteral("not an array"));
            return out;
        }
        for (const QJsonValue& x : v.toArray()) {
            if (!x.isDouble()) fail(place + QLatin1Char('.') + QLatin1String(key), QStringLiteral("not a number"));
            out.push_back(x.toDouble());
        }
        return out;
    }
};

StreamConfig configFromJson(Reader& rd, const QJsonObject& o)
{
    StreamConfig out;
    const QString link = rd.string(o, "link", QStringLiteral("config"));
    out.link = link == QLatin1String("trace")   ? StreamConfig::Trace
               : link == QLatin1String("steps") ? StreamConfig::Steps
                                                : StreamConfig::Constant;
    const QString mode = rd.string(o, "mode", QStringLiteral("config"));
    out.mode = StreamConfig::BackToBack;
    for (int m = 0; m < 3; ++m)
        if (mode == QLatin1String(kModes[m])) out.mode = StreamConfig::Mode(m);
    if (!mode.isEmpty() && out.mode == StreamConfig::BackToBack && mode != QLatin1String(kModes[0]))
        rd.fail(QStringLiteral("config.mode"), QStringLiteral("'%1' is not back_to_back, at_once or shared_link").arg(mode));
    // Older races named the same figure (one read of the weights) "target_first_token_s".
    out.weightPassSeconds = -1.0;
    for (const char* key : {"target_weight_pass_s", "target_first_token_s"})
        if (o.contains(QLatin1String(key))) {
            out.weightPassSeconds = rd.number(o, key, QStringLiteral("config"), -1, 1e6);
            break;
        }
    out.rate = rd.string(o, "rate", QStringLiteral("config"));
    out.tracePath = rd.string(o, "trace", QStringLiteral("config"));
    out.traceScale = rd.number(o, "trace_scale", QStringLiteral("config"), 0, 1e6);
    out.rttMs = rd.number(o, "rtt_ms", QStringLiteral("config"), 0, 1e6);
    out.sloSeconds = rd.number(o, "slo_s", QStringLiteral("config"), 0, 1e6);
    out.policies = rd.strings(o, "policies", QStringLiteral("config"));
    out.hardware = rd.string(o, "hardware", QStringLiteral("config"));
    out.prefillTokensPerSecond = rd.number(o, "target_prefill_tok_s", QStringLiteral("config"), 0, 1e12);
    out.decodeGBps = rd.number(o, "target_decode_gb_s", QStringLiteral("config"), 0, 1e9);
    out.store = rd.string(o, "store", QStringLiteral("config"));
    return out;
}

StreamRunResult resultFromJson(Reader& rd, const QJsonObject& o, int i, const QString& place)
{
    StreamRunResult r;
    r.run = int(rd.number(o, "run", place, 0, 1e9));
    r.lane = i;
    r.policy = rd.string(o, "policy", place);
    r.link = rd.string(o, "link", place);
    r.hardware = rd.string(o, "hardware", place);
    r.modelled = o.value(QLatin1String("modelled")).toBool();
    r.sloSeconds = rd.number(o, "slo_s", place, 0, 1e6);
    r.ttftSeconds = rd.number(o, "ttft_s", place, 0, 1e6);
    r.sloMet = o.value(QLatin1String("slo_met")).toBool();
    r.startS = rd.number(o, "start_s", place, 0, 1e6);
    const QJsonObject parts = o.value(QLatin1String("ttft_parts")).toObject();
    for (int p = 0; p < StreamRunResult::kParts; ++p)
        r.parts[p] = rd.number(parts, StreamRunResult::partName(p), place + QStringLiteral(".ttft_parts"), 0, 1e6);
    const QJsonArray chunks = o.value(QLatin1String("chunks")).toArray();
    if (chunks.size() > kMaxChunks) rd.fail(place + QStringLiteral(".chunks"), QStringLiteral("too many chunks"));
    for (int k = 0; k < chunks.size() && rd.ok() && k < kMaxChunks; ++k) {
        const QJsonObject ch = chunks[k].toObject();
        const QString cp = QStringLiteral("%1.chunks[%2]").arg(place).arg(k);
        StreamChunkPoint p;
        p.lane = i;
        p.index = int(rd.number(ch, "index", cp, 0, kMaxChunks));
        p.level = int(rd.number(ch, "level", cp, 0, 255));
        p.local = ch.value(QLatin1String("local")).toBool();
        p.bytes = quint64(rd.number(ch, "bytes", cp, 0, 1e15));
        p.sentS = rd.number(ch, "sent_s", cp, 0, 1e6);
        p.firstByteS = rd.number(ch, "first_byte_s", cp, 0, 1e6);
        p.arrivedS = rd.number(ch, "arrived_s", cp, 0, 1e6);
        p.jobStartS = rd.number(ch, "job_start_s", cp, 0, 1e6);
        p.decodedS = rd.number(ch, "decoded_s", cp, 0, 1e6);
        r.chunks.push_back(p);
    }
    r.deliveredBytes = quint64(rd.number(o, "delivered_bytes", place, 0, 1e15));
    r.capacityBytes = rd.number(o, "capacity_bytes", place, 0, 1e18);
    r.linkSeconds = rd.number(o, "link_s", place, 0, 1e6);
    r.tokenAgreement = rd.number(o, "token_agreement", place, 0, 1);
    r.text = rd.string(o, "text", place);
    r.referenceText = rd.string(o, "reference_text", place);
    r.log = rd.strings(o, "log", place);
    for (const QString& part : rd.strings(o, "modelled_parts", place)) {
        bool known = false;
        for (int p = 0; p < StreamRunResult::kParts; ++p)
            if (part == QLatin1String(StreamRunResult::partName(p))) r.partModelled[p] = known = true;
        if (!known) rd.fail(place + QStringLiteral(".modelled_parts"), QStringLiteral("'%1' is not a TTFT part").arg(part));
    }
    const QJsonValue q = o.value(QLatin1String("quality"));
    if (q.isObject()) {
        r.hasQuality = true;
        r.kl = rd.number(q.toObject(), "kl", place + QStringLiteral(".quality"), 0, 1e6);
        r.deltaPplPct = rd.number(q.toObject(), "delta_ppl_pct", place + QStringLiteral(".quality"), -100, 1e9);
    } else if (!q.isUndefined() && !q.isNull()) {
        rd.fail(place + QStringLiteral(".quality"), QStringLiteral("not an object"));
    }
    return r;
}

}  // namespace

QByteArray raceToJson(const RaceRecord& race)
{
    QJsonArray results;
    for (const StreamRunResult& r : race.results) results.append(resultJson(r));
    const QJsonObject root{{"format", QLatin1String(kRaceFormat)},
                           {"version", kRaceVersion},
                           {"cache", race.cache},
                           {"quality_source", race.qualitySource},
                           {"config", configJson(race.config)},
                           {"available", QJsonObject{{"seconds", numbers(race.available.seconds)},
                                                     {"mbps", numbers(race.available.mbps)}}},
                           {"results", results}};
    return QJsonDocument(root).toJson(QJsonDocument::Indented);
}

bool raceFromJson(const QByteArray& json, const QString& file, RaceRecord* out, QString* error)
{
    QJsonParseError parse;
    const QJsonDocument doc = QJsonDocument::fromJson(json, &parse);
    auto failWith = [&](const QString& text) {
        if (error) *error = text;
        return false;
    };
    if (parse.error != QJsonParseError::NoError)
        return failWith(QStringLiteral("%1: offset %2: %3").arg(file).arg(parse.offset).arg(parse.errorString()));
    if (!doc.isObject()) return failWith(QStringLiteral("%1: top level: not a JSON object").arg(file));
    const QJsonObject root = doc.object();
    if (root.value(QLatin1String("format")).toString() != QLatin1String(kRaceFormat))
        return failWith(QStringLiteral("%1: format: not a kvscope stream run").arg(file));
    if (root.value(QLatin1String("version")).toInt(-1) != kRaceVersion)
        return failWith(QStringLiteral("%1: version: unsupported (this build reads %2)").arg(file).arg(kRaceVersion));
    Reader rd{file, {}};
    RaceRecord race;
    race.cache = rd.string(root, "cache", QStringLiteral("cache"));
    race.qualitySource = rd.string(root, "quality_source", QStringLiteral("quality_source"));
    race.config = configFromJson(rd, root.value(QLatin1String("config")).toObject());
    const QJsonObject av = root.value(QLatin1String("available")).toObject();
    race.available.seconds = rd.doubles(av, "seconds", QStringLiteral("available"));
    race.available.mbps = rd.doubles(av, "mbps", QStringLiteral("available"));
    if (race.available.seconds.size() != race.available.mbps.size())
        rd.fail(QStringLiteral("available"), QStringLiteral("seconds and mbps differ in length"));
    const QJsonValue results = root.value(QLatin1String("results"));
    if (!results.isArray()) rd.fail(QStringLiteral("results"), QStringLiteral("not an array"));
    const QJsonArray list = results.toArray();
    if (list.size() > kMaxLanes) rd.fail(QStringLiteral("results"), QStringLiteral("more than %1 runs").arg(kMaxLanes));
    for (int i = 0; i < list.size() && rd.ok() && i < kMaxLanes; ++i) {
        const QString place = QStringLiteral("results[%1]").arg(i);
        if (!list[i].isObject()) {
            rd.fail(place, QStringLiteral("not an object"));
            break;
        }
        race.results.push_back(resultFromJson(rd, list[i].toObject(), i, place));
    }
    if (!rd.ok()) return failWith(rd.error);
    *out = race;
    return true;
}

bool saveRaceFile(const QString& path, const RaceRecord& race, QString* error)
{
    QSaveFile file(path);
    if (!file.open(QIODevice::WriteOnly) || file.write(raceToJson(race)) < 0 || !file.commit()) {
        if (error) *error = QStringLiteral("%1: %2").arg(path, file.errorString());
        return false;
    }
    return true;
}

bool loadRaceFile(const QString& path, RaceRecord* race, QString* error)
{
    QFile file(path);
    if (!file.open(QIODevice::ReadOnly)) {
        if (error) *error = QStringLiteral("%1: %2").arg(path, file.errorString());
        return false;
    }
    if (file.size() > kMaxFileBytes) {
        if (error) *error = QStringLiteral("%1: size: larger than 256 MiB").arg(path);
        return false;
    }
    return raceFromJson(file.readAll(), path, race, error);
}

bool isRaceFile(const QString& path)
{
    QFile file(path);
    if (!file.open(QIODevice::ReadOnly) || file.size() > kMaxFileBytes) return false;
    // The writer sorts keys, so "format" can sit after the arrays: look at the parsed object.
    const QJsonDocument doc = QJsonDocument::fromJson(file.readAll());
    return doc.isObject() && doc.object().value(QLatin1String("format")).toString() == QLatin1String(kRaceFormat);
}

}  // namespace kvscope
