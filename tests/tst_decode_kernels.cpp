// The decode kernels. Weight kernels (model/weight_kernels.h) against the expanded path they
// replace in decode steps (dequantizeGgml, then a dot product in double), on random blocks of
// every type they take and, when the default model is in the cache, on every matrix of
// SmolLM2-135M (Q4_1 and Q8_0): the scalar reference and each SIMD path this CPU has, batches of
// 1 to 4, row ranges; errors relative to sum |w x| of the row, against a named tolerance per
// format. Decode attention (model/decode_attention.h) against a softmax computed in double, with
// windows and soft-capping, on every path.
#include "testmain.h"

#include "model/decode_attention.h"
#include "model/model.h"
#include "model/weight_kernels.h"
#include "modelio/ggml_quants.h"
#include "modelio/llama_weights.h"

#include "common/half.h"

#include <cmath>
#include <fstream>
#include <random>
#include <tuple>

using namespace kvscope;

namespace {

struct Format {
    const char* name;
    uint32_t type;
    int blockValues;
    std::vector<int> halfAt;  // byte offsets of the block's fp16 scales
    // |kernel - exact| <= tolerance * sum |w x|: fp32 sums over a row of a few thousand products,
    // in blocks. Measured: at most 6e-8 on the random rows here, 1.8e-7 on SmolLM2's Q4_1
    // matrices (any path); a wrong block layout errs by O(1).
    double tolerance;
};

const std::vector<Format>& formats()
{
    static const std::vector<Format> f = {
        {"Q4_0", GgmlQ4_0, 32, {0}, 1e-6},    {"Q4_1", GgmlQ4_1, 32, {0, 2}, 1e-6},
        {"Q5_0", GgmlQ5_0, 32, {0}, 1e-6},    {"Q8_0", GgmlQ8_0, 32, {0}, 1e-6},
        {"Q4_K", GgmlQ4_K, 256, {0, 2}, 1e-6}, {"Q6_K", GgmlQ6_K, 256, {208}, 1e-6},
    };
    return f;
}

// Random rows of whole blocks with finite, small fp16 scales.
std::vector<uint8_t> randomRows(const Format& f, int64_t rows, int64_t cols, std::mt19937& rng)
{
    const uint64_t rowBytes = ggmlRowBytes(f.type, uint64_t(cols));
    const uint64_t blockBytes = ggmlRowBytes(f.type, uint64_t(f.blockValues));
    std::vector<uint8_t> data(size_t(rowBytes * uint64_t(rows)));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    for (uint8_t& b : data) b = uint8_t(byte(rng));
    for (size_t at = 0; at < data.size(); at += blockBytes)
        for (int off : f.halfAt) {
            const uint16_t h = floatToHalf(scale(rng));
            std::memcpy(&data[at + size_t(off)], &h, 2);
        }
    return data;
}

// Exact reference and scale of row r: sum w x in double, and sum |w x|.
std::pair<double, double> expandedDot(const PackedMatrix& w, int64_t r, const float* x)
{
    std::vector<float> row(size_t(w.cols));
    dequantizeGgml(w.type, w.data + uint64_t(r) * w.rowBytes, w.rowBytes, uint64_t(w.cols), row.data());
    double s = 0, a = 0;
    for (int64_t k = 0; k < w.cols; ++k) {
        s += double(row[size_t(k)]) * x[k];
        a += std::fabs(double(row[size_t(k)]) * x[k]);
    }
    return {s, a};
}

std::vector<SimdPath> paths()
{
    std::vector<SimdPath> p;
    for (SimdPath s : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512})
        if (simdPathSupported(s)) p.push_back(s);
    return p;
}

