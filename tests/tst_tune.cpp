// Sweeps and the auto-tuner on a real (tiny) model: stories260K from ../shared, contexts it wrote
// itself with seeded sampling, its own fp16 cache. What a user relies on:
//  - a sweep's points are sized and scored correctly (lossless baselines score exactly 0, more
//    bins never cost fewer bytes, the Pareto flags are consistent);
//  - codec trials split their bytes into per-layer blocks that add up to the payload;
//  - a tuned profile's levels are ordered by size, each meets its budget as measured on every
//    tuning context, and they record the model fingerprint, budgets and measured figures;
//  - a profile tuned for another model is refused unless forced; bad tuning input is refused.
#include "testmain.h"

#include "codec/profile.h"
#include "eval/codec_trial.h"
#include "eval/sweep.h"
#include "eval/tune.h"
#include "model/generate.h"
#include "modelio/llama2c.h"
#include "model/llama_runtime.h"
#include "modelio/llama_weights.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>

using namespace kvscope;

namespace {

const std::string kStories = KVSCOPE_SOURCE_DIR "/../shared/models/stories260K/stories260K.bin";
constexpr int kChunk = 64;

bool exists(const std::string& p) { return std::ifstream(p).good(); }

// A story the model samples itself from BOS (seeded): `context` tokens, then `continuation`.
struct Story {
    KvSet kv;
    std::unique_ptr<QualityReference> ref;
};

Story makeStory(const LlamaRuntime& rt, uint64_t seed, int context, int continuation)
{
    InferenceSession s(rt);
    SamplingOptions so;
    so.temperature = 0.8;
    so.topP = 0.95;
    so.seed = seed;
    std::vector<int32_t> tokens = {1};
    const Generation g = generate(s, tokens, context + continuation - 1, so);
    tokens.insert(tokens.end(), g.tokens.begin(), g.tokens.end());
    KVSCOPE_ASSERT(int(tokens.size()) == context + continuation);
    EvalTask task;
    task.context.assign(tokens.begin(), tokens.begin() + context);
    task.continuation.assign(tokens.begin() + context, tokens.end());
    task.question = {1, 403, 407};  // the first tokens of another story
    task.answerTokens = 24;
    InferenceSession capture(rt);
    capture.append(task.context, nullptr);
    Story st;
    st.kv = capture.exportKv();
    st.ref = std::make_unique<QualityReference>(rt, task, st.kv);
    return st;
}

CodecProfile baseProfile(int layers)
{
    CodecProfile p = defaultProfile(layers);
    p.chunkTokens = kChunk;
    return p;
}

}  // namespace

class TestTune : public QObject {
    Q_OBJECT
    std::unique_ptr<LlamaRuntime> m_rt;
    Story m_a, m_b;

private slots:
    void initTestCase()
    {
        if (!exists(kStories)) QSKIP("../shared/models/stories260K is absent (third-party test data, not in the repo)");
        m_rt = std::make_unique<LlamaRuntime>(loadLlama2cWeights(kStories), RuntimeOptions{});  // fp16 KV
        m_a = makeStory(*m_rt, 7, 200, 48);
        m_b = makeStory(*m_rt, 11, 160, 48);
    }

    void blockBytesAddUp()
    {
        for (TableMode mode : {TableMode::InBand, TableMode::Shared}) {
            CodecParams p;
            p.shape = m_a.kv.shape();
            p.dtype = m_a.kv.dtype();
            p.profile = baseProfile(p.shape.numLayers);
            p.profile.tables = mode;
            const CodecTrial t = runCodecTrial(m_a.kv, p, 2);
            QCOMPARE(int(t.blockBytes.size()), 2 * p.shape.numLayers);
            uint64_t sum = 0;
            for (uint64_t b : t.blockBytes) sum += b;
            QCOMPARE(sum + t.tableBytes, t.bytes);
            if (mode == TableMode::Shared) QVERIFY(t.tableBytes > 0);
        }
    }

