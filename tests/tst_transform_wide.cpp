// The transform fit's path for wide blocks (core/codec/transform_wide.h): the float PCA on LAPACK
// (through the Gram matrix with fewer tokens than channels, the covariance otherwise), the
// encoder's matrix A^T W, and the whole codec on one 1024-channel cache fitted both ways (the
// wide path against the double-precision one that smaller blocks keep).
#include "testmain.h"

#include "codec_cases.h"

#include "codec/chunk_codec.h"
#include "codec/profile.h"
#include "codec/simd_path.h"
#include "codec/linalg.h"
#include "codec/transform.h"
#include "codec/transform_wide.h"
#include "eval/codec_trial.h"

#include <algorithm>
#include <cmath>
#include <random>

using namespace kvscope;

namespace {

// H heads of D dims whose channels mix 48 AR(1) latent factors through a fixed random matrix,
// plus 5% independent noise per channel (a covariance of rank ~48 over a floor, as real KV has),
// with RoPE parameters, query second moments and o_proj weights for attention weighting.
KvSet wideCache(uint64_t seed, int tokens, int H = 8, int D = 128)
{
    const int C = H * D, F = 48;
    KvSet kv(KvShape{1, H, D, tokens}, DType::F32);
    std::mt19937 model(11), rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.1f, 2.0f);
    for (KvKind k : {KvKind::Key, KvKind::Value}) {
        std::vector<float> mix(size_t(C) * F), f(static_cast<size_t>(F), 0.0f);
        for (float& x : mix) x = g(model) / std::sqrt(float(F));
        for (int t = 0; t < tokens; ++t) {
            for (float& x : f) x = 0.9f * x + 0.44f * g(rng);
            for (int c = 0; c < C; ++c) {
                float x = 0.05f * g(rng);
                for (int i = 0; i < F; ++i) x += mix[size_t(c) * F + i] * f[size_t(i)];
                kv.set(k, 0, c / D, t, c % D, x);
            }
        }
    }
    for (int i = 0; i < D / 2; ++i) kv.ropeInvFreq.push_back(float(1.0 / std::pow(10000.0, 2.0 * i / D)));
    std::vector<float> q(static_cast<size_t>(C));
    for (float& x : q) x = u(model);
    const std::vector<float> w = kvscope_test::randomGramWeights(model, g, H, D);
    kv.querySq.push_back(q);
    kv.valueWeight.push_back(w);
    return kv;
}

CodecParams transformParams(const KvSet& kv, const std::vector<double>& thetas)
{
    return kvscope_test::transformParams(kv, TransformSettings{}, thetas, 256);
}

// Mean squared error over keys and values.
double mse(const KvSet& a, const KvSet& b)
{
    double e = 0;
    size_t n = 0;
    const KvShape& s = a.shape();
    for (KvKind k : {KvKind::Key, KvKind::Value})
        for (int h = 0; h < s.numKvHeads; ++h)
            for (int t = 0; t < s.numTokens; ++t)
                for (int d = 0; d < s.headDim; ++d, ++n) {
                    const double x = a.at(k, 0, h, t, d) - b.at(k, 0, h, t, d);
                    e += x * x;
                }
    return e / double(n);
}

// Restores the wide path's order when a test that changed it ends.
struct WideOrderScope {
    int saved = detail::wideOrder();
    explicit WideOrderScope(int order) { detail::setWideOrder(order); }
    ~WideOrderScope() { detail::setWideOrder(saved); }
};

}  // namespace

class TestTransformWide : public QObject {
    Q_OBJECT

private slots:
    // The basis is orthonormal to 1e-5, its leading rows are eigenvectors (S v = lambda v to 1e-4
    // of the largest eigenvalue), eigenvalues descend, and with fewer rows than channels the
    // components beyond the rows' rank have eigenvalue 0.
    void pcaOrthonormal_data()
    {
        QTest::addColumn<int>("rows");
        QTest::newRow("600 rows (Gram matrix)") << 600;
        QTest::newRow("1500 rows (covariance)") << 1500;
    }
    void pcaOrthonormal()
    {
        QFETCH(int, rows);
        const int C = 1024;
        const KvSet kv = wideCache(3, rows);
        std::vector<float> y(size_t(rows) * C);
        for (int t = 0; t < rows; ++t)
            for (int c = 0; c < C; ++c) y[size_t(t) * C + c] = kv.at(KvKind::Key, 0, c / 128, t, c % 128);
        std::vector<float> val, basis;
        detail::floatPca(y.data(), size_t(rows), C, val, basis);
        double orth = 0;
        for (int i = 0; i < C; ++i)
            for (int j = i; j < C; ++j) {
                double d = 0;
                for (int k = 0; k < C; ++k) d += double(basis[size_t(i) * C + k]) * basis[size_t(j) * C + k];
                orth = std::max(orth, std::fabs(d - (i == j ? 1.0 : 0.0)));
            }
        qInfo("max |B B^T - I| = %.3g", orth);
        QVERIFY2(orth < 1e-5, std::to_string(orth).c_str());
        for (int i = 1; i < C; ++i) QVERIFY(val[size_t(i)] <= val[size_t(i - 1)] && val[size_t(i)] >= 0);
        if (rows < C) QCOMPARE(val[size_t(rows)], 0.0f);
        double resid = 0;
        std::vector<double> yv(static_cast<size_t>(rows));
        for (int i = 0; i < 64; ++i) {  // S v = y^T (y v) / rows
            const float* v = &basis[size_t(i) * C];
            for (int t = 0; t < rows; ++t) {
                double s = 0;
                for (int k = 0; k < C; ++k) s += double(y[size_t(t) * C + k]) * v[k];
                yv[size_t(t)] = s;
            }
            for (int k = 0; k < C; ++k) {
                double s = 0;
                for (int t = 0; t < rows; ++t) s += double(y[size_t(t) * C + k]) * yv[size_t(t)];
                resid = std::max(resid, std::fabs(s / rows - double(val[size_t(i)]) * v[k]) / double(val[0]));
            }
        }
        qInfo("max |S v - lambda v| / lambda_max = %.3g", resid);
        QVERIFY2(resid < 1e-4, std::to_string(resid).c_str());
    }

