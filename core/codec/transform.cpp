// The transform codec's model: linear algebra, fitting (calibration), serialisation and the
// preparation an encoder needs. The math is in transform.h; the chunk payload in transform_chunk.cpp.
#include "codec/transform.h"

#include "codec/chunk_codec.h"
#include "codec/codec_detail.h"
#include "codec/prob_table.h"
#include "common/error.h"
#include "common/half.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kvscope {

const char* basisName(TransformBasis b)
{
    return b == TransformBasis::Pca ? "pca" : b == TransformBasis::Hadamard ? "hadamard" : "none";
}
const char* weightingName(TransformWeighting w) { return w == TransformWeighting::Attention ? "attention" : "mse"; }
const char* allocationName(TransformAllocation a) { return a == TransformAllocation::Waterfill ? "waterfill" : "uniform"; }
const char* entropyName(TransformEntropy e)
{
    return e == TransformEntropy::Rans32 ? "rans32" : e == TransformEntropy::Rans ? "rans" : "fixed";
}

bool TransformSettings::operator==(const TransformSettings& o) const
{
    return ropeUndo == o.ropeUndo && basis == o.basis && acrossHeads == o.acrossHeads && weighting == o.weighting &&
           allocation == o.allocation && entropy == o.entropy && sinkTokens == o.sinkTokens &&
           recentTokens == o.recentTokens;
}

int TransformModel::codedComponents(int level, KvKind k, int layer) const
{
    int n = 0;
    for (float s : levelBlock(level, k, layer).step) n += s > 0;
    return n;
}

// ---- linear algebra ---------------------------------------------------------------------------

void symmetricEigen(const std::vector<double>& a, int n, std::vector<double>& values, std::vector<double>& vectors)
{
    KVSCOPE_ASSERT(a.size() == size_t(n) * n);
    std::vector<double> m = a;
    std::vector<double> v(size_t(n) * n, 0.0);  // columns are eigenvectors while iterating
    for (int i = 0; i < n; ++i) v[size_t(i) * n + i] = 1.0;
    auto at = [&](int i, int j) -> double& { return m[size_t(i) * n + j]; };
    double total = 0;
    for (double x : m) total += x * x;
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0;
        for (int i = 0; i < n; ++i)
            for (int j = i + 1; j < n; ++j) off += at(i, j) * at(i, j);
        if (off <= 1e-30 * total || off == 0) break;
        for (int p = 0; p < n; ++p)
            for (int q = p + 1; q < n; ++q) {
                const double apq = at(p, q);
                if (std::fabs(apq) < 1e-300) continue;
                const double app = at(p, p), aqq = at(q, q);
                const double tau = (aqq - app) / (2 * apq);
                const double t = (tau >= 0 ? 1.0 : -1.0) / (std::fabs(tau) + std::sqrt(1 + tau * tau));
                const double c = 1 / std::sqrt(1 + t * t), s = t * c;
                for (int k = 0; k < n; ++k) {  // columns p, q
                    const double mkp = at(k, p), mkq = at(k, q);
                    at(k, p) = c * mkp - s * mkq;
                    at(k, q) = s * mkp + c * mkq;
                }
                for (int k = 0; k < n; ++k) {  // rows p, q
                    const double mpk = at(p, k), mqk = at(q, k);
                    at(p, k) = c * mpk - s * mqk;
                    at(q, k) = s * mpk + c * mqk;
                }
                for (int k = 0; k < n; ++k) {
                    const double vkp = v[size_t(k) * n + p], vkq = v[size_t(k) * n + q];
                    v[size_t(k) * n + p] = c * vkp - s * vkq;
                    v[size_t(k) * n + q] = s * vkp + c * vkq;
                }
            }
    }
    std::vector<int> order(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) order[size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return at(x, x) > at(y, y); });
    values.resize(size_t(n));
    vectors.assign(size_t(n) * n, 0.0);
    for (int r = 0; r < n; ++r) {
        const int i = order[size_t(r)];
        values[size_t(r)] = at(i, i);
        for (int k = 0; k < n; ++k) vectors[size_t(r) * n + k] = v[size_t(k) * n + i];
    }
}

std::vector<double> invertMatrix(const std::vector<double>& a, int n, const std::string& what)
{
    std::vector<double> m = a, inv(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i) inv[size_t(i) * n + i] = 1.0;
    double scale = 0;
    for (double x : a) scale = std::max(scale, std::fabs(x));
    for (int col = 0; col < n; ++col) {
        int piv = col;
        for (int r = col + 1; r < n; ++r)
            if (std::fabs(m[size_t(r) * n + col]) > std::fabs(m[size_t(piv) * n + col])) piv = r;
        const double pv = m[size_t(piv) * n + col];
        if (!(std::fabs(pv) > 1e-12 * scale)) throw Error(what + ": the transform matrix is singular");
        if (piv != col)
            for (int k = 0; k < n; ++k) {
                std::swap(m[size_t(piv) * n + k], m[size_t(col) * n + k]);
                std::swap(inv[size_t(piv) * n + k], inv[size_t(col) * n + k]);
            }
        const double r = 1.0 / pv;
        for (int k = 0; k < n; ++k) {
            m[size_t(col) * n + k] *= r;
            inv[size_t(col) * n + k] *= r;
        }
        for (int row = 0; row < n; ++row) {
            if (row == col) continue;
            const double f = m[size_t(row) * n + col];
            if (f == 0) continue;
            for (int k = 0; k < n; ++k) {
                m[size_t(row) * n + k] -= f * m[size_t(col) * n + k];
                inv[size_t(row) * n + k] -= f * inv[size_t(col) * n + k];
            }
        }
    }
    return inv;
}

