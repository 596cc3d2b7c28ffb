// Codec profiles (core/codec/profile.h): CacheGen's default layer groups, the JSON form and its
// two bins notations, errors that name the file and the field, and atomic saves.
#include "testmain.h"

#include "codec/profile.h"
#include "common/error.h"

#include <QDir>
#include <QFile>
#include <QJsonDocument>
#include <QTemporaryDir>

#include <string>
#include <vector>

using namespace kvscope;

namespace {

// bins for layers [0, n): `first` below `split`, `rest` from it on.
std::vector<int> split2(int n, int split, int first, int rest)
{
    std::vector<int> v(size_t(n), rest);
    for (int l = 0; l < split && l < n; ++l) v[size_t(l)] = first;
    return v;
}

QString binsText(const std::vector<int>& v)
{
    QStringList s;
    for (int b : v) s << QString::number(b);
    return s.join(',');
}

void compareProfiles(const CodecProfile& a, const CodecProfile& b)
{
    QCOMPARE(a.modelFingerprint, b.modelFingerprint);
    QCOMPARE(a.numLayers, b.numLayers);
    QCOMPARE(a.chunkTokens, b.chunkTokens);
    QCOMPARE(a.deltaGroup, b.deltaGroup);
    QCOMPARE(a.anchorBins, b.anchorBins);
    QCOMPARE(int(a.keyQuantizer), int(b.keyQuantizer));
    QCOMPARE(int(a.valueQuantizer), int(b.valueQuantizer));
    QCOMPARE(int(a.tables), int(b.tables));
    QCOMPARE(a.defaultLevel, b.defaultLevel);
    QCOMPARE(a.levels.size(), b.levels.size());
    for (size_t i = 0; i < a.levels.size(); ++i) {
        QCOMPARE(a.levels[i].name, b.levels[i].name);
        QCOMPARE(binsText(a.levels[i].keyBins), binsText(b.levels[i].keyBins));
        QCOMPARE(binsText(a.levels[i].valueBins), binsText(b.levels[i].valueBins));
        // The measured figures are kept as a JSON object: equal as JSON (whitespace and escapes
        // may be normalised).
        QCOMPARE(a.levels[i].measuredJson.empty(), b.levels[i].measuredJson.empty());
        if (!a.levels[i].measuredJson.empty()) {
            const QJsonDocument ja = QJsonDocument::fromJson(QByteArray::fromStdString(a.levels[i].measuredJson));
            const QJsonDocument jb = QJsonDocument::fromJson(QByteArray::fromStdString(b.levels[i].measuredJson));
            QVERIFY(ja.isObject());
            QCOMPARE(ja, jb);
        }
    }
}

// A valid profile as JSON text, with `patch` replacing the text of one member.
const char* const kValidJson = R"({
  "format": "kvscope-profile", "version": 1, "model_fingerprint": "abc", "num_layers": 4,
  "chunk_tokens": 256, "delta_group": 10, "anchor_bins": 0,
  "key_quantizer": "token", "value_quantizer": "channel", "tables": "shared",
  "default_level": 1,
  "levels": [ { "name": "only", "key_bins": [32, 32, 16, 16],
                "value_bins": [ {"start": 0, "end": 1, "bins": 32}, {"start": 1, "end": 4, "bins": 16} ] } ]
})";

}  // namespace

class TestProfile : public QObject {
    Q_OBJECT
private slots:
    void defaultProfileMatchesCacheGenMistral();
    void defaultProfileScales_data();
    void defaultProfileScales();
    void jsonRoundTrip_data();
    void jsonRoundTrip();
    void bothBinsFormsAccepted();
    void layerRanges();
    void malformed_data();
    void malformed();
    void saveLoadFile();
    void saveIsAtomic();
};

// CacheGen's Mistral-7B settings (32 layers), exactly.
void TestProfile::defaultProfileMatchesCacheGenMistral()
{
    const CodecProfile p = defaultProfile(32);
    QCOMPARE(p.numLayers, 32);
    QCOMPARE(p.levels.size(), size_t(3));
    QCOMPARE(p.defaultLevel, 2);
    QCOMPARE(p.chunkTokens, 256);
    QCOMPARE(p.deltaGroup, 10);
    // level 1: K 16/16/12 for [0,10)/[10,20)/[20,32), V 16/12 for [0,2)/[2,32)
    QCOMPARE(binsText(p.levels[0].keyBins), binsText(split2(32, 20, 16, 12)));
    QCOMPARE(binsText(p.levels[0].valueBins), binsText(split2(32, 2, 16, 12)));
    // level 2: K 32 below layer 10 then 16; V 32 below layer 2 then 16
    QCOMPARE(binsText(p.levels[1].keyBins), binsText(split2(32, 10, 32, 16)));
    QCOMPARE(binsText(p.levels[1].valueBins), binsText(split2(32, 2, 32, 16)));
    // level 3: all 32
    QCOMPARE(binsText(p.levels[2].keyBins), binsText(std::vector<int>(32, 32)));
    QCOMPARE(binsText(p.levels[2].valueBins), binsText(std::vector<int>(32, 32)));
    validateProfile(p, "default");
}

