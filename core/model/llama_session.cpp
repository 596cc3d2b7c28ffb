// The inference session of llama_runtime.h on libtorch: the KV cache, the forward pass over a
// block of tokens (prefill, decode, branches) and the blocked attention. The branch passes that
// share it are in llama_branches.cpp.
#include "model/llama_runtime_impl.h"

#include "common/error.h"
#include "model/decode_attention.h"

#include <cmath>

namespace kvscope {

void runtime_detail::checkTokens(const ModelConfig& c, const std::vector<int32_t>& tokens)
{
    for (int32_t t : tokens)
        if (t < 0 || t >= c.vocabSize)
            throw Error("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(c.vocabSize) + ")");
}

using runtime_detail::checkTokens;
using runtime_detail::Layer;
using runtime_detail::rmsNorm;
using runtime_detail::Weight;

namespace {

namespace F = torch::nn::functional;

torch::Tensor rotateHalf(const torch::Tensor& x)
{
    const int64_t half = x.size(-1) / 2;
    return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Codec statistics, nothing the forward pass uses: adds sum over positions and over the query
// heads of each KV group of q^2 (q after RoPE, (H, T, hd)) to acc (kv_heads, hd). A transform codec
// weights key errors by it (KvSet::querySq).
void accumulateQuerySq(torch::Tensor& acc, const torch::Tensor& q, int kvHeads)
{
    const torch::Tensor s = q.pow(2).sum(1).reshape({kvHeads, -1, q.size(2)}).sum(1);  // (KH, hd)
    if (acc.defined()) acc.add_(s);
    else acc = s.clone();
}

// cos and sin (1, T, head_dim) at positions pos (T, 1) for one set of inverse frequencies.
std::pair<torch::Tensor, torch::Tensor> ropeTablesAt(const torch::Tensor& invFreq, const torch::Tensor& pos)
{
    const torch::Tensor angles = pos * invFreq.unsqueeze(0);  // (T, hd/2)
    return {torch::cat({angles.cos(), angles.cos()}, -1).unsqueeze(0),
            torch::cat({angles.sin(), angles.sin()}, -1).unsqueeze(0)};
}

// Causal attention of T queries (positions P..P+T-1) over the first P+T cached keys, blocked over
// keys with a running ("online") softmax, so the (T x keys) score matrix is never materialised:
// per key block of at most `keyBlock` keys, the scores update each row's running maximum m, its
// running sum l of exp(score - m) and its output accumulator, both rescaled by exp(m_old - m_new).
// The queries go in sub-blocks of queryBlock: each sub-block reads only the keys some of its
// queries see (from its first query's window start to its last query), so a sliding layer reads
// window + queryBlock - 1 keys per query sub-block rather than the whole prefill block's span,
// the masked triangle on the causal diagonal shrinks with the sub-block, and the score buffer
// (KH x groups*queryBlock x keyBlock) stays in cache. Only key blocks that some query of the
// sub-block partly masks get an additive mask.
//   q (H, T, hd), query head h reads KV head h / (H / KH); K, V (KH, >= P+T, hd) in the cache's
//   dtype: the keys the call reads are converted to fp32 once, up front (exactly).
//   window > 0: query at p sees keys j with p - window < j <= p. softcap > 0: scores become
//   softcap * tanh(score / softcap). Returns (H, T, hd).
//   mass (optional, (KH, >= P+T)): adds each key's attention probability summed over the group's
//   query heads and the T queries, from a second pass over the key blocks with the final
//   normaliser (what a codec weights token errors by; nothing the forward pass uses).
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& K, const torch::Tensor& V, int P, int window,
                     double scale, double softcap, int keyBlock, int queryBlock, torch::Tensor* mass = nullptr)
{
    const int64_t H = q.size(0), T = q.size(1), hd = q.size(2), KH = K.size(0), groups = H / KH;
    const torch::Tensor q4 = (q * scale).view({KH, groups, T, hd});
    torch::Tensor out = torch::empty({KH, groups, T, hd});
    const int64_t base = window > 0 ? std::max<int64_t>(0, P - window + 1) : 0;  // the first key read
    const torch::Tensor Kf = K.narrow(1, base, P + T - base).to(torch::kFloat32);
    const torch::Tensor Vf = V.narrow(1, base, P + T - base).to(torch::kFloat32);
    for (int64_t q0 = 0; q0 < T; q0 += queryBlock) {
        const int64_t Tq = std::min<int64_t>(queryBlock, T - q0);
        const int64_t p0 = P + q0, p1 = P + q0 + Tq;  // positions of the sub-block: [p0, p1)
        const torch::Tensor qg = q4.narrow(2, q0, Tq).reshape({KH, groups * Tq, hd});
        // Keys some query of the sub-block sees: [first, p1).
        const int64_t first = window > 0 ? std::max<int64_t>(0, p0 - window + 1) : 0;
        // The additive mask of key block [k0, k0 + B) for this sub-block, or undefined when no
        // query of it masks any of those keys.
        auto blockMask = [&](int64_t k0, int64_t B) -> torch::Tensor {
            const bool causalCut = k0 + B - 1 > p0;                      // a key after the first query
            const bool windowCut = window > 0 && k0 <= p1 - 1 - window;  // a key too old for the last
            if (!causalCut && !windowCut) return {};
            const torch::Tensor qpos = torch::arange(p0, p1, torch::kLong).unsqueeze(1);
            const torch::Tensor kpos = torch::arange(k0, k0 + B, torch::kLong).unsqueeze(0);
            torch::Tensor allowed = kpos <= qpos;
            if (window > 0) allowed = allowed & (kpos > qpos - window);
            return torch::zeros({Tq, B}).masked_fill(allowed.logical_not(), -INFINITY);
        };
        torch::Tensor m = torch::full({KH, groups * Tq, 1}, -1e30f);  // finite: a fully masked row adds 0
        torch::Tensor l = torch::zeros({KH, groups * Tq, 1});
        torch::Tensor acc = torch::zeros({KH, groups * Tq, hd});
        for (int64_t k0 = first; k0 < p1; k0 += keyBlock) {
            const int64_t B = std::min<int64_t>(keyBlock, p1 - k0);
            const torch::Tensor Kb = Kf.narrow(1, k0 - base, B), Vb = Vf.narrow(1, k0 - base, B);
            torch::Tensor s = torch::bmm(qg, Kb.transpose(1, 2));  // (KH, g*Tq, B)
            if (softcap > 0) s = torch::tanh(s / softcap) * softcap;
            const torch::Tensor mask = blockMask(k0, B);
            if (mask.defined()) s.view({KH, groups, Tq, B}).add_(mask);
            const torch::Tensor mNew = torch::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
            s.sub_(mNew).exp_();  // s now holds the block's unnormalised probabilities
            const torch::Tensor corr = torch::exp(m - mNew);
            l.mul_(corr).add_(s.sum(-1, /*keepdim=*/true));
            acc.mul_(corr).baddbmm_(s, Vb);
            m = mNew;
        }
        if (mass) {
            for (int64_t k0 = first; k0 < p1; k0 += keyBlock) {
                const int64_t B = std::min<int64_t>(keyBlock, p1 - k0);
                torch::Tensor sc = torch::bmm(qg, Kf.narrow(1, k0 - base, B).transpose(1, 2));  // (KH, g*Tq, B)
                if (softcap > 0) sc = torch::tanh(sc / softcap) * softcap;
                const torch::Tensor mask = blockMask(k0, B);
                if (mask.defined()) sc.view({KH, groups, Tq, B}).add_(mask);
                mass->narrow(1, k0, B).add_(sc.sub_(m).exp_().div_(l).sum(1));  // (KH, B)
            }
        }
        out.narrow(2, q0, Tq).copy_(acc.div_(l).view({KH, groups, Tq, hd}));
    }
    return out.view({H, T, hd});
}

// One query (q (H, 1, hd), position P) over the first P + 1 cached keys with decode_attention.h,
// which reads the cache in its own dtype: the same visible keys and the same result as attend()
// up to the order of the sums.
torch::Tensor attendOne(const torch::Tensor& q, const torch::Tensor& K, const torch::Tensor& V, int P, int window,
                        double scale, double softcap, SimdPath path)
{
    const int64_t H = q.size(0), hd = q.size(2), KH = K.size(0), groups = H / KH;
    const torch::Tensor qs = (q * scale).contiguous();
    torch::Tensor out = torch::empty({H, 1, hd});
    const int64_t S = int64_t(P) + 1;
    const int64_t first = window > 0 ? std::max<int64_t>(0, S - window) : 0;
    std::vector<float> scratch(size_t(groups * (S - first)));
    const KvElem elem = K.scalar_type() == torch::kFloat16    ? KvElem::F16
                        : K.scalar_type() == torch::kBFloat16 ? KvElem::BF16
                                                              : KvElem::F32;
    const int64_t bytes = K.element_size();
    for (int64_t kh = 0; kh < KH; ++kh) {
        DecodeAttention a;
        a.q = qs.data_ptr<float>() + kh * groups * hd;
        a.K = static_cast<const char*>(K.data_ptr()) + kh * K.stride(0) * bytes;
        a.V = static_cast<const char*>(V.data_ptr()) + kh * V.stride(0) * bytes;
        a.elem = elem;
        a.groups = int(groups);
        a.headDim = int(hd);
        a.first = first;
        a.S = S;
        a.softcap = softcap;
        decodeAttention(a, out.data_ptr<float>() + kh * groups * hd, scratch.data(), path);
    }
    return out;
}

// Dense attention of q (H, T, hd) over the first S cached slots with an additive (T, S) mask:
// what branches use (their tokens do not see one another). Returns (H, T, hd).
torch::Tensor attendMasked(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values, int64_t S,
                           const torch::Tensor& mask, double scale, double softcap)
{
    const int64_t H = q.size(0), T = q.size(1), hd = q.size(2), KH = keys.size(0), g = H / KH;
    // One product per KV head over its query heads' rows: the cache is read in place, where a
    // broadcast over the query heads would copy K and V once per head.
    const torch::Tensor K = keys.narrow(1, 0, S).to(torch::kFloat32);    // (KH, S, hd)
    const torch::Tensor V = values.narrow(1, 0, S).to(torch::kFloat32);  // (KH, S, hd)
    const torch::Tensor qg = q.reshape({KH, g * T, hd});
    torch::Tensor scores = torch::bmm(qg, K.transpose(1, 2)).mul_(scale);  // (KH, g*T, S)
    if (softcap > 0) scores = torch::tanh(scores / softcap) * softcap;
    scores = scores.view({KH, g, T, S}) + mask;
    return torch::bmm(torch::softmax(scores, -1).view({KH, g * T, S}), V).view({H, T, hd});
}

torch::Tensor geluTanh(const torch::Tensor& x) { return F::gelu(x, F::GELUFuncOptions().approximate("tanh")); }

}  // namespace

InferenceSession::InferenceSession(const LlamaRuntime& runtime) : runtime_(&runtime), s_(std::make_unique<State>()) {}
InferenceSession::~InferenceSession() = default;
InferenceSession::InferenceSession(InferenceSession&&) noexcept = default;

int InferenceSession::position() const { return s_->length; }
const std::vector<int32_t>& InferenceSession::tokens() const { return s_->tokens; }

void InferenceSession::truncate(int tokens)
{
    if (tokens < 0 || tokens > s_->length)
        throw Error("cannot truncate a cache of " + std::to_string(s_->length) + " tokens to " + std::to_string(tokens));
    s_->length = tokens;
    s_->tokens.resize(size_t(tokens));
    if (tokens < s_->stashLength) s_->stashLength = -1;
}

void InferenceSession::loadKv(const KvSet& kv)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const KvShape want = runtime_->kvShape(kv.shape().numTokens);
    if (!(kv.shape() == want))
        throw Error("the KV cache (" + std::to_string(kv.shape().numLayers) + " layers, " +
                    std::to_string(kv.shape().numKvHeads) + " KV heads x " + std::to_string(kv.shape().headDim) +
                    ") does not fit the model (" + std::to_string(want.numLayers) + " layers, " +
                    std::to_string(want.numKvHeads) + " KV heads x " + std::to_string(want.headDim) + ")");
    c10::InferenceMode guard;
    const int n = kv.shape().numTokens;
    s_->length = 0;
    s_->stashLength = -1;
    s_->reserve(d, n);
    for (int l = 0; l < want.numLayers; ++l) {
        for (KvKind kind : {KvKind::Key, KvKind::Value}) {
            torch::Tensor& cache = (kind == KvKind::Key ? s_->keys : s_->values)[size_t(l)];
            torch::Tensor rows = torch::empty({want.numKvHeads, n, want.headDim});
            for (int h = 0; h < want.numKvHeads; ++h)
                kv.readRows(kind, l, h, 0, n, rows[h].data_ptr<float>());
            cache.narrow(1, 0, n).copy_(rows.to(d.kvType));
        }
    }
    s_->length = n;
    s_->tokens = kv.tokens;
    s_->tokens.resize(size_t(n), -1);
}