void ropeTable(int tokens, int headDim, const float* invFreq, int position0, int t0, std::vector<double>& cs)
{
    const int half = headDim / 2;
    cs.resize(size_t(2) * tokens * half);
    for (int t = 0; t < tokens; ++t) {
        const double pos = double(position0) + double(t0) + double(t);
        for (int i = 0; i < half; ++i) {
            const double a = pos * double(invFreq[i]);
            cs[2 * (size_t(t) * half + i)] = std::cos(a);
            cs[2 * (size_t(t) * half + i) + 1] = std::sin(a);
        }
    }
}

void applyRopeTable(float* rows, int tokens, int headDim, const double* cs, bool inverse)
{
    const int half = headDim / 2;
    for (int t = 0; t < tokens; ++t) {
        float* r = rows + size_t(t) * headDim;
        const double* e = cs + 2 * size_t(t) * half;
        for (int i = 0; i < half; ++i) {
            const double c = e[2 * i], s = inverse ? -e[2 * i + 1] : e[2 * i + 1];
            const double x1 = r[i], x2 = r[i + half];
            r[i] = float(x1 * c - x2 * s);
            r[i + half] = float(x2 * c + x1 * s);
        }
    }
}

void applyRope(float* rows, int tokens, int headDim, const float* invFreq, int position0, int t0, bool inverse)
{
    std::vector<double> cs;
    ropeTable(tokens, headDim, invFreq, position0, t0, cs);
    applyRopeTable(rows, tokens, headDim, cs.data(), inverse);
}

namespace {

// ---- fitting ------------------------------------------------------------------------------------

// Sylvester-Hadamard matrix of order n (a power of two), scaled to be orthonormal, with the signs
// of its columns flipped by a seeded generator: the randomized rotation H diag(s) / sqrt(n).
std::vector<double> randomHadamard(int n, uint64_t seed)
{
    std::vector<double> h(size_t(n) * n);
    const double norm = 1.0 / std::sqrt(double(n));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    std::vector<double> sign(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        sign[size_t(j)] = ((x * 0x2545F4914F6CDD1Dull) >> 63) ? -1.0 : 1.0;
    }
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
            h[size_t(i) * n + j] = (__builtin_popcount(unsigned(i & j)) & 1 ? -norm : norm) * sign[size_t(j)];
    return h;
}

bool powerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Symmetric square root and inverse square root of a symmetric positive semi-definite matrix,
// eigenvalues floored at 1e-4 of the largest so that the inverse stays bounded.
void sqrtPair(const std::vector<double>& m, int n, std::vector<double>& root, std::vector<double>& invRoot)
{
    std::vector<double> val, vec;
    symmetricEigen(m, n, val, vec);
    const double floor = std::max(1e-30, 1e-4 * std::max(0.0, val.front()));
    root.assign(size_t(n) * n, 0.0);
    invRoot.assign(size_t(n) * n, 0.0);
    for (int k = 0; k < n; ++k) {
        const double l = std::max(val[size_t(k)], floor), r = std::sqrt(l), ir = 1.0 / r;
        const double* u = &vec[size_t(k) * n];
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j) {
                root[size_t(i) * n + j] += r * u[i] * u[j];
                invRoot[size_t(i) * n + j] += ir * u[i] * u[j];
            }
    }
}

// The calibration rows of one (kind, layer): every token past the sinks of every cache, as C
// floats (RoPE undone for keys when asked).
std::vector<float> gatherRows(const TransformSettings& s, const std::vector<const KvSet*>& caches, KvKind kind,
                              int layer, size_t* rowsOut)
{
    const KvShape& sh = caches.front()->shape();
    const int H = sh.numKvHeads, D = sh.headDim, C = H * D;
    size_t rows = 0;
    for (const KvSet* kv : caches) rows += size_t(std::max(0, kv->shape().numTokens - s.sinkTokens));
    std::vector<float> out(rows * size_t(C));
    std::vector<float> head;
    size_t r0 = 0;
    for (const KvSet* kv : caches) {
        const int T = kv->shape().numTokens, n = T - s.sinkTokens;
        if (n <= 0) continue;
        head.resize(size_t(n) * D);
        for (int h = 0; h < H; ++h) {
            kv->readRows(kind, layer, h, s.sinkTokens, n, head.data());
            if (kind == KvKind::Key && s.ropeUndo)
                applyRope(head.data(), n, D, kv->ropeInvFreq.data(), kv->ropePosition0, s.sinkTokens, true);
            for (int t = 0; t < n; ++t)
                std::memcpy(&out[(r0 + size_t(t)) * C + size_t(h) * D], &head[size_t(t) * D], sizeof(float) * size_t(D));
        }
        r0 += size_t(n);
    }
    *rowsOut = rows;
    return out;
}

