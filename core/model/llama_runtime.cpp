// libtorch implementation of llama_runtime.h. The only translation unit that includes torch
// (each one costs ~20 s to compile); keep it that way.
#include "model/llama_runtime.h"

#include "common/error.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <thread>

namespace kvscope {

namespace {

namespace F = torch::nn::functional;

torch::ScalarType scalarType(DType t)
{
    switch (t) {
    case DType::F16: return torch::kFloat16;
    case DType::BF16: return torch::kBFloat16;
    case DType::F32: return torch::kFloat32;
    }
    return torch::kFloat32;
}

// Moves a host tensor into torch without copying: the vector's buffer is handed over and freed
// by torch's deleter.
torch::Tensor adopt(HostTensor&& h)
{
    auto* owned = new std::vector<float>(std::move(h.data));
    return torch::from_blob(owned->data(), h.shape, [owned](void*) { delete owned; },
                            torch::TensorOptions().dtype(torch::kFloat32));
}

// A weight matrix (out, in): either expanded (`dense`, in the compute dtype) or packed in the
// file's ggml blocks (`packed`) and expanded tile by tile each time the forward uses it.
struct Weight {
    torch::Tensor dense;
    std::shared_ptr<const HostTensor> packed;
    int64_t rows = 0, cols = 0;
};

// Rows [r0, r0 + n) of a packed weight as float32 into out (n x cols), over torch's threads.
void expandRows(const HostTensor& t, int64_t r0, int64_t n, float* out)
{
    const int64_t cols = t.shape[1];
    at::parallel_for(0, n, 16, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) t.readRow(r0 + r, out + r * cols);
    });
}

// Values of one expanded tile: 4 MB of fp32, small enough to stay in cache between its
// expansion and its matmul.
constexpr int64_t kTileValues = int64_t(1) << 20;

struct Layer {
    torch::Tensor inNorm, postNorm;
    torch::Tensor qNorm, kNorm;             // qkNorm only (per-head RMSNorm weights, head_dim)
    torch::Tensor preFfnNorm, postFfnNorm;  // sandwichNorm only (Gemma)
    Weight wq, wk, wv, wo;
    torch::Tensor bq, bk, bv;  // undefined without q/k/v biases
    Weight wGate, wUp, wDown;
    bool sliding = false;  // attends within the config's sliding window, with the local RoPE base
};

// Inverse RoPE frequencies of pair i (i < head_dim / 2) for base `theta`, with the config's
// scaling applied when `scaled` (global layers; Gemma 3's local layers are never scaled).
torch::Tensor ropeInvFreq(const ModelConfig& c, double theta, bool scaled)
{
    const int half = c.headDim / 2;
    std::vector<float> f(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
        // As Hugging Face computes it: 1 / theta^(2i / d) in float32.
        f[size_t(i)] = 1.0f / std::pow(float(theta), float(2 * i) / float(c.headDim));
    }
    if (!scaled) return torch::tensor(f);
    const RopeScaling& r = c.rope;
    if (r.type == "linear") {
        for (float& v : f) v = float(v / r.factor);
    } else if (r.type == "llama3") {
        // Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
        const double oldCtx = r.originalMaxPositionEmbeddings;
        const double lowWavelen = oldCtx / r.lowFreqFactor, highWavelen = oldCtx / r.highFreqFactor;
        for (float& v : f) {
            const double wavelen = 2.0 * M_PI / v;
            if (wavelen < highWavelen) continue;
            if (wavelen > lowWavelen) {
                v = float(v / r.factor);
            } else {
                const double smooth = (oldCtx / wavelen - r.lowFreqFactor) / (r.highFreqFactor - r.lowFreqFactor);
                v = float((1.0 - smooth) * v / r.factor + smooth * v);
            }
        }
    } else if (!r.type.empty() && r.type != "default") {
        throw Error("RoPE scaling '" + r.type + "' is not supported (supported: none, linear, llama3)");
    }
    return torch::tensor(f);
}

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

torch::Tensor geluTanh(const torch::Tensor& x) { return F::gelu(x, F::GELUFuncOptions().approximate("tanh")); }

}  // namespace