KvSet InferenceSession::exportKv() const
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const KvShape shape = runtime_->kvShape(s_->length);
    KvSet kv(shape, d.options.kvDtype);
    for (int l = 0; l < shape.numLayers; ++l) {
        for (KvKind kind : {KvKind::Key, KvKind::Value}) {
            const torch::Tensor& cache = (kind == KvKind::Key ? s_->keys : s_->values)[size_t(l)];
            const torch::Tensor rows = cache.narrow(1, 0, s_->length).to(torch::kFloat32).contiguous();
            for (int h = 0; h < shape.numKvHeads; ++h)
                kv.writeRows(kind, l, h, 0, s_->length, rows[h].data_ptr<float>());
        }
    }
    kv.tokens = s_->tokens;
    kv.modelName = d.spec.name;
    kv.modelFingerprint = d.fingerprint;
    exportCodecStatistics(kv);
    return kv;
}

torch::Tensor InferenceSession::State::forwardBlock(const LlamaRuntime::Impl& d, const int32_t* tokens, int T,
                                                   const torch::Tensor& pos, const BlockAttention& attention, bool recordQueries)
{
    State* s_ = this;
    const ModelConfig& c = d.spec.config;
    const int H = c.numHeads, KH = c.numKvHeads, hd = c.headDim;
    const torch::Tensor ids = torch::from_blob(const_cast<int32_t*>(tokens), {T}, torch::kInt32).to(torch::kLong);
    torch::Tensor x = d.embedRows(ids);  // (T, hidden)
    if (c.embedScale != 1.0) x = x * float(c.embedScale);
    const auto [cosG, sinG] = ropeTablesAt(d.invFreq, pos);
    const auto [cosL, sinL] = ropeTablesAt(d.invFreqLocal, pos);
    // Extensions are independent appends: each one's rows go through the products append gives them.
    std::vector<std::pair<int, int>> spans;
    for (const BlockAttention::Extend& e : attention.extends) spans.emplace_back(e.start, e.size);
    auto linear = [&](const torch::Tensor& in, const Weight& w, const torch::Tensor& b = {}) {
        return spans.empty() ? d.linear(in, w, b) : d.linearSpans(in, w, b, spans);
    };
    for (size_t l = 0; l < d.layers.size(); ++l) {
        const Layer& L = d.layers[l];
        const torch::Tensor h = rmsNorm(x, L.inNorm, c.rmsNormEps);
        torch::Tensor q = linear(h, L.wq, L.bq).view({T, H, hd});
        torch::Tensor k = linear(h, L.wk, L.bk).view({T, KH, hd});
        torch::Tensor v = linear(h, L.wv, L.bv).view({T, KH, hd}).transpose(0, 1);
        if (c.qkNorm) {
            q = rmsNorm(q, L.qNorm, c.rmsNormEps);
            k = rmsNorm(k, L.kNorm, c.rmsNormEps);
        }
        q = q.transpose(0, 1);  // (H, T, hd)
        k = k.transpose(0, 1);  // (KH, T, hd)
        const torch::Tensor& cos = L.sliding ? cosL : cosG;
        const torch::Tensor& sin = L.sliding ? sinL : sinG;
        q = q * cos + rotateHalf(q) * sin;
        k = k * cos + rotateHalf(k) * sin;
        if (recordQueries) {
            if (s_->querySq.size() < d.layers.size()) s_->querySq.resize(d.layers.size());
            accumulateQuerySq(s_->querySq[l], q, KH);
        }
        torch::Tensor o = s_->attendLayer(d, l, q, k, v, attention, recordQueries);
        o = o.transpose(0, 1).reshape({T, H * hd});
        torch::Tensor attnOut = linear(o, L.wo);
        if (c.sandwichNorm) attnOut = rmsNorm(attnOut, L.postNorm, c.rmsNormEps);
        x = x + attnOut;
        const torch::Tensor h2 = rmsNorm(x, c.sandwichNorm ? L.preFfnNorm : L.postNorm, c.rmsNormEps);
        const torch::Tensor gate = linear(h2, L.wGate);
        torch::Tensor mlp = linear((d.geglu ? geluTanh(gate) : F::silu(gate)) * linear(h2, L.wUp), L.wDown);
        if (c.sandwichNorm) mlp = rmsNorm(mlp, L.postFfnNorm, c.rmsNormEps);
        x = x + mlp;
    }
    return x;
}