// W^{1/2} and W^{-1/2} (C x C, block-diagonal per head) of one (kind, layer).
void weightRoots(const TransformSettings& s, const std::vector<const KvSet*>& caches, KvKind kind, int layer,
                 std::vector<double>& root, std::vector<double>& invRoot)
{
    const KvShape& sh = caches.front()->shape();
    const int H = sh.numKvHeads, D = sh.headDim, C = H * D;
    root.assign(size_t(C) * C, 0.0);
    invRoot.assign(size_t(C) * C, 0.0);
    if (s.weighting == TransformWeighting::Mse) {
        for (int c = 0; c < C; ++c) root[size_t(c) * C + c] = invRoot[size_t(c) * C + c] = 1.0;
        return;
    }
    if (kind == KvKind::Key) {
        std::vector<double> w(static_cast<size_t>(C), 0.0);
        for (const KvSet* kv : caches)
            for (int c = 0; c < C; ++c) w[size_t(c)] += kv->querySq[size_t(layer)][size_t(c)] / double(caches.size());
        if (s.ropeUndo)  // rotation-averaged: both dims of a pair see the pair's mean energy
            for (int h = 0; h < H; ++h)
                for (int i = 0; i < D / 2; ++i) {
                    double& a = w[size_t(h * D + i)];
                    double& b = w[size_t(h * D + i + D / 2)];
                    a = b = 0.5 * (a + b);
                }
        double mx = 0;
        for (double x : w) mx = std::max(mx, x);
        for (int c = 0; c < C; ++c) {
            const double x = std::max(w[size_t(c)], std::max(1e-30, 1e-4 * mx));
            root[size_t(c) * C + c] = std::sqrt(x);
            invRoot[size_t(c) * C + c] = 1.0 / std::sqrt(x);
        }
        return;
    }
    const std::vector<float>& m = caches.front()->valueWeight[size_t(layer)];
    for (int h = 0; h < H; ++h) {
        std::vector<double> mh(size_t(D) * D), r, ir;
        for (size_t i = 0; i < mh.size(); ++i) mh[i] = m[size_t(h) * D * D + i];
        sqrtPair(mh, D, r, ir);
        for (int i = 0; i < D; ++i)
            for (int j = 0; j < D; ++j) {
                root[size_t(h * D + i) * C + size_t(h * D + j)] = r[size_t(i) * D + j];
                invRoot[size_t(h * D + i) * C + size_t(h * D + j)] = ir[size_t(i) * D + j];
            }
    }
}

std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int n)
{
    std::vector<double> c(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k) {
            const double x = a[size_t(i) * n + k];
            if (x == 0) continue;
            const double* br = &b[size_t(k) * n];
            double* cr = &c[size_t(i) * n];
            for (int j = 0; j < n; ++j) cr[j] += x * br[j];
        }
    return c;
}

// Mean, decode matrix (rounded to fp16) and variances of one block from its calibration rows.
TransformBlock fitBlock(const TransformSettings& s, const std::vector<const KvSet*>& caches, KvKind kind, int layer,
                        const std::vector<float>& rows, size_t n)
{
    const KvShape& sh = caches.front()->shape();
    const int H = sh.numKvHeads, D = sh.headDim, C = H * D;
    std::vector<double> mean(static_cast<size_t>(C), 0.0), cov(size_t(C) * C, 0.0);
    for (size_t r = 0; r < n; ++r)
        for (int c = 0; c < C; ++c) mean[size_t(c)] += rows[r * C + size_t(c)];
    for (double& m : mean) m /= double(std::max<size_t>(n, 1));
    std::vector<double> d(static_cast<size_t>(C));
    for (size_t r = 0; r < n; ++r) {
        for (int c = 0; c < C; ++c) d[size_t(c)] = rows[r * C + size_t(c)] - mean[size_t(c)];
        for (int i = 0; i < C; ++i) {
            const double x = d[size_t(i)];
            double* row = &cov[size_t(i) * C];
            for (int j = i; j < C; ++j) row[j] += x * d[size_t(j)];
        }
    }
    for (int i = 0; i < C; ++i)
        for (int j = i; j < C; ++j) {
            cov[size_t(i) * C + j] /= double(std::max<size_t>(n, 1));
            cov[size_t(j) * C + i] = cov[size_t(i) * C + j];
        }
    std::vector<double> root, invRoot;
    weightRoots(s, caches, kind, layer, root, invRoot);
    const std::vector<double> wcov = matmul(matmul(root, cov, C), root, C);  // W^1/2 S W^1/2

    std::vector<double> basis(size_t(C) * C, 0.0);  // rows are the components
    if (s.basis == TransformBasis::Pca && s.acrossHeads) {
        std::vector<double> val;
        symmetricEigen(wcov, C, val, basis);
    } else {
        for (int h = 0; h < H; ++h) {
            std::vector<double> bh;
            if (s.basis == TransformBasis::Pca) {
                std::vector<double> sub(size_t(D) * D), val;
                for (int i = 0; i < D; ++i)
                    for (int j = 0; j < D; ++j) sub[size_t(i) * D + j] = wcov[size_t(h * D + i) * C + size_t(h * D + j)];
                symmetricEigen(sub, D, val, bh);
            } else if (s.basis == TransformBasis::Hadamard) {
                bh = randomHadamard(D, (uint64_t(kind) * 1000003ull + uint64_t(layer)) * 1009ull + uint64_t(h) + 1);
            } else {
                bh.assign(size_t(D) * D, 0.0);
                for (int i = 0; i < D; ++i) bh[size_t(i) * D + i] = 1.0;
            }
            for (int i = 0; i < D; ++i)
                for (int j = 0; j < D; ++j) basis[size_t(h * D + i) * C + size_t(h * D + j)] = bh[size_t(i) * D + j];
        }
    }
    TransformBlock b;
    b.mean.assign(mean.begin(), mean.end());
    b.variance.resize(size_t(C));
    for (int j = 0; j < C; ++j) {  // lambda_j = b_j^T S' b_j
        double v = 0;
        const double* bj = &basis[size_t(j) * C];
        for (int i = 0; i < C; ++i) {
            if (bj[i] == 0) continue;
            double t = 0;
            for (int k = 0; k < C; ++k) t += wcov[size_t(i) * C + k] * bj[k];
            v += bj[i] * t;
        }
        b.variance[size_t(j)] = float(std::max(0.0, v));
    }
    // A = W^{-1/2} B^T, rounded to fp16 as stored.
    b.decode.assign(size_t(C) * C, 0.0f);
    for (int i = 0; i < C; ++i)
        for (int j = 0; j < C; ++j) {
            double a = 0;
            for (int k = 0; k < C; ++k) a += invRoot[size_t(i) * C + k] * basis[size_t(j) * C + k];
            b.decode[size_t(i) * C + j] = halfToFloat(floatToHalf(float(a)));
        }
    prepareDecodeColumns(b);
    return b;
}

