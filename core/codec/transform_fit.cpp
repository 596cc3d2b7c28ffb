// The transform codec's fit (calibration): calibration rows, weights, basis, variances, steps and
// tables per level, and the model an encoder uses for a cache (prepareTransform). The math is in
// transform.h (READ ME FIRST), the linear algebra in linalg.cpp, the binary form in
// transform_model_io.cpp.
#include "codec/transform.h"

#include "codec/chunk_codec.h"
#include "codec/codec_detail.h"
#include "codec/linalg.h"
#include "codec/prob_table.h"
#include "codec/transform_wide.h"
#include "common/error.h"
#include "common/half.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvscope {

using detail::matmul;
using detail::powerOfTwo;
using detail::randomHadamard;
using detail::sqrtPair;

std::vector<double> detail::headBasis(const TransformSettings& s, KvKind kind, int layer, int h, int D,
                                      const std::vector<double>& sub)
{
    std::vector<double> bh;
    if (s.basis == TransformBasis::Pca) {
        std::vector<double> val;
        symmetricEigen(sub, D, val, bh);
    } else if (s.basis == TransformBasis::Hadamard) {
        bh = randomHadamard(D, (uint64_t(kind) * 1000003ull + uint64_t(layer)) * 1009ull + uint64_t(h) + 1);
    } else {
        bh.assign(size_t(D) * D, 0.0);
        for (int i = 0; i < D; ++i) bh[size_t(i) * D + i] = 1.0;
    }
    return bh;
}

namespace {

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

// W^{1/2} and W^{-1/2} of one (kind, layer), one D x D block per head: (H, D, D) row-major.
void headWeightRoots(const TransformSettings& s, const std::vector<const KvSet*>& caches, KvKind kind, int layer,
                     std::vector<double>& root, std::vector<double>& invRoot)
{
    const KvShape& sh = caches.front()->shape();
    const int H = sh.numKvHeads, D = sh.headDim, C = H * D;
    root.assign(size_t(C) * D, 0.0);
    invRoot.assign(size_t(C) * D, 0.0);
    auto at = [D](std::vector<double>& m, int c, int j) -> double& { return m[size_t(c) * D + size_t(j % D)]; };
    if (s.weighting == TransformWeighting::Mse) {
        for (int c = 0; c < C; ++c) at(root, c, c) = at(invRoot, c, c) = 1.0;
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
            at(root, c, c) = std::sqrt(x);
            at(invRoot, c, c) = 1.0 / std::sqrt(x);
        }
        return;
    }
    const std::vector<float>& m = caches.front()->valueWeight[size_t(layer)];
    for (int h = 0; h < H; ++h) {
        std::vector<double> mh(size_t(D) * D), r, ir;
        for (size_t i = 0; i < mh.size(); ++i) mh[i] = m[size_t(h) * D * D + i];
        sqrtPair(mh, D, r, ir);
        std::copy(r.begin(), r.end(), root.begin() + std::ptrdiff_t(size_t(h) * D * D));
        std::copy(ir.begin(), ir.end(), invRoot.begin() + std::ptrdiff_t(size_t(h) * D * D));
    }
}

// The same as dense C x C matrices (block-diagonal).
void weightRoots(const TransformSettings& s, const std::vector<const KvSet*>& caches, KvKind kind, int layer,
                 std::vector<double>& root, std::vector<double>& invRoot)
{
    const KvShape& sh = caches.front()->shape();
    const int H = sh.numKvHeads, D = sh.headDim, C = H * D;
    std::vector<double> rh, irh;
    headWeightRoots(s, caches, kind, layer, rh, irh);
    root.assign(size_t(C) * C, 0.0);
    invRoot.assign(size_t(C) * C, 0.0);
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < D; ++i)
            for (int j = 0; j < D; ++j) {
                root[size_t(h * D + i) * C + size_t(h * D + j)] = rh[size_t(h * D + i) * D + size_t(j)];
                invRoot[size_t(h * D + i) * C + size_t(h * D + j)] = irh[size_t(h * D + i) * D + size_t(j)];
            }
}

// The mean of each of the C columns of n rows (row-major), summed in row order in double; zeros
// when n is 0.
std::vector<double> rowMeans(const std::vector<float>& rows, size_t n, int C)
{
    std::vector<double> mean(static_cast<size_t>(C), 0.0);
    for (size_t r = 0; r < n; ++r)
        for (int c = 0; c < C; ++c) mean[size_t(c)] += rows[r * C + size_t(c)];
    for (double& m : mean) m /= double(std::max<size_t>(n, 1));
    return mean;
}