torch::Tensor InferenceSession::State::attendLayer(const LlamaRuntime::Impl& d, size_t l, const torch::Tensor& q,
                                                  const torch::Tensor& k, const torch::Tensor& v,
                                                  const BlockAttention& attention, bool recordQueries)
{
    State* s_ = this;
    const ModelConfig& c = d.spec.config;
    const Layer& L = d.layers[l];
    const int KH = c.numKvHeads, hd = c.headDim;
    const double scale = 1.0 / std::sqrt(c.queryPreAttnScalar > 0 ? c.queryPreAttnScalar : double(hd));
    const int P = s_->length, T = int(q.size(1)), S = P + T;
    // The cache holds what a serving stack would store: K/V rounded to kvDtype.
    const torch::Tensor kq = k.to(d.kvType), vq = v.to(d.kvType);
    if (!attention.extends.empty()) {
        // Each extension in turn: its group's stash, then its rows after the cache, attended as
        // append attends them (one row: the decode attention, unless append would record the mass).
        torch::Tensor out = torch::empty({q.size(0), T, hd});
        const int window = L.sliding ? c.slidingWindow : 0;
        for (const BlockAttention::Extend& e : attention.extends) {
            torch::Tensor& stashK = s_->stashKeys[size_t(e.index)][l];
            torch::Tensor& stashV = s_->stashValues[size_t(e.index)][l];
            const int at = P + int(stashK.size(1));
            s_->keys[l].narrow(1, P, at - P).copy_(stashK);
            s_->values[l].narrow(1, P, at - P).copy_(stashV);
            s_->keys[l].narrow(1, at, e.size).copy_(kq.narrow(1, e.start, e.size));
            s_->values[l].narrow(1, at, e.size).copy_(vq.narrow(1, e.start, e.size));
            const torch::Tensor qe = q.narrow(1, e.start, e.size);
            out.narrow(1, e.start, e.size)
                .copy_(e.size == 1 && !d.options.attnMass && d.kernels
                           ? attendOne(qe, s_->keys[l], s_->values[l], at, window, scale, c.attnSoftcap, d.kernelPath)
                           : attend(qe, s_->keys[l], s_->values[l], at, window, scale, c.attnSoftcap, d.options.keyBlock,
                                    d.options.queryBlock));
            stashK = s_->keys[l].narrow(1, P, at - P + e.size).clone();
            stashV = s_->values[l].narrow(1, P, at - P + e.size).clone();
        }
        return out;
    }
    if (!attention.groups.empty()) {
        // Each group in turn occupies the slots after the cache, as if it were the only one, in an
        // fp32 copy of the cache made once for all groups.
        torch::Tensor out = torch::empty({q.size(0), T, hd});
        int largest = 0;
        for (const BlockAttention::Group& g : attention.groups) largest = std::max(largest, g.size);
        torch::Tensor keys = torch::empty({KH, P + largest, hd}), values = torch::empty({KH, P + largest, hd});
        keys.narrow(1, 0, P).copy_(s_->keys[l].narrow(1, 0, P));
        values.narrow(1, 0, P).copy_(s_->values[l].narrow(1, 0, P));
        for (const BlockAttention::Group& g : attention.groups) {
            keys.narrow(1, P, g.size).copy_(kq.narrow(1, g.start, g.size));
            values.narrow(1, P, g.size).copy_(vq.narrow(1, g.start, g.size));
            s_->stashKeys[size_t(g.index)][l] = kq.narrow(1, g.start, g.trunk).clone();
            s_->stashValues[size_t(g.index)][l] = vq.narrow(1, g.start, g.trunk).clone();
            out.narrow(1, g.start, g.size)
                .copy_(attendMasked(q.narrow(1, g.start, g.size), keys, values, P + g.size,
                                    L.sliding ? g.maskLocal : g.maskGlobal, scale, c.attnSoftcap));
        }
        return out;
    }
    s_->keys[l].narrow(1, P, T).copy_(kq);
    s_->values[l].narrow(1, P, T).copy_(vq);
    if (attention.maskGlobal.defined())  // an explicit (T, S) mask: dense scores, for small T (branches)
        return attendMasked(q, s_->keys[l], s_->values[l], S, L.sliding ? attention.maskLocal : attention.maskGlobal,
                            scale, c.attnSoftcap);
    torch::Tensor* mass = nullptr;
    if (recordQueries && d.options.attnMass) {
        // Attention mass per slot (sum over the group's query heads and the block's queries),
        // and at layer 0 how many queries could see each slot: a codec weights token errors
        // by their ratio.
        if (s_->attnMass.size() < d.layers.size()) s_->attnMass.resize(d.layers.size());
        torch::Tensor& acc = s_->attnMass[l];
        if (!acc.defined() || acc.size(1) < S) {
            torch::Tensor grown = torch::zeros({KH, S});
            if (acc.defined()) grown.narrow(1, 0, acc.size(1)).copy_(acc);
            acc = grown;
        }
        mass = &acc;
        if (l == 0) {
            const int w = L.sliding ? c.slidingWindow : 0;
            const torch::Tensor j = torch::arange(0, S, torch::kLong);
            torch::Tensor hi = torch::full({S}, int64_t(S - 1), torch::kLong);
            if (w > 0) hi = torch::minimum(hi, j + (w - 1));
            const torch::Tensor lo = torch::maximum(j, torch::full({S}, int64_t(P), torch::kLong));
            const torch::Tensor seen = (hi - lo + 1).clamp_min(0).to(torch::kFloat32);
            if (!s_->attnSeen.defined() || s_->attnSeen.size(0) < S) {
                torch::Tensor grown = torch::zeros({S});
                if (s_->attnSeen.defined()) grown.narrow(0, 0, s_->attnSeen.size(0)).copy_(s_->attnSeen);
                s_->attnSeen = grown;
            }
            s_->attnSeen.narrow(0, 0, S).add_(seen);
        }
    }
    if (T == 1 && !mass && d.kernels)
        return attendOne(q, s_->keys[l], s_->values[l], P, L.sliding ? c.slidingWindow : 0, scale, c.attnSoftcap,
                         d.kernelPath);
    return attend(q, s_->keys[l], s_->values[l], P, L.sliding ? c.slidingWindow : 0, scale, c.attnSoftcap,
                  d.options.keyBlock, d.options.queryBlock, mass);
}

