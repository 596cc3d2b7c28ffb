// The command-line contract (app/cli/main.cpp): every subcommand with --json prints exactly one JSON
// object on stdout, exits 0 on success, and otherwise exits non-zero with one "error:" line.
#include "testmain.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>

#include <cmath>

namespace {

struct Run {
    int exitCode = -1;
    QByteArray out, err;
    QJsonObject json() const { return QJsonDocument::fromJson(out).object(); }
};

Run cli(const QStringList& args)
{
    QProcess p;
    p.start(KVSCOPE_BINARY_DIR "/app/cli/kvscope-cli", args);
    if (!p.waitForFinished(1200000)) p.kill();  // 20 minutes: the model commands take minutes on a loaded 2-core machine
    return {p.exitCode(), p.readAllStandardOutput(), p.readAllStandardError()};
}

bool isSingleJsonObject(const QByteArray& out)
{
    QJsonParseError e;
    const QJsonDocument d = QJsonDocument::fromJson(out, &e);
    return e.error == QJsonParseError::NoError && d.isObject();
}

}  // namespace

class TestCli : public QObject {
    Q_OBJECT
    QTemporaryDir m_dir;
    QString m_kv;

    QString path(const QString& name) const { return m_dir.filePath(name); }

private slots:
    void initTestCase()
    {
        QVERIFY(m_dir.isValid());
        m_kv = path("syn.h5");
        const Run r = cli({"synth", "--out", m_kv, "--layers", "6", "--kv-heads", "2", "--head-dim", "32",
                           "--tokens", "600", "--json"});
        QCOMPARE(r.exitCode, 0);
        QVERIFY(isSingleJsonObject(r.out));
        QCOMPARE(r.json()["num_tokens"].toInt(), 600);
    }

    void statsReportsEveryLayer()
    {
        const Run r = cli({"stats", m_kv, "--json"});
        QCOMPARE(r.exitCode, 0);
        QVERIFY(isSingleJsonObject(r.out));
        const QJsonArray layers = r.json()["layers"].toArray();
        QCOMPARE(layers.size(), 6);
        const QJsonObject key = layers[0].toObject()["key"].toObject();
        QVERIFY(key["absmax"].toDouble() > 0);
        QVERIFY(key["variance_delta"].toDouble() > 0);
        QVERIFY(!key["outlier_channels"].toArray().isEmpty());  // the synthetic keys carry outliers
    }

    void encodeDecodeRoundTrip_data()
    {
        QTest::addColumn<QString>("codec");
        QTest::addColumn<double>("maxBits");      // bits per value must stay below this
        QTest::addColumn<double>("maxError");     // max abs error after decoding
        // 64 channels per layer: int8 pays 16 scale bits per 64 values (8.25 bits); KIVI keeps the last
        // 128 of 600 tokens in fp16 (3.41 bits on its own); cachegen must beat int8 even with in-band tables.
        QTest::newRow("cachegen") << "cachegen" << 8.0 << 5.0;
        QTest::newRow("int8") << "int8" << 8.2501 << 0.5;
        QTest::newRow("kivi4") << "kivi4" << 7.5 << 5.0;
        QTest::newRow("kivi2") << "kivi2" << 6.0 << 20.0;
        QTest::newRow("zstd") << "zstd" << 16.0 << 0.0;
        QTest::newRow("fp16") << "fp16" << 16.01 << 0.0;
    }

    void encodeDecodeRoundTrip()
    {
        QFETCH(QString, codec);
        QFETCH(double, maxBits);
        QFETCH(double, maxError);
        const QString kvc = path(codec + ".kvc"), out = path(codec + ".out.h5");
        Run r = cli({"encode", m_kv, "--out", kvc, "--codec", codec, "--chunk-tokens", "64", "--json"});
        QCOMPARE(r.exitCode, 0);
        QVERIFY(isSingleJsonObject(r.out));
        QJsonObject j = r.json();
        for (const char* key : {"bytes", "bits_per_value", "ratio_vs_fp16", "ratio_vs_int8", "encode_s"})
            QVERIFY2(j.contains(key), key);
        QVERIFY(j["bits_per_value"].toDouble() < maxBits);
        QVERIFY(QFileInfo(kvc).size() == j["file_bytes"].toInteger());
        r = cli({"decode", kvc, "--out", out, "--source", m_kv, "--json"});
        QCOMPARE(r.exitCode, 0);
        j = r.json();
        QVERIFY(j.contains("decode_s"));
        QVERIFY2(j["max_abs_error"].toDouble() <= maxError, qPrintable(QString::number(j["max_abs_error"].toDouble())));
        QCOMPARE(j["layers"].toArray().size(), 6);
    }