// lambda_bar of a kind: mean variance over every layer and component.
double meanVariance(const TransformModel& m, KvKind kind)
{
    double sum = 0;
    size_t n = 0;
    for (int l = 0; l < m.numLayers; ++l)
        for (float v : m.block(kind, l).variance) sum += v, ++n;
    return n ? std::max(sum / double(n), 1e-30) : 1.0;
}

// Steps and alphabets of every component of one (level, kind, layer).
TransformLevelBlock levelSteps(const TransformModel& m, const TransformLevel& lev, KvKind kind, int layer, double lbar)
{
    const TransformBlock& b = m.block(kind, layer);
    const int C = m.channels();
    const std::vector<double>& scale = kind == KvKind::Key ? lev.keyLayerScale : lev.valueLayerScale;
    const double theta = (kind == KvKind::Key ? lev.keyTheta : lev.valueTheta) *
                         (scale.empty() ? 1.0 : scale[size_t(layer)]) * lbar;
    double blockMean = 0;
    for (float v : b.variance) blockMean += v / C;
    TransformLevelBlock lb;
    lb.step.assign(size_t(C), 0.0f);
    lb.maxQ.assign(size_t(C), 0);
    for (int j = 0; j < C; ++j) {
        const double lam = b.variance[size_t(j)];
        double step = 0;
        if (m.settings.allocation == TransformAllocation::Waterfill) {
            if (lam > theta) step = std::sqrt(12.0 * theta);
        } else if (lam > 1e-12 * blockMean && blockMean > 0) {
            step = std::sqrt(12.0 * theta * lam / blockMean);
        }
        if (!(step > 0) || !std::isfinite(step)) continue;
        const float st = float(step);
        lb.step[size_t(j)] = st;
        const double ratio = std::ceil(6.0 * std::sqrt(lam) / double(st));
        lb.maxQ[size_t(j)] = uint8_t(std::max(1.0, std::min(127.0, ratio)));
    }
    return lb;
}

// A Laplace distribution of the component's variance, quantized with its step: the table a model
// fitted on the cache itself uses (no calibration data to count on).
std::vector<uint16_t> laplaceTable(double variance, double step, int M)
{
    const int A = 2 * M + 1;
    const double b = std::sqrt(std::max(variance, 1e-30) / 2.0);
    auto cdf = [b](double x) { return x < 0 ? 0.5 * std::exp(x / b) : 1.0 - 0.5 * std::exp(-x / b); };
    std::vector<uint32_t> counts(static_cast<size_t>(A));
    for (int q = -M; q <= M; ++q) {
        const double lo = q == -M ? -1e300 : (q - 0.5) * step, hi = q == M ? 1e300 : (q + 0.5) * step;
        counts[size_t(q + M)] = uint32_t(std::lround((cdf(hi) - cdf(lo)) * double(1 << 24)));
    }
    return buildProbTable(counts.data(), A).freq;
}

}  // namespace

// Quantizes one component value: the symbol and (for escapes) the exact integer.
static inline int quantizeComponent(float z, float step, int M, int64_t* q)
{
    const double v = std::nearbyint(double(z) / double(step));
    *q = int64_t(std::max(-2147483647.0, std::min(2147483647.0, v)));
    if (*q <= -M) return 0;
    if (*q >= M) return 2 * M;
    return int(*q) + M;
}

std::vector<float> transformCodeLengths(const std::vector<uint16_t>& freq)
{
    uint32_t total = 0;
    for (uint16_t f : freq) total += f;
    std::vector<float> bits(freq.size());
    for (size_t i = 0; i < freq.size(); ++i)
        bits[i] = freq[i] ? float(std::log2(double(total) / double(freq[i]))) : 64.0f;
    return bits;
}