    void sweepPoints()
    {
        SweepGrid g;
        g.base = baseProfile(m_a.kv.shape().numLayers);
        g.keyBins = {{8}, {32}};
        g.valueBins = {{8}, {32}};
        g.chunkTokens = {kChunk};
        g.deltaGroups = {0, 10};
        const std::vector<SweepPoint> pts = runSweep(*m_a.ref, m_a.kv, g);
        QCOMPARE(int(pts.size()), 8 + 5);
        const uint64_t values = m_a.kv.shape().totalValues();
        for (const SweepPoint& p : pts) {
            qInfo("%s K%s V%s delta %d: %.3f bits/value, dPPL %.3f%%, KL %.5f", p.codec.c_str(), groupBinsText(p.keyGroups).c_str(),
                  groupBinsText(p.valueGroups).c_str(), p.deltaGroup, p.bitsPerValue, p.quality.deltaPplPct, p.quality.kl);
            QCOMPARE(p.bitsPerValue, 8.0 * double(p.bytes) / double(values));
            QVERIFY(p.quality.kl >= 0);
        }
        // Grid order: key bins slowest, then value bins, chunk, delta.
        auto at = [&](int k, int v, int d) -> const SweepPoint& { return pts[size_t(k * 4 + v * 2 + d)]; };
        QCOMPARE(at(1, 0, 1).keyGroups, std::vector<int>{32});
        QCOMPARE(at(1, 0, 1).deltaGroup, 10);
        for (int d = 0; d < 2; ++d) {
            QVERIFY(at(1, 1, d).bytes > at(0, 0, d).bytes);
            QVERIFY(at(1, 1, d).quality.kl < at(0, 0, d).quality.kl);
            QVERIFY(at(1, 1, d).keyRms < at(0, 1, d).keyRms);
        }
        // Lossless baselines reproduce the original: exactly zero change, the same answer.
        for (const SweepPoint& p : pts)
            if (p.codec == "fp16" || p.codec == "zstd") {
                QCOMPARE(p.quality.kl, 0.0);
                QCOMPARE(p.quality.deltaPplPct, 0.0);
                QCOMPARE(p.keyRms, 0.0);
            }
        // Pareto: no flagged point is dominated, and every unflagged one is.
        for (const SweepPoint& a : pts) {
            bool dominated = false;
            for (const SweepPoint& b : pts)
                if (&a != &b && b.bytes <= a.bytes && b.quality.kl <= a.quality.kl &&
                    (b.bytes < a.bytes || b.quality.kl < a.quality.kl))
                    dominated = true;
            QCOMPARE(a.pareto, !dominated);
        }
        QCOMPARE(parseGroupBins("32/16/16"), (std::vector<int>{32, 16, 16}));
        QVERIFY_THROWS_EXCEPTION(Error, parseGroupBins("32/x"));
        QVERIFY_THROWS_EXCEPTION(Error, parseGroupBins("2"));
        QVERIFY_THROWS_EXCEPTION(Error, parseGroupBins("300"));
    }

    void tunedProfileMeetsItsBudgets()
    {
        TuneOptions o;
        o.base = baseProfile(m_a.kv.shape().numLayers);
        o.base.tables = TableMode::Shared;
        o.base.deltaGroup = 0;  // at 256 bins this is then exactly the int8 baseline (0.04 % here)
        o.budgets = {1.0, 5.0};
        o.binChoices = {8, 16, 32, 64, 128, 256};  // this toy model needs int8-like bins for 1 %
        o.probeBins = 8;
        o.lambdaSteps = 16;
        const std::vector<TuneContext> ctx = {{"a", m_a.ref.get(), &m_a.kv}, {"b", m_b.ref.get(), &m_b.kv}};
        int lastDone = 0;
        std::string stages;
        const TuneResult r = tuneProfile(m_rt->fingerprint(), ctx, o, [&](const std::string& stage, int done, int) {
            if (stages.empty() || stages.substr(stages.rfind(' ') + 1) != stage) stages += " " + stage;
            lastDone = done;
            return true;
        });
        QCOMPARE(QString::fromStdString(stages), QStringLiteral(" sensitivity rates search final"));
        QVERIFY(lastDone > 0);
        QCOMPARE(int(r.sensitivity.size()), 2);
        QVERIFY(r.measuredCandidates >= 1);
        const CodecProfile& p = r.profile;
        QCOMPARE(p.modelFingerprint, m_rt->fingerprint());
        QVERIFY(p.hasCalibratedTables());
        QVERIFY(!p.levels.empty() && p.levels.size() <= 2);
        QCOMPARE(r.levels.size(), p.levels.size());
        for (size_t l = 0; l < r.levels.size(); ++l) {
            const TunedLevel& t = r.levels[l];
            qInfo("level %zu (budget %.1f%%, %s): %.3f bits/value, %.2fx vs int8, max dPPL %.3f%%, KL %.5f, agreement %.3f",
                  l + 1, t.budget, t.met ? "met" : "missed", t.bitsPerValue, t.ratioVsInt8, t.maxDeltaPplPct,
                  t.meanKl, t.meanAgreement);
            QCOMPARE(int(t.level.keyBins.size()), m_a.kv.shape().numLayers);
            if (l > 0) QVERIFY(t.bytes >= r.levels[l - 1].bytes);
            QVERIFY(t.met);
            QVERIFY2(t.maxDeltaPplPct <= t.budget, std::to_string(t.maxDeltaPplPct).c_str());
            const nlohmann::json m = nlohmann::json::parse(p.levels[l].measuredJson);
            QCOMPARE(m["budget_metric"].get<std::string>(), std::string("delta_ppl_pct"));
            QCOMPARE(m["budget"].get<double>(), t.budget);
            QCOMPARE(m["bits_per_value"].get<double>(), t.bitsPerValue);
            QCOMPARE(int(m["contexts"].size()), 2);
        }
        // The last level answers to the tightest budget.
        QCOMPARE(r.levels.back().budget, 1.0);

        // Round trip through JSON keeps bins, tables and measurements.
        const CodecProfile back = profileFromJson(profileToJson(p), "tuned.json");
        QCOMPARE(back.levels.size(), p.levels.size());
        QCOMPARE(back.levels.back().keyBins, p.levels.back().keyBins);
        QCOMPARE(back.levels.back().measuredJson.empty(), false);
        QCOMPARE(back.levelTables, p.levelTables);
        QCOMPARE(back.modelFingerprint, p.modelFingerprint);

        // Another model's cache: refused with both fingerprints named, accepted when forced.
        try {
            checkProfileModel(p, "0123abcd", "tuned.json", false);
            QFAIL("a profile for another model was accepted");
        } catch (const Error& e) {
            const std::string msg = e.what();
            QVERIFY2(msg.find("tuned.json: model_fingerprint:") == 0, msg.c_str());
            QVERIFY2(msg.find("0123abcd") != std::string::npos, msg.c_str());
        }
        checkProfileModel(p, "0123abcd", "tuned.json", true);
        checkProfileModel(p, m_rt->fingerprint(), "tuned.json", false);
    }