struct LlamaRuntime::Impl {
    LlamaSpec spec;
    RuntimeOptions options;
    std::string fingerprint;
    Weight embed;   // (vocab, hidden); expanded: fp32, for the lookup
    Weight lmHead;  // (vocab, hidden); the same packed rows as embed when tied
    torch::Tensor norm;
    torch::Tensor invFreq;       // (head_dim / 2), global layers
    torch::Tensor invFreqLocal;  // sliding layers (Gemma 3's own base); = invFreq otherwise
    std::vector<Layer> layers;
    torch::ScalarType compute = torch::kFloat32;
    torch::ScalarType kvType = torch::kFloat16;
    bool geglu = false;  // GeGLU (Gemma) instead of SwiGLU
    bool packedWeights = false;  // some matrices are held in their stored ggml blocks

    torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {}) const
    {
        if (compute == torch::kFloat32) return torch::linear(x, w, b);
        torch::Tensor y = torch::linear(x.to(compute), w, b.defined() ? b.to(compute) : b);
        return y.to(torch::kFloat32);
    }

    // x (T, in) times w^T (+ b): a packed weight is expanded kTileValues at a time into one
    // scratch tile, so memory holds the stored blocks plus one tile, never the fp32 matrix.
    torch::Tensor linear(const torch::Tensor& x, const Weight& w, const torch::Tensor& b = {}) const
    {
        if (!w.packed) return linear(x, w.dense, b);
        const int64_t N = w.rows, K = w.cols, T = x.size(0);
        const int64_t tile = std::max<int64_t>(1, std::min<int64_t>(N, kTileValues / K));
        const torch::Tensor xc = compute == torch::kFloat32 ? x.contiguous() : x.to(compute).contiguous();
        torch::Tensor scratch = torch::empty({tile, K});
        torch::Tensor out = torch::empty({T, N});
        for (int64_t n0 = 0; n0 < N; n0 += tile) {
            const int64_t n = std::min(tile, N - n0);
            expandRows(*w.packed, n0, n, scratch.data_ptr<float>());
            torch::Tensor wt = scratch.narrow(0, 0, n);
            if (compute != torch::kFloat32) wt = wt.to(compute);
            if (n == N) {
                out = torch::mm(xc, wt.t());
                if (compute != torch::kFloat32) out = out.to(torch::kFloat32);
            } else {
                out.narrow(1, n0, n).copy_(torch::mm(xc, wt.t()));
            }
        }
        if (b.defined()) out.add_(b);
        return out;
    }

    // The whole weight as float32 (out, in).
    torch::Tensor expanded(const Weight& w) const
    {
        if (!w.packed) return w.dense.to(torch::kFloat32);
        torch::Tensor t = torch::empty({w.rows, w.cols});
        expandRows(*w.packed, 0, w.rows, t.data_ptr<float>());
        return t;
    }

    // Embedding rows of `ids` (T) as float32 (T, hidden): a packed table expands only those rows.
    torch::Tensor embedRows(const torch::Tensor& ids) const
    {
        if (!embed.packed) return embed.dense.index_select(0, ids);
        const int64_t T = ids.size(0);
        torch::Tensor x = torch::empty({T, embed.cols});
        const int64_t* id = ids.data_ptr<int64_t>();
        for (int64_t i = 0; i < T; ++i) embed.packed->readRow(id[i], x.data_ptr<float>() + i * embed.cols);
        return x;
    }
};

