// The inference session of llama_runtime.h on libtorch: the KV cache, the forward pass over a
// block of tokens (prefill, decode, branches) and the blocked attention.
#include "model/llama_runtime_impl.h"

#include "common/error.h"
#include "model/decode_attention.h"

#include <cmath>

namespace kvscope {

using runtime_detail::Layer;
using runtime_detail::Weight;

namespace {

namespace F = torch::nn::functional;

torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps)
{
    const torch::Tensor var = x.pow(2).mean(-1, /*keepdim=*/true);
    return w * (x * torch::rsqrt(var + eps));
}

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
//   q (H, T, hd), query head h reads KV head h / (H / KH); K, V (KH, >= P+T, hd) fp32.
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
            const torch::Tensor Kb = K.narrow(1, k0, B), Vb = V.narrow(1, k0, B);
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
                torch::Tensor sc = torch::bmm(qg, K.narrow(1, k0, B).transpose(1, 2));  // (KH, g*Tq, B)
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

// One query (q (H, 1, hd), position P) over the first P + 1 cached keys with decode_attention.h:
// the same visible keys and the same result as attend() up to the order of the sums.
torch::Tensor attendOne(const torch::Tensor& q, const torch::Tensor& K, const torch::Tensor& V, int P, int window,
                        double scale, double softcap, SimdPath path)
{
    const int64_t H = q.size(0), hd = q.size(2), KH = K.size(0), groups = H / KH;
    const torch::Tensor qs = (q * scale).contiguous();
    torch::Tensor out = torch::empty({H, 1, hd});
    const int64_t S = int64_t(P) + 1;
    const int64_t first = window > 0 ? std::max<int64_t>(0, S - window) : 0;
    std::vector<float> scratch(size_t(groups * (S - first)));
    for (int64_t kh = 0; kh < KH; ++kh) {
        DecodeAttention a;
        a.q = qs.data_ptr<float>() + kh * groups * hd;
        a.K = K.data_ptr<float>() + kh * K.stride(0);
        a.V = V.data_ptr<float>() + kh * V.stride(0);
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
    const torch::Tensor K = keys.narrow(1, 0, S);    // (KH, S, hd)
    const torch::Tensor V = values.narrow(1, 0, S);  // (KH, S, hd)
    const torch::Tensor qg = q.reshape({KH, g * T, hd});
    torch::Tensor scores = torch::bmm(qg, K.transpose(1, 2)).mul_(scale);  // (KH, g*T, S)
    if (softcap > 0) scores = torch::tanh(scores / softcap) * softcap;
    scores = scores.view({KH, g, T, S}) + mask;
    return torch::bmm(torch::softmax(scores, -1).view({KH, g * T, S}), V).view({H, T, hd});
}

torch::Tensor geluTanh(const torch::Tensor& x) { return F::gelu(x, F::GELUFuncOptions().approximate("tanh")); }

void checkTokens(const ModelConfig& c, const std::vector<int32_t>& tokens)
{
    for (int32_t t : tokens)
        if (t < 0 || t >= c.vocabSize)
            throw Error("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(c.vocabSize) + ")");
}

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
            cache.narrow(1, 0, n).copy_(rows.to(d.kvType).to(torch::kFloat32));
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
            const torch::Tensor rows = cache.narrow(1, 0, s_->length).contiguous();
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
    for (size_t l = 0; l < d.layers.size(); ++l) {
        const Layer& L = d.layers[l];
        const torch::Tensor h = rmsNorm(x, L.inNorm, c.rmsNormEps);
        torch::Tensor q = d.linear(h, L.wq, L.bq).view({T, H, hd});
        torch::Tensor k = d.linear(h, L.wk, L.bk).view({T, KH, hd});
        torch::Tensor v = d.linear(h, L.wv, L.bv).view({T, KH, hd}).transpose(0, 1);
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
        torch::Tensor attnOut = d.linear(o, L.wo);
        if (c.sandwichNorm) attnOut = rmsNorm(attnOut, L.postNorm, c.rmsNormEps);
        x = x + attnOut;
        const torch::Tensor h2 = rmsNorm(x, c.sandwichNorm ? L.preFfnNorm : L.postNorm, c.rmsNormEps);
        const torch::Tensor gate = d.linear(h2, L.wGate);
        torch::Tensor mlp = d.linear((d.geglu ? geluTanh(gate) : F::silu(gate)) * d.linear(h2, L.wUp), L.wDown);
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
    if (!attention.groups.empty()) {
        // Each group in turn occupies the slots after the cache, as if it were the only one.
        torch::Tensor out = torch::empty({q.size(0), T, hd});
        for (const BlockAttention::Group& g : attention.groups) {
            s_->keys[l].narrow(1, P, g.size).copy_(kq.narrow(1, g.start, g.size));
            s_->values[l].narrow(1, P, g.size).copy_(vq.narrow(1, g.start, g.size));
            s_->stashKeys[size_t(g.index)][l] = s_->keys[l].narrow(1, P, g.trunk).clone();
            s_->stashValues[size_t(g.index)][l] = s_->values[l].narrow(1, P, g.trunk).clone();
            out.narrow(1, g.start, g.size)
                .copy_(attendMasked(q.narrow(1, g.start, g.size), s_->keys[l], s_->values[l], P + g.size,
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

namespace {

// The positions and masks of one trunk with its branches after P0 cached slots (appendBranches'
// layout): posv receives the NT + branch tokens' RoPE positions, mask and maskLocal (T, P0 + T)
// the additive masks of global and sliding layers.
void branchMasks(const ModelConfig& c, int P0, int NT, const std::vector<std::vector<int32_t>>& branches,
                 std::vector<float>& posv, torch::Tensor& mask, torch::Tensor& maskLocal)
{
    std::vector<int> branchStart;
    int T = NT;
    for (const auto& b : branches) {
        branchStart.push_back(T);
        T += int(b.size());
    }
    // Positions: the trunk continues the cache; every branch starts right after the trunk.
    posv.assign(size_t(T), 0.0f);
    for (int i = 0; i < NT; ++i) posv[size_t(i)] = float(P0 + i);
    for (size_t b = 0; b < branches.size(); ++b)
        for (size_t o = 0; o < branches[b].size(); ++o) posv[size_t(branchStart[b]) + o] = float(P0 + NT + int(o));
    // Mask (T, P0 + T): trunk token i sees slots j <= P0 + i; branch token (b, o) sees the
    // context and the trunk (j < P0 + NT) and its own branch's slots up to itself.
    torch::Tensor allowed = torch::zeros({T, P0 + T}, torch::kBool);
    auto a = allowed.accessor<bool, 2>();
    for (int i = 0; i < NT; ++i)
        for (int j = 0; j <= P0 + i; ++j) a[i][j] = true;
    for (size_t b = 0; b < branches.size(); ++b)
        for (size_t o = 0; o < branches[b].size(); ++o) {
            const int i = branchStart[b] + int(o);
            for (int j = 0; j < P0 + NT; ++j) a[i][j] = true;
            for (int j = P0 + branchStart[b]; j <= P0 + i; ++j) a[i][j] = true;
        }
    mask = torch::zeros({T, P0 + T}).masked_fill(allowed.logical_not(), -INFINITY);
    maskLocal = mask;
    if (c.slidingWindow > 0) {  // sliding layers: slot j < P0 + NT holds position j, a branch slot its own
        torch::Tensor windowed = allowed.clone();
        auto w = windowed.accessor<bool, 2>();
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < P0 + T; ++j) {
                const float keyPos = j < P0 + NT ? float(j) : posv[size_t(j - P0)];
                if (w[i][j] && keyPos <= posv[size_t(i)] - float(c.slidingWindow)) w[i][j] = false;
            }
        maskLocal = torch::zeros({T, P0 + T}).masked_fill(windowed.logical_not(), -INFINITY);
    }
}

// Final norm and LM head of the rows `rows` of x (hidden states before the last norm): (rows, vocab).
torch::Tensor headLogits(const LlamaRuntime::Impl& d, const torch::Tensor& x, const std::vector<int64_t>& rows)
{
    const ModelConfig& c = d.spec.config;
    const torch::Tensor sel = torch::from_blob(const_cast<int64_t*>(rows.data()), {int64_t(rows.size())}, torch::kLong).clone();
    return d.linear(rmsNorm(x.index_select(0, sel), d.norm, c.rmsNormEps), d.lmHead).contiguous();
}

}  // namespace

void InferenceSession::appendBranches(const std::vector<int32_t>& trunk, const std::vector<std::vector<int32_t>>& branches,
                                      std::vector<float>* trunkLastLogits, std::vector<std::vector<float>>* branchLogits)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    if (trunk.empty()) throw Error("no tokens to run");
    std::vector<int32_t> all = trunk;
    for (const auto& b : branches) all.insert(all.end(), b.begin(), b.end());
    checkTokens(c, all);
    const int P0 = s_->length, NT = int(trunk.size()), T = int(all.size());
    if (size_t(P0) + size_t(T) > size_t(KvLimits::maxTokens))
        throw Error("context longer than " + std::to_string(KvLimits::maxTokens) + " tokens");

    c10::InferenceMode guard;
    s_->reserve(d, P0 + T);
    std::vector<float> posv;
    BlockAttention attention;
    branchMasks(c, P0, NT, branches, posv, attention.maskGlobal, attention.maskLocal);
    const torch::Tensor pos = torch::from_blob(posv.data(), {T, 1}, torch::kFloat32).clone();
    const torch::Tensor x = s_->forwardBlock(d, all.data(), T, pos, attention, false);
    // Keep the trunk; the branches' slots are scratch, overwritten by the next append.
    s_->length = P0 + NT;
    s_->tokens.insert(s_->tokens.end(), trunk.begin(), trunk.end());
    s_->stashLength = -1;
    std::vector<int64_t> rowsWanted = {NT - 1};
    for (int i = NT; i < T; ++i) rowsWanted.push_back(i);
    const torch::Tensor logits = headLogits(d, x, rowsWanted);
    const float* p = logits.data_ptr<float>();
    const size_t V = size_t(c.vocabSize);
    if (trunkLastLogits) trunkLastLogits->assign(p, p + V);
    if (branchLogits) {
        branchLogits->assign(branches.size(), {});
        for (size_t b = 0, row = 1; b < branches.size(); row += branches[b].size(), ++b)
            (*branchLogits)[b].assign(p + V * row, p + V * (row + branches[b].size()));
    }
}

std::vector<InferenceSession::BranchGroupLogits> InferenceSession::appendBranchGroups(const std::vector<BranchGroup>& groups)
{
    static_assert(kBranchGroupAlone == kWeightKernelMaxBatch, "a group alone must run as appendBranches runs it");
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    const int P0 = s_->length;
    std::vector<int> sizes;
    for (const BranchGroup& g : groups) {
        if (g.trunk.empty()) throw Error("no tokens to run");
        checkTokens(c, g.trunk);
        int T = int(g.trunk.size());
        for (const auto& b : g.branches) {
            checkTokens(c, b);
            T += int(b.size());
        }
        if (size_t(P0) + size_t(T) > size_t(KvLimits::maxTokens))
            throw Error("context longer than " + std::to_string(KvLimits::maxTokens) + " tokens");
        sizes.push_back(T);
    }
    c10::InferenceMode guard;
    s_->stashTokens.assign(groups.size(), {});
    s_->stashKeys.assign(groups.size(), std::vector<torch::Tensor>(d.layers.size()));
    s_->stashValues.assign(groups.size(), std::vector<torch::Tensor>(d.layers.size()));
    s_->stashLength = -1;
    std::vector<BranchGroupLogits> out(groups.size());
    // A group small enough for the decode kernels runs alone, as appendBranches would run it; the
    // others share passes of up to prefillBlock tokens (a larger group has one of its own).
    std::vector<std::vector<int>> passes;
    std::vector<int> batch;
    int filled = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
        if (sizes[g] <= kBranchGroupAlone) {
            passes.push_back({int(g)});
            continue;
        }
        if (!batch.empty() && filled + sizes[g] > d.options.prefillBlock) {
            passes.push_back(std::move(batch));
            batch.clear();
            filled = 0;
        }
        batch.push_back(int(g));
        filled += sizes[g];
    }
    if (!batch.empty()) passes.push_back(std::move(batch));
    for (const std::vector<int>& pass : passes) runBranchPass(groups, pass, out);
    s_->stashLength = P0;
    return out;
}

void InferenceSession::runBranchPass(const std::vector<BranchGroup>& groups, const std::vector<int>& pass,
                                     std::vector<BranchGroupLogits>& out)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    const int P0 = s_->length;
    BlockAttention attention;
    std::vector<int32_t> all;
    std::vector<float> posAll;
    int largest = 0;
    for (int g : pass) {
        const BranchGroup& bg = groups[size_t(g)];
        BlockAttention::Group span;
        span.start = int(all.size());
        span.trunk = int(bg.trunk.size());
        span.index = g;
        all.insert(all.end(), bg.trunk.begin(), bg.trunk.end());
        for (const auto& b : bg.branches) all.insert(all.end(), b.begin(), b.end());
        span.size = int(all.size()) - span.start;
        std::vector<float> posv;
        branchMasks(c, P0, span.trunk, bg.branches, posv, span.maskGlobal, span.maskLocal);
        posAll.insert(posAll.end(), posv.begin(), posv.end());
        largest = std::max(largest, span.size);
        s_->stashTokens[size_t(g)] = bg.trunk;
        attention.groups.push_back(std::move(span));
    }
    s_->reserve(d, P0 + largest);
    const int T = int(all.size());
    const torch::Tensor pos = torch::from_blob(posAll.data(), {T, 1}, torch::kFloat32).clone();
    const torch::Tensor x = s_->forwardBlock(d, all.data(), T, pos, attention, false);

    // The LM head on the rows appendBranches would read (the trunk's last token, every branch
    // token): a group with few enough rows for the decode kernels alone, as there; the others in
    // one product.
    std::vector<int64_t> sharedRows;
    std::vector<std::pair<size_t, int64_t>> sharedAt;  // (index in pass, first row in the shared product)
    auto rowsOf = [&](const BlockAttention::Group& span) {
        std::vector<int64_t> rows;
        for (int i = span.trunk - 1; i < span.size; ++i) rows.push_back(span.start + i);
        return rows;
    };
    const size_t V = size_t(c.vocabSize);
    auto deliver = [&](const BlockAttention::Group& span, const float* p) {
        BranchGroupLogits& o = out[size_t(span.index)];
        o.trunkLast.assign(p, p + V);
        const BranchGroup& bg = groups[size_t(span.index)];
        o.branches.assign(bg.branches.size(), {});
        for (size_t b = 0, row = 1; b < bg.branches.size(); row += bg.branches[b].size(), ++b)
            o.branches[b].assign(p + V * row, p + V * (row + bg.branches[b].size()));
    };
    for (size_t i = 0; i < attention.groups.size(); ++i) {
        const std::vector<int64_t> rows = rowsOf(attention.groups[i]);
        if (int(rows.size()) <= kWeightKernelMaxBatch) {
            deliver(attention.groups[i], headLogits(d, x, rows).data_ptr<float>());
        } else {
            sharedAt.emplace_back(i, int64_t(sharedRows.size()));
            sharedRows.insert(sharedRows.end(), rows.begin(), rows.end());
        }
    }
    if (sharedRows.empty()) return;
    const torch::Tensor logits = headLogits(d, x, sharedRows);
    for (const auto& [i, row] : sharedAt) deliver(attention.groups[i], logits.data_ptr<float>() + size_t(row) * V);
}

void InferenceSession::resumeGroup(int g)
{
    if (s_->stashLength < 0 || s_->length != s_->stashLength || g < 0 || size_t(g) >= s_->stashKeys.size())
        throw Error("no branch group " + std::to_string(g) + " to resume after a cache of " + std::to_string(s_->length) +
                    " tokens");
    const LlamaRuntime::Impl& d = runtime_->impl();
    c10::InferenceMode guard;
    const std::vector<int32_t>& trunk = s_->stashTokens[size_t(g)];
    const int NT = int(trunk.size());
    s_->reserve(d, s_->length + NT);
    for (size_t l = 0; l < d.layers.size(); ++l) {
        s_->keys[l].narrow(1, s_->length, NT).copy_(s_->stashKeys[size_t(g)][l]);
        s_->values[l].narrow(1, s_->length, NT).copy_(s_->stashValues[size_t(g)][l]);
    }
    s_->length += NT;
    s_->tokens.insert(s_->tokens.end(), trunk.begin(), trunk.end());
}

}  // namespace kvscope