void TestProfile::defaultProfileScales_data()
{
    QTest::addColumn<int>("layers");
    // boundaries 10/32, 20/32 and 2/32 of the depth, rounded to the nearest layer
    QTest::addColumn<int>("k10");
    QTest::addColumn<int>("k20");
    QTest::addColumn<int>("v2");
    QTest::newRow("SmolLM2 30 layers") << 30 << 9 << 19 << 2;
    QTest::newRow("Llama-2-13B 40 layers") << 40 << 13 << 25 << 3;
    QTest::newRow("16 layers") << 16 << 5 << 10 << 1;
    QTest::newRow("64 layers") << 64 << 20 << 40 << 4;
    QTest::newRow("2 layers") << 2 << 1 << 1 << 0;
}

void TestProfile::defaultProfileScales()
{
    QFETCH(int, layers);
    QFETCH(int, k10);
    QFETCH(int, k20);
    QFETCH(int, v2);
    const CodecProfile p = defaultProfile(layers);
    QCOMPARE(p.numLayers, layers);
    QCOMPARE(binsText(p.levels[0].keyBins), binsText(split2(layers, k20, 16, 12)));
    QCOMPARE(binsText(p.levels[0].valueBins), binsText(split2(layers, v2, 16, 12)));
    QCOMPARE(binsText(p.levels[1].keyBins), binsText(split2(layers, k10, 32, 16)));
    QCOMPARE(binsText(p.levels[1].valueBins), binsText(split2(layers, v2, 32, 16)));
    QCOMPARE(binsText(p.levels[2].keyBins), binsText(std::vector<int>(size_t(layers), 32)));
    validateProfile(p, "default");
}

void TestProfile::jsonRoundTrip_data()
{
    QTest::addColumn<int>("variant");
    QTest::newRow("default 32 layers") << 0;
    QTest::newRow("default 30 layers, measured figures") << 1;
    QTest::newRow("every field changed") << 2;
    QTest::newRow("no num_layers: per-layer lists") << 3;
}

void TestProfile::jsonRoundTrip()
{
    QFETCH(int, variant);
    CodecProfile p = defaultProfile(variant == 0 ? 32 : 30);
    if (variant >= 1) {
        p.levels[0].measuredJson = R"({"bits_per_value":1.9,"delta_ppl_pct":2.5,"kl":0.01})";
        p.levels[2].measuredJson = R"({"notes":"unicode \u00e9 ok","sizes":[1,2,3]})";
    }
    if (variant == 2) {
        p.modelFingerprint = "sha256:0123456789abcdef";
        p.chunkTokens = 100;
        p.deltaGroup = 0;
        p.anchorBins = 64;
        p.keyQuantizer = Quantizer::PerChannel;
        p.valueQuantizer = Quantizer::PerChannel;
        p.tables = TableMode::Shared;
        p.defaultLevel = 3;
        p.levels[1].name = "my level";
        p.levels[1].keyBins[7] = 4;
        p.levels[1].valueBins[29] = 256;
        p.levels[1].keyBins[8] = 100;  // isolated layers become their own ranges
    }
    if (variant == 3) p.numLayers = 0;
    const std::string text = profileToJson(p);
    const CodecProfile back = profileFromJson(text, "round-trip.json");
    compareProfiles(p, back);
    // Idempotent: the text written again is the same text.
    QCOMPARE(QString::fromStdString(profileToJson(back)), QString::fromStdString(text));
}

// Per-layer lists and LMCache-style ranges mean the same thing; both may be mixed in one file.
void TestProfile::bothBinsFormsAccepted()
{
    const CodecProfile p = profileFromJson(kValidJson, "mixed.json");
    QCOMPARE(p.numLayers, 4);
    QCOMPARE(p.levels.size(), size_t(1));
    QCOMPARE(binsText(p.levels[0].keyBins), QString("32,32,16,16"));
    QCOMPARE(binsText(p.levels[0].valueBins), QString("32,16,16,16"));
    QCOMPARE(p.modelFingerprint, std::string("abc"));
    QCOMPARE(int(p.keyQuantizer), int(Quantizer::PerToken));
    QCOMPARE(int(p.valueQuantizer), int(Quantizer::PerChannel));
    QCOMPARE(int(p.tables), int(TableMode::Shared));

    // Defaults for optional fields.
    const CodecProfile q = profileFromJson(
        R"({"format":"kvscope-profile","version":1,"levels":[{"key_bins":[8,8],"value_bins":[6,6]}]})", "minimal.json");
    QCOMPARE(q.chunkTokens, 256);
    QCOMPARE(q.deltaGroup, 10);
    QCOMPARE(q.defaultLevel, 1);
    QCOMPARE(q.levels[0].name, std::string("level 1"));
    QCOMPARE(int(q.tables), int(TableMode::InBand));
}