    // A KV file with no RoPE table (written by another stack; synth writes none) still encodes
    // with the transform codec: its keys are coded as they are, and stderr says so in one line.
    void transformWithoutRopeParameters()
    {
        const QString kvc = path("norope.kvc"), out = path("norope.out.h5");
        Run r = cli({"encode", m_kv, "--out", kvc, "--codec", "transform", "--chunk-tokens", "64", "--json"});
        QVERIFY2(r.exitCode == 0, r.err.constData());
        QVERIFY(isSingleJsonObject(r.out));
        QVERIFY2(r.err.contains("note: the KV cache carries no RoPE parameters: keys are coded as they are"), r.err.constData());
        QVERIFY(r.json()["bits_per_value"].toDouble() > 0);
        r = cli({"decode", kvc, "--out", out, "--source", m_kv, "--json"});
        QVERIFY2(r.exitCode == 0, r.err.constData());
        QCOMPARE(r.json()["layers"].toArray().size(), 6);
        QVERIFY(r.json()["max_abs_error"].toDouble() < 1.0);
    }

    void decodeAnyLevelMix()
    {
        const QString kvc = path("levels.kvc");
        QCOMPARE(cli({"encode", m_kv, "--out", kvc, "--chunk-tokens", "64", "--json"}).exitCode, 0);
        // 600 tokens in chunks of 64: 10 chunks, the last one short
        const Run r = cli({"decode", kvc, "--out", path("mix.h5"), "--level", "3,1,2,1,3,3,2,2,1,1", "--source", m_kv, "--json"});
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.json()["levels"].toArray().size(), 10);
        const Run bad = cli({"decode", kvc, "--out", path("mix2.h5"), "--level", "1,2", "--json"});
        QVERIFY(bad.exitCode != 0);
        QVERIFY(bad.err.startsWith("error: "));
    }

    // verify reads every level of every chunk: a flipped byte in one payload is reported as that
    // (chunk, level), on one error line, with exit status 1; the other payloads still count as sound.
    void verifyFindsEveryDamagedPlace()
    {
        const QString kvc = path("verify.kvc"), bad = path("verify_bad.kvc");
        QCOMPARE(cli({"encode", m_kv, "--out", kvc, "--chunk-tokens", "64", "--json"}).exitCode, 0);
        Run r = cli({"verify", kvc, "--json"});
        QCOMPARE(r.exitCode, 0);
        QVERIFY(isSingleJsonObject(r.out));
        QCOMPARE(r.json()["checked"].toInt(), 30);  // 10 chunks x 3 levels
        QVERIFY(r.json()["ok"].toBool());

        QFile f(kvc);
        QVERIFY(f.open(QIODevice::ReadOnly));
        QByteArray bytes = f.readAll();
        f.close();
        // chunk index: u64 offset at header byte 120; entry (chunk 4, level 2) = 4 * 3 + 1
        auto u64 = [&](qsizetype at) { quint64 v = 0; for (int i = 7; i >= 0; --i) v = v << 8 | quint8(bytes[at + i]); return v; };
        auto u32 = [&](qsizetype at) { quint32 v = 0; for (int i = 3; i >= 0; --i) v = v << 8 | quint8(bytes[at + i]); return v; };
        const qsizetype entry = qsizetype(u64(120)) + 16 * (4 * 3 + 1);
        const qsizetype payload = qsizetype(u64(entry)), size = qsizetype(u32(entry + 8));
        bytes[payload + size / 2] = char(bytes[payload + size / 2] ^ 0x5a);
        QFile g(bad);
        QVERIFY(g.open(QIODevice::WriteOnly));
        g.write(bytes);
        g.close();

        r = cli({"verify", bad, "--json"});
        QCOMPARE(r.exitCode, 1);
        const QJsonArray damaged = r.json()["damaged"].toArray();
        QCOMPARE(damaged.size(), 1);
        QCOMPARE(damaged[0].toObject()["chunk"].toInt(), 4);
        QCOMPARE(damaged[0].toObject()["level"].toInt(), 2);
        const QList<QByteArray> lines = r.err.trimmed().split('\n');
        QCOMPARE(lines.size(), 1);
        QVERIFY2(lines[0].startsWith("error: ") && lines[0].contains("chunk 4 level 2") && lines[0].contains("CRC"),
                 lines[0].constData());
        // decoding another level of that chunk still works: streaming never notices the damage
        QCOMPARE(cli({"decode", bad, "--out", path("verify_l1.h5"), "--level", "1", "--json"}).exitCode, 0);
    }

    // Per-channel tables calibrated offline on one cache and stored in the profile code another
    // cache of the same shape; at small chunks they beat per-channel tables shipped in every chunk.
    // One table per KV head (the default) ships so few tables that in-band beats both.
    void calibratedProfileTables()
    {
        const QString other = path("other.h5"), profile = path("calibrated.json");
        QCOMPARE(cli({"synth", "--out", other, "--layers", "6", "--kv-heads", "2", "--head-dim", "32", "--tokens", "600",
                      "--seed", "9", "--json"}).exitCode, 0);
        Run r = cli({"calibrate", other, "--out", profile, "--chunk-tokens", "64", "--delta-group", "0", "--table-scope",
                     "channel", "--json"});
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.json()["channels"].toInt(), 64);
        r = cli({"encode", m_kv, "--out", path("cal.kvc"), "--profile", profile, "--verify", "--json"});
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.json()["table_scope"].toString(), QString("channel"));
        const QJsonArray calibrated = r.json()["levels"].toArray();
        r = cli({"encode", m_kv, "--out", path("inband.kvc"), "--chunk-tokens", "64", "--delta-group", "0", "--table-scope",
                 "channel", "--verify", "--json"});
        QCOMPARE(r.exitCode, 0);
        const QJsonArray inband = r.json()["levels"].toArray();
        r = cli({"encode", m_kv, "--out", path("inband_head.kvc"), "--chunk-tokens", "64", "--delta-group", "0", "--verify",
                 "--json"});
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.json()["table_scope"].toString(), QString("head"));
        const QJsonArray perHead = r.json()["levels"].toArray();
        QCOMPARE(calibrated.size(), 3);
        for (int l = 0; l < 3; ++l) {
            const QJsonObject c = calibrated[l].toObject(), i = inband[l].toObject(), h = perHead[l].toObject();
            QVERIFY2(h["bits_per_value"].toDouble() < c["bits_per_value"].toDouble(),
                     qPrintable(QString("level %1: per head %2 vs calibrated per channel %3").arg(l + 1)
                                    .arg(h["bits_per_value"].toDouble()).arg(c["bits_per_value"].toDouble())));
            QCOMPARE(h["max_abs_error"].toDouble(), i["max_abs_error"].toDouble());
            QCOMPARE(c["tables_from"].toString(), QString("profile"));
            QVERIFY(c["table_bytes"].toInteger() > 0);
            QVERIFY2(c["bits_per_value"].toDouble() < i["bits_per_value"].toDouble(),
                     qPrintable(QString("level %1: %2 vs %3").arg(l + 1).arg(c["bits_per_value"].toDouble()).arg(i["bits_per_value"].toDouble())));
            // same quantization, so the same reconstruction
            QCOMPARE(c["max_abs_error"].toDouble(), i["max_abs_error"].toDouble());
        }
        // recalibrating the profile may change what its tables describe: one table per head, here
        // on two caches (the text line names both the scope and the count)
        const QString perHeadProfile = path("calibrated_head.json");
        r = cli({"calibrate", other, m_kv, "--profile", profile, "--table-scope", "head", "--out", perHeadProfile});
        QCOMPARE(r.exitCode, 0);
        QVERIFY2(r.out.contains("one table per head, 64 channels per layer, from 2 caches"), qPrintable(r.out));
        r = cli({"encode", m_kv, "--out", path("cal_head.kvc"), "--profile", perHeadProfile, "--verify", "--json"});
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.json()["table_scope"].toString(), QString("head"));
        QCOMPARE(r.json()["tables"].toString(), QString("shared"));
        // overriding what the tables describe is refused
        r = cli({"encode", m_kv, "--out", path("x.kvc"), "--profile", profile, "--delta-group", "10", "--json"});
        QVERIFY(r.exitCode != 0);
        QVERIFY(r.err.contains("recalibrate"));
    }

    void benchPrintsSideBySide()
    {
        const Run r = cli({"bench", "codec", m_kv, "--repeats", "1", "--json"});
        QCOMPARE(r.exitCode, 0);
        const QJsonObject j = r.json();
        for (const char* key : {"encode_MBps", "decode_MBps", "zstd_compress_MBps", "zstd_decompress_MBps", "bits_per_value",
                                "entropy_encode_MBps", "entropy_decode_MBps", "htscodecs_encode_MBps", "htscodecs_decode_MBps"})
            QVERIFY2(j[key].toDouble() > 0, key);
        QCOMPARE(j["results"].toArray().size(), 3);
        QVERIFY(j["threads"].toInt() >= 1);
        QVERIFY2(QStringList({"scalar", "avx2", "avx512"}).contains(j["simd"].toString()), qPrintable(j["simd"].toString()));
        // the same symbols through both entropy coders: htscodecs' single order-0 table per stream
        // against our per-channel tables; neither may be wildly off the other
        const double ratio = j["entropy_bytes"].toDouble() / j["htscodecs_bytes"].toDouble();
        QVERIFY2(ratio > 0.5 && ratio < 2.0, qPrintable(QString::number(ratio)));

        const Run scalar = cli({"bench", "codec", m_kv, "--repeats", "1", "--threads", "1", "--simd", "scalar", "--json"});
        QCOMPARE(scalar.exitCode, 0);
        QCOMPARE(scalar.json()["simd"].toString(), QString("scalar"));
        QCOMPARE(scalar.json()["threads"].toInt(), 1);
        QCOMPARE(scalar.json()["bits_per_value"].toDouble(), j["bits_per_value"].toDouble());  // same bytes on every path
    }

    void errorsAreOneLine_data()
    {
        QTest::addColumn<QStringList>("args");
        QTest::addColumn<QString>("needle");
        QTest::newRow("missing file") << QStringList{"stats", "/nonexistent/x.h5", "--json"} << "/nonexistent/x.h5";
        QTest::newRow("not a kvc") << QStringList{"decode", "SELF", "--out", "x.h5", "--json"} << "bad magic";
        QTest::newRow("unknown codec") << QStringList{"encode", "SELF", "--out", "x.kvc", "--codec", "lz4", "--json"} << "lz4";
        QTest::newRow("bad chunk size") << QStringList{"encode", "SELF", "--out", "x.kvc", "--chunk-tokens", "8", "--json"} << "chunk_tokens";
        QTest::newRow("no subcommand") << QStringList{} << "error:";
    }

    void errorsAreOneLine()
    {
        QFETCH(QStringList, args);
        QFETCH(QString, needle);
        for (QString& a : args)
            if (a == "SELF") a = m_kv;
            else if (a.endsWith(".h5") && !a.startsWith("/")) a = path(a);
            else if (a.endsWith(".kvc")) a = path(a);
        const Run r = cli(args);
        QVERIFY(r.exitCode != 0);
        QVERIFY(r.out.isEmpty());
        QVERIFY2(r.err.startsWith("error: "), r.err.constData());
        QCOMPARE(r.err.count('\n'), 1);
        QVERIFY2(r.err.contains(needle.toUtf8()), r.err.constData());
    }

    // The default profile at Mistral-7B's depth is CacheGen's own layer groups, in LMCache's form.
    void profileExportsLmcacheRanges()
    {
        const Run r = cli({"profile", "--layers", "32", "--json"});
        QCOMPARE(r.exitCode, 0);
        QVERIFY(isSingleJsonObject(r.out));
        const QJsonObject level2 = r.json()["levels"].toArray()[1].toObject();
        const QJsonArray k = level2["kspecs"].toArray(), v = level2["vspecs"].toArray();
        QCOMPARE(k.size(), 2);
        QCOMPARE(k[0].toObject()["end_layer"].toInt(), 10);
        QCOMPARE(k[0].toObject()["bins"].toInt(), 32);
        QCOMPARE(k[1].toObject()["start_layer"].toInt(), 10);
        QCOMPARE(k[1].toObject()["end_layer"].toInt(), 32);
        QCOMPARE(k[1].toObject()["bins"].toInt(), 16);
        QCOMPARE(v[0].toObject()["end_layer"].toInt(), 2);
        QCOMPARE(level2["lmcache_python"].toString(),
                 QString("CacheGenConfig(nlayers=32, kspecs=[QuantizationSpec(start_layer=0, end_layer=10, bins=32), "
                         "QuantizationSpec(start_layer=10, end_layer=32, bins=16)], vspecs=[QuantizationSpec(start_layer=0, "
                         "end_layer=2, bins=32), QuantizationSpec(start_layer=2, end_layer=32, bins=16)])"));
        const Run bad = cli({"profile", path("missing.json"), "--json"});
        QVERIFY(bad.exitCode != 0);
        QVERIFY2(bad.err.startsWith("error: ") && bad.err.contains("missing.json"), bad.err.constData());
    }

    // ---- model commands on a real llama2.c checkpoint (aidreams260K, third-party test data) ----
    void modelCommands()
    {
        const QString dir = KVSCOPE_SOURCE_DIR "/../shared/models/aidreams260K";
        if (!QFile::exists(dir + "/aidreams260K.bin")) QSKIP("../shared/models/aidreams260K is absent (test data)");
        const QStringList model = {"--model", dir + "/aidreams260K.bin", "--tokenizer", dir + "/tok512.bin"};

        Run r = cli({"info", dir + "/aidreams260K.bin", "--tokenizer", dir + "/tok512.bin", "--json"});
        QCOMPARE(r.exitCode, 0);
        QVERIFY(isSingleJsonObject(r.out));
        QCOMPARE(r.json()["architecture"].toString(), QString("LlamaForCausalLM"));
        QCOMPARE(r.json()["num_layers"].toInt(), 4);
        QCOMPARE(r.json()["num_kv_heads"].toInt(), 4);
        QCOMPARE(r.json()["head_dim"].toInt(), 16);
        QCOMPARE(r.json()["vocab_size"].toInt(), 512);

        r = cli({"tokenize", "--tokenizer", dir + "/tok512.bin", "--text", "I dreamed", "--json"});
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.json()["ids"].toArray(), (QJsonArray{1, 303, 281, 269, 435, 447, 328}));

        r = cli(QStringList{"generate"} + model + QStringList{"--prompt", "I dreamed", "--max-new-tokens", "30", "--kv-dtype", "fp32", "--json"});
        QCOMPARE(r.exitCode, 0);
        QVERIFY(isSingleJsonObject(r.out));
        QCOMPARE(r.json()["tokens"].toArray().size(), 30);
        QCOMPARE(r.json()["prompt_tokens"].toArray().size(), 7);
        QVERIFY2(r.json()["text"].toString().startsWith(", as I sense the nodes, a gentle hum of probability."),
                 qPrintable(r.json()["text"].toString()));

        // capture writes the documented HDF5 layout; h5py (Debian's python3-h5py) reads it.
        const QString ctx = path("ctx.txt"), kv = path("captured.h5");
        QFile f(ctx);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write("The network hums quietly. Vectors align, and a pattern settles.");
        f.close();
        r = cli(QStringList{"capture"} + model + QStringList{"--context", ctx, "--out", kv, "--json"});
        QCOMPARE(r.exitCode, 0);
        const int n = r.json()["num_tokens"].toInt();
        QVERIFY(n > 10);
        QCOMPARE(r.json()["bytes_fp16"].toInteger(), qint64(2) * 4 * 4 * n * 16 * 2);
        QVERIFY(r.json()["prefill_s"].toDouble() > 0);
        QProcess py;
        py.start("/usr/bin/python3", {"-c",
            "import h5py,sys; f=h5py.File(sys.argv[1],'r'); k=f['layers/03/value']; "
            "print(f.attrs['format'], k.dtype.str, k.shape, len(f['tokens']), f['tokens'][0])", kv});
        QVERIFY(py.waitForFinished(60000));
        QCOMPARE(QString(py.readAllStandardOutput()).trimmed(), QString("kvscope-kv <f2 (4, %1, 16) %1 1").arg(n));

        // The attention mass is written only when asked for: (kv_heads, tokens) per layer.
        QCOMPARE(r.json()["attn_mass"].toBool(), false);
        const QString kvMass = path("captured_mass.h5");
        r = cli(QStringList{"capture"} + model + QStringList{"--context", ctx, "--out", kvMass, "--attn-mass", "--json"});
        QCOMPARE(r.exitCode, 0);
        QCOMPARE(r.json()["attn_mass"].toBool(), true);
        QProcess pyMass;
        pyMass.start("/usr/bin/python3", {"-c",
            "import h5py,sys\nfor p in sys.argv[1:]:\n f=h5py.File(p,'r'); g=f['layers/03']\n"
            " print(g['attn_mass'].shape if 'attn_mass' in g else None)", kv, kvMass});
        QVERIFY(pyMass.waitForFinished(60000));
        QCOMPARE(QString(pyMass.readAllStandardOutput()).trimmed(), QString("None\n(4, %1)").arg(n));

        // Errors: one "error:" line last on stderr, nothing on stdout.
        for (const QStringList& bad : {QStringList{"generate", "--model", dir + "/aidreams260K.bin", "--prompt", "x", "--json"},
                                       QStringList{"info", "/nonexistent/model.gguf", "--json"}}) {
            r = cli(bad);
            QVERIFY(r.exitCode != 0);
            QVERIFY(r.out.isEmpty());
            const QList<QByteArray> lines = r.err.trimmed().split('\n');
            QVERIFY2(lines.last().startsWith("error: "), r.err.constData());
        }
    }

    // sweep and tune on aidreams260K with text contexts whose last tokens are held out: files
    // a plot and a serving stack can read, the tuned profile bound to this model, clear refusals.
    void sweepAndTune()
    {
        const QString dir = KVSCOPE_SOURCE_DIR "/../shared/models/aidreams260K";
        if (!QFile::exists(dir + "/aidreams260K.bin")) QSKIP("../shared/models/aidreams260K is absent (test data)");
        const QStringList model = {"--model", dir + "/aidreams260K.bin", "--tokenizer", dir + "/tok512.bin"};
        auto write = [&](const QString& name, const QByteArray& text) {
            QFile f(path(name));
            QVERIFY(f.open(QIODevice::WriteOnly));
            f.write(text);
        };
        write("a.txt", "I dreamed of a river that ran through the quiet town. The nodes hummed softly as the light "
                       "faded, and every window held a small lamp. A child counted the boats, one by one, until the "
                       "night was deep and the water was still. Then the bells rang out over the hills.");
        write("b.txt", "The network woke before dawn. Signals moved like birds between the towers, and each tower "
                       "kept a record of what it heard. By noon the records filled a library, and by night the "
                       "library began to dream of the sea, of salt and wind and long grey waves.");

        Run r = cli(QStringList{"sweep"} + model +
                    QStringList{"--context", path("a.txt"), "--holdout-tokens", "24", "--chunk-tokens", "16", "--key-bins",
                                "8,32", "--value-bins", "8", "--deltas", "0", "--csv", path("s.csv"), "--out", path("s.json"),
                                "--json"});
        QVERIFY2(r.exitCode == 0, r.err.constData());
        QVERIFY(isSingleJsonObject(r.out));
        QCOMPARE(r.json()["points"].toArray().size(), 2 + 5);
        QCOMPARE(r.json()["continuation_tokens"].toInt(), 24);
        QFile csv(path("s.csv"));
        QVERIFY(csv.open(QIODevice::ReadOnly));
        const QList<QByteArray> lines = csv.readAll().trimmed().split('\n');
        QCOMPARE(lines.size(), 1 + 7);
        QVERIFY(lines[0].startsWith("codec,key_bins,value_bins,chunk_tokens,"));
        QVERIFY2(lines[1].startsWith("cachegen,8,8,16,0,token,token,"), lines[1].constData());
        QVERIFY(QFile::exists(path("s.json")));

        r = cli(QStringList{"tune"} + model +
                QStringList{"--contexts", path("a.txt") + "," + path("b.txt"), "--holdout-tokens", "24", "--chunk-tokens", "16",
                            "--delta-group", "0", "--tables", "shared", "--bins", "16,64,256", "--budgets", "5,1",
                            "--answer-tokens", "8", "--out", path("tuned.json"), "--lmcache", path("tuned.py"), "--json"});
        QVERIFY2(r.exitCode == 0, r.err.constData());
        QVERIFY(isSingleJsonObject(r.out));
        const QJsonObject t = r.json();
        const QJsonArray levels = t["levels"].toArray();
        QVERIFY(!levels.isEmpty());
        for (const auto& v : levels) {
            const QJsonObject l = v.toObject();
            QVERIFY(l["budget_met"].toBool());
            QCOMPARE(l["budget_metric"].toString(), QString("delta_ppl_pct"));
            QVERIFY(l["max_delta_ppl_pct"].toDouble() <= l["budget"].toDouble());
        }
        QFile tuned(path("tuned.json"));
        QVERIFY(tuned.open(QIODevice::ReadOnly));
        const QJsonObject profile = QJsonDocument::fromJson(tuned.readAll()).object();
        QCOMPARE(profile["model_fingerprint"].toString(), t["fingerprint"].toString());
        QVERIFY(profile.contains("calibrated_tables"));
        QFile py(path("tuned.py"));
        QVERIFY(py.open(QIODevice::ReadOnly));
        QVERIFY(py.readAll().contains("QuantizationSpec(start_layer=0"));

        // The tuned profile works on this model and is refused for another one unless forced.
        r = cli(QStringList{"eval"} + model +
                QStringList{"--context", path("b.txt"), "--holdout-tokens", "24", "--profile", path("tuned.json"),
                            "--answer-tokens", "4", "--no-text", "--json"});
        QVERIFY2(r.exitCode == 0, r.err.constData());
        QJsonObject foreign = profile;
        foreign["model_fingerprint"] = "0123456789abcdef";
        write("foreign.json", QJsonDocument(foreign).toJson());
        const QStringList evalForeign = QStringList{"eval"} + model +
                                        QStringList{"--context", path("b.txt"), "--holdout-tokens", "24", "--profile",
                                                    path("foreign.json"), "--answer-tokens", "4", "--no-text", "--json"};
        r = cli(evalForeign);
        QVERIFY(r.exitCode != 0);
        QVERIFY2(r.err.contains("foreign.json: model_fingerprint: the profile was tuned for model 0123456789abcdef, this cache "
                                "comes from " + t["fingerprint"].toString().toUtf8()),
                 r.err.constData());
        r = cli(evalForeign + QStringList{"--force-profile"});
        QVERIFY2(r.exitCode == 0, r.err.constData());

        // Bad input: one error line naming the reason.
        const QStringList base = QStringList{"tune"} + model + QStringList{"--contexts", path("a.txt"), "--json"};
        const QList<QPair<QStringList, QByteArray>> bad = {
            {base + QStringList{"--holdout-tokens", "24", "--bins", "8,300"}, "--bins: 300 is outside 2..256"},
            {base + QStringList{"--holdout-tokens", "24", "--chunk-tokens", "512"}, "fewer than one chunk of 512"},
            {base + QStringList{"--holdout-tokens", "0", "--chunk-tokens", "16"}, "no continuation to score"},
            {base + QStringList{"--holdout-tokens", "24", "--budget-metric", "ppl"}, "--budget-metric: expected dppl or kl"},
            {base + QStringList{"--holdout-tokens", "24", "--chunk-tokens", "16", "--budgets", "-1"},
             "is not a positive delta_ppl_pct"},
        };
        for (const auto& [args, expect] : bad) {
            r = cli(args);
            QVERIFY(r.exitCode != 0);
            QVERIFY(r.out.isEmpty());
            const QByteArray last = r.err.trimmed().split('\n').last();
            QVERIFY2(last.startsWith("error: ") && last.contains(expect), r.err.constData());
        }
    }

    // eval --suite on the mini suite: the contract's keys on every row and at the top, fp16 exact,
    // and the iso-quality flag as the bar says.
    void evalSuiteJson()
    {
        if (!QFile::exists(QDir::homePath() + "/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf") &&
            qEnvironmentVariableIsEmpty("KVSCOPE_MODEL"))
            QSKIP("the default model is not in the cache (kvscope-cli fetch-model fetches it)");
        const Run r = cli({"eval", "--suite", KVSCOPE_SOURCE_DIR "/samples/suites/mini.json", "--baselines", "int8,kivi2",
                           "--levels", "none", "--threads", "1", "--suite-cache", path("suite-cache"), "--json"});
        QVERIFY2(r.exitCode == 0, r.err.constData());
        QVERIFY(isSingleJsonObject(r.out));
        const QJsonObject j = r.json();
        QCOMPARE(j["suite"].toString(), QString("mini"));
        QCOMPARE(j["questions"].toInt(), 20);
        const QJsonArray rows = j["results"].toArray();
        QCOMPARE(rows.size(), 3);  // fp16 (always: it is the bar), int8, kivi2
        for (const auto& v : rows) {
            const QJsonObject o = v.toObject();
            for (const char* key : {"codec", "level", "bits_per_value", "ratio_vs_int8", "delta_ppl_pct", "kl", "token_agreement",
                                    "accuracy", "accuracy_ci", "exact_match", "answer_logprob_delta", "mcnemar_p",
                                    "meets_iso_quality"})
                QVERIFY2(o.contains(key), key);
            QCOMPARE(o["accuracy_ci"].toArray().size(), 2);
            QVERIFY(o["accuracy_ci"].toArray()[0].toDouble() <= o["accuracy"].toDouble());
            QVERIFY(o["accuracy"].toDouble() <= o["accuracy_ci"].toArray()[1].toDouble());
        }
        const QJsonObject fp16 = rows[0].toObject(), int8 = rows[1].toObject(), kivi2 = rows[2].toObject();
        QCOMPARE(fp16["codec"].toString(), QString("fp16"));
        QCOMPARE(fp16["delta_ppl_pct"].toDouble(), 0.0);
        QCOMPARE(fp16["mcnemar_p"].toDouble(), 1.0);
        QVERIFY(fp16["meets_iso_quality"].toBool());
        QVERIFY(int8["meets_iso_quality"].toBool());
        QCOMPARE(int8["ratio_vs_int8"].toDouble(), 1.0);
        QVERIFY(kivi2["delta_ppl_pct"].toDouble() > 5.0);  // 2-bit keys and values hurt this model
        QVERIFY(!kivi2["meets_iso_quality"].toBool());
        QCOMPARE(j["reference_cache"].toObject()["prefills"].toInt(), 2);
        // A second run reads the reference and the prefill KV from the cache.
        const Run again = cli({"eval", "--suite", KVSCOPE_SOURCE_DIR "/samples/suites/mini.json", "--baselines", "none",
                               "--levels", "none", "--threads", "1", "--suite-cache", path("suite-cache"), "--json"});
        QVERIFY2(again.exitCode == 0, again.err.constData());
        QCOMPARE(again.json()["reference_cache"].toObject()["prefills"].toInt(), 0);
        QCOMPARE(again.json()["reference_cache"].toObject()["reference_passes"].toInt(), 0);
        QCOMPARE(again.json()["fp16"].toObject()["accuracy"].toDouble(), fp16["accuracy"].toDouble());
        // Errors stay one line naming the file and the place.
        const QString bad = path("bad_suite.json");
        QFile f(bad);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(R"({"name": "x", "items": [{"id": "a", "context": "c", "questions": [{"question": "q"}]}]})");
        f.close();
        const Run e = cli({"eval", "--suite", bad, "--json"});
        QVERIFY(e.exitCode != 0);
        QVERIFY2(e.err.contains("bad_suite.json: items[0].questions[0].answer: missing"), e.err.constData());
    }

    // capture -> encode -> decode -> generate on the embedded default model and the 1K sample:
    // the lossless rows are exact, the lossy ones stay within bounds a user would accept.
    void demoRunsEndToEnd()
    {
        if (!QFile::exists(QDir::homePath() + "/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf") &&
            qEnvironmentVariableIsEmpty("KVSCOPE_MODEL"))
            QSKIP("the default model is not in the cache (kvscope-cli fetch-model fetches it)");
        const Run r = cli({"demo", "--answer-tokens", "12", "--max-continuation", "96", "--json"});
        QVERIFY2(r.exitCode == 0, r.err.constData());
        QVERIFY(isSingleJsonObject(r.out));
        const QJsonObject j = r.json();
        QCOMPARE(j["context"].toString(), QString("long_1k"));
        QVERIFY(j["num_tokens"].toInt() > 900);
        QCOMPARE(j["continuation_tokens"].toInt(), 96);
        QVERIFY(j["ttft_s"].toDouble() > 0);
        QMap<QString, QJsonObject> rows;
        for (const auto& v : j["results"].toArray()) {
            const QJsonObject o = v.toObject();
            rows[o["codec"].toString() + QString::number(o["level"].toInt())] = o;
            for (const char* key : {"bits_per_value", "ratio_vs_int8", "delta_ppl_pct", "kl", "token_agreement", "answer", "ttft_s"})
                QVERIFY2(o.contains(key), key);
        }
        QCOMPARE(rows.size(), 1 + 5 + 3);  // text, five baselines, three CacheGen levels
        for (const char* exact : {"text1", "fp161"}) {
            QVERIFY2(rows[exact]["exact"].toBool(), exact);
            QCOMPARE(rows[exact]["delta_ppl_pct"].toDouble(), 0.0);
            QCOMPARE(rows[exact]["token_agreement"].toDouble(), 1.0);
        }
        QVERIFY(std::fabs(rows["int81"]["delta_ppl_pct"].toDouble()) < 0.5);
        QVERIFY(rows["int81"]["kl"].toDouble() < 0.01);
        QCOMPARE(rows["int81"]["ratio_vs_int8"].toDouble(), 1.0);
        for (const char* level : {"cachegen1", "cachegen2", "cachegen3"}) {
            QVERIFY2(rows[level]["ratio_vs_int8"].toDouble() > 1.3, level);
            QVERIFY2(std::fabs(rows[level]["delta_ppl_pct"].toDouble()) < 10.0, level);
            QVERIFY2(rows[level]["kl"].toDouble() < 0.1, level);
        }
        // More bins, less damage: level 3 is closer to the original than level 1.
        QVERIFY(rows["cachegen3"]["kl"].toDouble() < rows["cachegen1"]["kl"].toDouble());
        QVERIFY(rows["cachegen1"]["bits_per_value"].toDouble() < rows["cachegen3"]["bits_per_value"].toDouble());
    }
};

KVSCOPE_TEST_MAIN(TestCli)
#include "tst_cli.moc"