TransformFit fitTransformBlocks(const TransformSettings& s, const std::vector<const KvSet*>& caches)
{
    KVSCOPE_ASSERT(!caches.empty());
    const KvShape& sh = caches.front()->shape();
    const int L = sh.numLayers, H = sh.numKvHeads, D = sh.headDim, C = H * D;
    for (size_t i = 0; i < caches.size(); ++i) {
        const KvSet& kv = *caches[i];
        const std::string what = "calibration cache " + std::to_string(i + 1);
        if (kv.shape().numLayers != L || kv.shape().numKvHeads != H || kv.shape().headDim != D)
            throw Error(what + ": shape differs from the first cache");
        if (s.ropeUndo && int(kv.ropeInvFreq.size()) != D / 2)
            throw Error(what + ": rope_undo needs the RoPE parameters (rope_inv_freq), which this cache lacks; "
                               "recapture it or set \"rope_undo\": false");
        if (s.weighting == TransformWeighting::Attention &&
            (int(kv.querySq.size()) != L || int(kv.valueWeight.size()) != L))
            throw Error(what + ": attention weighting needs query_sq and value_weight, which this cache lacks; "
                               "recapture it or set \"weighting\": \"mse\"");
    }
    if (s.basis == TransformBasis::Hadamard && !powerOfTwo(D))
        throw Error("transform: a hadamard basis needs a power-of-two head_dim, not " + std::to_string(D));
    if (s.ropeUndo && D % 2) throw Error("transform: rope_undo needs an even head_dim");

    TransformFit fit;
    TransformModel& m = fit.model;
    m.settings = s;
    m.numLayers = L;
    m.heads = H;
    m.headDim = D;
    if (s.ropeUndo) {
        m.ropeInvFreq = caches.front()->ropeInvFreq;
        m.ropePosition0 = caches.front()->ropePosition0;
    }
    m.blocks.resize(size_t(2 * L));
    std::vector<std::vector<float>>& rows = fit.rows;
    std::vector<size_t>& counts = fit.counts;
    rows.resize(size_t(2 * L));
    counts.resize(size_t(2 * L));
    detail::parallelUnits(2 * L, [&](int u) {
        const KvKind kind = u < L ? KvKind::Key : KvKind::Value;
        const int layer = u % L;
        rows[size_t(u)] = gatherRows(s, caches, kind, layer, &counts[size_t(u)]);
        m.blocks[size_t(u)] = fitBlock(s, caches, kind, layer, rows[size_t(u)], counts[size_t(u)]);
        const TransformBlock& b = m.blocks[size_t(u)];
        std::vector<double> a(b.decode.begin(), b.decode.end());
        const std::vector<double> inv = invertMatrix(a, C, "transform: " + std::string(kindName(kind)) + " layer " + std::to_string(layer));
        m.blocks[size_t(u)].encode.assign(inv.begin(), inv.end());
        // The rows become their components z = A^{-1} (x - mean), once for every level's counts.
        std::vector<float>& r = rows[size_t(u)];
        const std::vector<float>& e = m.blocks[size_t(u)].encode;
        std::vector<float> x(static_cast<size_t>(C));
        for (size_t t = 0; t < counts[size_t(u)]; ++t) {
            float* row = &r[t * C];
            for (int c = 0; c < C; ++c) x[size_t(c)] = row[c] - b.mean[size_t(c)];
            for (int j = 0; j < C; ++j) {
                const float* ej = &e[size_t(j) * C];
                float z = 0;
                for (int c = 0; c < C; ++c) z += ej[c] * x[size_t(c)];
                row[j] = z;
            }
        }
    });
    fit.meanVariance[0] = meanVariance(m, KvKind::Key);
    fit.meanVariance[1] = meanVariance(m, KvKind::Value);
    return fit;
}

std::vector<TransformLevelBlock> fitTransformLevel(const TransformFit& fit, const TransformLevel& lev)
{
    const TransformModel& m = fit.model;
    const TransformSettings& s = m.settings;
    const int L = m.numLayers, C = m.channels();
    const std::vector<std::vector<float>>& rows = fit.rows;
    const std::vector<size_t>& counts = fit.counts;
    for (const std::vector<double>* sc : {&lev.keyLayerScale, &lev.valueLayerScale})
        if (!sc->empty() && int(sc->size()) != L)
            throw Error("transform: level '" + lev.name + "' has " + std::to_string(sc->size()) + " layer scales for " +
                        std::to_string(L) + " layers");
    std::vector<TransformLevelBlock> lbs(size_t(2 * L));
    detail::parallelUnits(2 * L, [&](int u) {
        const KvKind kind = u < L ? KvKind::Key : KvKind::Value;
        const int layer = u % L;
        TransformLevelBlock lb = levelSteps(m, lev, kind, layer, fit.meanVariance[u < L ? 0 : 1]);
        if (entropyUsesTables(s.entropy)) {
            // Symbol counts on the calibration rows, one table per coded component.
            std::vector<int> coded;
            for (int j = 0; j < C; ++j)
                if (lb.step[size_t(j)] > 0) coded.push_back(j);
            std::vector<std::vector<uint32_t>> cnt(coded.size());
            for (size_t k = 0; k < coded.size(); ++k) cnt[k].assign(2 * size_t(lb.maxQ[size_t(coded[k])]) + 1, 0);
            const std::vector<float>& r = rows[size_t(u)];
            for (size_t t = 0; t < counts[size_t(u)]; ++t) {
                for (size_t k = 0; k < coded.size(); ++k) {
                    const int j = coded[k];
                    const float z = r[t * C + size_t(j)];
                    int64_t q;
                    cnt[k][size_t(quantizeComponent(z, lb.step[size_t(j)], lb.maxQ[size_t(j)], &q))]++;
                }
            }
            for (size_t k = 0; k < coded.size(); ++k)
                lb.freq.push_back(buildProbTable(cnt[k].data(), int(cnt[k].size())).freq);
            if (s.rdoLambda > 0) {  // recount with the RD rule and the first tables' code lengths
                for (size_t k = 0; k < coded.size(); ++k) {
                    const int j = coded[k];
                    const int M = lb.maxQ[size_t(j)];
                    const std::vector<float> bits = transformCodeLengths(lb.freq[k]);
                    std::fill(cnt[k].begin(), cnt[k].end(), 0u);
                    for (size_t t = 0; t < counts[size_t(u)]; ++t) {
                        const double x = double(r[t * C + size_t(j)]) / double(lb.step[size_t(j)]);
                        int64_t q;
                        const int sym = quantizeComponent(float(x), 1.0f, M, &q);
                        cnt[k][size_t(sym == 0 || sym == 2 * M ? sym : rdoSymbol(x, sym, M, bits.data(), s.rdoLambda))]++;
                    }
                    lb.freq[k] = buildProbTable(cnt[k].data(), int(cnt[k].size())).freq;
                }
            }
        }
        lbs[size_t(u)] = std::move(lb);
    });
    return lbs;
}