LlamaRuntime::LlamaRuntime(LlamaWeights weights, const RuntimeOptions& options) : d_(std::make_unique<Impl>())
{
    Impl& d = *d_;
    d.options = options;
    if (options.compute != DType::F32 && options.compute != DType::BF16)
        throw Error("compute dtype must be float32 or bfloat16");
    if (options.prefillBlock < 1) throw Error("prefill block must be at least 1 token");
    if (options.keyBlock < 1) throw Error("key block must be at least 1 token");
    if (options.queryBlock < 1) throw Error("query block must be at least 1 token");
    d.compute = scalarType(options.compute);
    d.kvType = scalarType(options.kvDtype);
    d.fingerprint = weightsFingerprint(weights);
    d.spec = weights.spec;
    const ModelConfig& cfg = d.spec.config;
    d.invFreq = ropeInvFreq(cfg, cfg.ropeTheta, true);
    d.invFreqLocal = cfg.ropeLocalTheta > 0 ? ropeInvFreq(cfg, cfg.ropeLocalTheta, false) : d.invFreq;
    d.geglu = cfg.hiddenAct == "gelu_pytorch_tanh";
    if (cfg.hiddenAct != "silu" && !d.geglu)
        throw Error("activation '" + cfg.hiddenAct + "' is not supported (supported: silu, gelu_pytorch_tanh)");

    const int threads = options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    torch::set_num_threads(threads);

    auto take = [&](const std::string& name) {
        auto it = weights.tensors.find(name);
        KVSCOPE_ASSERT(it != weights.tensors.end());  // validateLlamaWeights checked
        torch::Tensor t = adopt(std::move(it->second));
        weights.tensors.erase(it);
        return t;
    };
    uint64_t packedValues = 0;
    for (const auto& [name, t] : weights.tensors)
        if (t.isPacked()) packedValues += t.elements();
    const bool pack = options.weights == RuntimeOptions::Weights::Packed ||
                      (options.weights == RuntimeOptions::Weights::Auto &&
                       packedValues * sizeof(float) > RuntimeOptions::kAutoExpandLimit);
    d.packedWeights = pack && packedValues > 0;
    // A matrix stays packed when `pack`; float32 ones are adopted as they are.
    auto matAs = [&](const std::string& name, torch::ScalarType dtype) {
        auto it = weights.tensors.find(name);
        KVSCOPE_ASSERT(it != weights.tensors.end());
        HostTensor& h = it->second;
        Weight w;
        w.rows = h.shape[0];
        w.cols = h.shape[1];
        if (h.isPacked() && pack) {
            w.packed = std::make_shared<const HostTensor>(std::move(h));
            weights.tensors.erase(it);
            return w;
        }
        if (h.isPacked()) {
            h.data = h.toFloat();
            h.packed = {};
        }
        torch::Tensor t = take(name);
        w.dense = dtype == torch::kFloat32 ? t : t.to(dtype);
        return w;
    };
    auto mat = [&](const std::string& name) { return matAs(name, d.compute); };
    const ModelConfig& c = d.spec.config;
    d.layers.resize(size_t(c.numLayers));
    for (int l = 0; l < c.numLayers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        Layer& L = d.layers[size_t(l)];
        L.inNorm = take(p + "input_layernorm.weight");
        L.postNorm = take(p + "post_attention_layernorm.weight");
        L.sliding = c.layerIsSliding(l);
        if (c.qkNorm) {
            L.qNorm = take(p + "self_attn.q_norm.weight");
            L.kNorm = take(p + "self_attn.k_norm.weight");
        }
        if (c.sandwichNorm) {
            L.preFfnNorm = take(p + "pre_feedforward_layernorm.weight");
            L.postFfnNorm = take(p + "post_feedforward_layernorm.weight");
        }
        L.wq = mat(p + "self_attn.q_proj.weight");
        L.wk = mat(p + "self_attn.k_proj.weight");
        L.wv = mat(p + "self_attn.v_proj.weight");
        L.wo = mat(p + "self_attn.o_proj.weight");
        if (d.spec.qkvBias) {
            L.bq = take(p + "self_attn.q_proj.bias");
            L.bk = take(p + "self_attn.k_proj.bias");
            L.bv = take(p + "self_attn.v_proj.bias");
        }
        L.wGate = mat(p + "mlp.gate_proj.weight");
        L.wUp = mat(p + "mlp.up_proj.weight");
        L.wDown = mat(p + "mlp.down_proj.weight");
    }
    d.norm = take("model.norm.weight");
    d.embed = matAs("model.embed_tokens.weight", torch::kFloat32);  // the lookup reads fp32 rows
    if (!d.spec.tiedEmbeddings)
        d.lmHead = mat("lm_head.weight");
    else if (d.embed.packed)
        d.lmHead = d.embed;
    else
        d.lmHead = Weight{d.compute == torch::kFloat32 ? d.embed.dense : d.embed.dense.to(d.compute), nullptr,
                          d.embed.rows, d.embed.cols};
}

