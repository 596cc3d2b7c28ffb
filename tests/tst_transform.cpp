// The transform codec (core/codec/transform.h): RoPE undo/redo, the Jacobi eigen-solver, the fit,
// water-filling, chunk and container round trips, the golden file, and one-line errors on bad
// input. On a real SmolLM2 capture when the default model is installed.
//
// Regenerate the golden file (only when the transform format changes on purpose):
//   KVSCOPE_REGEN_GOLDEN=1 ./tst_transform
#include "testmain.h"

#include "codec_cases.h"

#include "codec/container.h"
#include "codec/rans.h"
#include "codec/simd_path.h"
#include "codec/symbol_stream.h"
#include "codec/transform.h"
#include "codec/transform_kernels.h"
#include "common/crc32.h"
#include "common/error.h"
#include "common/half.h"
#include "eval/codec_trial.h"
#include "kv/kv_compare.h"
#include "kvio/kv_h5.h"
#include "model/model.h"

#include <QFile>
#include <QTemporaryDir>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

using namespace kvscope;

namespace {

const QString kGolden = QStringLiteral(KVSCOPE_TEST_DATA "/golden-transform/transform_synthetic.kvc");
const QString kGoldenCrc = QStringLiteral(KVSCOPE_TEST_DATA "/golden-transform/transform_synthetic.decoded_crc");
const QString kGolden32 = QStringLiteral(KVSCOPE_TEST_DATA "/golden-transform/transform_synthetic_rans32.kvc");
const QString kGolden32Crc = QStringLiteral(KVSCOPE_TEST_DATA "/golden-transform/transform_synthetic_rans32.decoded_crc");

// A float32 synthetic cache with the side data the transform codec uses: a RoPE table, query
// second moments and o_proj matrices (random, deterministic).
KvSet syntheticCache(uint64_t seed, int tokens = 300, DType dtype = DType::F32, int H = 2, int D = 16)
{
    SyntheticSpec spec;
    spec.shape = KvShape{3, H, D, tokens};
    spec.dtype = dtype;
    spec.seed = seed;
    KvSet kv = makeSyntheticKv(spec);
    const int L = 3;
    for (int i = 0; i < D / 2; ++i) kv.ropeInvFreq.push_back(float(1.0 / std::pow(10000.0, 2.0 * i / D)));
    std::mt19937 rng(7);  // the same model statistics for every seed, as for one model
    std::uniform_real_distribution<float> u(0.1f, 2.0f);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (int l = 0; l < L; ++l) {
        std::vector<float> q(size_t(H) * D);
        for (float& x : q) x = u(rng);
        std::vector<float> w = kvscope_test::randomGramWeights(rng, g, H, D);
        kv.querySq.push_back(q);
        kv.valueWeight.push_back(w);
    }
    return kv;
}

// Attention mass like a prefill's: a sink-like decay plus a few heavy tokens (every 50th and
// the recent end), and the least on token 100.
void withAttentionMass(KvSet& kv)
{
    const KvShape& sh = kv.shape();
    kv.attnMass.assign(size_t(sh.numLayers), std::vector<float>(size_t(sh.numKvHeads) * sh.numTokens));
    for (int l = 0; l < sh.numLayers; ++l)
        for (int h = 0; h < sh.numKvHeads; ++h)
            for (int t = 0; t < sh.numTokens; ++t) {
                float w = 0.002f * std::exp(2.0f * std::sin(0.37f * float(t + 3 * l + h)));
                if (t % 50 == 0 || t >= sh.numTokens - 4) w = 0.2f;
                if (t == sh.numTokens - 3) w = 0.5f;
                if (t >= 96 && t < 104) w = 1e-5f;
                kv.attnMass[size_t(l)][size_t(h) * sh.numTokens + t] = w;
            }
}

CodecParams transformParams(const KvSet& kv, const TransformSettings& s, const std::vector<double>& thetas)
{
    return kvscope_test::transformParams(kv, s, thetas, 128);
}

// Calibrates on `calib` and stores the model in the profile, like `calibrate --codec transform`.
void calibrate(CodecParams& p, const std::vector<const KvSet*>& calib)
{
    const TransformModel m = fitTransform(p.profile.transform, p.profile.transformLevels, calib);
    serializeTransformModel(m, p.profile.transformModel);
}

double maxAbsDiff(const KvSet& a, const KvSet& b)
{
    return compareKv(a, b).maxAbs;
}

// Largest |value| of a cache: fp16 sinks round within 2^-11 of it.
double maxAbs(const KvSet& a)
{
    double m = 0;
    const KvShape& s = a.shape();
    for (int l = 0; l < s.numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            for (int h = 0; h < s.numKvHeads; ++h)
                for (int t = 0; t < s.numTokens; ++t)
                    for (int d = 0; d < s.headDim; ++d) m = std::max(m, double(std::fabs(a.at(k, l, h, t, d))));
    return m;
}

// Sum over every value of the attention-weighted squared error of keys (querySq per channel).
double keyMse(const KvSet& a, const KvSet& b)
{
    double e = 0;
    size_t n = 0;
    const KvShape& s = a.shape();
    for (int l = 0; l < s.numLayers; ++l)
        for (int h = 0; h < s.numKvHeads; ++h)
            for (int t = 0; t < s.numTokens; ++t)
                for (int d = 0; d < s.headDim; ++d, ++n) {
                    const double x = a.at(KvKind::Key, l, h, t, d) - b.at(KvKind::Key, l, h, t, d);
                    const double y = a.at(KvKind::Value, l, h, t, d) - b.at(KvKind::Value, l, h, t, d);
                    e += x * x + y * y;
                }
    return e / double(n);
}

std::vector<uint8_t> readAll(const QString& path)
{
    QFile f(path);
    if (!f.open(QIODevice::ReadOnly)) return {};
    const QByteArray b = f.readAll();
    return std::vector<uint8_t>(b.begin(), b.end());
}

uint32_t decodedCrc(const KvSet& kv)
{
    uint32_t crc = 0;
    std::vector<uint8_t> all;
    for (int l = 0; l < kv.shape().numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            all.insert(all.end(), kv.data(k, l), kv.data(k, l) + kv.tensorBytes());
    crc = crc32(all.data(), all.size());
    return crc;
}

// FORMAT.md's tolerance for the fast decoder paths, value by value against the scalar reference
// (the same dtype): at most one unit in the last place of the output dtype at |ref|, plus
// 2^-12 of the largest |ref| of the (kind, layer), where a sum of terms cancels. Fills `why`
// with the first value outside it.
bool withinFastTolerance(const KvSet& got, const KvSet& ref, std::string* why, double* worst = nullptr)
{
    const KvShape& s = ref.shape();
    const int ulpBits = ref.dtype() == DType::F16 ? 10 : ref.dtype() == DType::BF16 ? 7 : 23;
    double worstRatio = 0;
    for (int l = 0; l < s.numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value}) {
            double big = 0;
            for (int h = 0; h < s.numKvHeads; ++h)
                for (int t = 0; t < s.numTokens; ++t)
                    for (int d = 0; d < s.headDim; ++d) big = std::max(big, double(std::fabs(ref.at(k, l, h, t, d))));
            for (int h = 0; h < s.numKvHeads; ++h)
                for (int t = 0; t < s.numTokens; ++t)
                    for (int d = 0; d < s.headDim; ++d) {
                        const double r = ref.at(k, l, h, t, d), g = got.at(k, l, h, t, d);
                        const double ulp = std::ldexp(1.0, std::max(std::ilogb(std::max(std::fabs(r), 1e-30)), -14) - ulpBits);
                        const double tol = ulp + std::ldexp(big, -12), err = std::fabs(g - r);
                        worstRatio = std::max(worstRatio, err / tol);
                        if (!(err <= tol)) {
                            if (why)
                                *why = std::string(kindName(k)) + " layer " + std::to_string(l) + " head " + std::to_string(h) +
                                       " token " + std::to_string(t) + " dim " + std::to_string(d) + ": " + std::to_string(g) +
                                       " against " + std::to_string(r);
                            return false;
                        }
                    }
        }
    if (worst) *worst = worstRatio;
    return true;
}

// The decoder paths a test compares with the scalar reference: each SIMD path this CPU has, and
// the AVX-512 path once more with AMX tiles when the CPU has them.
struct DecoderPath {
    SimdPath simd;
    bool amx;
    std::string name() const { return std::string(simdPathName(simd)) + (amx ? "+amx" : ""); }
    void select() const
    {
        setSimdPath(simd);
        setAmxEnabled(amx);
    }
};
std::vector<DecoderPath> decoderPaths()
{
    std::vector<DecoderPath> v{{SimdPath::Scalar, false}};
    if (simdPathSupported(SimdPath::Avx2)) v.push_back({SimdPath::Avx2, false});
    if (simdPathSupported(SimdPath::Avx512)) v.push_back({SimdPath::Avx512, false});
    if (simdPathSupported(SimdPath::Avx512) && amxSupported()) v.push_back({SimdPath::Avx512, true});
    return v;
}
void restoreDecoderPath()
{
    setSimdPath(bestSimdPath());
    setAmxEnabled(true);
}

}  // namespace

class TestTransform : public QObject {
    Q_OBJECT

private slots:
    void ropeRoundTrip()
    {
        const int D = 64, T = 50;
        std::vector<float> inv(D / 2);
        for (int i = 0; i < D / 2; ++i) inv[size_t(i)] = float(1.0 / std::pow(100000.0, 2.0 * i / D));
        std::mt19937 rng(1);
        std::normal_distribution<float> g(0.0f, 3.0f);
        std::vector<float> x(size_t(T) * D);
        for (float& v : x) v = g(rng);
        std::vector<float> y = x;
        applyRope(y.data(), T, D, inv.data(), 1000, 20, false);
        // The rotate_half convention: y_i = x_i cos a - x_{i+D/2} sin a, a = pos * inv_freq[i].
        const double a = 1020.0 * inv[3];
        QVERIFY(std::fabs(y[3] - (x[3] * std::cos(a) - x[3 + D / 2] * std::sin(a))) < 1e-5);
        QVERIFY(std::fabs(y[3 + D / 2] - (x[3 + D / 2] * std::cos(a) + x[3] * std::sin(a))) < 1e-5);
        applyRope(y.data(), T, D, inv.data(), 1000, 20, true);
        double worst = 0;
        for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::fabs(y[i] - x[i])) / (1 + std::fabs(x[i])));
        QVERIFY2(worst < 4e-7, std::to_string(worst).c_str());  // a few float32 roundings
    }

    // The KV file carries the RoPE table and the attention statistics; files without them read
    // with them empty.
    void kvFileKeepsCodecSideData()
    {
        QTemporaryDir dir;
        KvSet kv = syntheticCache(5, 40);
        kv.ropePosition0 = 17;
        const std::string path = (dir.path() + "/a.h5").toStdString();
        writeKvH5(kv, path);
        const KvSet back = readKvH5(path);
        QCOMPARE(back.ropeInvFreq, kv.ropeInvFreq);
        QCOMPARE(back.ropePosition0, 17);
        QCOMPARE(back.querySq, kv.querySq);
        QCOMPARE(back.valueWeight, kv.valueWeight);
        KvSet plain = syntheticCache(5, 40);
        plain.ropeInvFreq.clear();
        plain.querySq.clear();
        plain.valueWeight.clear();
        writeKvH5(plain, path);
        const KvSet old = readKvH5(path);
        QVERIFY(!old.hasRope() && old.querySq.empty() && old.valueWeight.empty());
    }

    void kvFileKeepsAttentionMass()
    {
        QTemporaryDir dir;
        KvSet kv = syntheticCache(6, 40);
        withAttentionMass(kv);
        const std::string path = (dir.path() + "/a.h5").toStdString();
        writeKvH5(kv, path);
        QCOMPARE(readKvH5(path).attnMass, kv.attnMass);
        kv.attnMass.clear();
        writeKvH5(kv, path);
        QVERIFY(readKvH5(path).attnMass.empty());
    }

    // Token importance: tokens in class 0 (the most attended quarter) decode exactly as without
    // it, the others coarser, and the file is smaller; both entropy modes and the container
    // round-trip; a cache without attention mass is refused with one line.
    void tokenImportance_data()
    {
        QTest::addColumn<int>("entropy");
        QTest::newRow("rans") << int(TransformEntropy::Rans);
        QTest::newRow("rans32") << int(TransformEntropy::Rans32);
        QTest::newRow("fixed") << int(TransformEntropy::Fixed);
    }
    void tokenImportance()
    {
        QFETCH(int, entropy);
        const KvSet calib = syntheticCache(71);
        KvSet kv = syntheticCache(72, 300, DType::F16);
        withAttentionMass(kv);
        TransformSettings s;
        s.entropy = TransformEntropy(entropy);
        CodecParams off = transformParams(kv, s, {0.03, 0.003});
        calibrate(off, {&calib});
        CodecParams on = off;
        on.profile.transform.tokenImportance = true;  // the same calibrated model serves both
        for (int level = 1; level <= 2; ++level) {
            const CodecTrial a = runCodecTrial(kv, off, level), b = runCodecTrial(kv, on, level);
            // rans32: up to 4 class streams per block of 128 bytes of states each, which on this
            // small cache (C = 32, 128-token chunks) costs about what the classes save.
            if (TransformEntropy(entropy) != TransformEntropy::Rans32)
                QVERIFY2(double(b.bytes) < 0.92 * double(a.bytes), (std::to_string(b.bytes) + " vs " + std::to_string(a.bytes)).c_str());
            // Token 297 has the most mass in every layer (class 0), token 100 the least (class 3).
            for (int l = 0; l < 3; ++l)
                for (int h = 0; h < 2; ++h)
                    for (int d = 0; d < 16; ++d)
                        for (KvKind k : {KvKind::Key, KvKind::Value})
                            QCOMPARE(b.decoded.at(k, l, h, 297, d), a.decoded.at(k, l, h, 297, d));
            double errA = 0, errB = 0;
            for (int t = 96; t < 104; ++t)
                for (int d = 0; d < 16; ++d) {
                    errA += std::pow(a.decoded.at(KvKind::Value, 1, 0, t, d) - kv.at(KvKind::Value, 1, 0, t, d), 2);
                    errB += std::pow(b.decoded.at(KvKind::Value, 1, 0, t, d) - kv.at(KvKind::Value, 1, 0, t, d), 2);
                }
            QVERIFY2(errB > 1.5 * errA, (std::to_string(errB) + " vs " + std::to_string(errA)).c_str());
        }
        QTemporaryDir dir;
        prepareTransform(on, kv, "profile");
        QVERIFY(on.transform->settings.tokenImportance);
        const std::string path = (dir.path() + "/i.kvc").toStdString();
        writeKvc(kv, on, path);
        const auto r = KvcReader::openFile(path);
        QVERIFY(r->params().transform->settings.tokenImportance);
        QCOMPARE(decodedCrc(r->decodeAll({1})), decodedCrc(runCodecTrial(kv, on, 1).decoded));
        KvSet bare = kv;
        bare.attnMass.clear();
        CodecParams p = on;
        kvscope_test::expectError("bare.h5", [&] { prepareTransform(p, bare, "bare.h5"); }, "needs a capture with attention mass");
    }

    // RD rounding (READ ME FIRST, 8): the decoder is unchanged, the bytes fall, the weighted
    // error rises by less than a coarser water level would cost for the same saving, and the
    // calibrated tables (counted with the rule) decode the payload exactly as the encoder saw it.
    void rdoRounding()
    {
        const KvSet calib = syntheticCache(81);
        const KvSet kv = syntheticCache(82, 300, DType::F16);
        TransformSettings s;
        CodecParams off = transformParams(kv, s, {0.03, 0.01});
        calibrate(off, {&calib});
        CodecParams on = transformParams(kv, s, {0.03, 0.01});
        on.profile.transform.rdoLambda = 1.0;
        calibrate(on, {&calib});
        for (int level = 1; level <= 2; ++level) {
            const CodecTrial a = runCodecTrial(kv, off, level), b = runCodecTrial(kv, on, level);
            QVERIFY2(double(b.bytes) < 0.985 * double(a.bytes), (std::to_string(b.bytes) + " vs " + std::to_string(a.bytes)).c_str());
            const double ea = keyMse(kv, a.decoded), eb = keyMse(kv, b.decoded);
            QVERIFY2(eb > ea && eb < 1.6 * ea, (std::to_string(eb) + " vs " + std::to_string(ea)).c_str());
            // Sinks stay exact.
            QCOMPARE(b.decoded.at(KvKind::Value, 2, 1, 1, 5), kv.at(KvKind::Value, 2, 1, 1, 5));
        }
        // The switch is encoder-side: a model calibrated without it serves with it (and decodes).
        CodecParams mixed = off;
        mixed.profile.transform.rdoLambda = 1.0;
        const CodecTrial m = runCodecTrial(kv, mixed, 1), a = runCodecTrial(kv, off, 1);
        QVERIFY(m.bytes < a.bytes);
        QTemporaryDir dir;
        prepareTransform(on, kv, "profile");
        const std::string path = (dir.path() + "/r.kvc").toStdString();
        writeKvc(kv, on, path);
        QCOMPARE(decodedCrc(KvcReader::openFile(path)->decodeAll({1})), decodedCrc(runCodecTrial(kv, on, 1).decoded));
        // The profile keeps it; out of range is a one-line error.
        CodecProfile pr = on.profile;
        const std::string ppath = (dir.path() + "/p.json").toStdString();
        saveProfile(pr, ppath);
        QCOMPARE(loadProfile(ppath).transform.rdoLambda, 1.0);
        pr.transform.rdoLambda = 20;
        kvscope_test::expectError("p.json", [&] { validateProfile(pr, "p.json"); }, "transform.rdo_lambda");
    }

    // Per-cache means (READ ME FIRST, 9): a cache whose values sit away from the calibration's
    // mean (another genre) codes smaller and closer with adapt_mean; the means travel in the
    // file (which decodes like the trial) and count 4 bytes per channel and block.
    void adaptMean()
    {
        const KvSet calib = syntheticCache(83);
        KvSet kv = syntheticCache(84, 300, DType::F32);
        const KvShape& sh = kv.shape();
        for (int l = 0; l < sh.numLayers; ++l)  // values of channel 3 of head 1 shifted by 1.5
            for (int t = 0; t < sh.numTokens; ++t) kv.set(KvKind::Value, l, 1, t, 3, kv.at(KvKind::Value, l, 1, t, 3) + 1.5f);
        TransformSettings s;
        CodecParams off = transformParams(kv, s, {0.03, 0.01});
        calibrate(off, {&calib});
        CodecParams on = off;
        on.profile.transform.adaptMean = true;
        prepareTransform(on, kv, "profile");
        const TransformModel& m = *on.transform;
        QVERIFY(m.meansFromCache);
        QCOMPARE(transformSideBytes(m), size_t(2 * sh.numLayers * sh.numKvHeads * sh.headDim * 4));
        double mean = 0;  // the coded tokens' mean of that channel in layer 2 (value channel 1 * D + 3)
        for (int t = s.sinkTokens; t < sh.numTokens; ++t) mean += kv.at(KvKind::Value, 2, 1, t, 3);
        mean /= double(sh.numTokens - s.sinkTokens);
        QVERIFY(std::fabs(m.block(KvKind::Value, 2).mean[size_t(sh.headDim + 3)] - mean) < 1e-5);
        for (int level = 1; level <= 2; ++level) {
            const CodecTrial a = runCodecTrial(kv, off, level), b = runCodecTrial(kv, on, level);
            const double ea = keyMse(kv, a.decoded), eb = keyMse(kv, b.decoded);
            QVERIFY2(b.bytes < a.bytes && eb < ea, (std::to_string(b.bytes) + " B, error " + std::to_string(eb) + " vs " +
                                                    std::to_string(a.bytes) + " B, " + std::to_string(ea)).c_str());
            QCOMPARE(b.tableBytes, transformSideBytes(m));
        }
        QTemporaryDir dir;
        const std::string path = (dir.path() + "/m.kvc").toStdString();
        writeKvc(kv, on, path);
        QCOMPARE(decodedCrc(KvcReader::openFile(path)->decodeAll({2})), decodedCrc(runCodecTrial(kv, on, 2).decoded));
        const std::string ppath = (dir.path() + "/p.json").toStdString();
        saveProfile(on.profile, ppath);
        QVERIFY(loadProfile(ppath).transform.adaptMean);
    }

    // READ ME FIRST, 10: layers 1 and 2 repeat layer 0 (scaled) plus noise, so one PCA across the
    // three codes their shared part once: fewer bytes at no more error than a PCA per layer, and
    // every path (in-memory trial, container, token importance, per-cache means) decodes the same.
    // The grouped block has 3 x 2 x 64 = 384 channels, so its fit takes the BLAS and LAPACK path
    // (linalg.h kBlasOrder) and the per-layer one (128) the loops and Jacobi.
    void layerGroups()
    {
        auto correlated = [](uint64_t seed) {
            KvSet kv = syntheticCache(seed, 300, DType::F32, 2, 64);
            std::mt19937 rng(static_cast<uint32_t>(seed));
            std::normal_distribution<float> g(0.0f, 1.0f);
            const KvShape& sh = kv.shape();
            for (int l = 1; l < sh.numLayers; ++l)
                for (KvKind k : {KvKind::Key, KvKind::Value})
                    for (int h = 0; h < sh.numKvHeads; ++h)
                        for (int t = 0; t < sh.numTokens; ++t)
                            for (int d = 0; d < sh.headDim; ++d)
                                kv.set(k, l, h, t, d, kv.at(k, 0, h, t, d) * (1.0f + 0.25f * float(l)) + 0.05f * g(rng));
            withAttentionMass(kv);
            return kv;
        };
        const KvSet calib = correlated(91), kv = correlated(92);
        const KvShape& sh = kv.shape();
        TransformSettings perLayer, grouped;
        grouped.layerGroup = 3;
        CodecParams p1 = transformParams(kv, perLayer, {0.03, 0.01}), p3 = transformParams(kv, grouped, {0.03, 0.01});
        calibrate(p1, {&calib});
        calibrate(p3, {&calib});
        prepareTransform(p3, kv, "profile");
        QCOMPARE(p3.transform->numLayers, 1);
        QCOMPARE(p3.transform->heads, 3 * sh.numKvHeads);
        QCOMPARE(p3.transform->settings.layerGroup, 3);
        for (int level = 1; level <= 2; ++level) {
            const CodecTrial a = runCodecTrial(kv, p1, level), b = runCodecTrial(kv, p3, level);
            const double ea = keyMse(kv, a.decoded), eb = keyMse(kv, b.decoded);
            QVERIFY2(double(b.bytes) < 0.8 * double(a.bytes) && eb < 1.25 * ea,
                     (std::to_string(b.bytes) + " B, error " + std::to_string(eb) + " vs " + std::to_string(a.bytes) +
                      " B, " + std::to_string(ea)).c_str());
        }
        QTemporaryDir dir;
        const std::string path = (dir.path() + "/g.kvc").toStdString();
        writeKvc(kv, p3, path);
        QCOMPARE(decodedCrc(KvcReader::openFile(path)->decodeAll({2})), decodedCrc(runCodecTrial(kv, p3, 2).decoded));
        for (int variant = 0; variant < 2; ++variant) {  // encoder-side switches read the group's layers too
            CodecParams q = p3;
            q.transform.reset();
            (variant == 0 ? q.profile.transform.tokenImportance : q.profile.transform.adaptMean) = true;
            prepareTransform(q, kv, "profile");
            const CodecTrial t = runCodecTrial(kv, q, 1);
            QVERIFY(keyMse(kv, t.decoded) < 2.0 * keyMse(kv, runCodecTrial(kv, p3, 1).decoded));
        }
        const std::string ppath = (dir.path() + "/p.json").toStdString();
        saveProfile(p3.profile, ppath);
        QCOMPARE(loadProfile(ppath).transform.layerGroup, 3);
        CodecProfile bad = p3.profile;
        bad.transform.layerGroup = 0;
        kvscope_test::expectError("p.json", [&] { validateProfile(bad, "p.json"); }, "transform.layer_group");
        TransformSettings two;
        two.layerGroup = 2;
        try {
            fitTransform(two, p1.profile.transformLevels, {&calib});
            QFAIL("layer_group 2 of 3 layers was accepted");
        } catch (const Error& e) {
            QCOMPARE(std::string(e.what()), std::string("transform: layer_group 2 does not divide the 3 layers"));
        }
        try {  // a grouped model does not fit a cache of another layer count
            KvShape six = sh;
            six.numLayers = 6;
            parseTransformModel(p3.profile.transformModel.data(), p3.profile.transformModel.size(), six, "m");
            QFAIL("a 1 x 3-layer model was accepted for 6 layers");
        } catch (const Error& e) {
            QVERIFY2(std::string(e.what()).find("m: the model is for 1 layers x 6 heads x 64") == 0, e.what());
        }
    }

    // fitTransform is fitTransformBlocks + fitTransformLevel per level, byte for byte.
    void fitSplitsIntoLevels()
    {
        const KvSet calib = syntheticCache(91);
        TransformSettings s;
        CodecParams p = transformParams(calib, s, {0.1, 0.01});
        p.profile.transformLevels[1].valueLayerScale = {0.5, 1.0, 2.0};
        const TransformModel whole = fitTransform(s, p.profile.transformLevels, {&calib});
        TransformFit fit = fitTransformBlocks(s, {&calib});
        for (const TransformLevel& l : p.profile.transformLevels) {
            fit.model.keyTheta.push_back(l.keyTheta);
            fit.model.valueTheta.push_back(l.valueTheta);
            fit.model.levels.push_back(fitTransformLevel(fit, l));
        }
        std::vector<uint8_t> a, b;
        serializeTransformModel(whole, a);
        serializeTransformModel(fit.model, b);
        QVERIFY(a == b);
        // Layer scales 0.5 and 2: theta 4x apart, the step of the largest component 2x; layer 2
        // codes no more components than it does at scale 1.
        const double ratio = double(whole.levelBlock(2, KvKind::Value, 2).step[0]) / double(whole.levelBlock(2, KvKind::Value, 0).step[0]);
        QVERIFY2(std::fabs(ratio - 2.0) < 1e-5, std::to_string(ratio).c_str());
        TransformLevel flat = p.profile.transformLevels[1];
        flat.valueLayerScale.clear();
        const std::vector<TransformLevelBlock> f = fitTransformLevel(fit, flat);
        int codedFlat = 0;
        for (float st : f[size_t(3 + 2)].step) codedFlat += st > 0;
        QVERIFY(whole.codedComponents(2, KvKind::Value, 2) <= codedFlat);
        QVERIFY(std::fabs(double(whole.levelBlock(2, KvKind::Value, 2).step[0]) / double(f[size_t(3 + 2)].step[0]) - std::sqrt(2.0)) < 1e-5);
        TransformLevel bad = p.profile.transformLevels[0];
        bad.keyLayerScale = {1.0};
        kvscope_test::expectError("transform", [&] { fitTransformLevel(fit, bad); }, "1 layer scales for 3 layers");
    }

    void eigenOrthonormal_data()
    {
        QTest::addColumn<int>("n");
        QTest::newRow("8") << 8;
        QTest::newRow("64") << 64;
        QTest::newRow("192") << 192;
        QTest::newRow("320 (LAPACK)") << 320;  // linalg.h kBlasOrder and beyond
    }
    void eigenOrthonormal()
    {
        QFETCH(int, n);
        std::mt19937 rng{uint32_t(n)};
        std::normal_distribution<double> g(0.0, 1.0);
        std::vector<double> b(size_t(n) * n), a(size_t(n) * n, 0.0);
        for (double& x : b) x = g(rng);
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j)
                for (int k = 0; k < n; ++k) a[size_t(i) * n + j] += b[size_t(k) * n + i] * b[size_t(k) * n + j];
        std::vector<double> val, vec;
        symmetricEigen(a, n, val, vec);
        double orth = 0, resid = 0, scale = val.front();
        for (int i = 0; i < n; ++i) {
            if (i > 0) QVERIFY(val[size_t(i)] <= val[size_t(i - 1)]);
            for (int j = 0; j < n; ++j) {
                double d = 0;
                for (int k = 0; k < n; ++k) d += vec[size_t(i) * n + k] * vec[size_t(j) * n + k];
                orth = std::max(orth, std::fabs(d - (i == j ? 1.0 : 0.0)));
            }
            for (int r = 0; r < n; ++r) {  // A v_i = lambda_i v_i
                double av = 0;
                for (int k = 0; k < n; ++k) av += a[size_t(r) * n + k] * vec[size_t(i) * n + k];
                resid = std::max(resid, std::fabs(av - val[size_t(i)] * vec[size_t(i) * n + r]) / scale);
            }
        }
        QVERIFY2(orth < 1e-10, std::to_string(orth).c_str());
        QVERIFY2(resid < 1e-10, std::to_string(resid).c_str());
    }

    // invertMatrix works in panels of pivots (linalg.cpp); the encoder's bytes rest on its
    // inverse being the plain pivot-by-pivot Gauss-Jordan's to the bit, on every SIMD path. The
    // plain loop is written out here as the reference (x86-64 has no FMA at its baseline, so
    // this file's a - f * b is the same two roundings as linalg.cpp's). Orders across and within
    // panels, with row swaps (random matrices), without (a heavy diagonal), and with zero factors.
    void inverseMatchesPlainLoop_data()
    {
        QTest::addColumn<int>("n");
        QTest::addColumn<int>("kind");  // 0 random, 1 diagonal-heavy (no swaps), 2 a third of entries 0
        QTest::newRow("1") << 1 << 0;
        QTest::newRow("31") << 31 << 0;
        QTest::newRow("33 no swaps") << 33 << 1;
        QTest::newRow("100 zeros") << 100 << 2;
        QTest::newRow("300") << 300 << 0;
    }
    void inverseMatchesPlainLoop()
    {
        QFETCH(int, n);
        QFETCH(int, kind);
        std::mt19937_64 rng{uint64_t(n * 3 + kind)};
        std::normal_distribution<double> g(0.0, 1.0);
        std::vector<double> a(size_t(n) * n);
        for (double& x : a) x = kind == 2 && rng() % 3 == 0 ? 0.0 : g(rng);
        if (kind == 1)
            for (int i = 0; i < n; ++i) a[size_t(i) * n + i] += 1000.0;
        std::vector<double> m = a, ref(size_t(n) * n, 0.0);
        for (int i = 0; i < n; ++i) ref[size_t(i) * n + i] = 1.0;
        for (int col = 0; col < n; ++col) {
            int piv = col;
            for (int r = col + 1; r < n; ++r)
                if (std::fabs(m[size_t(r) * n + col]) > std::fabs(m[size_t(piv) * n + col])) piv = r;
            for (int k = 0; k < n; ++k) {
                std::swap(m[size_t(piv) * n + k], m[size_t(col) * n + k]);
                std::swap(ref[size_t(piv) * n + k], ref[size_t(col) * n + k]);
            }
            const double r = 1.0 / m[size_t(col) * n + col];
            for (int k = 0; k < n; ++k) m[size_t(col) * n + k] *= r, ref[size_t(col) * n + k] *= r;
            for (int row = 0; row < n; ++row) {
                const double f = m[size_t(row) * n + col];
                if (row == col || f == 0) continue;
                for (int k = col + 1; k < n; ++k) m[size_t(row) * n + k] -= f * m[size_t(col) * n + k];
                for (int k = 0; k < n; ++k) ref[size_t(row) * n + k] -= f * ref[size_t(col) * n + k];
            }
        }
        const SimdPath saved = simdPath();
        for (SimdPath path : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {
            if (!simdPathSupported(path)) continue;
            setSimdPath(path);
            const std::vector<double> inv = invertMatrix(a, n, "m");
            QVERIFY2(std::memcmp(inv.data(), ref.data(), sizeof(double) * ref.size()) == 0, simdPathName(path));
        }
        setSimdPath(saved);
        double err = 0;  // and it is an inverse
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j) {
                double d = 0;
                for (int k = 0; k < n; ++k) d += a[size_t(i) * n + k] * ref[size_t(k) * n + j];
                err = std::max(err, std::fabs(d - (i == j ? 1.0 : 0.0)));
            }
        QVERIFY2(err < 1e-8, std::to_string(err).c_str());
        std::vector<double> singular(9, 1.0);
        kvscope_test::expectError("m", [&] { invertMatrix(singular, 3, "m"); }, "m: the transform matrix is singular");
    }

    void symbolStreamRoundTrip()
    {
        const int rows = 37, cols = 5;
        std::mt19937 rng(3);
        std::vector<CodingTable> enc(cols), dec(cols);
        std::vector<uint8_t> sym(size_t(rows) * cols);
        for (int c = 0; c < cols; ++c) {
            const int A = 3 + 2 * c;
            std::vector<uint32_t> counts{}; counts.resize(size_t(A));
            for (uint32_t& x : counts) x = rng() % 100;
            buildCodingTable(counts.data(), A, &enc[size_t(c)], false);
            buildCodingTable(counts.data(), A, &dec[size_t(c)], true);
            for (int r = 0; r < rows; ++r) sym[size_t(r) * cols + c] = uint8_t(rng() % A);
        }
        std::vector<uint8_t> stream;
        encodeSymbolMatrix(sym.data(), rows, cols, enc.data(), stream);
        {  // the encoder's bytes are those of rans.h's plain reference (encPut: a divide, a loop)
            rans::RansWriter w;
            uint32_t x[rans::kRansWays];
            for (uint32_t& v : x) rans::encInit(&v);
            for (size_t i = sym.size(); i-- > 0;)
                rans::encPut(&x[i % rans::kRansWays], w, enc[i % cols].start(sym[i]), enc[i % cols].freq(sym[i]));
            for (int k = rans::kRansWays - 1; k >= 0; --k) rans::encFlush(x[k], w);
            std::vector<uint8_t> want;
            w.finishInto(want);
            QCOMPARE(stream, want);
        }
        std::vector<uint8_t> back(sym.size());
        decodeSymbolMatrix(stream.data(), stream.size(), rows, cols, dec.data(), back.data(), "s");
        QCOMPARE(back, sym);
        std::vector<uint8_t> cut(stream.begin(), stream.end() - 1);
        kvscope_test::expectError("s", [&] { decodeSymbolMatrix(cut.data(), cut.size(), rows, cols, dec.data(), back.data(), "s"); },
                                  "corrupt");

        // Against a decoder written from FORMAT.md (4 states, symbol i by state i % 4, byte
        // renormalisation, a linear search for the slot): the stream, every truncation and 300
        // streams with one byte changed are accepted or refused alike, with the same symbols.
        auto reference = [&](const std::vector<uint8_t>& b, std::vector<uint8_t>& out) {
            size_t pos = 0;
            bool overrun = false;
            auto byte = [&]() -> uint32_t {
                if (pos < b.size()) return b[pos++];
                overrun = true;
                return 0;
            };
            uint32_t x[4];
            for (uint32_t& v : x) v = byte() | byte() << 8 | byte() << 16 | byte() << 24;
            for (size_t i = 0; i < out.size() && !overrun; ++i) {
                const CodingTable& t = dec[i % cols];
                uint32_t& st = x[i % 4];
                const uint32_t slot = st & 4095;
                int sy = 0;
                while (t.start(sy) + t.freq(sy) <= slot) ++sy;
                st = t.freq(sy) * (st >> 12) + slot - t.start(sy);
                const int k = int(st < (1u << 23)) + int(st < (1u << 15));
                for (int j = 0; j < k; ++j) st = st << 8 | byte();
                out[i] = uint8_t(sy);
            }
            bool ok = !overrun && pos == b.size();
            for (uint32_t v : x) ok = ok && v == (1u << 23);
            return ok;
        };
        auto same = [&](const std::vector<uint8_t>& b) {
            std::vector<uint8_t> want(sym.size()), got(sym.size());
            const bool ok = reference(b, want);
            bool gotOk = true;
            try {
                decodeSymbolMatrix(b.data(), b.size(), rows, cols, dec.data(), got.data(), "s");
            } catch (const Error&) {
                gotOk = false;
            }
            return ok == gotOk && (!ok || got == want);
        };
        QVERIFY(same(stream));
        for (size_t n = 0; n < stream.size(); ++n)
            QVERIFY2(same(std::vector<uint8_t>(stream.begin(), stream.begin() + std::ptrdiff_t(n))), qPrintable(QString::number(n)));
        for (int trial = 0; trial < 300; ++trial) {
            std::vector<uint8_t> b = stream;
            b[rng() % b.size()] ^= uint8_t(1 + rng() % 255);
            QVERIFY2(same(b), qPrintable(QString("trial %1").arg(trial)));
        }
    }

    // rans32 matrices (symbol_stream.h): every SIMD path writes the scalar encoder's bytes and
    // decodes the scalar decoder's symbols, for column counts that are and are not multiples of
    // the kernels' widths (the flat rows of lcm(cols, 16)), short matrices with no full row, wide
    // alphabets with rare symbols (the kernels' slow lookup) and tiny ones; a stream cut short, one
    // with a word too many and one with a corrupt word give the same one-line error on every path.
    void symbolStreamW32_data()
    {
        QTest::addColumn<int>("rows");
        QTest::addColumn<int>("cols");
        QTest::addColumn<int>("maxAlphabet");
        QTest::newRow("37 x 5") << 37 << 5 << 15;
        QTest::newRow("1 x 5 (no full row)") << 1 << 5 << 15;
        QTest::newRow("200 x 1") << 200 << 1 << 3;
        QTest::newRow("50 x 8") << 50 << 8 << 255;
        QTest::newRow("64 x 16") << 64 << 16 << 31;
        QTest::newRow("33 x 24") << 33 << 24 << 101;
        QTest::newRow("40 x 33") << 40 << 33 << 255;
        QTest::newRow("300 x 100") << 300 << 100 << 61;
        QTest::newRow("3 x 192") << 3 << 192 << 255;
    }
    void symbolStreamW32()
    {
        QFETCH(int, rows);
        QFETCH(int, cols);
        QFETCH(int, maxAlphabet);
        std::mt19937 rng(uint32_t(rows * 1000 + cols));
        std::vector<CodingTable> enc(static_cast<size_t>(cols)), dec(static_cast<size_t>(cols));
        std::vector<int> alphabet(static_cast<size_t>(cols));
        for (int c = 0; c < cols; ++c) {
            const int A = 3 + 2 * int(rng() % uint32_t((maxAlphabet - 1) / 2));
            alphabet[size_t(c)] = A;
            std::vector<uint32_t> counts(static_cast<size_t>(A));
            for (int a = 0; a < A; ++a) {  // Laplace-like around the middle, rare edges
                const int q = std::abs(a - A / 2);
                counts[size_t(a)] = uint32_t(100000.0 * std::exp(-0.4 * q)) + rng() % 3;
            }
            buildCodingTable(counts.data(), A, &enc[size_t(c)], false);
            buildCodingTable(counts.data(), A, &dec[size_t(c)], true);
        }
        std::vector<uint8_t> sym(size_t(rows) * cols);
        std::geometric_distribution<int> g(0.3);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) {
                const int A = alphabet[size_t(c)];
                const int q = std::min(g(rng), A / 2) * (rng() % 2 ? 1 : -1);
                sym[size_t(r) * cols + c] = uint8_t(A / 2 + q);
            }
        const SimdPath saved = simdPath();
        std::vector<uint8_t> ref;
        for (SimdPath path : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {
            if (!simdPathSupported(path)) continue;
            setSimdPath(path);
            std::vector<uint8_t> stream{0xee};  // appends after what is there
            encodeSymbolMatrixW32(sym.data(), rows, cols, enc.data(), stream);
            stream.erase(stream.begin());
            if (path == SimdPath::Scalar) {
                ref = stream;
                QVERIFY(ref.size() >= 128 && ref.size() % 2 == 0);
            }
            QVERIFY2(stream == ref, simdPathName(path));
            // Decoded from the end of a buffer (the kernels' read-ahead must not need more).
            std::vector<uint8_t> back(sym.size());
            decodeSymbolMatrixW32(ref.data(), ref.size(), rows, cols, dec.data(), back.data(), "s");
            QVERIFY2(back == sym, simdPathName(path));
            std::vector<uint8_t> cut(ref.begin(), ref.end() - 2), more = ref, flipped = ref;
            more.push_back(0), more.push_back(0);
            // A word past the states when the stream has any (a one-row matrix may have none).
            flipped[flipped.size() > 128 ? 128 + (flipped.size() - 128) / 2 : 64] ^= 0x5a;
            flipped[flipped.size() - 1] ^= 0x21;
            for (const std::vector<uint8_t>* bad : {&cut, &more, &flipped})
                kvscope_test::expectError(
                    "s", [&] { decodeSymbolMatrixW32(bad->data(), bad->size(), rows, cols, dec.data(), back.data(), "s"); },
                    "s: entropy-coded stream is corrupt");
            std::vector<uint8_t> tiny(ref.begin(), ref.begin() + 100);
            kvscope_test::expectError("s", [&] { decodeSymbolMatrixW32(tiny.data(), tiny.size(), rows, cols, dec.data(), back.data(), "s"); },
                                      "s: entropy-coded stream is corrupt");
        }
        setSimdPath(saved);
        kvscope_test::expectError("s", [&] { decodeSymbolMatrixW32(ref.data(), ref.size(), 0, cols, dec.data(), nullptr, "s"); },
                                  "bytes for an empty matrix");
        std::vector<uint8_t> empty;
        encodeSymbolMatrixW32(sym.data(), 0, cols, enc.data(), empty);
        QVERIFY(empty.empty());
    }

    // Transform chunks with entropy rans32: every SIMD path encodes the scalar path's payload
    // bytes; the size exceeds rans by less than the 32 flushed states of every stream; a model
    // calibrated for rans serves rans32 with the same tables, and both decode to the same values.
    void rans32Chunks_data()
    {
        QTest::addColumn<bool>("importance");
        QTest::newRow("plain") << false;
        QTest::newRow("token classes") << true;
    }
    void rans32Chunks()
    {
        QFETCH(bool, importance);
        const KvSet calib = syntheticCache(91);
        KvSet kv = syntheticCache(92, 300, DType::F16);
        if (importance) withAttentionMass(kv);
        TransformSettings s;
        CodecParams p4 = transformParams(kv, s, {0.03, 0.003});
        calibrate(p4, {&calib});
        p4.profile.transform.tokenImportance = importance;
        CodecParams p32 = p4;
        p32.profile.transform.entropy = TransformEntropy::Rans32;  // the rans-calibrated model
        prepareTransform(p4, kv, "profile");
        prepareTransform(p32, kv, "profile");
        QCOMPARE(int(p32.transform->settings.entropy), int(TransformEntropy::Rans32));
        const SimdPath saved = simdPath();
        for (int level = 1; level <= 2; ++level) {
            size_t bytes4 = 0, bytes32 = 0;
            for (int ch = 0; ch < p32.numChunks(); ++ch) {
                setSimdPath(SimdPath::Scalar);
                const std::vector<uint8_t> ref = encodeChunk(p32, kv, ch, level, nullptr);
                bytes32 += ref.size();
                bytes4 += encodeChunk(p4, kv, ch, level, nullptr).size();
                for (SimdPath path : {SimdPath::Avx2, SimdPath::Avx512}) {
                    if (!simdPathSupported(path)) continue;
                    setSimdPath(path);
                    QVERIFY2(encodeChunk(p32, kv, ch, level, nullptr) == ref, simdPathName(path));
                }
            }
            qInfo("level %d: rans %zu bytes, rans32 %zu bytes (%+.2f%%)", level, bytes4, bytes32,
                  100.0 * (double(bytes32) / double(bytes4) - 1.0));
            // Beyond the 112 more bytes of states per stream (up to 4 streams per block with
            // classes), 16-bit words cost at most a few bytes per stream.
            const size_t streams = size_t(p32.numChunks()) * size_t(2 * kv.shape().numLayers) * (importance ? 4 : 1);
            QVERIFY(bytes32 > bytes4);
            QVERIFY2(bytes32 - bytes4 < streams * 128, (std::to_string(bytes32) + " vs " + std::to_string(bytes4)).c_str());
            // The same symbols: both decode to the same values.
            QCOMPARE(decodedCrc(runCodecTrial(kv, p32, level).decoded), decodedCrc(runCodecTrial(kv, p4, level).decoded));
        }
        setSimdPath(saved);
    }

    // A rans32 block stream cut short or with garbage (sizes kept consistent, past the chunk CRC)
    // gives the rans path's one-line error on every SIMD path.
    void rans32BadStreams()
    {
        const KvSet calib = syntheticCache(61), kv = syntheticCache(62, 200, DType::F16);
        TransformSettings s;
        s.entropy = TransformEntropy::Rans32;
        CodecParams p = transformParams(kv, s, {0.1});
        calibrate(p, {&calib});
        prepareTransform(p, kv, "profile");
        const std::vector<uint8_t> good = encodeChunk(p, kv, 1, 1, nullptr);
        const int B = 2 * kv.shape().numLayers;
        auto u32At = [](const std::vector<uint8_t>& b, size_t at) {
            return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24;
        };
        // Block 0's stream: after the size arrays, every block's raw tokens and block 0's escapes.
        size_t rawAll = good.size() - 8 * size_t(B);
        for (int b = 0; b < B; ++b) rawAll -= u32At(good, 4 * size_t(b)) + u32At(good, 4 * size_t(B + b));
        const size_t streamAt = 8 * size_t(B) + rawAll + u32At(good, 0), streamLen = u32At(good, 4 * size_t(B));
        QVERIFY(streamLen >= 128);
        std::vector<uint8_t> cut = good;  // the stream's last word dropped, its size 2 smaller
        cut.erase(cut.begin() + std::ptrdiff_t(streamAt + streamLen - 2), cut.begin() + std::ptrdiff_t(streamAt + streamLen));
        const uint32_t shorter = uint32_t(streamLen - 2);
        for (int i = 0; i < 4; ++i) cut[4 * size_t(B) + size_t(i)] = uint8_t(shorter >> (8 * i));
        std::vector<uint8_t> garbage = good;
        for (size_t i = streamAt + 128; i < streamAt + streamLen; i += 7) garbage[i] ^= 0x5a;
        std::vector<uint8_t> states = good;  // the initial states too short for a stream
        for (int i = 0; i < 4; ++i) states[4 * size_t(B) + size_t(i)] = 0;
        states.erase(states.begin() + std::ptrdiff_t(streamAt), states.begin() + std::ptrdiff_t(streamAt + streamLen));
        const SimdPath saved = simdPath();
        KvSet out(kv.shape(), kv.dtype());
        for (SimdPath path : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {
            if (!simdPathSupported(path)) continue;
            setSimdPath(path);
            decodeChunk(p, good.data(), good.size(), 1, 1, nullptr, out, "c");
            for (const std::vector<uint8_t>* bad : {&cut, &garbage, &states})
                kvscope_test::expectError("c", [&] { decodeChunk(p, bad->data(), bad->size(), 1, 1, nullptr, out, "c"); },
                                          "c: key layer 0: entropy-coded stream is corrupt");
        }
        setSimdPath(saved);
        // An entropy id past rans32 in the transform section.
        std::vector<uint8_t> model;
        serializeTransformModel(*p.transform, model);
        QCOMPARE(int(model[11]), 2);  // magic, version, 5 settings bytes, then entropy
        model[11] = 3;
        kvscope_test::expectError("m", [&] { parseTransformModel(model.data(), model.size(), kv.shape(), "m"); },
                                  "unknown transform setting id");
        // The profile names it; an unknown name lists the three.
        const std::string head = R"({"format":"kvscope-profile","version":2,"levels":[{"key_bins":[16],"value_bins":[16]}],)";
        QCOMPARE(int(profileFromJson(head + R"("transform":{"entropy":"rans32","levels":[{"key_theta":1,"value_theta":1}]}})", "p")
                         .transform.entropy),
                 int(TransformEntropy::Rans32));
        kvscope_test::expectError("p", [&] { profileFromJson(head + R"("transform":{"entropy":"rans64","levels":[{"key_theta":1,"value_theta":1}]}})", "p"); },
                                  "unknown value 'rans64' (fixed, rans, rans32)");
        CodecProfile pr = p.profile;
        QCOMPARE(int(profileFromJson(profileToJson(pr), "rt").transform.entropy), int(TransformEntropy::Rans32));
    }

    // Every component coded at a fine step: reconstruction within float32/fp16 rounding of the basis.
    void fineStepReconstructs_data()
    {
        QTest::addColumn<int>("basis");
        QTest::addColumn<bool>("across");
        QTest::addColumn<bool>("rope");
        QTest::newRow("pca across heads, rope undo") << int(TransformBasis::Pca) << true << true;
        QTest::newRow("pca per head") << int(TransformBasis::Pca) << false << true;
        QTest::newRow("hadamard") << int(TransformBasis::Hadamard) << false << false;
        QTest::newRow("none") << int(TransformBasis::None) << false << true;
    }
    void fineStepReconstructs()
    {
        QFETCH(int, basis);
        QFETCH(bool, across);
        QFETCH(bool, rope);
        const KvSet calib = syntheticCache(11), kv = syntheticCache(12);
        TransformSettings s;
        s.basis = TransformBasis(basis);
        s.acrossHeads = across;
        s.ropeUndo = rope;
        s.sinkTokens = 2;
        CodecParams p = transformParams(kv, s, {1e-9});
        calibrate(p, {&calib});
        const CodecTrial t = runCodecTrial(kv, p, 1);
        const double err = maxAbsDiff(kv, t.decoded);
        QVERIFY2(err < 1e-3 * maxAbs(kv), std::to_string(err).c_str());
        // Sinks are stored as fp16: token 0 reproduces exactly up to fp16 rounding.
        QVERIFY(std::fabs(t.decoded.at(KvKind::Key, 0, 0, 0, 0) - kv.at(KvKind::Key, 0, 0, 0, 0)) <=
                std::fabs(kv.at(KvKind::Key, 0, 0, 0, 0)) * 1e-3f);
    }

    // The inverse transform on every SIMD path this CPU has (and AMX) is within FORMAT.md's
    // tolerance of the scalar reference, value by value, at a coarse and a fine step, with bases
    // across heads (dense columns) and per head (block-diagonal columns, whose zero rows are
    // skipped), RoPE undone, and token classes.
    void simdPathsAgree_data()
    {
        QTest::addColumn<bool>("across");
        QTest::addColumn<bool>("importance");
        QTest::addColumn<bool>("rans32");
        QTest::addColumn<int>("heads");
        QTest::addColumn<int>("headDim");
        QTest::newRow("pca across heads") << true << false << false << 2 << 16;
        QTest::newRow("pca per head") << false << false << false << 2 << 16;
        QTest::newRow("pca per head, token classes") << false << true << false << 2 << 16;
        QTest::newRow("rans32 pca across heads") << true << false << true << 2 << 16;
        QTest::newRow("rans32 pca per head, token classes") << false << true << true << 2 << 16;
        // 72 channels: the register sums' groups (32 for AVX2, 64 for AVX-512) end mid-head and
        // leave a tail of 8 channels
        QTest::newRow("pca across heads, 3 x 24 channels") << true << false << false << 3 << 24;
        QTest::newRow("pca per head, 3 x 24 channels") << false << false << false << 3 << 24;
        // headDim -24: the same, with one block's first mean set to -0, which rules out adding the
        // zero terms (Tile::plain) and skipping the zero rows of a column in that block
        QTest::newRow("pca per head, 3 x 24 channels, a mean of -0") << false << false << false << 3 << -24;
    }
    void simdPathsAgree()
    {
        QFETCH(bool, across);
        QFETCH(bool, importance);
        QFETCH(bool, rans32);
        QFETCH(int, heads);
        QFETCH(int, headDim);
        const bool negZero = headDim < 0;
        headDim = std::abs(headDim);
        const KvSet calib = syntheticCache(11, 300, DType::F32, heads, headDim);
        KvSet kv = syntheticCache(12, 300, DType::F32, heads, headDim);
        if (importance) withAttentionMass(kv);
        TransformSettings s;
        if (rans32) s.entropy = TransformEntropy::Rans32;
        s.acrossHeads = across;
        s.ropeUndo = true;
        s.sinkTokens = 2;
        CodecParams p = transformParams(kv, s, {0.05, 1e-6});
        TransformModel m = fitTransform(p.profile.transform, p.profile.transformLevels, {&calib});
        if (negZero) m.blocks[1].mean[0] = -0.0f;
        serializeTransformModel(m, p.profile.transformModel);
        p.profile.transform.tokenImportance = importance;
        for (int level : {1, 2}) {
            KvSet ref;
            int paths = 0;
            double worst = 0;
            for (const DecoderPath& path : decoderPaths()) {
                path.select();
                const KvSet d = runCodecTrial(kv, p, level).decoded;
                ++paths;
                if (path.simd == SimdPath::Scalar) {
                    ref = d;
                    continue;
                }
                std::string why;
                double ratio = 0;
                QVERIFY2(withinFastTolerance(d, ref, &why, &ratio), (path.name() + ": " + why).c_str());
                worst = std::max(worst, ratio);
            }
            qInfo("level %d: %d paths within tolerance of the scalar reference (worst error %.3g of the bound)", level, paths, worst);
        }
        restoreDecoderPath();
    }

    // The decoder's store (transform_decode.cpp): with fp16 output the AVX2 and AVX-512 paths
    // re-apply RoPE and round in one pass; the bytes must be those of the generic store (RoPE in
    // double as rope.cpp does it, then floatToHalfN) of the same sums, which a float32 output of
    // the same payloads gives. Keys with RoPE undone, head dims a multiple of 16 (the AVX-512
    // store) and of 8 only (the AVX2 store, AVX-512's generic one), two levels.
    void fusedStoreSameBytes_data()
    {
        QTest::addColumn<int>("heads");
        QTest::addColumn<int>("headDim");
        QTest::newRow("2 x 16 channels") << 2 << 16;
        QTest::newRow("3 x 24 channels") << 3 << 24;
        QTest::newRow("2 x 64 channels") << 2 << 64;
    }
    void fusedStoreSameBytes()
    {
        QFETCH(int, heads);
        QFETCH(int, headDim);
        const KvSet calib = syntheticCache(21, 300, DType::F32, heads, headDim);
        const KvSet kv = syntheticCache(22, 300, DType::F32, heads, headDim);
        TransformSettings s;
        s.entropy = TransformEntropy::Rans32;
        s.ropeUndo = true;
        s.sinkTokens = 2;
        CodecParams p = transformParams(kv, s, {0.05, 1e-6});
        const TransformModel m = fitTransform(p.profile.transform, p.profile.transformLevels, {&calib});
        serializeTransformModel(m, p.profile.transformModel);
        prepareTransform(p, kv, "test");
        for (int level : {1, 2}) {
            std::vector<ChunkRequest> all;
            for (int c = 0; c < p.numChunks(); ++c) all.push_back({c, level});
            const std::vector<std::vector<uint8_t>> payloads = encodeChunks(p, kv, all, nullptr);
            std::vector<ChunkPayload> batch;
            for (int c = 0; c < p.numChunks(); ++c) batch.push_back({c, level, payloads[size_t(c)].data(), payloads[size_t(c)].size(), "test"});
            for (const DecoderPath& path : decoderPaths()) {
                path.select();
                KvSet f16(p.shape, DType::F16), f32(p.shape, DType::F32);
                decodeChunks(p, batch, nullptr, f16);
                decodeChunks(p, batch, nullptr, f32);
                size_t differ = 0, n = 0;
                for (int l = 0; l < p.shape.numLayers; ++l)
                    for (KvKind k : {KvKind::Key, KvKind::Value}) {
                        const size_t count = p.shape.layerValues();
                        std::vector<uint16_t> want(count);
                        floatToHalfN(reinterpret_cast<const float*>(f32.data(k, l)), want.data(), count);
                        const uint16_t* got = reinterpret_cast<const uint16_t*>(f16.data(k, l));
                        for (size_t i = 0; i < count; ++i, ++n) differ += got[i] != want[i];
                    }
                QVERIFY2(differ == 0, qPrintable(QString("%1, level %2: %3 of %4 fp16 values differ from the generic store's")
                                                     .arg(QString::fromStdString(path.name())).arg(level).arg(differ).arg(n)));
            }
        }
        restoreDecoderPath();
    }

    // The inverse transform's kernels against the scalar reference on random tiles, value by
    // value: within 2^-16 of the sum of the terms' magnitudes S = |mean| + sum |A z| (FORMAT.md),
    // channel counts that are not a multiple of 16, components not a multiple of 32, tiles that
    // end mid-way, token classes, and escapes too large for AMX's bfloat16 (added in float32).
    void inverseTransformKernels_data()
    {
        QTest::addColumn<int>("C");
        QTest::addColumn<int>("K");
        QTest::addColumn<int>("nt");
        QTest::newRow("SmolLM2 block 192 x 150, 64 tokens") << 192 << 150 << 64;
        QTest::newRow("72 x 37, 23 tokens") << 72 << 37 << 23;
        QTest::newRow("960 x 333, 40 tokens") << 960 << 333 << 40;
        QTest::newRow("8 x 1, 1 token") << 8 << 1 << 1;
    }
    void inverseTransformKernels()
    {
        QFETCH(int, C);
        QFETCH(int, K);
        QFETCH(int, nt);
        std::mt19937 rng(uint32_t(C * 7 + K));
        std::normal_distribution<float> g(0.0f, 1.0f);
        std::vector<float> col(size_t(K) * C), step(static_cast<size_t>(K)), mean(static_cast<size_t>(C));
        for (float& x : col) x = halfToFloat(floatToHalf(0.2f * g(rng)));  // the decode matrix is stored as fp16
        for (float& x : step) x = 0.01f + 0.1f * float(rng() % 100) / 100.0f;
        for (float& x : mean) x = 0.5f + g(rng);  // never -0
        std::vector<int> M(4 * static_cast<size_t>(K));  // [class * K + k]
        for (int k = 0; k < K; ++k) {
            M[size_t(k)] = 20 + int(rng() % 100);
            for (int c = 1; c < 4; ++c) M[size_t(c) * K + k] = std::max(1, (M[size_t(k)] + (1 << c) - 1) >> c);
        }
        std::vector<uint8_t> sym(size_t(nt) * K), escapes;
        std::vector<int> cls(static_cast<size_t>(nt));
        for (int i = 0; i < nt; ++i) {
            cls[size_t(i)] = int(rng() % 4);
            for (int k = 0; k < K; ++k) {
                const int m = M[size_t(cls[size_t(i)]) * K + k];
                int64_t q = std::lround(g(rng) * 0.3f * float(m));
                if (rng() % 97 == 0) q = (rng() % 2 ? 1 : -1) * int64_t(m + rng() % 5000);  // an escape
                if (q > -m && q < m) {
                    sym[size_t(i) * K + k] = uint8_t(q + m);
                    continue;
                }
                sym[size_t(i) * K + k] = uint8_t(q < 0 ? 0 : 2 * m);
                uint64_t zz = q < 0 ? (uint64_t(-q) << 1) - 1 : uint64_t(q) << 1;
                for (; zz >= 0x80; zz >>= 7) escapes.push_back(uint8_t(zz | 0x80));
                escapes.push_back(uint8_t(zz));
            }
        }
        const std::string where = "tile";
        std::vector<int> lo(static_cast<size_t>(K), 0), hi(static_cast<size_t>(K), C);
        std::vector<float> zq(size_t(nt) * K);
        auto vectorPath = [&](SimdPath path, std::vector<float>& v) {
            const detail::TileKernels kk = detail::kernelsFor(path);
            detail::EscapeReader esc{escapes.data(), escapes.data() + escapes.size(), &where};
            v.assign(size_t(detail::kTileTokens) * C, 0.0f);
            for (int i = 0; i < nt; ++i) {
                kk.dequant(sym.data() + size_t(i) * K, M.data() + size_t(cls[size_t(i)]) * K, step.data(), float(1 << cls[size_t(i)]),
                           K, zq.data() + size_t(i) * K, esc);
                std::copy(mean.begin(), mean.end(), v.begin() + std::ptrdiff_t(size_t(i) * C));
            }
            QVERIFY(esc.p == esc.end);
            kk.accumulate(detail::Tile{v.data(), col.data(), zq.data(), lo.data(), hi.data(), nt, K, C, true});
        };
        std::vector<float> ref;
        vectorPath(SimdPath::Scalar, ref);
        std::vector<double> S(size_t(nt) * C);  // the bound's scale, from the reference's z
        for (int i = 0; i < nt; ++i)
            for (int c = 0; c < C; ++c) {
                double a = std::fabs(mean[size_t(c)]);
                for (int k = 0; k < K; ++k) a += std::fabs(double(col[size_t(k) * C + c]) * zq[size_t(i) * K + k]);
                S[size_t(i) * C + c] = a;
            }
        auto check = [&](const std::string& name, const float* v, int ld) {
            double worst = 0;
            for (int i = 0; i < nt; ++i)
                for (int c = 0; c < C; ++c) {
                    const double e = std::fabs(double(v[size_t(i) * ld + c]) - ref[size_t(i) * C + c]) / S[size_t(i) * C + c];
                    worst = std::max(worst, e);
                    if (!(e <= std::ldexp(1.0, -16)))
                        QFAIL(qPrintable(QString("%1: token %2 channel %3: %4 against %5 (bound %6)")
                                             .arg(QString::fromStdString(name)).arg(i).arg(c).arg(double(v[size_t(i) * ld + c]))
                                             .arg(double(ref[size_t(i) * C + c])).arg(std::ldexp(S[size_t(i) * C + c], -16))));
                }
            qInfo("%s: worst error 2^%.1f S", name.c_str(), worst > 0 ? std::log2(worst) : -99.0);
        };
        for (SimdPath path : {SimdPath::Avx2, SimdPath::Avx512}) {
            if (!simdPathSupported(path)) continue;
            std::vector<float> v;
            vectorPath(path, v);
            check(simdPathName(path), v.data(), C);
        }
        if (!amxSupported()) QSKIP("no AMX on this CPU (or the kernel refuses its tile state)");
        detail::AmxProduct amx;
        QVERIFY(amx.prepare(col.data(), step.data(), mean.data(), K, C));
        // B and the mean rows on cache lines: a tile load whose rows straddle two lines took 6x
        // as long (issue 31). zb and v below are deliberately left as malloc gives them: the
        // product is correct either way.
        QCOMPARE(reinterpret_cast<uintptr_t>(amx.b.data()) % 64, uintptr_t(0));
        QCOMPARE(reinterpret_cast<uintptr_t>(amx.mean16.data()) % 64, uintptr_t(0));
        std::vector<uint16_t> zb(size_t(detail::kTileTokens) * amx.Kp, 0);
        std::vector<float> v(size_t(detail::kTileTokens) * amx.Cp, -1.0f);  // overwritten: the sums start from the mean
        std::vector<detail::AmxFixup> fixups;
        detail::EscapeReader esc{escapes.data(), escapes.data() + escapes.size(), &where};
        for (int i = 0; i < nt; ++i) {
            amx.dequantRow(sym.data() + size_t(i) * K, M.data() + size_t(cls[size_t(i)]) * K, cls[size_t(i)], i,
                           zb.data() + size_t(i) * amx.Kp, esc, fixups);
        }
        QVERIFY(esc.p == esc.end);
        amx.accumulate(v.data(), zb.data(), nt);
        amx.applyFixups(v.data(), col.data(), step.data(), fixups);
        qInfo("AMX: %zu escapes added in float32", fixups.size());
        if (nt * K > 1000) QVERIFY(!fixups.empty());
        check("avx512+amx", v.data(), amx.Cp);
    }

    // The encoder's forward transform on every path: z bit for bit the fused multiply-adds of the
    // reference order (issue 31: s = fma(eT, v, s), c ascending from +0), on component counts
    // that are not a multiple of 8, 16 or 32 and tiles that end mid-way; and the same z are not
    // what separate multiplies and adds give (so a path that stopped fusing would fail here).
    void forwardTransformKernels_data()
    {
        QTest::addColumn<int>("C");
        QTest::addColumn<int>("K");
        QTest::addColumn<int>("nt");
        QTest::newRow("SmolLM2 block 192 x 150, 64 tokens") << 192 << 150 << 64;
        QTest::newRow("72 x 37, 23 tokens") << 72 << 37 << 23;
        QTest::newRow("960 x 333, 13 tokens") << 960 << 333 << 13;
        QTest::newRow("8 x 1, 1 token") << 8 << 1 << 1;
    }
    void forwardTransformKernels()
    {
        QFETCH(int, C);
        QFETCH(int, K);
        QFETCH(int, nt);
        std::mt19937 rng(uint32_t(C * 11 + K));
        std::normal_distribution<float> g(0.0f, 1.0f);
        const int Kp = detail::forwardStride(K);
        std::vector<float> encode(size_t(C) * C), v(size_t(nt) * C), eT(size_t(C) * Kp, -1.0f);
        for (float& x : encode) x = g(rng);
        for (float& x : v) x = g(rng);
        std::vector<int> coded;  // every other component, then the rest: not a prefix
        for (int j = 0; j < C && int(coded.size()) < K; j += 2) coded.push_back(j);
        for (int j = 1; j < C && int(coded.size()) < K; j += 2) coded.push_back(j);
        detail::transposeCodedRows(encode.data(), C, coded.data(), K, Kp, eT.data());
        for (int c = 0; c < C; ++c)
            for (int k = 0; k < Kp; ++k)
                QCOMPARE(eT[size_t(c) * Kp + k], k < K ? encode[size_t(coded[size_t(k)]) * C + c] : 0.0f);
        std::vector<float> fused(size_t(nt) * Kp), plain(size_t(nt) * Kp);
        for (int i = 0; i < nt; ++i)
            for (int k = 0; k < Kp; ++k) {
                float s = 0.0f, p = 0.0f;
                for (int c = 0; c < C; ++c) {
                    const float e = eT[size_t(c) * Kp + k], x = v[size_t(i) * C + c];
                    s = std::fma(e, x, s);
                    volatile float prod = e * x;  // rounded on its own: no contraction
                    p = p + prod;
                }
                fused[size_t(i) * Kp + k] = s;
                plain[size_t(i) * Kp + k] = p;
            }
        if (C > 8) QVERIFY2(fused != plain, "fused and separate multiply-adds agree everywhere: the test cannot tell them apart");
        for (SimdPath path : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {
            if (!simdPathSupported(path)) continue;
            std::vector<float> z(size_t(nt) * Kp, -7.0f);
            detail::kernelsFor(path).forward(detail::ForwardTile{v.data(), eT.data(), z.data(), nt, C, Kp});
            for (size_t i = 0; i < z.size(); ++i)
                if (std::memcmp(&z[i], &fused[i], 4) != 0)
                    QFAIL(qPrintable(QString("%1: token %2 component %3: %4, the reference %5")
                                         .arg(simdPathName(path)).arg(i / size_t(Kp)).arg(i % size_t(Kp))
                                         .arg(double(z[i]), 0, 'g', 9).arg(double(fused[i]), 0, 'g', 9)));
        }
    }

    // Quantisation on every path gives the scalar loop's symbols and escapes (a division in
    // double), also for values a hair from a rounding boundary, where the vector paths' product
    // with 1 / div could round the other way and they must fall back to the division.
    void quantizeKernels()
    {
        std::mt19937 rng(31);
        const int K = 203;
        std::vector<double> div(static_cast<size_t>(K)), inv(static_cast<size_t>(K));
        std::vector<int> M(static_cast<size_t>(K));
        for (int k = 0; k < K; ++k) {
            div[size_t(k)] = double(0.01f + 0.3f * float(rng() % 1000) / 1000.0f) * double(1 << (k % 4));
            inv[size_t(k)] = 1.0 / div[size_t(k)];
            M[size_t(k)] = 1 + int(rng() % 127);
        }
        int nearBoundary = 0;
        for (int row = 0; row < 200; ++row) {
            std::vector<float> z(static_cast<size_t>(K));
            for (int k = 0; k < K; ++k) {
                const int q = int(rng() % (2 * M[size_t(k)] + 9)) - M[size_t(k)] - 4;  // escapes too
                const double half = (q + 0.5) * div[size_t(k)];
                const int ulps = int(rng() % 5) - 2;  // on the boundary or a few float ulps off it
                float x = float(half);
                for (int u = 0; u < std::abs(ulps); ++u) x = std::nextafter(x, ulps > 0 ? 1e30f : -1e30f);
                z[size_t(k)] = row % 2 ? x : float(q * div[size_t(k)]) + 0.1f * float(int(rng() % 9) - 4) * float(div[size_t(k)]);
                nearBoundary += row % 2;
            }
            std::vector<uint8_t> refSym(static_cast<size_t>(K)), refEsc;
            detail::kernelsFor(SimdPath::Scalar).quantize(z.data(), div.data(), inv.data(), M.data(), K, refSym.data(), refEsc);
            for (SimdPath path : {SimdPath::Avx2, SimdPath::Avx512}) {
                if (!simdPathSupported(path)) continue;
                std::vector<uint8_t> sym(static_cast<size_t>(K)), esc;
                detail::kernelsFor(path).quantize(z.data(), div.data(), inv.data(), M.data(), K, sym.data(), esc);
                QVERIFY2(sym == refSym, qPrintable(QString("%1: row %2 symbols").arg(simdPathName(path)).arg(row)));
                QVERIFY2(esc == refEsc, qPrintable(QString("%1: row %2 escapes").arg(simdPathName(path)).arg(row)));
            }
        }
        QVERIFY(nearBoundary > 10000);
    }

    // encodeChunks, the whole-cache path (issue 31: every pair of chunk and block in one loop,
    // block after block): the bytes encodeChunk gives each chunk and level, with 1 and 2 threads,
    // and the error of the first failing chunk although a later chunk fails in a lower block.
    void encodeChunksMatchChunkByChunk()
    {
        const KvSet calib = syntheticCache(21, 300), kv = syntheticCache(22, 300);
        TransformSettings s;
        s.sinkTokens = 2;
        CodecParams p = kvscope_test::transformParams(kv, s, {0.3, 0.05}, 64);
        calibrate(p, {&calib});
        prepareTransform(p, kv, "test");
        QCOMPARE(p.numChunks(), 5);
        std::vector<ChunkRequest> all;
        for (int c = 0; c < p.numChunks(); ++c)
            for (int l = 1; l <= p.numLevels(); ++l) all.push_back({c, l});
        const int saved = omp_get_max_threads();
        for (int threads : {1, 2}) {
            omp_set_num_threads(threads);
            const std::vector<std::vector<uint8_t>> got = encodeChunks(p, kv, all, nullptr);
            QCOMPARE(got.size(), all.size());
            for (size_t i = 0; i < all.size(); ++i)
                QVERIFY2(got[i] == encodeChunk(p, kv, all[i].chunk, all[i].level, nullptr),
                         qPrintable(QString("%1 threads, chunk %2 level %3").arg(threads).arg(all[i].chunk).arg(all[i].level)));
        }
        KvSet bad = syntheticCache(22, 300);
        const std::vector<float> nan(16, std::nanf(""));
        bad.writeRows(KvKind::Value, 2, 0, 64 + 5, 1, nan.data());  // chunk 1, the last block
        bad.writeRows(KvKind::Key, 0, 1, 128 + 5, 1, nan.data());   // chunk 2, the first block
        for (int threads : {1, 2}) {
            omp_set_num_threads(threads);
            try {
                encodeChunks(p, bad, all, nullptr);
                QFAIL("a cache with NaNs encoded");
            } catch (const Error& e) {
                QCOMPARE(QString(e.what()), QString("value layer 2: a value is not finite"));
            }
        }
        omp_set_num_threads(saved);
    }

    // The encoder's forward transform and quantisation on every SIMD path this CPU has give the
    // scalar path's payload bytes (issue 31: the blocked product sums each component in one fixed
    // order of fused multiply-adds): coded-component counts that are not a multiple of 8 or 16,
    // tiles of tokens that end mid-chunk, escapes at the fine level, token classes, RD rounding.
    void encoderPathsAgree_data()
    {
        QTest::addColumn<bool>("across");
        QTest::addColumn<bool>("importance");
        QTest::addColumn<double>("rdo");
        QTest::addColumn<int>("heads");
        QTest::addColumn<int>("headDim");
        QTest::newRow("pca across heads") << true << false << 0.0 << 2 << 16;
        QTest::newRow("pca per head, token classes") << false << true << 0.0 << 2 << 16;
        QTest::newRow("pca across heads, RD rounding") << true << false << 1.0 << 2 << 16;
        QTest::newRow("pca across heads, 3 x 24 channels") << true << false << 0.0 << 3 << 24;
        QTest::newRow("pca per head, 3 x 24 channels, token classes, RD") << false << true << 0.5 << 3 << 24;
    }
    void encoderPathsAgree()
    {
        QFETCH(bool, across);
        QFETCH(bool, importance);
        QFETCH(double, rdo);
        QFETCH(int, heads);
        QFETCH(int, headDim);
        const KvSet calib = syntheticCache(13, 300, DType::F32, heads, headDim);
        KvSet kv = syntheticCache(14, 300, DType::F32, heads, headDim);
        if (importance) withAttentionMass(kv);
        TransformSettings s;
        s.acrossHeads = across;
        s.sinkTokens = 2;
        s.rdoLambda = rdo;
        CodecParams p = transformParams(kv, s, {0.3, 0.05, 1e-6});
        calibrate(p, {&calib});
        p.profile.transform.tokenImportance = importance;
        prepareTransform(p, kv, "test");
        const SimdPath saved = simdPath();
        std::vector<std::vector<uint8_t>> ref;
        int paths = 0;
        for (SimdPath path : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {
            if (!simdPathSupported(path)) continue;
            setSimdPath(path);
            ++paths;
            for (int level = 1; level <= p.numLevels(); ++level)
                for (int c = 0; c < p.numChunks(); ++c) {
                    const std::vector<uint8_t> b = encodeChunk(p, kv, c, level, nullptr);
                    const size_t i = size_t(level - 1) * p.numChunks() + c;
                    if (path == SimdPath::Scalar) ref.push_back(b);
                    else QVERIFY2(b == ref[i], (std::string(simdPathName(path)) + " level " + std::to_string(level) +
                                                " chunk " + std::to_string(c)).c_str());
                }
        }
        setSimdPath(saved);
        qInfo("%d paths give the same payloads", paths);
    }

    // Lower water levels: more bytes, less error, every step.
    void waterfillingMonotone()
    {
        const KvSet calib = syntheticCache(21), kv = syntheticCache(22);
        TransformSettings s;
        CodecParams p = transformParams(kv, s, {1.0, 0.3, 0.1, 0.03, 0.01, 0.003});
        calibrate(p, {&calib});
        uint64_t lastBytes = 0;
        double lastErr = 1e300;
        for (int l = 1; l <= 6; ++l) {
            const CodecTrial t = runCodecTrial(kv, p, l);
            const double e = keyMse(kv, t.decoded);
            QVERIFY2(t.bytes > lastBytes, ("level " + std::to_string(l)).c_str());
            QVERIFY2(e < lastErr, ("level " + std::to_string(l)).c_str());
            lastBytes = t.bytes;
            lastErr = e;
        }
    }

    // Each stage switched off in turn (and the TurboQuant-like baseline) still round-trips.
    void ablationsDecode_data()
    {
        QTest::addColumn<QString>("change");
        for (const char* c : {"rope_off", "mse", "uniform", "fixed", "rans32", "turboquant", "recent", "recent_after_calibration",
                              "uncalibrated",
                              "uncalibrated_rans32"})
            QTest::newRow(c) << QString(c);
    }
    void ablationsDecode()
    {
        QFETCH(QString, change);
        const KvSet calib = syntheticCache(31), kv = syntheticCache(32);
        TransformSettings s;
        if (change == "rope_off") s.ropeUndo = false;
        if (change == "mse") s.weighting = TransformWeighting::Mse;
        if (change == "uniform") s.allocation = TransformAllocation::Uniform;
        if (change == "fixed") s.entropy = TransformEntropy::Fixed;
        if (change == "rans32" || change == "uncalibrated_rans32") s.entropy = TransformEntropy::Rans32;
        if (change == "recent") s.recentTokens = 20;
        if (change == "turboquant") {
            s.basis = TransformBasis::Hadamard;
            s.acrossHeads = false;
            s.weighting = TransformWeighting::Mse;
            s.allocation = TransformAllocation::Uniform;
            s.entropy = TransformEntropy::Fixed;
            s.ropeUndo = false;
        }
        CodecParams p = transformParams(kv, s, {0.1, 1e-7});
        const bool uncalibrated = change.startsWith("uncalibrated");
        if (!uncalibrated) calibrate(p, {&calib});
        // The fit never reads recent_tokens, so a model calibrated without them serves any number.
        if (change == "recent_after_calibration") p.profile.transform.recentTokens = 20;
        const CodecTrial coarse = runCodecTrial(kv, p, 1), fine = runCodecTrial(kv, p, 2);
        QVERIFY(coarse.bytes < fine.bytes);
        const double e = maxAbsDiff(kv, fine.decoded);
        QVERIFY2(e < 1e-3 * maxAbs(kv), (std::to_string(e) + " of " + std::to_string(maxAbs(kv))).c_str());
        if (uncalibrated) QVERIFY(coarse.tableBytes > 0);  // its statistics travel with the cache
        else QCOMPARE(coarse.tableBytes, uint64_t(0));
        if (change.startsWith("recent")) {  // the last tokens are fp16 copies
            const int T = kv.shape().numTokens;
            QCOMPARE(coarse.decoded.at(KvKind::Value, 2, 1, T - 1, 5), halfToFloat(floatToHalf(kv.at(KvKind::Value, 2, 1, T - 1, 5))));
        }
    }

    // writeKvc -> KvcReader decodes every level byte for byte like the in-memory trial; the encoder
    // is deterministic; a skeleton plus payloads decodes too.
    void containerRoundTrip()
    {
        QTemporaryDir dir;
        const KvSet calib = syntheticCache(41), kv = syntheticCache(42, 300, DType::F16);
        CodecParams p = transformParams(kv, TransformSettings{}, {0.1, 0.01});
        calibrate(p, {&calib});
        prepareTransform(p, kv, "profile");
        const std::string a = (dir.path() + "/a.kvc").toStdString(), b = (dir.path() + "/b.kvc").toStdString();
        writeKvc(kv, p, a);
        writeKvc(kv, p, b);
        QCOMPARE(readAll(QString::fromStdString(a)), readAll(QString::fromStdString(b)));
        const auto r = KvcReader::openFile(a);
        QCOMPARE(r->params().codec, CodecId::Transform);
        QCOMPARE(r->params().numLevels(), 2);
        for (int l = 1; l <= 2; ++l) {
            const KvSet fromFile = r->decodeAll({l});
            const CodecTrial t = runCodecTrial(kv, p, l);
            QCOMPARE(decodedCrc(fromFile), decodedCrc(t.decoded));
        }
        const auto sk = KvcReader::fromSkeleton(r->skeleton(), "skeleton");
        KvSet out(kv.shape(), kv.dtype());
        for (int c = 0; c < p.numChunks(); ++c) {
            const std::vector<uint8_t> payload = r->readChunk(c, 2);
            sk->decodePayloadInto(c, 2, payload.data(), payload.size(), out);
        }
        QCOMPARE(decodedCrc(out), decodedCrc(r->decodeAll({2})));
    }

    void goldenDecode()
    {
        // Calibrated on the cache itself (synthetic caches of other seeds put their outlier
        // channels elsewhere, which a real model does not).
        const KvSet kv = syntheticCache(52, 200, DType::F16);
        CodecParams p = transformParams(kv, TransformSettings{}, {0.05});
        calibrate(p, {&kv});
        prepareTransform(p, kv, "profile");
        if (std::getenv("KVSCOPE_REGEN_GOLDEN")) {
            writeKvc(kv, p, kGolden.toStdString());
            setSimdPath(SimdPath::Scalar);
            const KvSet d = KvcReader::openFile(kGolden.toStdString())->decodeAll({1});
            restoreDecoderPath();
            QFile f(kGoldenCrc);
            QVERIFY(f.open(QIODevice::WriteOnly));
            f.write(QByteArray::number(decodedCrc(d)) + "\n");
        }
        if (!QFile::exists(kGolden)) QSKIP("no golden file (run with KVSCOPE_REGEN_GOLDEN=1)");
        QFile f(kGoldenCrc);
        QVERIFY(f.open(QIODevice::ReadOnly));
        const uint32_t want = f.readAll().trimmed().toUInt();
        setSimdPath(SimdPath::Scalar);  // the reference's bytes; the fast paths within tolerance of them
        const KvSet d = KvcReader::openFile(kGolden.toStdString())->decodeAll({1});
        restoreDecoderPath();
        QCOMPARE(decodedCrc(d), want);
        std::string why;
        QVERIFY2(withinFastTolerance(KvcReader::openFile(kGolden.toStdString())->decodeAll({1}), d, &why), why.c_str());
        const KvError e = compareKv(kv, d);  // a coarse level: close, not exact
        QVERIFY2(e.rms < 0.1 * maxAbs(kv), std::to_string(e.rms).c_str());
    }

    // The rans32 golden file: the same synthetic input and level as the rans one. It must decode
    // to its recorded CRC, and today's encoder must write it byte for byte (a change to the
    // rans32 layout, or to anything it codes, fails here until the file is regenerated on purpose).
    void goldenDecodeRans32()
    {
        const KvSet kv = syntheticCache(52, 200, DType::F16);
        TransformSettings s;
        s.entropy = TransformEntropy::Rans32;
        CodecParams p = transformParams(kv, s, {0.05});
        calibrate(p, {&kv});
        prepareTransform(p, kv, "profile");
        if (std::getenv("KVSCOPE_REGEN_GOLDEN")) {
            writeKvc(kv, p, kGolden32.toStdString());
            setSimdPath(SimdPath::Scalar);
            const KvSet d = KvcReader::openFile(kGolden32.toStdString())->decodeAll({1});
            restoreDecoderPath();
            QFile f(kGolden32Crc);
            QVERIFY(f.open(QIODevice::WriteOnly));
            f.write(QByteArray::number(decodedCrc(d)) + "\n");
        }
        if (!QFile::exists(kGolden32)) QSKIP("no golden file (run with KVSCOPE_REGEN_GOLDEN=1)");
        QFile f(kGolden32Crc);
        QVERIFY(f.open(QIODevice::ReadOnly));
        const uint32_t want = f.readAll().trimmed().toUInt();
        const auto r = KvcReader::openFile(kGolden32.toStdString());
        QCOMPARE(int(r->params().transform->settings.entropy), int(TransformEntropy::Rans32));
        setSimdPath(SimdPath::Scalar);
        const KvSet d = r->decodeAll({1});
        restoreDecoderPath();
        QCOMPARE(decodedCrc(d), want);
        std::string why;
        QVERIFY2(withinFastTolerance(r->decodeAll({1}), d, &why), why.c_str());
        // The rans golden's input and level: the same symbols, so the same values.
        QCOMPARE(want, QFile::exists(kGoldenCrc) ? [] {
            QFile g(kGoldenCrc);
            return g.open(QIODevice::ReadOnly) ? g.readAll().trimmed().toUInt() : 0u;
        }() : want);
        QTemporaryDir dir;
        const std::string again = (dir.path() + "/g.kvc").toStdString();
        writeKvc(kv, p, again);
        QVERIFY2(readAll(QString::fromStdString(again)) == readAll(kGolden32), "the rans32 encoder no longer writes the golden bytes");
    }

    void badInput()
    {
        QTemporaryDir dir;
        const KvSet calib = syntheticCache(61), kv = syntheticCache(62, 200, DType::F16);
        CodecParams p = transformParams(kv, TransformSettings{}, {0.1});
        calibrate(p, {&calib});
        prepareTransform(p, kv, "profile");
        const std::string path = (dir.path() + "/x.kvc").toStdString();
        writeKvc(kv, p, path);
        std::vector<uint8_t> bytes = readAll(QString::fromStdString(path));
        // The transform section's offset sits at header byte 136; flip a byte inside it.
        uint64_t off = 0;
        for (int i = 0; i < 8; ++i) off |= uint64_t(bytes[136 + size_t(i)]) << (8 * i);
        std::vector<uint8_t> bad = bytes;
        bad[size_t(off) + 10] ^= 0x40;
        kvscope_test::expectError("bad", [&] { KvcReader::fromMemory(bad, "bad"); }, "transform section: CRC mismatch");
        // A chunk cut short: the CRC catches it; past the CRC (decodeChunk directly), the sizes do.
        const auto r = KvcReader::fromMemory(bytes, "good");
        std::vector<uint8_t> chunk = r->readChunk(0, 1);
        KvSet out(kv.shape(), kv.dtype());
        chunk.resize(chunk.size() - 3);
        kvscope_test::expectError("c", [&] { decodeChunk(r->params(), chunk.data(), chunk.size(), 0, 1, nullptr, out, "c"); },
                                  "block sizes add up");
        // Garbage in a stream (sizes intact): the rANS end-state check.
        chunk = r->readChunk(0, 1);
        for (size_t i = chunk.size() - 40; i < chunk.size(); ++i) chunk[i] ^= 0x5a;
        kvscope_test::expectError("c", [&] { decodeChunk(r->params(), chunk.data(), chunk.size(), 0, 1, nullptr, out, "c"); },
                                  "");
        // A model for another shape.
        std::vector<uint8_t> model;
        serializeTransformModel(*p.transform, model);
        KvShape other = kv.shape();
        other.headDim = 32;
        kvscope_test::expectError("m", [&] { parseTransformModel(model.data(), model.size(), other, "m"); }, "the model is for");
        kvscope_test::expectError("m", [&] { parseTransformModel(model.data(), model.size() - 1, kv.shape(), "m"); }, "");
        // rope_undo on a cache without RoPE parameters.
        KvSet noRope = syntheticCache(63);
        noRope.ropeInvFreq.clear();
        CodecParams q = transformParams(noRope, TransformSettings{}, {0.1});
        kvscope_test::expectError("P.json", [&] { prepareTransform(q, noRope, "P.json"); }, "no RoPE parameters");
        // Profile fields.
        const std::string head = R"({"format":"kvscope-profile","version":2,"levels":[{"key_bins":[16],"value_bins":[16]}],)";
        kvscope_test::expectError("p", [&] { profileFromJson(head + R"("transform":{"basis":"dct","levels":[{"key_theta":1,"value_theta":1}]}})", "p"); },
                                  "unknown value 'dct'");
        kvscope_test::expectError("p", [&] { profileFromJson(head + R"("transform":{"levels":[{"key_theta":-1,"value_theta":1}]}})", "p"); },
                                  "positive");
        kvscope_test::expectError("p", [&] { profileFromJson(head + R"("transform":{"levels":[]}})", "p"); }, "1 to 64 levels");
        kvscope_test::expectError("p", [&] { profileFromJson(head + R"("transform":{"levels":[{"key_theta":1,"value_theta":1}],"model":"@@"}})", "p"); },
                                  "base64");
        // A profile's round trip keeps every switch.
        CodecProfile pr = p.profile;
        pr.transform.basis = TransformBasis::Hadamard;
        pr.transform.recentTokens = 16;
        const CodecProfile back = profileFromJson(profileToJson(pr), "rt");
        QVERIFY(back.transform == pr.transform);
        QCOMPARE(back.transformModel, pr.transformModel);
        QCOMPARE(back.transformLevels.size(), pr.transformLevels.size());
    }

    // A real SmolLM2 capture: the RoPE table is the model's, the statistics are there, and the
    // codec round-trips it at a fine level.
    void smollm2Capture()
    {
        const std::string path = std::string(std::getenv("HOME") ? std::getenv("HOME") : "") +
                                 "/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf";
        if (!QFile::exists(QString::fromStdString(path))) QSKIP("SmolLM2 GGUF not installed");
        RuntimeOptions ro;
        ro.threads = 1;
        const std::unique_ptr<Model> m = Model::open(path, "", ro);
        std::vector<int32_t> ids = m->tokenizer().encode(
            "The lighthouse keeper wrote in the log every evening: the wind, the ships, the colour of the sea. "
            "On the third of March a schooner named Wren passed the point at dusk and signalled twice.", true);
        InferenceSession s(m->runtime());
        s.append(ids, nullptr);
        const KvSet kv = s.exportKv();
        QCOMPARE(int(kv.ropeInvFreq.size()), kv.shape().headDim / 2);
        QVERIFY(std::fabs(kv.ropeInvFreq[1] - float(1.0 / std::pow(100000.0, 2.0 / 64))) < 1e-6f);  // SmolLM2: theta 1e5
        QCOMPARE(int(kv.querySq.size()), kv.shape().numLayers);
        QCOMPARE(int(kv.valueWeight.size()), kv.shape().numLayers);
        CodecParams p = transformParams(kv, TransformSettings{}, {1e-9});
        p.profile.chunkTokens = 16;
        calibrate(p, {&kv});
        const CodecTrial t = runCodecTrial(kv, p, 1);
        const KvError e = compareKv(kv, t.decoded);
        QVERIFY2(e.rms < 0.02, std::to_string(e.rms).c_str());
    }
};

KVSCOPE_TEST_MAIN(TestTransform)
#include "tst_transform.moc"