// The RoPE table, the mean query second moments and the o_proj weight matrices of each KV group:
// what a transform codec needs to undo RoPE and weight errors by what attention sees.
void InferenceSession::exportCodecStatistics(KvSet& kv) const
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    const torch::Tensor inv = d.invFreq.contiguous();
    kv.ropeInvFreq.assign(inv.data_ptr<float>(), inv.data_ptr<float>() + inv.numel());
    kv.ropePosition0 = 0;
    const int KH = c.numKvHeads, hd = c.headDim, groups = c.numHeads / c.numKvHeads;
    kv.querySq.clear();
    if (s_->queryCount > 0 && s_->querySq.size() == d.layers.size())
        for (const torch::Tensor& acc : s_->querySq) {
            const torch::Tensor m = (acc / double(s_->queryCount)).contiguous();
            kv.querySq.emplace_back(m.data_ptr<float>(), m.data_ptr<float>() + m.numel());
        }
    kv.attnMass.clear();
    const int T = s_->length;
    if (T > 0 && s_->attnMass.size() == d.layers.size() && s_->attnSeen.defined() && s_->attnSeen.size(0) >= T) {
        const torch::Tensor seen = s_->attnSeen.narrow(0, 0, T).clamp_min(1.0f) * float(groups);
        for (const torch::Tensor& acc : s_->attnMass) {
            if (!acc.defined() || acc.size(1) < T) {
                kv.attnMass.clear();
                break;
            }
            const torch::Tensor m = (acc.narrow(1, 0, T) / seen.unsqueeze(0)).contiguous();
            kv.attnMass.emplace_back(m.data_ptr<float>(), m.data_ptr<float>() + m.numel());
        }
    }
    kv.valueWeight.clear();
    for (const Layer& L : d.layers) {
        // wo (hidden, H * hd): head h's columns; M_g = sum_h W_h^T W_h over the group's heads.
        const torch::Tensor wo = d.expanded(L.wo).reshape({L.wo.rows, KH, groups, hd});
        const torch::Tensor m = torch::einsum("nkgi,nkgj->kij", {wo, wo}).contiguous();  // (KH, hd, hd)
        kv.valueWeight.emplace_back(m.data_ptr<float>(), m.data_ptr<float>() + m.numel());
    }
}