    // KL budgets: every level's worst-context KL is within its budget, and the levels say so.
    void klBudgets()
    {
        TuneOptions o;
        o.base = baseProfile(m_a.kv.shape().numLayers);
        o.base.deltaGroup = 0;
        o.metric = TuneMetric::Kl;
        o.budgets = {0.05, 0.01};
        o.binChoices = {8, 16, 32, 64, 128, 256};
        o.lambdaSteps = 16;
        const TuneResult r = tuneProfile(m_rt->fingerprint(), {{"a", m_a.ref.get(), &m_a.kv}}, o);
        QVERIFY(!r.levels.empty());
        for (const TunedLevel& t : r.levels) {
            qInfo("%s: %.3f bits/value, KL %.5f", t.level.name.c_str(), t.bitsPerValue, t.maxKl);
            QVERIFY(t.met);
            QVERIFY2(t.maxKl <= t.budget, std::to_string(t.maxKl).c_str());
            QVERIFY2(t.level.name.rfind("KL <= ", 0) == 0, t.level.name.c_str());
            QCOMPARE(nlohmann::json::parse(t.level.measuredJson)["budget_metric"].get<std::string>(), std::string("kl"));
        }
        QCOMPARE(r.levels.back().budget, 0.01);
    }

    void badTuningInput()
    {
        TuneOptions o;
        o.base = baseProfile(m_a.kv.shape().numLayers);
        const std::vector<TuneContext> ok = {{"a", m_a.ref.get(), &m_a.kv}};
        auto refused = [&](const std::vector<TuneContext>& c, const TuneOptions& opt, const char* expect) {
            try {
                tuneProfile("fp", c, opt);
                QFAIL(("accepted: " + std::string(expect)).c_str());
            } catch (const Error& e) {
                QVERIFY2(std::string(e.what()).find(expect) != std::string::npos, e.what());
            }
        };
        refused({}, o, "no tuning contexts");
        TuneOptions bins = o;
        bins.binChoices = {4, 300};
        refused(ok, bins, "bins 300 outside 4..256");
        TuneOptions odd = o;
        odd.binChoices = {7};
        refused(ok, odd, "bins 7 outside 4..256 or odd");
        TuneOptions budget = o;
        budget.budgets = {0};
        refused(ok, budget, "not a positive delta_ppl_pct");
        TuneOptions longChunk = o;
        longChunk.base.chunkTokens = 256;
        refused(ok, longChunk, "fewer than one chunk of 256");
        // A context with no continuation cannot be scored.
        EvalTask task = m_a.ref->task();
        task.continuation.clear();
        const QualityReference noCont(*m_rt, task, m_a.kv);
        refused({{"silent", &noCont, &m_a.kv}}, o, "'silent' has no continuation");
    }
};

KVSCOPE_TEST_MAIN(TestTune)
#include "tst_tune.moc"