// Worst |kernel - expanded| / sum |w x| over rows [r0, r1) and a batch of `batch` x rows; the rows
// of y outside [r0, r1) must keep their sentinel.
double worstError(const PackedMatrix& w, int64_t r0, int64_t r1, int batch, SimdPath path, std::mt19937& rng)
{
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(batch * w.cols));
    for (float& v : x) v = nd(rng);
    const int64_t stride = w.rows + 3;
    std::vector<float> y(size_t(batch * stride), -12345.0f);
    packedMatmul(w, r0, r1, x.data(), batch, y.data(), stride, path);
    double worst = 0;
    for (int t = 0; t < batch; ++t)
        for (int64_t r = 0; r < stride; ++r) {
            const float got = y[size_t(t * stride + r)];
            if (r < r0 || r >= r1) {
                if (got != -12345.0f) return INFINITY;
                continue;
            }
            const auto [exact, scale] = expandedDot(w, r, x.data() + t * w.cols);
            worst = std::max(worst, std::fabs(got - exact) / std::max(scale, 1e-30));
        }
    return worst;
}

}  // namespace

class TestDecodeKernels : public QObject {
    Q_OBJECT

private slots:
    void supportedTypes()
    {
        for (const Format& f : formats()) QVERIFY2(weightKernelSupports(f.type), f.name);
        for (uint32_t t : {GgmlF32, GgmlF16, GgmlBF16, GgmlQ5_1, GgmlQ2_K, GgmlQ3_K, GgmlQ5_K})
            QVERIFY(!weightKernelSupports(t));
    }

    // Every format, every path, batches 1-4, the whole matrix and a middle range of rows.
    void randomBlocksMatchExpanded_data()
    {
        QTest::addColumn<int>("format");
        QTest::addColumn<int>("path");
        for (size_t f = 0; f < formats().size(); ++f)
            for (SimdPath p : paths())
                QTest::newRow((std::string(formats()[f].name) + " " + simdPathName(p)).c_str()) << int(f) << int(p);
    }
    void randomBlocksMatchExpanded()
    {
        QFETCH(int, format);
        QFETCH(int, path);
        const Format& f = formats()[size_t(format)];
        std::mt19937 rng(uint32_t(1234 + format));
        const int64_t rows = 37, cols = f.blockValues == 256 ? 768 : 576;
        const std::vector<uint8_t> data = randomRows(f, rows, cols, rng);
        const PackedMatrix w{data.data(), f.type, rows, cols, ggmlRowBytes(f.type, uint64_t(cols))};
        double worst = 0;
        for (int batch = 1; batch <= kWeightKernelMaxBatch; ++batch) {
            worst = std::max(worst, worstError(w, 0, rows, batch, SimdPath(path), rng));
            worst = std::max(worst, worstError(w, 5, 23, batch, SimdPath(path), rng));
        }
        qInfo("%s %s: worst |kernel - expanded| / sum|wx| = %.2e (tolerance %.0e)", f.name,
              simdPathName(SimdPath(path)), worst, f.tolerance);
        QVERIFY2(worst <= f.tolerance, qPrintable(QString::number(worst)));
    }

    // The SIMD paths against the scalar reference on the same input: they differ only in the
    // order of the sums, so by at most the sum of both tolerances.
    void simdMatchesScalar()
    {
        if (paths().size() < 2) QSKIP("this CPU has no AVX2");
        std::mt19937 rng(99);
        for (const Format& f : formats()) {
            const int64_t rows = 16, cols = 1024;
            const std::vector<uint8_t> data = randomRows(f, rows, cols, rng);
            const PackedMatrix w{data.data(), f.type, rows, cols, ggmlRowBytes(f.type, uint64_t(cols))};
            std::normal_distribution<float> nd(0.0f, 1.0f);
            std::vector<float> x(size_t(3 * cols));
            for (float& v : x) v = nd(rng);
            std::vector<float> ref(size_t(3 * rows));
            packedMatmul(w, 0, rows, x.data(), 3, ref.data(), rows, SimdPath::Scalar);
            for (SimdPath p : paths()) {
                std::vector<float> y(size_t(3 * rows));
                packedMatmul(w, 0, rows, x.data(), 3, y.data(), rows, p);
                for (int t = 0; t < 3; ++t)
                    for (int64_t r = 0; r < rows; ++r) {
                        const double scale = expandedDot(w, r, x.data() + t * cols).second;
                        const double d = std::fabs(double(y[size_t(t * rows + r)]) - ref[size_t(t * rows + r)]);
                        QVERIFY2(d <= 2 * f.tolerance * scale, qPrintable(QString("%1 %2: %3").arg(f.name).arg(simdPathName(p)).arg(d / scale)));
                    }
            }
        }
    }

