// A plain scalar forward of a llama2.c checkpoint, one token at a time, written from the
// semantics of llama2.c's run.c (fp32 everywhere, RMSNorm eps 1e-5, RoPE theta 10000, GQA).
// The independent reference that the libtorch runtime and the RoPE permutation are checked against.
#pragma once

#include "modelio/llama2c.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace ref_llama2c {

using kvscope::Llama2cConfig;
using kvscope::Llama2cModel;


inline void matmul(float* out, const float* x, const float* w, int in, int outDim)
{
    for (int i = 0; i < outDim; ++i) {
        float s = 0.0f;
        for (int j = 0; j < in; ++j) s += w[size_t(i) * size_t(in) + size_t(j)] * x[j];
        out[i] = s;
    }
}

inline void rmsnorm(float* out, const float* x, const float* w, int n)
{
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    ss = 1.0f / std::sqrt(ss / float(n) + 1e-5f);
    for (int i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

// Rotates every head of vec (nHeads * hs). interleaved: pairs (2i, 2i+1) as llama2.c;
// otherwise rotate_half pairs (i, i + hs/2). Pair i turns by pos * 10000^(-2i/hs) in both.
inline void rope(float* vec, int nHeads, int hs, int pos, bool interleaved)
{
    for (int h = 0; h < nHeads; ++h) {
        float* v = vec + size_t(h) * size_t(hs);
        for (int i = 0; i < hs / 2; ++i) {
            const float freq = 1.0f / std::pow(10000.0f, float(2 * i) / float(hs));
            const float a = float(pos) * freq, c = std::cos(a), s = std::sin(a);
            const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + hs / 2;
            const float v0 = v[i0], v1 = v[i1];
            v[i0] = v0 * c - v1 * s;
            v[i1] = v0 * s + v1 * c;
        }
    }
}

struct RefState {
    std::vector<float> keys, values;  // (L, seq, kvDim)
};

inline std::vector<float> forward(const Llama2cModel& m, RefState& st, int token, int pos, bool interleaved)
{
    const Llama2cConfig& c = m.config;
    const int d = c.dim, hs = c.headSize(), kvd = c.kvDim(), qd = c.qDim(), hid = c.hiddenDim;
    if (st.keys.empty()) {
        st.keys.assign(size_t(c.nLayers) * size_t(c.seqLen) * size_t(kvd), 0.0f);
        st.values = st.keys;
    }
    std::vector<float> x(m.tokenEmbedding.begin() + ptrdiff_t(token) * d,
                         m.tokenEmbedding.begin() + ptrdiff_t(token + 1) * d);
    std::vector<float> xb(static_cast<size_t>(std::max(d, qd))), xb2(static_cast<size_t>(d)),
        q(static_cast<size_t>(qd)), att(static_cast<size_t>(pos + 1));
    std::vector<float> hb(static_cast<size_t>(hid)), hb2(static_cast<size_t>(hid));
    for (int l = 0; l < c.nLayers; ++l) {
        rmsnorm(xb.data(), x.data(), m.rmsAtt.data() + size_t(l) * size_t(d), d);
        float* kc = st.keys.data() + (size_t(l) * size_t(c.seqLen) + size_t(pos)) * size_t(kvd);
        float* vc = st.values.data() + (size_t(l) * size_t(c.seqLen) + size_t(pos)) * size_t(kvd);
        matmul(q.data(), xb.data(), m.wq.data() + size_t(l) * size_t(qd) * size_t(d), d, qd);
        matmul(kc, xb.data(), m.wk.data() + size_t(l) * size_t(kvd) * size_t(d), d, kvd);
        matmul(vc, xb.data(), m.wv.data() + size_t(l) * size_t(kvd) * size_t(d), d, kvd);
        rope(q.data(), c.nHeads, hs, pos, interleaved);
        rope(kc, c.nKvHeads, hs, pos, interleaved);
        for (int h = 0; h < c.nHeads; ++h) {
            const int kh = h / (c.nHeads / c.nKvHeads);
            float mx = -1e30f;
            for (int t = 0; t <= pos; ++t) {
                const float* k = st.keys.data() + (size_t(l) * size_t(c.seqLen) + size_t(t)) * size_t(kvd) + size_t(kh) * size_t(hs);
                float s = 0.0f;
                for (int i = 0; i < hs; ++i) s += q[size_t(h) * size_t(hs) + size_t(i)] * k[i];
                att[size_t(t)] = s / std::sqrt(float(hs));
                mx = std::max(mx, att[size_t(t)]);
            }
            float sum = 0.0f;
            for (int t = 0; t <= pos; ++t) sum += (att[size_t(t)] = std::exp(att[size_t(t)] - mx));
            float* o = xb.data() + size_t(h) * size_t(hs);
            std::fill(o, o + hs, 0.0f);
            for (int t = 0; t <= pos; ++t) {
                const float* v = st.values.data() + (size_t(l) * size_t(c.seqLen) + size_t(t)) * size_t(kvd) + size_t(kh) * size_t(hs);
                for (int i = 0; i < hs; ++i) o[i] += att[size_t(t)] / sum * v[i];
            }
        }
        matmul(xb2.data(), xb.data(), m.wo.data() + size_t(l) * size_t(d) * size_t(qd), qd, d);
        for (int i = 0; i < d; ++i) x[size_t(i)] += xb2[size_t(i)];
        rmsnorm(xb.data(), x.data(), m.rmsFfn.data() + size_t(l) * size_t(d), d);
        matmul(hb.data(), xb.data(), m.w1.data() + size_t(l) * size_t(hid) * size_t(d), d, hid);
        matmul(hb2.data(), xb.data(), m.w3.data() + size_t(l) * size_t(hid) * size_t(d), d, hid);
        for (int i = 0; i < hid; ++i) hb[size_t(i)] = hb[size_t(i)] / (1.0f + std::exp(-hb[size_t(i)])) * hb2[size_t(i)];
        matmul(xb2.data(), hb.data(), m.w2.data() + size_t(l) * size_t(d) * size_t(hid), hid, d);
        for (int i = 0; i < d; ++i) x[size_t(i)] += xb2[size_t(i)];
    }
    rmsnorm(xb.data(), x.data(), m.rmsFinal.data(), d);
    std::vector<float> logits(size_t(c.vocabSize));
    matmul(logits.data(), xb.data(), m.classifier(), d, c.vocabSize);
    return logits;
}

// Greedy: feed the prompt (starting with BOS), then n argmax tokens. Returns the generated ids.
inline std::vector<int> greedy(const Llama2cModel& m, std::vector<int> prompt, int n, bool interleaved)
{
    RefState st;
    std::vector<int> out;
    int token = prompt[0];
    for (int pos = 0; pos < int(prompt.size()) - 1 + n; ++pos) {
        const std::vector<float> logits = forward(m, st, token, pos, interleaved);
        if (pos + 1 < int(prompt.size())) {
            token = prompt[size_t(pos) + 1];
            continue;
        }
        token = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(token);
    }
    return out;
}

}  // namespace ref_llama2c