    // The encoder's matrix of a fitted 1024-channel block (attention weighting: W diagonal for
    // keys, dense D x D blocks for values) is the Gauss-Jordan inverse of its fp16 decode matrix
    // to within what the fp16 rounding of that matrix allows (measured: 2.7e-4 keys, 2.3e-3
    // values, relative), the same bits on every SIMD path; a matrix not of the form W^{-1/2} B^T
    // gets the Gauss-Jordan inverse itself.
    void encoderMatrix()
    {
        const KvSet kv = wideCache(5, 700);
        CodecParams p = transformParams(kv, {0.03});
        const TransformModel m = fitTransform(p.profile.transform, p.profile.transformLevels, {&kv});
        const int C = m.channels();
        for (KvKind k : {KvKind::Key, KvKind::Value}) {
            const TransformBlock& b = m.block(k, 0);
            const std::vector<double> a(b.decode.begin(), b.decode.end());
            const std::vector<double> gj = invertMatrix(a, C, "m");
            const std::vector<float> e = detail::encoderMatrix(b, m.headDim, "m");
            const SimdPath saved = simdPath();
            for (SimdPath path : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {  // the same bits on every path
                if (!simdPathSupported(path)) continue;
                setSimdPath(path);
                QVERIFY2(detail::encoderMatrix(b, m.headDim, "m") == e, simdPathName(path));
            }
            setSimdPath(saved);
            double diff = 0, scale = 0;
            for (size_t i = 0; i < e.size(); ++i) {
                diff += (double(e[i]) - gj[i]) * (double(e[i]) - gj[i]);
                scale += gj[i] * gj[i];
            }
            const double rel = std::sqrt(diff / scale);
            qInfo("%s: |E - A^-1| / |A^-1| = %.3g", kindName(k), rel);
            QVERIFY2(rel < (k == KvKind::Key ? 1e-3 : 5e-3), (std::string(kindName(k)) + ": " + std::to_string(rel)).c_str());
            QVERIFY(b.encode == e);  // what the fit stored
        }
        TransformBlock r;
        r.mean.assign(size_t(C), 0.0f);
        r.decode.resize(size_t(C) * C);
        std::mt19937 rng(1);
        std::normal_distribution<float> g(0.0f, 0.03f);
        for (int i = 0; i < C; ++i)
            for (int j = 0; j < C; ++j) r.decode[size_t(i) * C + j] = (i == j ? 1.0f : 0.0f) + g(rng);
        prepareDecodeColumns(r);
        const std::vector<double> ra(r.decode.begin(), r.decode.end());
        const std::vector<double> rgj = invertMatrix(ra, C, "m");
        QVERIFY(detail::encoderMatrix(r, 128, "m") == std::vector<float>(rgj.begin(), rgj.end()));
    }

    // One 1024-channel cache, calibrated on another, coded at two levels with the wide path and
    // with the double-precision path that narrower blocks take (LAPACK dsyevd, BLAS products,
    // Gauss-Jordan): the same sizes to 0.1% and the same error to 0.5% (measured: 0.01% and 0.02%).
    void widePathAgainstDouble()
    {
        const KvSet calib = wideCache(7, 900), kv = wideCache(8, 600);
        CodecParams wide = transformParams(kv, {0.03, 0.005}), dbl = wide;
        {
            const TransformModel m = fitTransform(wide.profile.transform, wide.profile.transformLevels, {&calib});
            serializeTransformModel(m, wide.profile.transformModel);
        }
        WideOrderScope scope(1 << 30);
        {
            const TransformModel m = fitTransform(dbl.profile.transform, dbl.profile.transformLevels, {&calib});
            serializeTransformModel(m, dbl.profile.transformModel);
        }
        QVERIFY(wide.profile.transformModel != dbl.profile.transformModel);
        for (int level = 1; level <= 2; ++level) {
            const CodecTrial d = runCodecTrial(kv, dbl, level);
            detail::setWideOrder(detail::kWideOrder);
            const CodecTrial w = runCodecTrial(kv, wide, level);
            detail::setWideOrder(1 << 30);
            const double eb = double(w.bytes) / double(d.bytes), ee = mse(kv, w.decoded) / mse(kv, d.decoded);
            qInfo("level %d: wide %zu B, mse %.6g; double %zu B, mse %.6g", level, size_t(w.bytes), mse(kv, w.decoded),
                  size_t(d.bytes), mse(kv, d.decoded));
            QVERIFY2(std::fabs(eb - 1) < 0.001 && std::fabs(ee - 1) < 0.005,
                     ("bytes " + std::to_string(eb) + ", error " + std::to_string(ee)).c_str());
        }
    }
};

KVSCOPE_TEST_MAIN(TestTransformWide)
#include "tst_transform_wide.moc"
