// The embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF), against reference figures
// recorded in tests/data/reference/smollm2_llamacpp.json by tests/reference/ (llama.cpp through
// llama-cpp-python, and a plain numpy fp32 forward over the same dequantized weights; the README
// there has the commands). Our runtime dequantizes to fp32 and runs fp32, as the numpy forward
// does, so it must match that one closely; llama.cpp multiplies with 8-bit activations, so it is
// matched within its quantization noise. Skips when the model is not in the cache.
#include "testmain.h"

#include "model/generate.h"
#include "model/model.h"

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

#include <cmath>
#include <fstream>

using namespace kvscope;

namespace {

QJsonObject reference()
{
    QFile f(KVSCOPE_TEST_DATA "/reference/smollm2_llamacpp.json");
    if (!f.open(QIODevice::ReadOnly)) return {};
    return QJsonDocument::fromJson(f.readAll()).object();
}

std::vector<int32_t> ids(const QJsonArray& a)
{
    std::vector<int32_t> v;
    for (const auto& x : a) v.push_back(int32_t(x.toInt()));
    return v;
}

}  // namespace

class TestSmolLM2 : public QObject {
    Q_OBJECT
    std::unique_ptr<Model> m_model;
    QJsonObject m_ref;

private slots:
    void initTestCase()
    {
        if (!std::ifstream(defaultModelPath()).good())
            QSKIP("the default model is not in the cache (kvscope-cli fetch-model fetches it)");
        m_ref = reference();
        QVERIFY(!m_ref.isEmpty());
        RuntimeOptions o;
        o.kvDtype = DType::F32;  // the numpy reference keeps its cache in fp32
        m_model = Model::open("", "", o);
        QCOMPARE(m_model->spec().config.numLayers, 30);
        QCOMPARE(m_model->spec().config.numKvHeads, 3);
        QCOMPARE(m_model->spec().config.headDim, 64);
        QCOMPARE(m_model->spec().config.ropeTheta, 100000.0);
        QVERIFY(m_model->spec().tiedEmbeddings);
    }

    void tokenizerMatchesLlamaCpp()
    {
        int checked = 0;
        for (const auto& c : m_ref["tokenizer"].toObject()["cases"].toArray()) {
            const QJsonObject o = c.toObject();
            // ids_special_true: control tokens written in the text are parsed, as our encode does.
            const QJsonValue t = o["ids_special_true"];
            const std::vector<int32_t> want = ids(t.isString() ? o["ids_special_false"].toArray() : t.toArray());
            const std::string text = o["text"].toString().toStdString();
            QCOMPARE(m_model->tokenizer().encode(text, true), want);
            ++checked;
        }
        QVERIFY(checked >= 15);
        for (const auto& p : m_ref["prompts"].toArray())
            QCOMPARE(m_model->tokenizer().encode(p.toObject()["text"].toString().toStdString(), true),
                     ids(p.toObject()["ids"].toArray()));
    }

    void logitsMatchNumpyFp32()
    {
        for (const auto& pv : m_ref["prompts"].toArray()) {
            const QJsonObject p = pv.toObject();
            const std::vector<int32_t> prompt = ids(p["ids"].toArray());
            InferenceSession s(m_model->runtime());
            std::vector<float> all;
            s.append(prompt, nullptr, &all);
            const size_t vocab = all.size() / prompt.size();
            const float* last = all.data() + (prompt.size() - 1) * vocab;

            const QJsonObject np = p["numpy_fp32"].toObject(), cpp = p["llamacpp"].toObject();
            double maxNp = 0, maxCpp = 0;
            for (const auto& e : np["last"].toObject()["top50"].toArray())
                maxNp = std::max(maxNp, std::fabs(last[e.toArray()[0].toInt()] - e.toArray()[1].toDouble()));
            for (const auto& e : cpp["last"].toObject()["top50"].toArray())
                maxCpp = std::max(maxCpp, std::fabs(last[e.toArray()[0].toInt()] - e.toArray()[1].toDouble()));
            // Teacher-forced log-probs of every prompt token after the first.
            double maxLp = 0;
            const QJsonArray lp = np["teacher_forced_logprobs"].toArray();
            for (int t = 1; t < int(prompt.size()); ++t)
                maxLp = std::max(maxLp, std::fabs(logSoftmaxAt(all.data() + size_t(t - 1) * vocab, vocab, prompt[size_t(t)]) -
                                                  lp[t - 1].toDouble()));
            qInfo("%s: max |logit - numpy fp32| %.2e, max |log-prob - numpy fp32| %.2e, max |logit - llama.cpp| %.3f",
                  qPrintable(p["name"].toString()), maxNp, maxLp, maxCpp);
            QVERIFY2(maxNp < 2e-3, qPrintable(QString::number(maxNp)));
            QVERIFY2(maxLp < 2e-3, qPrintable(QString::number(maxLp)));
            QVERIFY2(maxCpp < 2.0, qPrintable(QString::number(maxCpp)));
            QCOMPARE(argmax(last, vocab), int32_t(cpp["last"].toObject()["top50"].toArray()[0].toArray()[0].toInt()));
        }
    }