    // One query over caches of 1 to 3,000 keys, 1-4 query heads per KV head, head_dim 64 and 256,
    // sliding windows and Gemma's soft-capping: every output within 1e-5 of the double-precision
    // softmax's, relative to the largest |V| entry (fp32 sums over 3,000 keys: measured at most
    // 1.9e-6 on every path), every path.
    void decodeAttentionMatchesDouble_data()
    {
        QTest::addColumn<int>("path");
        for (SimdPath p : paths()) QTest::newRow(simdPathName(p)) << int(p);
    }
    void decodeAttentionMatchesDouble()
    {
        QFETCH(int, path);
        std::mt19937 rng(5);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        struct Shape {
            int groups, hd;
            int64_t first, S;
            double softcap;
        };
        double worst = 0;
        for (const Shape& sh : {Shape{3, 64, 0, 1, 0.0}, Shape{3, 64, 0, 517, 0.0}, Shape{4, 256, 0, 3000, 0.0},
                                Shape{4, 256, 2488, 3000, 50.0}, Shape{1, 64, 100, 2048, 0.0}, Shape{2, 8, 0, 33, 30.0}}) {
            std::vector<float> q(size_t(sh.groups * sh.hd)), K(size_t(sh.S * sh.hd)), V(size_t(sh.S * sh.hd));
            for (float& v : q) v = 0.3f * nd(rng);
            for (float& v : K) v = nd(rng);
            for (float& v : V) v = nd(rng);
            DecodeAttention a;
            a.q = q.data(), a.K = K.data(), a.V = V.data(), a.groups = sh.groups, a.headDim = sh.hd;
            a.first = sh.first, a.S = sh.S, a.softcap = sh.softcap;
            std::vector<float> out(size_t(sh.groups * sh.hd)), scratch(size_t(sh.groups * (sh.S - sh.first)));
            decodeAttention(a, out.data(), scratch.data(), SimdPath(path));
            for (int g = 0; g < sh.groups; ++g) {
                std::vector<double> s;
                for (int64_t j = sh.first; j < sh.S; ++j) {
                    double d = 0;
                    for (int i = 0; i < sh.hd; ++i) d += double(q[size_t(g * sh.hd + i)]) * K[size_t(j * sh.hd + i)];
                    if (sh.softcap > 0) d = sh.softcap * std::tanh(d / sh.softcap);
                    s.push_back(d);
                }
                const double m = *std::max_element(s.begin(), s.end());
                double sum = 0;
                for (double& v : s) sum += (v = std::exp(v - m));
                for (int i = 0; i < sh.hd; ++i) {
                    double o = 0;
                    for (int64_t j = sh.first; j < sh.S; ++j) o += s[size_t(j - sh.first)] / sum * V[size_t(j * sh.hd + i)];
                    worst = std::max(worst, std::fabs(o - out[size_t(g * sh.hd + i)]) / 5.0);  // |V| < 5 here
                }
            }
        }
        qInfo("%s: worst |decode attention - double| / max|V| = %.2e", simdPathName(SimdPath(path)), worst);
        QVERIFY2(worst <= 1e-5, qPrintable(QString::number(worst)));
    }

