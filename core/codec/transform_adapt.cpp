// The backward-adaptive basis (transform_adapt.h). Compiled with -ffp-contract=off: encoder and
// decoders must derive the same bits (READ ME FIRST there).
#include "codec/transform_adapt.h"

#include "codec/prob_table.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

int jacobiSweeps(std::vector<double>& m, int n, std::vector<double>& v, int sweeps)
{
    KVSCOPE_ASSERT(m.size() == size_t(n) * n && v.size() == size_t(n) * n);
    auto at = [&](int i, int j) -> double& { return m[size_t(i) * n + j]; };
    double total = 0;
    for (double x : m) total += x * x;
    int done = 0;
    for (; done < sweeps; ++done) {
        double off = 0;
        for (int i = 0; i < n; ++i)
            for (int j = i + 1; j < n; ++j) off += at(i, j) * at(i, j);
        if (off <= 1e-24 * total) break;
        for (int p = 0; p < n; ++p)
            for (int q = p + 1; q < n; ++q) {
                const double apq = at(p, q), app = at(p, p), aqq = at(q, q);
                if (apq * apq <= 1e-30 * (app * app + aqq * aqq) || std::fabs(apq) < 1e-300) continue;
                const double tau = (aqq - app) / (2 * apq);
                const double t = (tau >= 0 ? 1.0 : -1.0) / (std::fabs(tau) + std::sqrt(1 + tau * tau));
                const double c = 1 / std::sqrt(1 + t * t), s = t * c;
                // m <- J^T m J: rows p, q, then columns p, q (the symmetric copy of the rows).
                for (int k = 0; k < n; ++k) {
                    const double mpk = at(p, k), mqk = at(q, k);
                    at(p, k) = c * mpk - s * mqk;
                    at(q, k) = s * mpk + c * mqk;
                }
                for (int k = 0; k < n; ++k) {
                    const double mkp = at(k, p), mkq = at(k, q);
                    at(k, p) = c * mkp - s * mkq;
                    at(k, q) = s * mkp + c * mkq;
                }
                double* vp = v.data() + size_t(p) * n;
                double* vq = v.data() + size_t(q) * n;
                for (int k = 0; k < n; ++k) {
                    const double a = vp[k], b = vq[k];
                    vp[k] = c * a - s * b;
                    vq[k] = s * a + c * b;
                }
            }
    }
    return done;
}

AdaptiveBasis startAdaptiveBasis(const std::vector<float>& lambda, double priorTokens)
{
    if (!(priorTokens > 0) || !std::isfinite(priorTokens))
        throw Error("adaptive basis: prior_tokens must be a positive number");
    AdaptiveBasis a;
    a.C = int(lambda.size());
    a.priorTokens = priorTokens;
    a.lambda.assign(lambda.begin(), lambda.end());
    a.sum.assign(size_t(a.C) * a.C, 0.0);
    a.rotation.assign(size_t(a.C) * a.C, 0.0);
    for (int i = 0; i < a.C; ++i) a.rotation[size_t(i) * a.C + i] = 1.0;
    a.variance = a.lambda;
    return a;
}