void TestProfile::layerRanges()
{
    const std::vector<int> bins = {32, 32, 16, 16, 16, 12, 32};
    const std::vector<LayerRange> r = toLayerRanges(bins);
    QCOMPARE(r.size(), size_t(4));
    const int expect[4][3] = {{0, 2, 32}, {2, 5, 16}, {5, 6, 12}, {6, 7, 32}};
    for (int i = 0; i < 4; ++i) {
        QCOMPARE(r[size_t(i)].start, expect[i][0]);
        QCOMPARE(r[size_t(i)].end, expect[i][1]);
        QCOMPARE(r[size_t(i)].bins, expect[i][2]);
    }
    QVERIFY(toLayerRanges({}).empty());
    const std::vector<LayerRange> one = toLayerRanges(std::vector<int>(30, 16));
    QCOMPARE(one.size(), size_t(1));
    QCOMPARE(one[0].end, 30);
    // Ranges of the default profile: CacheGen's three K groups at level 1 merge into two.
    const std::vector<LayerRange> k1 = toLayerRanges(defaultProfile(32).levels[0].keyBins);
    QCOMPARE(k1.size(), size_t(2));
    QCOMPARE(k1[0].end, 20);
}

void TestProfile::malformed_data()
{
    QTest::addColumn<QString>("json");
    QTest::addColumn<QString>("field");  // the place the message must name

    const QString valid = QString::fromUtf8(kValidJson);
    auto with = [&](const QString& from, const QString& to) {
        QString s = valid;
        const int i = s.indexOf(from);
        Q_ASSERT(i >= 0);
        return s.replace(i, from.size(), to);
    };
    QTest::newRow("not JSON") << "{\"format\": " << "not valid JSON";
    QTest::newRow("JSON array") << "[1, 2]" << "JSON object";
    QTest::newRow("wrong format string") << with("\"kvscope-profile\"", "\"cachegen\"") << "format";
    QTest::newRow("no format") << with("\"format\": \"kvscope-profile\",", "") << "format";
    QTest::newRow("version 3") << with("\"version\": 1", "\"version\": 3") << "version";
    QTest::newRow("version as string") << with("\"version\": 1", "\"version\": \"1\"") << "version";
    QTest::newRow("chunk_tokens 8") << with("\"chunk_tokens\": 256", "\"chunk_tokens\": 8") << "chunk_tokens";
    QTest::newRow("chunk_tokens 9000") << with("\"chunk_tokens\": 256", "\"chunk_tokens\": 9000") << "chunk_tokens";
    QTest::newRow("delta_group 1") << with("\"delta_group\": 10", "\"delta_group\": 1") << "delta_group";
    QTest::newRow("delta_group -3") << with("\"delta_group\": 10", "\"delta_group\": -3") << "delta_group";
    QTest::newRow("delta_group over chunk") << with("\"delta_group\": 10", "\"delta_group\": 300") << "delta_group";
    QTest::newRow("anchor_bins odd") << with("\"anchor_bins\": 0", "\"anchor_bins\": 17") << "anchor_bins";
    QTest::newRow("odd bins") << with("[32, 32, 16, 16]", "[32, 31, 16, 16]") << "layer 1";
    QTest::newRow("bins 2") << with("[32, 32, 16, 16]", "[32, 32, 2, 16]") << "layer 2";
    QTest::newRow("bins 258") << with("[32, 32, 16, 16]", "[258, 32, 16, 16]") << "layer 0";
    QTest::newRow("bins not integers") << with("[32, 32, 16, 16]", "[32, \"32\", 16, 16]") << "key_bins[1]";
    QTest::newRow("too few layers") << with("[32, 32, 16, 16]", "[32, 32, 16]") << "levels[0]";
    QTest::newRow("missing levels") << with("\"levels\"", "\"levelz\"") << "levels";
    QTest::newRow("empty levels") << R"({"format":"kvscope-profile","version":1,"levels":[]})" << "levels";
    QTest::newRow("missing key_bins") << with("\"key_bins\"", "\"kee_bins\"") << "key_bins";
    QTest::newRow("ranges with a gap")
        << with("{\"start\": 1, \"end\": 4", "{\"start\": 2, \"end\": 4") << "layer 1 has no bins";
    QTest::newRow("range past the last layer")
        << with("{\"start\": 1, \"end\": 4", "{\"start\": 1, \"end\": 5") << "value_bins[1]";
    QTest::newRow("empty range") << with("{\"start\": 1, \"end\": 4", "{\"start\": 4, \"end\": 4") << "value_bins[1]";
    QTest::newRow("default_level 0") << with("\"default_level\": 1", "\"default_level\": 0") << "default_level";
    QTest::newRow("default_level 2 of 1") << with("\"default_level\": 1", "\"default_level\": 2") << "default_level";
    QTest::newRow("unknown quantizer") << with("\"value_quantizer\": \"channel\"", "\"value_quantizer\": \"group\"") << "value_quantizer";
    QTest::newRow("unknown table mode") << with("\"tables\": \"shared\"", "\"tables\": \"global\"") << "tables";
    QTest::newRow("measured not an object") << with("\"name\": \"only\",", "\"name\": \"only\", \"measured\": 3,") << "measured";
    QTest::newRow("num_layers negative") << with("\"num_layers\": 4", "\"num_layers\": -4") << "num_layers";
}

