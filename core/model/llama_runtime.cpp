// The runtime of llama_runtime.h on libtorch: the weights as torch tensors (expanded or kept in
// their ggml blocks), RoPE frequencies, options. The session and the forward pass are in
// llama_session.cpp; both include torch through llama_runtime_impl.h (each costs ~20 s to compile).
#include "model/llama_runtime_impl.h"

#include "common/error.h"

#include <cmath>
#include <thread>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace kvscope {

using runtime_detail::Layer;
using runtime_detail::Weight;

namespace {

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

}  // namespace

LlamaRuntime::LlamaRuntime(LlamaWeights weights, const RuntimeOptions& options) : d_(std::make_unique<Impl>())
{
    Impl& d = *d_;
    d.options = options;
#ifdef __GLIBC__
    // A forward pass allocates and frees its activations op by op. glibc maps every block above its
    // mmap threshold afresh (128 KiB until a large free raises it) and returns freed heap above its
    // trim threshold, both paid again in page faults: fixed here, prefill speed no longer depends on
    // which buffers the loader happened to free (docs/models.md, "Decode on the stored blocks").
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
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
    d.kernels = options.decodeKernels && d.compute == torch::kFloat32;
    d.kernelPath = simdPath();
    // The kernels' view of a packed matrix they can multiply; none for other types.
    auto withBlocks = [&](Weight& w) {
        if (!d.kernels || !weightKernelSupports(w.packed->ggmlType)) return;
        w.blocks = PackedMatrix{w.packed->packed.data(), w.packed->ggmlType, w.rows, w.cols, w.packed->rowBytes()};
    };
    // A matrix stays packed when `pack`; an expanded one keeps its blocks too when a kernel can
    // use them; float32 ones are adopted as they are.
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
            withBlocks(w);
            return w;
        }
        if (h.isPacked()) {
            auto blocks = std::make_shared<HostTensor>(std::move(h));
            h = HostTensor{};
            h.shape = blocks->shape;
            h.data = blocks->toFloat();
            if (d.kernels && weightKernelSupports(blocks->ggmlType)) {
                w.packed = blocks;
                withBlocks(w);
            }
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
    else if (!d.embed.dense.defined())
        d.lmHead = d.embed;
    else
        d.lmHead = Weight{d.compute == torch::kFloat32 ? d.embed.dense : d.embed.dense.to(d.compute), d.embed.packed,
                          d.embed.blocks, d.embed.rows, d.embed.cols};
}

LlamaRuntime::~LlamaRuntime() = default;

const LlamaSpec& LlamaRuntime::spec() const { return d_->spec; }
const RuntimeOptions& LlamaRuntime::options() const { return d_->options; }
const std::string& LlamaRuntime::fingerprint() const { return d_->fingerprint; }
bool LlamaRuntime::packedWeights() const { return d_->packedWeights; }
const char* LlamaRuntime::decodeKernels() const { return d_->kernels ? simdPathName(d_->kernelPath) : "off"; }

KvShape LlamaRuntime::kvShape(int tokens) const
{
    const ModelConfig& c = d_->spec.config;
    return KvShape{c.numLayers, c.numKvHeads, c.headDim, tokens};
}

std::string LlamaRuntime::describe() const
{
    return std::string("libtorch ") + TORCH_VERSION + ", " + std::to_string(torch::get_num_threads()) +
           " threads, " + dtypeName(d_->options.compute) + " compute, " + dtypeName(d_->options.kvDtype) + " KV" +
           (d_->packedWeights ? ", packed weights" : "") +
           (d_->kernels ? std::string(", ") + simdPathName(d_->kernelPath) + " decode kernels" : "");
}

}  // namespace kvscope
