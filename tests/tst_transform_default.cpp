// The transform codec's shipped default (core/eval/transform_default.h). What a user relies on:
//  - `--codec transform` without --profile on the default model finds the shipped ladder and,
//    the first time, calibrates it on the ladder's sample contexts and caches a complete profile;
//  - the cached profile carries the calibrated model, the model's fingerprint and every level of
//    the shipped ladder, and a second call reuses it untouched;
//  - a damaged cache entry is refitted, never trusted; a model with no ladder of its own gets the
//    generic ladder;
//  - the calibrated codec encodes and decodes a capture of another text (the sizes of the
//    calibrated and the self-fitted transform are printed side by side).
#include "testmain.h"

#include "codec/container.h"
#include "codec/profile.h"
#include "codec/transform.h"
#include "common/file_io.h"
#include "eval/codec_trial.h"
#include "eval/samples.h"
#include "eval/transform_default.h"
#include "model/llama_runtime.h"
#include "model/model.h"

#include <QFileInfo>
#include <QTemporaryDir>

#include <cstdlib>
#include <fstream>
#include <memory>

using namespace kvscope;

class TestTransformDefault : public QObject {
    Q_OBJECT
    QTemporaryDir m_cache;
    std::unique_ptr<Model> m_model;


private slots:
    void initTestCase()
    {
        QVERIFY(m_cache.isValid());
        // The model stays where it is; only the profile cache moves to a temporary folder.
        const std::string modelPath = defaultModelPath();
        ::setenv("XDG_CACHE_HOME", m_cache.path().toUtf8().constData(), 1);
        if (std::ifstream(modelPath).good()) {
            RuntimeOptions ro;
            ro.threads = 1;
            m_model = Model::open(modelPath, "", ro);
        }
    }

    void findsTheLadders()
    {
        const DefaultTransform own = findDefaultTransform("2b5d3154c5afb0c8");
        QVERIFY(QString::fromStdString(own.ladderPath).endsWith("smollm2-135m-instruct.transform.json"));
        QVERIFY(!own.contexts.empty());
        // Gemma 3 270M (kvscope-cli fetch-model gemma3-270m) has a ladder of its own, found by its fingerprint.
        const DefaultTransform gemma = findDefaultTransform("4976ffac47bad3c3");
        QVERIFY(QString::fromStdString(gemma.ladderPath).endsWith("gemma-3-270m.transform.json"));
        QCOMPARE(loadProfile(gemma.ladderPath).numLayers, 18);
        const DefaultTransform generic = findDefaultTransform("0123456789abcdef");
        QVERIFY(QString::fromStdString(generic.ladderPath).endsWith("generic.transform.json"));
        QCOMPARE(QString::fromStdString(generic.cachePath), m_cache.path() + "/kvscope/profiles/0123456789abcdef.transform.json");
        const CodecProfile p = loadProfile(own.ladderPath);
        QVERIFY2(p.transformLevels.size() >= 5, "the shipped ladder has at least 5 levels for the streamer to choose from");
        QVERIFY(p.transformModel.empty());  // the model is fitted on first use, not shipped
        QCOMPARE(cachedDefaultTransform("0123456789abcdef"), std::string());
    }

    void calibratesOnceThenReuses()
    {
        if (!m_model) QSKIP("the default model is not in the cache (kvscope-cli fetch-model fetches it)");
        const std::string fp = m_model->runtime().fingerprint();
        int lines = 0;
        const std::string path = ensureDefaultTransform(*m_model, [&](const std::string&) { ++lines; });
        QVERIFY(lines >= 2);
        QVERIFY(isRegularFile(path));
        QCOMPARE(cachedDefaultTransform(fp), path);
        const CodecProfile p = loadProfile(path);
        QCOMPARE(p.modelFingerprint, fp);
        QVERIFY(!p.transformModel.empty());
        QCOMPARE(p.transformLevels.size(), loadProfile(findDefaultTransform(fp).ladderPath).transformLevels.size());
        const QDateTime written = QFileInfo(QString::fromStdString(path)).lastModified();
        int again = 0;
        QCOMPARE(ensureDefaultTransform(*m_model, [&](const std::string&) { ++again; }), path);
        QCOMPARE(again, 0);
        QCOMPARE(QFileInfo(QString::fromStdString(path)).lastModified(), written);

        // The calibrated codec on a capture of another text decodes to a cache of the same shape.
        const SampleContext s = loadSampleContext("story");
        InferenceSession session(m_model->runtime());
        session.append(m_model->contextTokens(s.text), nullptr);
        const KvSet kv = session.exportKv();
        CodecParams cal;
        cal.codec = CodecId::Transform;
        cal.shape = kv.shape();
        cal.dtype = kv.dtype();
        cal.profile = p;
        prepareTransform(cal, kv, path);
        CodecParams own = cal;
        own.profile.transformModel.clear();
        own.transform.reset();
        prepareTransform(own, kv, "uncalibrated");
        const int level = p.transformDefaultLevel;
        const CodecTrial a = runCodecTrial(kv, cal, level);
        const CodecTrial b = runCodecTrial(kv, own, level);
        qInfo("story at level %d: calibrated %.3f bits/value, uncalibrated %.3f", level, a.bitsPerValue, b.bitsPerValue);
        QCOMPARE(a.decoded.shape().numTokens, kv.shape().numTokens);
        QVERIFY(a.bitsPerValue > 0.3 && a.bitsPerValue < 6.0);
    }

    void refitsADamagedCache()
    {
        if (!m_model) QSKIP("the default model is not in the cache (kvscope-cli fetch-model fetches it)");
        const std::string fp = m_model->runtime().fingerprint();
        const std::string path = findDefaultTransform(fp).cachePath;
        writeFileAtomic(path, "{\"format\": \"kvscope-profile\", \"trunc");
        QCOMPARE(cachedDefaultTransform(fp), std::string());
        QCOMPARE(ensureDefaultTransform(*m_model), path);
        QVERIFY(!loadProfile(path).transformModel.empty());
    }
};

KVSCOPE_TEST_MAIN(TestTransformDefault)
#include "tst_transform_default.moc"
