#include "kv/kv_compare.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvscope {

namespace {

struct Acc {
    double maxAbs = 0, err2 = 0, sig2 = 0;
    size_t n = 0;
};

Acc accumulate(const KvSet& a, const KvSet& b, KvKind kind, int layer)
{
    const KvShape& s = a.shape();
    Acc acc;
    std::vector<float> ra(size_t(s.numTokens) * s.headDim), rb(ra.size());
    for (int h = 0; h < s.numKvHeads; ++h) {
        a.readRows(kind, layer, h, 0, s.numTokens, ra.data());
        b.readRows(kind, layer, h, 0, s.numTokens, rb.data());
        for (size_t i = 0; i < ra.size(); ++i) {
            const double e = double(rb[i]) - double(ra[i]);
            acc.maxAbs = std::max(acc.maxAbs, std::fabs(e));
            acc.err2 += e * e;
            acc.sig2 += double(ra[i]) * double(ra[i]);
        }
        acc.n += ra.size();
    }
    return acc;
}

TensorError finish(const Acc& a)
{
    TensorError t;
    t.maxAbs = a.maxAbs;
    t.rms = a.n ? std::sqrt(a.err2 / double(a.n)) : 0.0;
    t.snrDb = a.err2 > 0 ? 10.0 * std::log10(a.sig2 / a.err2) : std::numeric_limits<double>::infinity();
    return t;
}

}  // namespace

KvError compareKv(const KvSet& reference, const KvSet& decoded)
{
    if (!(reference.shape() == decoded.shape()))
        throw Error("cannot compare caches of different shapes");
    const int L = reference.shape().numLayers;
    KvError out;
    out.layers.resize(size_t(L));
    std::vector<Acc> keys(static_cast<size_t>(L)), values(static_cast<size_t>(L));
#pragma omp parallel for schedule(dynamic, 1)
    for (int u = 0; u < 2 * L; ++u) {
        if (u % 2 == 0) keys[size_t(u / 2)] = accumulate(reference, decoded, KvKind::Key, u / 2);
        else values[size_t(u / 2)] = accumulate(reference, decoded, KvKind::Value, u / 2);
    }
    double err2 = 0;
    size_t n = 0;
    for (int l = 0; l < L; ++l) {
        out.layers[size_t(l)] = {l, finish(keys[size_t(l)]), finish(values[size_t(l)])};
        out.maxAbs = std::max({out.maxAbs, keys[size_t(l)].maxAbs, values[size_t(l)].maxAbs});
        err2 += keys[size_t(l)].err2 + values[size_t(l)].err2;
        n += keys[size_t(l)].n + values[size_t(l)].n;
    }
    out.rms = n ? std::sqrt(err2 / double(n)) : 0.0;
    return out;
}

}  // namespace kvscope