TransformModel fitTransform(const TransformSettings& s, const std::vector<TransformLevel>& levels,
                            const std::vector<const KvSet*>& caches)
{
    if (levels.empty() || levels.size() > 64) throw Error("transform: need 1 to 64 levels");
    TransformFit fit = fitTransformBlocks(s, caches);
    for (const TransformLevel& lev : levels) {
        std::vector<TransformLevelBlock> lbs = fitTransformLevel(fit, lev);
        fit.model.keyTheta.push_back(lev.keyTheta);
        fit.model.valueTheta.push_back(lev.valueTheta);
        fit.model.levels.push_back(std::move(lbs));
    }
    return std::move(fit.model);
}

// ---- serialisation ------------------------------------------------------------------------------

namespace {

const uint8_t kModelMagic[4] = {'K', 'V', 'T', 'R'};
constexpr uint16_t kModelVersion = 1;
// Version 2 adds, after recent_tokens: u8 token_importance (1), f32 importance_quantile, f32
// importance_power. Written only when token importance is on, so other models stay version 1.
constexpr uint16_t kModelVersionImportance = 2;

struct Writer {
    std::vector<uint8_t>& b;
    void u8(uint8_t v) { b.push_back(v); }
    void u16(uint16_t v) { b.push_back(uint8_t(v)), b.push_back(uint8_t(v >> 8)); }
    void u32(uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void f32(float f) { u32(floatToBits(f)); }
    void f64(double d) { uint64_t u; std::memcpy(&u, &d, 8); u32(uint32_t(u)); u32(uint32_t(u >> 32)); }
};

struct Reader {
    const uint8_t* p;
    const uint8_t* end;
    const std::string& where;
    const uint8_t* take(size_t n, const char* what)
    {
        if (size_t(end - p) < n) throw Error(where + ": truncated " + what);
        const uint8_t* r = p;
        p += n;
        return r;
    }
    uint8_t u8(const char* w) { return *take(1, w); }
    uint16_t u16(const char* w) { const uint8_t* q = take(2, w); return uint16_t(q[0] | q[1] << 8); }
    uint32_t u32(const char* w) { return detail::getU32(take(4, w)); }
    float f32(const char* w)
    {
        const float f = bitsToFloat(u32(w));
        if (!std::isfinite(f)) throw Error(where + ": " + w + " is not finite");
        return f;
    }
    double f64(const char* w)
    {
        const uint64_t lo = u32(w), hi = u32(w);
        const uint64_t u = lo | hi << 32;
        double d;
        std::memcpy(&d, &u, 8);
        if (!std::isfinite(d)) throw Error(where + ": " + w + " is not finite");
        return d;
    }
};

}  // namespace

void serializeTransformModel(const TransformModel& m, std::vector<uint8_t>& out)
{
    Writer w{out};
    for (uint8_t c : kModelMagic) w.u8(c);
    w.u16(m.settings.tokenImportance ? kModelVersionImportance : kModelVersion);
    const TransformSettings& s = m.settings;
    w.u8(s.ropeUndo), w.u8(uint8_t(s.basis)), w.u8(s.acrossHeads), w.u8(uint8_t(s.weighting));
    w.u8(uint8_t(s.allocation)), w.u8(uint8_t(s.entropy));
    w.u32(uint32_t(s.sinkTokens)), w.u32(uint32_t(s.recentTokens));
    if (s.tokenImportance) w.u8(1), w.f32(float(s.importanceQuantile)), w.f32(float(s.importancePower));
    w.u32(uint32_t(m.numLayers)), w.u32(uint32_t(m.heads)), w.u32(uint32_t(m.headDim));
    w.u32(uint32_t(m.numLevels()));
    w.u32(uint32_t(m.ropeInvFreq.size()));
    for (float f : m.ropeInvFreq) w.f32(f);
    w.u32(uint32_t(m.ropePosition0));
    for (const TransformBlock& b : m.blocks) {
        for (float f : b.mean) w.f32(f);
        for (float f : b.variance) w.f32(f);
        for (float f : b.decode) w.u16(floatToHalf(f));
    }
    for (int l = 0; l < m.numLevels(); ++l) {
        w.f64(m.keyTheta[size_t(l)]);
        w.f64(m.valueTheta[size_t(l)]);
        for (const TransformLevelBlock& lb : m.levels[size_t(l)]) {
            for (size_t j = 0; j < lb.step.size(); ++j) {
                w.f32(lb.step[j]);
                w.u8(lb.maxQ[j]);
            }
            if (entropyUsesTables(s.entropy))
                for (const std::vector<uint16_t>& f : lb.freq) {
                    ProbTable t;
                    t.alphabet = int(f.size());
                    t.freq = f;
                    serializeProbTable(t, out);
                }
        }
    }
}

size_t transformModelBytes(const TransformModel& m)
{
    std::vector<uint8_t> b;
    serializeTransformModel(m, b);
    return b.size();
}

size_t transformSideBytes(const TransformModel& m)
{
    if (!m.fittedOnCache) return 0;
    const size_t matrices = 2 * size_t(m.numLayers) * size_t(m.channels()) * size_t(m.channels()) * 2;
    return transformModelBytes(m) - matrices;
}

std::vector<TransformLevel> defaultTransformLevels()
{
    std::vector<TransformLevel> out;
    for (double t : {0.3, 0.1, 0.03, 0.01, 0.003}) {
        TransformLevel l;
        char name[32];
        std::snprintf(name, sizeof name, "t %g", t);
        l.name = name;
        l.keyTheta = l.valueTheta = t;
        out.push_back(l);
    }
    return out;
}

void prepareDecodeColumns(TransformBlock& b)
{
    const size_t C = b.mean.size();
    KVSCOPE_ASSERT(b.decode.size() == C * C);
    b.columns.resize(C * C);
    b.colLo.assign(C, int(C));
    b.colHi.assign(C, 0);
    b.decodeFinite = true;
    for (size_t c = 0; c < C; ++c)
        for (size_t j = 0; j < C; ++j) {
            const float a = b.decode[c * C + j];
            b.columns[j * C + c] = a;
            b.decodeFinite = b.decodeFinite && std::isfinite(a);
            if (a != 0.0f) b.colLo[j] = std::min(b.colLo[j], int(c)), b.colHi[j] = int(c) + 1;
        }
    for (size_t j = 0; j < C; ++j) b.colLo[j] = std::min(b.colLo[j], b.colHi[j]);
}

TransformModel parseTransformModel(const uint8_t* data, size_t size, const KvShape& shape, const std::string& where)
{
    Reader r{data, data + size, where};
    if (std::memcmp(r.take(4, "magic"), kModelMagic, 4) != 0) throw Error(where + ": not a transform model (bad magic)");
    const uint16_t version = r.u16("version");
    if (version != kModelVersion && version != kModelVersionImportance)
        throw Error(where + ": transform model version " + std::to_string(version) + " is not supported (this build reads 1, 2)");
    TransformModel m;
    TransformSettings& s = m.settings;
    const uint8_t rope = r.u8("settings"), basis = r.u8("settings"), across = r.u8("settings"),
                  weighting = r.u8("settings"), alloc = r.u8("settings"), entropy = r.u8("settings");
    if (rope > 1 || basis > 2 || across > 1 || weighting > 1 || alloc > 1 || entropy > 2)
        throw Error(where + ": unknown transform setting id");
    s.ropeUndo = rope, s.basis = TransformBasis(basis), s.acrossHeads = across;
    s.weighting = TransformWeighting(weighting), s.allocation = TransformAllocation(alloc), s.entropy = TransformEntropy(entropy);
    const uint32_t sink = r.u32("sink_tokens"), recent = r.u32("recent_tokens");
    if (sink > 4096 || recent > 65536) throw Error(where + ": sink_tokens or recent_tokens out of range");
    s.sinkTokens = int(sink), s.recentTokens = int(recent);
    if (version == kModelVersionImportance) {
        if (r.u8("token_importance") != 1) throw Error(where + ": token_importance must be 1 in a version-2 model");
        s.tokenImportance = true;
        s.importanceQuantile = r.f32("importance_quantile");
        s.importancePower = r.f32("importance_power");
        if (!(s.importanceQuantile >= 0 && s.importanceQuantile <= 1) || !(s.importancePower >= 0 && s.importancePower <= 8))
            throw Error(where + ": importance_quantile or importance_power out of range");
    }
    const uint32_t L = r.u32("num_layers"), H = r.u32("heads"), D = r.u32("head_dim"), levels = r.u32("num_levels");
    if (int(L) != shape.numLayers || int(H) != shape.numKvHeads || int(D) != shape.headDim)
        throw Error(where + ": the model is for " + std::to_string(L) + " layers x " + std::to_string(H) + " heads x " +
                    std::to_string(D) + ", the cache has " + std::to_string(shape.numLayers) + " x " +
                    std::to_string(shape.numKvHeads) + " x " + std::to_string(shape.headDim));
    if (levels < 1 || levels > 64) throw Error(where + ": num_levels " + std::to_string(levels) + " is outside 1..64");
    m.numLayers = int(L), m.heads = int(H), m.headDim = int(D);
    const size_t C = size_t(H) * D;
    const uint32_t ropeN = r.u32("rope table size");
    if (ropeN != 0 && ropeN != D / 2) throw Error(where + ": rope table of " + std::to_string(ropeN) + " entries for head_dim " + std::to_string(D));
    if (s.ropeUndo != (ropeN != 0)) throw Error(where + ": rope_undo and the rope table disagree");
    for (uint32_t i = 0; i < ropeN; ++i) m.ropeInvFreq.push_back(r.f32("rope_inv_freq"));
    const uint32_t p0 = r.u32("rope_position0");
    if (p0 > (1u << 30)) throw Error(where + ": rope_position0 out of range");
    m.ropePosition0 = int(p0);
    // The fixed-size part must fit before anything is allocated for it.
    const size_t blockBytes = C * 8 + C * C * 2;
    if (size_t(r.end - r.p) / blockBytes < 2 * size_t(L)) throw Error(where + ": truncated blocks");
    m.blocks.resize(2 * size_t(L));
    for (TransformBlock& b : m.blocks) {
        b.mean.resize(C), b.variance.resize(C), b.decode.resize(C * C);
        for (float& f : b.mean) f = r.f32("mean");
        for (float& f : b.variance) {
            f = r.f32("variance");
            if (f < 0) throw Error(where + ": negative variance");
        }
        const uint8_t* a = r.take(C * C * 2, "decode matrix");
        for (size_t i = 0; i < C * C; ++i) {
            b.decode[i] = halfToFloat(uint16_t(a[2 * i] | a[2 * i + 1] << 8));
            if (!std::isfinite(b.decode[i])) throw Error(where + ": decode matrix entry is not finite");
        }
        prepareDecodeColumns(b);
    }
    for (uint32_t l = 0; l < levels; ++l) {
        m.keyTheta.push_back(r.f64("key theta"));
        m.valueTheta.push_back(r.f64("value theta"));
        if (size_t(r.end - r.p) / (C * 5) < 2 * size_t(L)) throw Error(where + ": truncated level " + std::to_string(l + 1));
        std::vector<TransformLevelBlock> lbs(2 * size_t(L));
        for (size_t u = 0; u < lbs.size(); ++u) {
            TransformLevelBlock& lb = lbs[u];
            const std::string place = where + ": level " + std::to_string(l + 1) + " " +
                                      kindName(u < L ? KvKind::Key : KvKind::Value) + " layer " + std::to_string(u % L);
            lb.step.resize(C), lb.maxQ.resize(C);
            for (size_t j = 0; j < C; ++j) {
                lb.step[j] = r.f32("step");
                lb.maxQ[j] = r.u8("alphabet");
                const bool coded = lb.step[j] > 0;
                if (lb.step[j] < 0 || (coded && (lb.maxQ[j] < 1 || lb.maxQ[j] > 127)) || (!coded && lb.maxQ[j] != 0))
                    throw Error(place + ": component " + std::to_string(j) + " has an invalid step or alphabet");
            }
            if (entropyUsesTables(s.entropy))
                for (size_t j = 0; j < C; ++j) {
                    if (lb.maxQ[j] == 0) continue;
                    ProbTable t;
                    std::string why;
                    if (!parseProbTable(&r.p, r.end, 2 * lb.maxQ[j] + 1, &t, &why))
                        throw Error(place + ": component " + std::to_string(j) + ": " + why);
                    lb.freq.push_back(std::move(t.freq));
                }
        }
        m.levels.push_back(std::move(lbs));
    }
    if (r.p != r.end) throw Error(where + ": unexpected trailing bytes");
    return m;
}

// ---- preparation for encoding -------------------------------------------------------------------

void prepareTransform(CodecParams& p, const KvSet& kv, const std::string& source)
{
    const CodecProfile& pr = p.profile;
    const TransformSettings& s = pr.transform;
    const int D = kv.shape().headDim;
    if (pr.transformLevels.empty()) throw inputError(source, "transform.levels", "the transform codec needs at least one level");
    if (s.ropeUndo && int(kv.ropeInvFreq.size()) != D / 2)
        throw inputError(source, "transform.rope_undo",
                         "the KV cache carries no RoPE parameters (captured before they were recorded): recapture it or "
                         "set \"rope_undo\": false");
    if (s.tokenImportance) {
        bool ok = int(kv.attnMass.size()) == kv.shape().numLayers;
        for (const auto& a : kv.attnMass) ok = ok && a.size() == size_t(kv.shape().numKvHeads) * size_t(kv.shape().numTokens);
        if (!ok)
            throw inputError(source, "transform.token_importance",
                             "token_importance needs a capture with attention mass and this KV cache has none: recapture "
                             "it with attention mass (capture --attn-mass) or set \"token_importance\": false");
    }
    TransformModel m;
    if (!pr.transformModel.empty()) {
        m = parseTransformModel(pr.transformModel.data(), pr.transformModel.size(), kv.shape(), source + ": transform.model");
        // rans and rans32 code with the same tables: a model calibrated for one serves the other.
        TransformSettings calibrated = m.settings;
        if (entropyUsesTables(calibrated.entropy) && entropyUsesTables(s.entropy)) calibrated.entropy = s.entropy;
        if (!(calibrated == s))
            throw inputError(source, "transform", "the switches differ from those the model was calibrated with: recalibrate");
        m.settings.entropy = s.entropy;
        m.settings.tokenImportance = s.tokenImportance;  // encoder-side, independent of calibration
        m.settings.importanceQuantile = s.importanceQuantile;
        m.settings.importancePower = s.importancePower;
        m.settings.rdoLambda = s.rdoLambda;
        if (m.numLevels() != int(pr.transformLevels.size()))
            throw inputError(source, "transform.levels", "the calibrated model has " + std::to_string(m.numLevels()) +
                                                             " levels, the profile lists " + std::to_string(pr.transformLevels.size()) +
                                                             ": recalibrate");
        for (TransformBlock& b : m.blocks) {
            std::vector<double> a(b.decode.begin(), b.decode.end());
            const std::vector<double> inv = invertMatrix(a, m.channels(), source + ": transform.model");
            b.encode.assign(inv.begin(), inv.end());
        }
    } else {
        // No calibration: statistics from the cache itself, a data-independent basis, and
        // parametric tables (they need no counts that would have to travel).
        TransformSettings own = s;
        if (own.basis == TransformBasis::Pca) own.basis = powerOfTwo(D) ? TransformBasis::Hadamard : TransformBasis::None;
        if (own.weighting == TransformWeighting::Attention && (kv.querySq.empty() || kv.valueWeight.empty()))
            own.weighting = TransformWeighting::Mse;
        const TransformEntropy entropy = own.entropy;
        own.entropy = TransformEntropy::Fixed;  // no counting pass
        m = fitTransform(own, pr.transformLevels, {&kv});
        m.settings.entropy = entropy;
        if (entropyUsesTables(entropy))
            for (auto& lbs : m.levels)
                for (size_t u = 0; u < lbs.size(); ++u)
                    for (size_t j = 0; j < lbs[u].step.size(); ++j)
                        if (lbs[u].maxQ[j])
                            lbs[u].freq.push_back(laplaceTable(m.blocks[u].variance[j], lbs[u].step[j], lbs[u].maxQ[j]));
        m.fittedOnCache = true;
    }
    if (m.settings.ropeUndo) {
        m.ropeInvFreq = kv.ropeInvFreq;
        m.ropePosition0 = kv.ropePosition0;
    }
    p.transform = std::make_shared<const TransformModel>(std::move(m));
}

}  // namespace kvscope