void advanceAdaptiveBasis(AdaptiveBasis& a, int sweeps)
{
    if (a.tokens <= 0) return;
    const int C = a.C;
    const double w = 1.0 / (a.priorTokens + a.tokens);
    std::vector<double> cov(a.sum.size());
    for (int i = 0; i < C; ++i)
        for (int j = 0; j < C; ++j)
            cov[size_t(i) * C + j] = (a.sum[size_t(i) * C + j] + (i == j ? a.priorTokens * a.lambda[size_t(i)] : 0.0)) * w;
    // Warm start: the covariance in the previous basis, R cov R^T, which is nearly diagonal.
    std::vector<double> tmp(cov.size(), 0.0), warm(cov.size(), 0.0);
    const std::vector<double>& R = a.rotation;
    for (int i = 0; i < C; ++i)
        for (int k = 0; k < C; ++k) {
            const double r = R[size_t(i) * C + k];
            if (r == 0) continue;
            const double* ck = cov.data() + size_t(k) * C;
            double* ti = tmp.data() + size_t(i) * C;
            for (int j = 0; j < C; ++j) ti[j] += r * ck[j];
        }
    for (int i = 0; i < C; ++i)
        for (int j = i; j < C; ++j) {
            double s = 0;
            const double* ti = tmp.data() + size_t(i) * C;
            const double* rj = R.data() + size_t(j) * C;
            for (int k = 0; k < C; ++k) s += ti[k] * rj[k];
            warm[size_t(i) * C + j] = warm[size_t(j) * C + i] = s;
        }
    std::vector<double> v = a.rotation;
    jacobiSweeps(warm, C, v, sweeps);
    std::vector<int> order(static_cast<size_t>(C));
    for (int i = 0; i < C; ++i) order[size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return warm[size_t(x) * C + x] > warm[size_t(y) * C + y]; });
    for (int r = 0; r < C; ++r) {
        const int i = order[size_t(r)];
        a.variance[size_t(r)] = std::max(0.0, warm[size_t(i) * C + i]);
        std::copy_n(v.data() + size_t(i) * C, C, a.rotation.data() + size_t(r) * C);
    }
}

TransformLevelBlock adaptiveLevelBlock(const AdaptiveBasis& a, double theta)
{
    TransformLevelBlock lb;
    lb.step.assign(size_t(a.C), 0.0f);
    lb.maxQ.assign(size_t(a.C), 0);
    const float st = float(std::sqrt(12.0 * theta));
    if (!(st > 0) || !std::isfinite(st)) return lb;
    for (int j = 0; j < a.C; ++j) {
        const double lam = a.variance[size_t(j)];
        if (!(lam > theta)) continue;
        lb.step[size_t(j)] = st;
        const int M = int(std::max(1.0, std::min(127.0, std::ceil(6.0 * std::sqrt(lam) / double(st)))));
        lb.maxQ[size_t(j)] = uint8_t(M);
        lb.freq.push_back(laplaceFreq(lam, double(st), M));
    }
    return lb;
}

void accumulateAdaptive(AdaptiveBasis& a, const TransformLevelBlock& lb, const int32_t* q, int rows)
{
    const int C = a.C;
    std::vector<int> coded;
    for (int j = 0; j < C; ++j)
        if (lb.step[size_t(j)] > 0) coded.push_back(j);
    const int K = int(coded.size());
    a.tokens += rows;
    if (K == 0 || rows == 0) return;
    // G = Y^T Y of the chunk's reconstructed components y = q Delta (K x K), then S += R_K^T G R_K.
    std::vector<double> g(size_t(K) * K, 0.0), y(static_cast<size_t>(K));
    for (int r = 0; r < rows; ++r) {
        for (int k = 0; k < K; ++k) y[size_t(k)] = double(q[size_t(r) * K + k]) * double(lb.step[size_t(coded[size_t(k)])]);
        for (int i = 0; i < K; ++i) {
            const double yi = y[size_t(i)];
            if (yi == 0) continue;
            double* gi = g.data() + size_t(i) * K;
            for (int j = 0; j < K; ++j) gi[j] += yi * y[size_t(j)];
        }
    }
    std::vector<double> t(size_t(K) * C, 0.0);  // G R_K (K x C)
    for (int i = 0; i < K; ++i)
        for (int k = 0; k < K; ++k) {
            const double gik = g[size_t(i) * K + k];
            if (gik == 0) continue;
            const double* rk = a.rotation.data() + size_t(coded[size_t(k)]) * C;
            double* ti = t.data() + size_t(i) * C;
            for (int c = 0; c < C; ++c) ti[c] += gik * rk[c];
        }
    for (int i = 0; i < K; ++i) {  // S += R_K^T (G R_K): row c of S gets R[coded i][c] times row i
        const double* ri = a.rotation.data() + size_t(coded[size_t(i)]) * C;
        const double* ti = t.data() + size_t(i) * C;
        for (int c = 0; c < C; ++c) {
            const double r = ri[c];
            if (r == 0) continue;
            double* sc = a.sum.data() + size_t(c) * C;
            for (int d = 0; d < C; ++d) sc[d] += r * ti[d];
        }
    }
}

}  // namespace kvscope