void InferenceSession::append(const std::vector<int32_t>& tokens, std::vector<float>* lastLogits,
                              std::vector<float>* allLogits, const ProgressFn& progress)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    if (tokens.empty()) throw Error("no tokens to run");
    checkTokens(c, tokens);
    if (size_t(s_->length) + tokens.size() > size_t(KvLimits::maxTokens))
        throw Error("context longer than " + std::to_string(KvLimits::maxTokens) + " tokens");

    c10::InferenceMode guard;
    const int total = int(tokens.size());
    if (allLogits) allLogits->assign(size_t(total) * size_t(c.vocabSize), 0.0f);
    s_->reserve(d, s_->length + total);

    for (int start = 0; start < total; start += d.options.prefillBlock) {
        const int T = std::min(d.options.prefillBlock, total - start);
        const int P = s_->length;  // position of the block's first token
        const int S = P + T;       // keys visible to the block's last token
        const torch::Tensor pos = torch::arange(P, S, torch::kFloat32).unsqueeze(1);
        // Causal (and per-layer sliding-window) attention, blocked over keys: no mask tensors.
        const torch::Tensor x = s_->forwardBlock(d, tokens.data() + start, T, pos, {}, true);
        s_->length = S;
        s_->queryCount += T;
        s_->tokens.insert(s_->tokens.end(), tokens.begin() + start, tokens.begin() + start + T);

        const bool lastBlock = start + T == total;
        if (allLogits || lastBlock) {
            const torch::Tensor rows = allLogits ? x : x.narrow(0, T - 1, 1);
            torch::Tensor logits = d.linear(rmsNorm(rows, d.norm, c.rmsNormEps), d.lmHead);
            if (c.finalSoftcap > 0) logits = torch::tanh(logits / c.finalSoftcap) * c.finalSoftcap;
            logits = logits.contiguous();
            const float* p = logits.data_ptr<float>();
            if (allLogits)
                std::copy(p, p + logits.numel(), allLogits->data() + size_t(start) * size_t(c.vocabSize));
            if (lastBlock && lastLogits) {
                const float* lastRow = p + (logits.size(0) - 1) * c.vocabSize;
                lastLogits->assign(lastRow, lastRow + c.vocabSize);
            }
        }
        if (progress && !progress(start + T, total)) throw Error("cancelled");
    }
}

}  // namespace kvscope