LlamaRuntime::~LlamaRuntime() = default;

const LlamaSpec& LlamaRuntime::spec() const { return d_->spec; }
const RuntimeOptions& LlamaRuntime::options() const { return d_->options; }
const std::string& LlamaRuntime::fingerprint() const { return d_->fingerprint; }
bool LlamaRuntime::packedWeights() const { return d_->packedWeights; }

KvShape LlamaRuntime::kvShape(int tokens) const
{
    const ModelConfig& c = d_->spec.config;
    return KvShape{c.numLayers, c.numKvHeads, c.headDim, tokens};
}

std::string LlamaRuntime::describe() const
{
    return std::string("libtorch ") + TORCH_VERSION + ", " + std::to_string(torch::get_num_threads()) +
           " threads, " + dtypeName(d_->options.compute) + " compute, " + dtypeName(d_->options.kvDtype) + " KV" +
           (d_->packedWeights ? ", packed weights" : "");
}

// ---- session ---------------------------------------------------------------------------------

struct InferenceSession::State {
    std::vector<torch::Tensor> keys, values;  // per layer (kv_heads, capacity, head_dim), fp32
    int length = 0;
    int capacity = 0;
    std::vector<int32_t> tokens;
    // Codec statistics (see accumulateQuerySq): per layer (kv_heads, head_dim) sums of q^2, and
    // how many query positions they cover.
    std::vector<torch::Tensor> querySq;
    int64_t queryCount = 0;
    // Per layer (kv_heads, slots) sums over query heads and queries of the softmax probability each
    // cache slot received, and (slots) how many recorded queries saw each slot.
    std::vector<torch::Tensor> attnMass;
    torch::Tensor attnSeen;

    void reserve(const LlamaRuntime::Impl& d, int needed)
    {
        if (needed <= capacity) return;
        const ModelConfig& c = d.spec.config;
        const int cap = std::max(needed, std::max(64, capacity * 2));
        for (size_t l = 0; l < size_t(c.numLayers); ++l) {
            for (auto* cache : {&keys, &values}) {
                torch::Tensor fresh = torch::zeros({c.numKvHeads, cap, c.headDim});
                if (length > 0) fresh.narrow(1, 0, length).copy_((*cache)[l].narrow(1, 0, length));
                if (cache->size() <= l) cache->push_back(fresh);
                else (*cache)[l] = fresh;
            }
        }
        capacity = cap;
    }

    // One forward over T tokens written to cache slots [length, length + T): `pos` (T, 1) are
    // their RoPE positions, `mask` (T, length + T) says which slots each one sees. Returns the
    // final hidden states (T, hidden) before the last norm; length is left to the caller. With
    // recordQueries the queries' second moments are added to querySq (the caller counts them).
    // Without masks, attention is causal with each layer's sliding window, blocked over keys
    // (attend); with masks (T, length + T, additive), dense with maskLocal on sliding layers.
    torch::Tensor forwardBlock(const LlamaRuntime::Impl& d, const int32_t* tokens, int T, const torch::Tensor& pos,
                               const torch::Tensor& maskGlobal, const torch::Tensor& maskLocal, bool recordQueries);
};

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

namespace {

void checkTokens(const ModelConfig& c, const std::vector<int32_t>& tokens)
{
    for (int32_t t : tokens)
        if (t < 0 || t >= c.vocabSize)
            throw Error("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(c.vocabSize) + ")");
}

}  // namespace