    void greedyMatches()
    {
        for (const auto& pv : m_ref["prompts"].toArray()) {
            const QJsonObject p = pv.toObject();
            InferenceSession s(m_model->runtime());
            const std::vector<int32_t> got = generate(s, ids(p["ids"].toArray()), 64, SamplingOptions{}).tokens;
            const std::vector<int32_t> np = ids(p["numpy_fp32"].toObject()["greedy"].toObject()["ids"].toArray());
            const std::vector<int32_t> cpp = ids(p["llamacpp"].toObject()["greedy"].toObject()["ids"].toArray());
            size_t sameCpp = 0;
            while (sameCpp < got.size() && sameCpp < cpp.size() && got[sameCpp] == cpp[sameCpp]) ++sameCpp;
            qInfo("%s: greedy equals numpy fp32 for %zu/64 tokens, llama.cpp (Q8 activations) for the first %zu",
                  qPrintable(p["name"].toString()), got == np ? size_t(64) : size_t(0), sameCpp);
            QCOMPARE(got, np);
            // llama.cpp's recorded divergence points (tests/reference/README.md): the plain prompt
            // parts at a near-tie after 5 tokens; the two others agree for all 64.
            QVERIFY(sameCpp >= (p["name"].toString() == "plain_capital" ? 5u : 64u));
        }
    }

    // Weights kept in their Q4_1 blocks and expanded tile by tile per matmul: the same greedy
    // tokens on every prompt, logits within 1e-4 of the expanded model, the same fingerprint
    // (KV files record it), and the weights take the file's size instead of 4 bytes each.
    void packedWeightsMatchExpanded()
    {
        RuntimeOptions o;
        o.kvDtype = DType::F32;
        o.weights = RuntimeOptions::Weights::Packed;
        const std::unique_ptr<Model> packed = Model::open("", "", o);
        QVERIFY(packed->runtime().packedWeights());
        QVERIFY(!m_model->runtime().packedWeights());  // Auto expands a model this small
        QCOMPARE(packed->runtime().fingerprint(), m_model->runtime().fingerprint());
        QVERIFY(packed->spec().weightBytes < 120'000'000);  // Q4_1: 0.75 bytes per weight (+ fp32 norms)
        QCOMPARE(packed->spec().parameters, m_model->spec().parameters);
        for (const auto& pv : m_ref["prompts"].toArray()) {
            const QJsonObject p = pv.toObject();
            const std::vector<int32_t> prompt = ids(p["ids"].toArray());
            InferenceSession a(packed->runtime()), b(m_model->runtime());
            std::vector<float> la, lb;
            a.append(prompt, &la);
            b.append(prompt, &lb);
            float maxDiff = 0;
            for (size_t i = 0; i < la.size(); ++i) maxDiff = std::max(maxDiff, std::fabs(la[i] - lb[i]));
            QVERIFY2(maxDiff < 1e-4f, qPrintable(QString::number(maxDiff)));
            InferenceSession g(packed->runtime());
            const std::vector<int32_t> got = generate(g, prompt, 64, SamplingOptions{}).tokens;
            QCOMPARE(got, ids(p["numpy_fp32"].toObject()["greedy"].toObject()["ids"].toArray()));
        }
    }
};

KVSCOPE_TEST_MAIN(TestSmolLM2)
#include "tst_smollm2.moc"
