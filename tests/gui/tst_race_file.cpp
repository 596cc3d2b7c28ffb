// The stream race file ({"format": "kvscope-stream-run", "version": 1}) without a model: a race
// written by the code before issue 35 moved the format out of the Stream page's widget
// (tests/gui/data/race_v1.json) reads back field by field and writes back byte for byte, the
// same race built here writes those bytes, an older key still reads, and bad files give one-line
// errors that name the file and the place.
#include "gui_testmain.h"

#include "race_file.h"

#include <QFile>
#include <QTemporaryDir>

namespace {

const QString kGolden = QStringLiteral(KVSCOPE_SOURCE_DIR "/tests/gui/data/race_v1.json");

QByteArray readAll(const QString& path)
{
    QFile f(path);
    return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

kvscope::StreamChunkPoint chunk(int lane, int index, int level, bool local, quint64 bytes, double sent, double arrived,
                                double jobStart, double decoded)
{
    kvscope::StreamChunkPoint c;
    c.lane = lane;
    c.index = index;
    c.level = level;
    c.local = local;
    c.bytes = bytes;
    c.sentS = sent;
    c.firstByteS = sent + 0.0125;
    c.arrivedS = arrived;
    c.jobStartS = jobStart;
    c.decodedS = decoded;
    return c;
}

// Two lanes of a race at once on a drawn schedule, modelled on a preset: one with quality and a
// recomputed chunk, one text lane without quality; fractions that do not print short.
kvscope::RaceRecord sampleRace()
{
    kvscope::RaceRecord race;
    race.cache = QStringLiteral("978 tokens of SmolLM2-135M-Instruct");
    race.qualitySource = QStringLiteral("continuation text");
    kvscope::StreamConfig& c = race.config;
    c.link = kvscope::StreamConfig::Steps;
    c.mode = kvscope::StreamConfig::AtOnce;
    c.rate = QStringLiteral("40Mbit:0.3,4Mbit:0.4,40Mbit");
    c.tracePath = QStringLiteral("/traces/lte é.down");
    c.traceScale = 0.5;
    c.rttMs = 20;
    c.sloSeconds = 1.0 / 3.0;
    c.policies = {QStringLiteral("adaptive"), QStringLiteral("text")};
    c.hardware = QStringLiteral("a100-7b");
    c.prefillTokensPerSecond = 12000;
    c.decodeGBps = 1555.5;
    c.weightPassSeconds = 0.1 + 0.2;
    c.store = QStringLiteral("redis://localhost:6379/kv");
    race.available.seconds = {0, 0.3, 0.7, 1.0 + 1.0 / 3.0};
    race.available.mbps = {40, 4, 40, 40};

    kvscope::StreamRunResult a;
    a.run = 7;
    a.lane = 0;
    a.policy = QStringLiteral("adaptive");
    a.link = QStringLiteral("steps 40Mbit:0.3,4Mbit:0.4,40Mbit");
    a.hardware = QStringLiteral("A100 (modelled)");
    a.modelled = true;
    a.sloSeconds = c.sloSeconds;
    a.ttftSeconds = 0.28125;
    a.sloMet = true;
    a.startS = 0;
    const double parts[kvscope::StreamRunResult::kParts] = {0.2, 0.01, 0.03, 0.001, 0.0395, 0.00025};
    for (int i = 0; i < kvscope::StreamRunResult::kParts; ++i) a.parts[i] = parts[i];
    a.partModelled[1] = a.partModelled[2] = a.partModelled[4] = a.partModelled[5] = true;
    a.chunks = {chunk(0, 0, 3, false, 123456, 0.0, 0.05, 0.05, 0.06), chunk(0, 1, 1, false, 40000, 0.05, 0.17, 0.17, 0.18),
                chunk(0, 2, 0, true, 0, 0.17, 0.2, 0.2, 0.23)};
    a.deliveredBytes = 163456;
    a.capacityBytes = 1.5e6;
    a.linkSeconds = 0.2;
    a.tokenAgreement = 0.875;
    a.hasQuality = true;
    a.kl = 0.0123456789;
    a.deltaPplPct = -1.25;
    a.text = QStringLiteral("Lily liked to play \"tag\".\nΔ");
    a.referenceText = QStringLiteral("Lily liked to play.");
    a.log = {QStringLiteral("chunk 0: level 3"), QStringLiteral("chunk 2: fetch failed, recomputed")};

    kvscope::StreamRunResult t;
    t.run = 8;
    t.lane = 1;
    t.policy = QStringLiteral("text");
    t.link = a.link;
    t.hardware = a.hardware;
    t.modelled = true;
    t.sloSeconds = c.sloSeconds;
    t.ttftSeconds = 0.5;
    t.sloMet = false;
    t.startS = 0.001;
    t.parts[2] = 0.45;
    t.parts[5] = 0.05;
    t.partModelled[2] = true;
    t.chunks = {chunk(1, 0, 0, false, 0, 0, 0.001, 0.001, 0.3), chunk(1, 1, 0, false, 0, 0, 0.002, 0.3, 0.45)};
    t.tokenAgreement = 1;
    t.text = QStringLiteral("Lily liked to play.");
    t.referenceText = t.text;
    race.results = {a, t};
    return race;
}

}  // namespace

class TestRaceFile : public QObject {
    Q_OBJECT
private slots:
    void writesTheSavedBytes();
    void readsTheSavedFile();
    void readsTheOlderWeightPassKey();
    void badFilesName_data();
    void badFilesName();
};

void TestRaceFile::writesTheSavedBytes()
{
    const QByteArray golden = readAll(kGolden);
    QVERIFY2(!golden.isEmpty(), qPrintable(kGolden));
    QCOMPARE(kvscope::raceToJson(sampleRace()), golden);
}

void TestRaceFile::readsTheSavedFile()
{
    const QByteArray golden = readAll(kGolden);
    kvscope::RaceRecord race;
    QString error;
    QVERIFY2(kvscope::raceFromJson(golden, kGolden, &race, &error), qPrintable(error));
    const kvscope::RaceRecord want = sampleRace();
    QCOMPARE(race.cache, want.cache);
    QCOMPARE(race.qualitySource, want.qualitySource);
    QCOMPARE(race.config.link, want.config.link);
    QCOMPARE(race.config.mode, want.config.mode);
    QCOMPARE(race.config.rate, want.config.rate);
    QCOMPARE(race.config.tracePath, want.config.tracePath);
    QCOMPARE(race.config.sloSeconds, want.config.sloSeconds);
    QCOMPARE(race.config.policies, want.config.policies);
    QCOMPARE(race.config.weightPassSeconds, want.config.weightPassSeconds);
    QCOMPARE(race.config.decodeGBps, want.config.decodeGBps);
    QCOMPARE(race.config.store, want.config.store);
    QCOMPARE(race.available.seconds, want.available.seconds);
    QCOMPARE(race.available.mbps, want.available.mbps);
    QCOMPARE(race.results.size(), want.results.size());
    for (size_t i = 0; i < want.results.size(); ++i) {
        const kvscope::StreamRunResult& r = race.results[i];
        const kvscope::StreamRunResult& w = want.results[i];
        QCOMPARE(r.run, w.run);
        QCOMPARE(r.lane, int(i));
        QCOMPARE(r.policy, w.policy);
        QCOMPARE(r.sloMet, w.sloMet);
        QCOMPARE(r.ttftSeconds, w.ttftSeconds);
        for (int p = 0; p < kvscope::StreamRunResult::kParts; ++p) {
            QCOMPARE(r.parts[p], w.parts[p]);
            QCOMPARE(r.partModelled[p], w.partModelled[p]);
        }
        QCOMPARE(r.chunks.size(), w.chunks.size());
        for (size_t k = 0; k < w.chunks.size(); ++k) {
            QCOMPARE(r.chunks[k].lane, int(i));
            QCOMPARE(r.chunks[k].level, w.chunks[k].level);
            QCOMPARE(r.chunks[k].local, w.chunks[k].local);
            QCOMPARE(r.chunks[k].bytes, w.chunks[k].bytes);
            QCOMPARE(r.chunks[k].firstByteS, w.chunks[k].firstByteS);
            QCOMPARE(r.chunks[k].decodedS, w.chunks[k].decodedS);
        }
        QCOMPARE(r.hasQuality, w.hasQuality);
        QCOMPARE(r.kl, w.kl);
        QCOMPARE(r.deltaPplPct, w.deltaPplPct);
        QCOMPARE(r.text, w.text);
        QCOMPARE(r.log, w.log);
    }
    // Read and written again: the same bytes.
    QCOMPARE(kvscope::raceToJson(race), golden);
}

void TestRaceFile::readsTheOlderWeightPassKey()
{
    // Races before the weight pass was named so kept it as "target_first_token_s".
    QByteArray older = readAll(kGolden);
    QVERIFY(older.contains("\"target_weight_pass_s\""));
    older.replace("\"target_weight_pass_s\"", "\"target_first_token_s\"");
    kvscope::RaceRecord race;
    QString error;
    QVERIFY2(kvscope::raceFromJson(older, kGolden, &race, &error), qPrintable(error));
    QCOMPARE(race.config.weightPassSeconds, sampleRace().config.weightPassSeconds);
}

void TestRaceFile::badFilesName_data()
{
    QTest::addColumn<QByteArray>("from");  // replaced in the saved file; empty: the whole file
    QTest::addColumn<QByteArray>("to");
    QTest::addColumn<QString>("place");
    QTest::newRow("truncated") << QByteArray() << QByteArray("{\"format\": \"kvscope-stream-run\", \"vers")
                               << QStringLiteral("offset");
    QTest::newRow("a profile") << QByteArray() << QByteArray("{\"format\": \"kvscope-profile\", \"version\": 1}")
                               << QStringLiteral("format");
    QTest::newRow("future version") << QByteArray("\"version\": 1") << QByteArray("\"version\": 9")
                                    << QStringLiteral("version");
    QTest::newRow("unknown mode") << QByteArray("\"at_once\"") << QByteArray("\"sideways\"")
                                  << QStringLiteral("config.mode");
    QTest::newRow("unknown part") << QByteArray("\"modelled_parts\": [\n                \"recompute\"")
                                  << QByteArray("\"modelled_parts\": [\n                \"teleport\"")
                                  << QStringLiteral("results[1].modelled_parts");
    QTest::newRow("level out of range") << QByteArray("\"level\": 3") << QByteArray("\"level\": 300")
                                        << QStringLiteral("results[0].chunks[0].level");
    QTest::newRow("text not a string") << QByteArray("\"text\": \"Lily liked to play.\"") << QByteArray("\"text\": 5")
                                       << QStringLiteral("results[1].text");
    QTest::newRow("lengths differ") << QByteArray("\"mbps\": [\n            40,") << QByteArray("\"mbps\": [")
                                    << QStringLiteral("available");
}

void TestRaceFile::badFilesName()
{
    QFETCH(QByteArray, from);
    QFETCH(QByteArray, to);
    QFETCH(QString, place);
    QByteArray text = to;
    if (!from.isEmpty()) {
        text = readAll(kGolden);
        QVERIFY2(text.contains(from), from.constData());
        text.replace(from, to);
    }
    kvscope::RaceRecord race;
    QString error;
    const QString file = QStringLiteral("bad-race.json");
    QVERIFY(!kvscope::raceFromJson(text, file, &race, &error));
    QVERIFY2(error.startsWith(file + QStringLiteral(": ")) && error.contains(place) && !error.contains(QLatin1Char('\n')),
             qPrintable(error));
}

KVSCOPE_GUI_TEST_MAIN(TestRaceFile)
#include "tst_race_file.moc"