torch::Tensor InferenceSession::State::forwardBlock(const LlamaRuntime::Impl& d, const int32_t* tokens, int T,
                                                   const torch::Tensor& pos, const torch::Tensor& maskGlobal,
                                                   const torch::Tensor& maskLocal, bool recordQueries)
{
    State* s_ = this;
    const ModelConfig& c = d.spec.config;
    const int H = c.numHeads, KH = c.numKvHeads, hd = c.headDim, groups = H / KH;
    const double scale = 1.0 / std::sqrt(c.queryPreAttnScalar > 0 ? c.queryPreAttnScalar : double(hd));
    const int P = s_->length;
    const int S = P + T;
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
        // The cache holds what a serving stack would store: K/V rounded to kvDtype.
        s_->keys[l].narrow(1, P, T).copy_(k.to(d.kvType));
        s_->values[l].narrow(1, P, T).copy_(v.to(d.kvType));
        torch::Tensor o;
        if (!maskGlobal.defined()) {
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
            o = attend(q, s_->keys[l], s_->values[l], P, L.sliding ? c.slidingWindow : 0, scale, c.attnSoftcap,
                       d.options.keyBlock, d.options.queryBlock, mass);
        } else {  // an explicit (T, S) mask: dense scores, for small T (branches)
            const torch::Tensor K = s_->keys[l].narrow(1, 0, S).unsqueeze(1);    // (KH, 1, S, hd)
            const torch::Tensor V = s_->values[l].narrow(1, 0, S).unsqueeze(1);  // (KH, 1, S, hd)
            const torch::Tensor qg = q.reshape({KH, groups, T, hd});
            torch::Tensor scores = torch::matmul(qg, K.transpose(-1, -2)) * scale;  // (KH, g, T, S)
            if (c.attnSoftcap > 0) scores = torch::tanh(scores / c.attnSoftcap) * c.attnSoftcap;
            scores = scores + (L.sliding ? maskLocal : maskGlobal);
            o = torch::matmul(torch::softmax(scores, -1), V).reshape({H, T, hd});
        }
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
        const torch::Tensor x = s_->forwardBlock(d, tokens.data() + start, T, pos, {}, {}, true);
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

void InferenceSession::appendBranches(const std::vector<int32_t>& trunk, const std::vector<std::vector<int32_t>>& branches,
                                      std::vector<float>* trunkLastLogits, std::vector<std::vector<float>>* branchLogits)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    if (trunk.empty()) throw Error("no tokens to run");
    std::vector<int32_t> all = trunk;
    std::vector<int> branchStart;
    for (const auto& b : branches) {
        branchStart.push_back(int(all.size()));
        all.insert(all.end(), b.begin(), b.end());
    }
    checkTokens(c, all);
    const int P0 = s_->length, NT = int(trunk.size()), T = int(all.size());
    if (size_t(P0) + size_t(T) > size_t(KvLimits::maxTokens))
        throw Error("context longer than " + std::to_string(KvLimits::maxTokens) + " tokens");

    c10::InferenceMode guard;
    s_->reserve(d, P0 + T);
    // Positions: the trunk continues the cache; every branch starts right after the trunk.
    std::vector<float> posv(static_cast<size_t>(T));
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
    const torch::Tensor mask = torch::zeros({T, P0 + T}).masked_fill(allowed.logical_not(), -INFINITY);
    torch::Tensor maskLocal = mask;
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
    const torch::Tensor pos = torch::from_blob(posv.data(), {T, 1}, torch::kFloat32).clone();
    const torch::Tensor x = s_->forwardBlock(d, all.data(), T, pos, mask, maskLocal, false);
    // Keep the trunk; the branches' slots are scratch, overwritten by the next append.
    s_->length = P0 + NT;
    s_->tokens.insert(s_->tokens.end(), trunk.begin(), trunk.end());
    std::vector<int64_t> rowsWanted = {NT - 1};
    for (int i = NT; i < T; ++i) rowsWanted.push_back(i);
    const torch::Tensor sel = torch::from_blob(rowsWanted.data(), {int64_t(rowsWanted.size())}, torch::kLong).clone();
    const torch::Tensor logits = d.linear(rmsNorm(x.index_select(0, sel), d.norm, c.rmsNormEps), d.lmHead).contiguous();
    const float* p = logits.data_ptr<float>();
    const size_t V = size_t(c.vocabSize);
    if (trunkLastLogits) trunkLastLogits->assign(p, p + V);
    if (branchLogits) {
        branchLogits->assign(branches.size(), {});
        for (size_t b = 0; b < branches.size(); ++b) {
            const float* first = p + V * size_t(1 + branchStart[b] - NT);
            (*branchLogits)[b].assign(first, first + V * branches[b].size());
        }
    }
}

}  // namespace kvscope