    // Issue 37: the cache read in the dtype it was captured in. An fp16 or bf16 cache gives, on
    // every path, the very output (bit for bit) the same values give as fp32: the kernel converts
    // them exactly and sums in the same order. Shapes with a window and a softcap included.
    void decodeAttentionReadsHalfCaches_data()
    {
        QTest::addColumn<int>("path");
        for (SimdPath p : paths()) QTest::newRow(simdPathName(p)) << int(p);
    }
    void decodeAttentionReadsHalfCaches()
    {
        QFETCH(int, path);
        std::mt19937 rng(11);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (const KvElem elem : {KvElem::F16, KvElem::BF16}) {
            for (const auto& [groups, hd, first, S, softcap] :
                 {std::tuple<int, int, int64_t, int64_t, double>{3, 64, 0, 700, 0.0}, {4, 256, 100, 1500, 50.0}, {2, 8, 0, 33, 0.0}}) {
                std::vector<float> q(size_t(groups * hd)), K(size_t(S * hd)), V(size_t(S * hd));
                std::vector<uint16_t> Kh(K.size()), Vh(V.size());
                for (float& v : q) v = 0.3f * nd(rng);
                for (size_t i = 0; i < K.size(); ++i) {
                    Kh[i] = elem == KvElem::F16 ? floatToHalf(nd(rng)) : floatToBf16(nd(rng));
                    Vh[i] = elem == KvElem::F16 ? floatToHalf(nd(rng)) : floatToBf16(nd(rng));
                    K[i] = elem == KvElem::F16 ? halfToFloat(Kh[i]) : bf16ToFloat(Kh[i]);
                    V[i] = elem == KvElem::F16 ? halfToFloat(Vh[i]) : bf16ToFloat(Vh[i]);
                }
                DecodeAttention a;
                a.q = q.data(), a.groups = groups, a.headDim = hd, a.first = first, a.S = S, a.softcap = softcap;
                std::vector<float> want(q.size()), got(q.size()), scratch(size_t(groups * (S - first)));
                a.K = K.data(), a.V = V.data(), a.elem = KvElem::F32;
                decodeAttention(a, want.data(), scratch.data(), SimdPath(path));
                a.K = Kh.data(), a.V = Vh.data(), a.elem = elem;
                decodeAttention(a, got.data(), scratch.data(), SimdPath(path));
                QVERIFY2(want == got, qPrintable(QString("%1, head_dim %2, %3 keys").arg(elem == KvElem::F16 ? "fp16" : "bf16").arg(hd).arg(S - first)));
            }
        }
    }

    // Every matrix of the default model (its Q4_1 projections and its Q8_0 embedding, which is
    // also the output head) through the best path, one activation row: within the tolerances.
    void defaultModelMatrices()
    {
        if (!std::ifstream(defaultModelPath()).good())
            QSKIP("the default model is not in the cache (installer/fetch_model.sh fetches it)");
        const LlamaWeights weights = loadLlamaWeights(defaultModelPath());
        std::mt19937 rng(7);
        int matrices = 0;
        std::map<uint32_t, double> worst;
        for (const auto& [name, t] : weights.tensors) {
            if (!t.isPacked()) continue;
            QVERIFY2(weightKernelSupports(t.ggmlType), name.c_str());
            const PackedMatrix w{t.packed.data(), t.ggmlType, t.shape[0], t.shape[1], t.rowBytes()};
            // The output head has 49,152 rows: a slice of it keeps the expanded reference cheap.
            const int64_t r1 = std::min<int64_t>(w.rows, 1024);
            worst[t.ggmlType] = std::max(worst[t.ggmlType], worstError(w, 0, r1, 1, bestSimdPath(), rng));
            ++matrices;
        }
        QCOMPARE(matrices, 30 * 7 + 1);
        for (const Format& f : formats())
            if (worst.count(f.type)) {
                qInfo("%s (%s): worst %.2e over the model's matrices", f.name, simdPathName(bestSimdPath()), worst[f.type]);
                QVERIFY2(worst[f.type] <= f.tolerance, f.name);
            }
        QVERIFY(worst.count(GgmlQ4_1) && worst.count(GgmlQ8_0));
    }
};

KVSCOPE_TEST_MAIN(TestDecodeKernels)
#include "tst_decode_kernels.moc"