// Mean, decode matrix (rounded to fp16) and variances of one block from its calibration rows.
TransformBlock fitBlock(const TransformSettings& s, const std::vector<const KvSet*>& caches, KvKind kind, int layer,
                        const std::vector<float>& rows, size_t n)
{
    const KvShape& sh = caches.front()->shape();
    const int H = sh.numKvHeads, D = sh.headDim, C = H * D;
    const std::vector<double> mean = rowMeans(rows, n, C);
    if (C >= detail::wideOrder()) {  // float PCA on LAPACK, products with the per-head weights (transform_wide.h)
        std::vector<double> root, invRoot;
        headWeightRoots(s, caches, kind, layer, root, invRoot);
        return detail::fitWideBlock(s, kind, layer, H, D, rows, n, mean, root, invRoot);
    }
    const bool blas = C >= detail::kBlasOrder;  // large blocks: the products below go to BLAS (linalg.h)
    std::vector<double> cov(size_t(C) * C, 0.0);
    if (blas) {
        std::vector<double> centred(n * size_t(C));
        for (size_t r = 0; r < n; ++r)
            for (int c = 0; c < C; ++c) centred[r * C + size_t(c)] = rows[r * C + size_t(c)] - mean[size_t(c)];
        detail::gram(int(n), C, 1.0 / double(std::max<size_t>(n, 1)), centred.data(), cov.data());
    } else {
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
            std::vector<double> sub;
            if (s.basis == TransformBasis::Pca) {
                sub.resize(size_t(D) * D);
                for (int i = 0; i < D; ++i)
                    for (int j = 0; j < D; ++j) sub[size_t(i) * D + j] = wcov[size_t(h * D + i) * C + size_t(h * D + j)];
            }
            const std::vector<double> bh = detail::headBasis(s, kind, layer, h, D, sub);
            for (int i = 0; i < D; ++i)
                for (int j = 0; j < D; ++j) basis[size_t(h * D + i) * C + size_t(h * D + j)] = bh[size_t(i) * D + j];
        }
    }
    TransformBlock b;
    b.mean.assign(mean.begin(), mean.end());
    b.variance.resize(size_t(C));
    if (blas) {  // lambda_j = b_j^T S' b_j: the rows of B S' dotted with those of B
        std::vector<double> bs(size_t(C) * C);
        detail::gemm(false, C, C, C, basis.data(), wcov.data(), bs.data());
        for (int j = 0; j < C; ++j) {
            double v = 0;
            for (int i = 0; i < C; ++i) v += bs[size_t(j) * C + i] * basis[size_t(j) * C + i];
            b.variance[size_t(j)] = float(std::max(0.0, v));
        }
    } else {
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
    }
    // A = W^{-1/2} B^T, rounded to fp16 as stored.
    b.decode.assign(size_t(C) * C, 0.0f);
    if (blas) {
        std::vector<double> a(size_t(C) * C);
        detail::gemm(true, C, C, C, invRoot.data(), basis.data(), a.data());
        for (size_t i = 0; i < a.size(); ++i) b.decode[i] = halfToFloat(floatToHalf(float(a[i])));
    } else {
        for (int i = 0; i < C; ++i)
            for (int j = 0; j < C; ++j) {
                double a = 0;
                for (int k = 0; k < C; ++k) a += invRoot[size_t(i) * C + k] * basis[size_t(j) * C + k];
                b.decode[size_t(i) * C + j] = halfToFloat(floatToHalf(float(a)));
            }
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

// READ ME FIRST, 9: the block means of a calibrated model replaced by those of kv's coded tokens
// (past the sinks; with m's RoPE, which is kv's, undone for keys). Blocks whose cache rows are
// empty keep the calibrated mean.
void adaptMeans(TransformModel& m, const KvSet& kvIn)
{
    const int L = m.numLayers, C = m.channels();
    KvSet grouped;
    if (m.settings.layerGroup > 1) grouped = groupLayers(kvIn, m.settings.layerGroup);
    const KvSet& kv = m.settings.layerGroup > 1 ? grouped : kvIn;
    detail::parallelUnits(2 * L, [&](int u) {
        const KvKind kind = u < L ? KvKind::Key : KvKind::Value;
        size_t n = 0;
        const std::vector<float> rows = gatherRows(m.settings, {&kv}, kind, u % L, &n);
        if (n == 0) return;
        const std::vector<double> mean = rowMeans(rows, n, C);
        m.blocks[size_t(u)].mean.assign(mean.begin(), mean.end());
    });
    m.meansFromCache = true;
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

namespace {

// A level's per-layer scales for the blocks: the list as it is when it has one per block, the
// geometric mean of each group's when it lists the cache's layers.
std::vector<double> blockScales(const std::vector<double>& scale, int blocks, int G)
{
    if (G == 1 || int(scale.size()) != blocks * G) return scale;
    std::vector<double> out(static_cast<size_t>(blocks));
    for (int j = 0; j < blocks; ++j) {
        double logMean = 0;
        for (int g = 0; g < G; ++g) logMean += std::log(scale[size_t(j * G + g)]) / G;
        out[size_t(j)] = std::exp(logMean);
    }
    return out;
}

// rel_l of READ ME FIRST, 10: each layer's scale over its group's geometric mean (blockScales; 1
// when the list does not list the L layers: empty, or one scale per block).
std::vector<double> groupRelativeScales(const std::vector<double>& scale, int L, int G)
{
    std::vector<double> rel(static_cast<size_t>(L), 1.0);
    if (int(scale.size()) != L) return rel;
    const std::vector<double> group = blockScales(scale, L / G, G);
    for (int l = 0; l < L; ++l) rel[size_t(l)] = scale[size_t(l)] / group[size_t(l / G)];
    return rel;
}

}  // namespace

KvSet groupLayers(const KvSet& kv, int G, const std::vector<double>& keyScale, const std::vector<double>& valueScale)
{
    const KvShape& sh = kv.shape();
    const int L = sh.numLayers, H = sh.numKvHeads;
    KVSCOPE_ASSERT(G >= 1 && L % G == 0);
    KvShape gs = sh;
    gs.numLayers = L / G;
    gs.numKvHeads = H * G;
    KvSet out(gs, kv.dtype());
    out.modelName = kv.modelName;
    out.modelFingerprint = kv.modelFingerprint;
    out.tokens = kv.tokens;
    out.ropeInvFreq = kv.ropeInvFreq;
    out.ropePosition0 = kv.ropePosition0;
    const std::vector<double> keyRel = groupRelativeScales(keyScale, L, G), valueRel = groupRelativeScales(valueScale, L, G);
    const bool q = int(kv.querySq.size()) == L, w = int(kv.valueWeight.size()) == L, a = int(kv.attnMass.size()) == L;
    if (q) out.querySq.resize(size_t(gs.numLayers));
    if (w) out.valueWeight.resize(size_t(gs.numLayers));
    if (a) out.attnMass.resize(size_t(gs.numLayers));
    for (int l = 0; l < L; ++l) {
        const int j = l / G, g = l % G;
        for (KvKind k : {KvKind::Key, KvKind::Value})  // (H, T, D) of layer l is heads [g H, (g + 1) H) of block j
            std::memcpy(out.data(k, j) + size_t(g) * kv.tensorBytes(), kv.data(k, l), kv.tensorBytes());
        if (q)
            for (float x : kv.querySq[size_t(l)]) out.querySq[size_t(j)].push_back(float(x / keyRel[size_t(l)]));
        if (w)
            for (float x : kv.valueWeight[size_t(l)]) out.valueWeight[size_t(j)].push_back(float(x / valueRel[size_t(l)]));
        if (a) out.attnMass[size_t(j)].insert(out.attnMass[size_t(j)].end(), kv.attnMass[size_t(l)].begin(), kv.attnMass[size_t(l)].end());
    }
    return out;
}

TransformFit fitTransformBlocks(const TransformSettings& s, const std::vector<const KvSet*>& cachesIn,
                                const TransformLevel* shape)
{
    KVSCOPE_ASSERT(!cachesIn.empty());
    // Layer groups (READ ME FIRST, 10): the fit below runs unchanged on the grouped caches.
    const int G = s.layerGroup, Lc = cachesIn.front()->shape().numLayers;
    if (G < 1 || Lc % G != 0)
        throw Error("transform: layer_group " + std::to_string(G) + " does not divide the " + std::to_string(Lc) + " layers");
    std::vector<KvSet> grouped;
    std::vector<const KvSet*> caches = cachesIn;
    if (G > 1) {
        for (size_t i = 0; i < cachesIn.size(); ++i)
            if (cachesIn[i]->shape().numLayers != Lc)
                throw Error("calibration cache " + std::to_string(i + 1) + ": shape differs from the first cache");
        grouped.reserve(cachesIn.size());
        for (const KvSet* kv : cachesIn)
            grouped.push_back(groupLayers(*kv, G, shape ? shape->keyLayerScale : std::vector<double>{},
                                          shape ? shape->valueLayerScale : std::vector<double>{}));
        for (size_t i = 0; i < grouped.size(); ++i) caches[i] = &grouped[i];
    }
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
        m.blocks[size_t(u)].encode =
            detail::encoderMatrix(b, D, "transform: " + std::string(kindName(kind)) + " layer " + std::to_string(layer));
        // The rows become their components z = A^{-1} (x - mean), once for every level's counts.
        std::vector<float>& r = rows[size_t(u)];
        const std::vector<float>& e = m.blocks[size_t(u)].encode;
        std::vector<float> x(static_cast<size_t>(C));
        if (C >= detail::kBlasOrder) {  // z = (x - mean) E^T over all rows at once
            std::vector<float> centred(r.size());
            for (size_t t = 0; t < counts[size_t(u)]; ++t)
                for (int c = 0; c < C; ++c) centred[t * C + size_t(c)] = r[t * C + size_t(c)] - b.mean[size_t(c)];
            const int rows = int(counts[size_t(u)]);
            if (rows > 0 && C >= detail::wideOrder()) {  // components of variance 0 are never coded: left at 0
                int K = C;
                while (K > 0 && !(b.variance[size_t(K - 1)] > 0)) --K;
                std::fill(r.begin(), r.end(), 0.0f);
                if (K > 0) detail::sgemmCol('T', 'N', K, rows, C, e.data(), C, centred.data(), C, r.data(), C);
            } else if (rows > 0) {
                detail::gemm(true, rows, C, C, centred.data(), e.data(), r.data());
            }
            return;
        }
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

std::vector<TransformLevelBlock> fitTransformLevel(const TransformFit& fit, const TransformLevel& levIn)
{
    const TransformModel& m = fit.model;
    const TransformSettings& s = m.settings;
    const int L = m.numLayers, C = m.channels();
    TransformLevel lev = levIn;  // with layer groups, one scale per block (READ ME FIRST, 10)
    lev.keyLayerScale = blockScales(levIn.keyLayerScale, L, s.layerGroup);
    lev.valueLayerScale = blockScales(levIn.valueLayerScale, L, s.layerGroup);
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
    TransformFit fit = fitTransformBlocks(s, caches, &levels.front());
    for (const TransformLevel& lev : levels) {
        std::vector<TransformLevelBlock> lbs = fitTransformLevel(fit, lev);
        fit.model.keyTheta.push_back(lev.keyTheta);
        fit.model.valueTheta.push_back(lev.valueTheta);
        fit.model.levels.push_back(std::move(lbs));
    }
    return std::move(fit.model);
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
        // The fit never reads recent_tokens (only sinks are left out of it), so any number of fp16 recent
        // tokens can be asked of a calibrated model.
        calibrated.recentTokens = s.recentTokens;
        if (!(calibrated == s))
            throw inputError(source, "transform", "the switches differ from those the model was calibrated with: recalibrate");
        m.settings.entropy = s.entropy;
        m.settings.recentTokens = s.recentTokens;
        m.settings.tokenImportance = s.tokenImportance;  // encoder-side, independent of calibration
        m.settings.importanceQuantile = s.importanceQuantile;
        m.settings.importancePower = s.importancePower;
        m.settings.rdoLambda = s.rdoLambda;
        m.settings.adaptMean = s.adaptMean;
        m.settings.adaptPriorTokens = s.adaptPriorTokens;  // the chain's, written with the model into a .kvc
        m.settings.adaptSweeps = s.adaptSweeps;
        m.settings.adaptResetChunks = s.adaptResetChunks;
        if (m.numLevels() != int(pr.transformLevels.size()))
            throw inputError(source, "transform.levels", "the calibrated model has " + std::to_string(m.numLevels()) +
                                                             " levels, the profile lists " + std::to_string(pr.transformLevels.size()) +
                                                             ": recalibrate");
        detail::parallelUnits(int(m.blocks.size()), [&](int u) {
            TransformBlock& b = m.blocks[size_t(u)];
            b.encode = detail::encoderMatrix(b, m.headDim, source + ": transform.model");
        });
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
                            lbs[u].freq.push_back(laplaceFreq(m.blocks[u].variance[j], lbs[u].step[j], lbs[u].maxQ[j]));
        m.fittedOnCache = true;
    }
    if (m.settings.ropeUndo) {
        m.ropeInvFreq = kv.ropeInvFreq;
        m.ropePosition0 = kv.ropePosition0;
    }
    if (s.adaptMean && !m.fittedOnCache) adaptMeans(m, kv);
    p.transform = std::make_shared<const TransformModel>(std::move(m));
}

}  // namespace kvscope