// Every malformed profile is a kvscope::Error "source: field: reason".
void TestProfile::malformed()
{
    QFETCH(QString, json);
    QFETCH(QString, field);
    const std::string source = "/profiles/bad-profile.json";
    try {
        profileFromJson(json.toStdString(), source);
        QFAIL("accepted");
    } catch (const Error& e) {
        const QString msg = QString::fromUtf8(e.what());
        QVERIFY2(msg.startsWith(QString::fromStdString(source) + ": "), qPrintable(msg));
        QVERIFY2(msg.contains(field), qPrintable(QString("'%1' does not name '%2'").arg(msg, field)));
        QVERIFY2(!msg.contains('\n'), qPrintable(msg));
    }
}

void TestProfile::saveLoadFile()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const std::string path = dir.filePath("p.json").toStdString();
    CodecProfile p = defaultProfile(30);
    p.levels[1].measuredJson = R"({"bits_per_value":2.5})";
    saveProfile(p, path);
    compareProfiles(p, loadProfile(path));
    QVERIFY(QDir(dir.path()).entryList({"p.json.tmp*"}).isEmpty());

    // A missing file names itself.
    try {
        loadProfile(dir.filePath("missing.json").toStdString());
        QFAIL("loaded a missing file");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(dir.filePath("missing.json")), e.what());
    }
    // Not JSON on disk: the message names the path.
    QFile bad(dir.filePath("bad.json"));
    QVERIFY(bad.open(QIODevice::WriteOnly));
    bad.write("{\"format\": \"kvscope-profile\", ");
    bad.close();
    try {
        loadProfile(bad.fileName().toStdString());
        QFAIL("loaded a truncated file");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(bad.fileName() + ": "), e.what());
    }
}

// A failed save leaves the previous file as it was: invalid profiles are refused before writing,
// and a write that cannot happen (read-only folder) does not touch the old file.
void TestProfile::saveIsAtomic()
{
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString path = dir.filePath("p.json");
    const CodecProfile good = defaultProfile(8);
    saveProfile(good, path.toStdString());
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray before = f.readAll();
    f.close();
    QVERIFY(!before.isEmpty());

    CodecProfile invalid = good;
    invalid.levels[0].keyBins[3] = 7;
    QVERIFY_THROWS_EXCEPTION(Error, saveProfile(invalid, path.toStdString()));
    QVERIFY(f.open(QIODevice::ReadOnly));
    QCOMPARE(f.readAll(), before);
    f.close();

    // The temporary cannot be created (a folder sits where it would go, p.json.tmp-<pid>): the
    // save fails with the path in the message and the old file is untouched. Works as root too.
    const QString tmp = QStringLiteral("p.json.tmp-%1").arg(QCoreApplication::applicationPid());
    QVERIFY(QDir(dir.path()).mkdir(tmp));
    CodecProfile other = good;
    other.modelFingerprint = "changed";
    try {
        saveProfile(other, path.toStdString());
        QFAIL("saved although the temporary could not be created");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(path), e.what());
    }
    QVERIFY(f.open(QIODevice::ReadOnly));
    QCOMPARE(f.readAll(), before);
    f.close();
    QVERIFY(QDir(dir.path()).rmdir(tmp));

    // And once it can, the new profile replaces the old one in full.
    saveProfile(other, path.toStdString());
    QCOMPARE(loadProfile(path.toStdString()).modelFingerprint, std::string("changed"));
    QVERIFY(QDir(dir.path()).entryList({"p.json.tmp*"}).isEmpty());
}

KVSCOPE_TEST_MAIN(TestProfile)
#include "tst_profile.moc"
