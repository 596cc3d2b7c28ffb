// Loaders that bring the three checkpoint formats onto the Hugging Face names and layouts
// (see llama_weights.h).
#include "modelio/llama_weights.h"

#include "common/error.h"
#include "modelio/ggml_quants.h"
#include "modelio/gguf.h"
#include "modelio/llama2c.h"
#include "modelio/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace kvscope {

uint64_t HostTensor::elements() const
{
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
}

uint64_t HostTensor::rowBytes() const
{
    return shape.size() == 2 ? ggmlRowBytes(ggmlType, uint64_t(shape[1])) : 0;
}

void HostTensor::readRow(int64_t r, float* out) const
{
    const int64_t cols = shape.size() == 2 ? shape[1] : int64_t(elements());
    KVSCOPE_ASSERT(r >= 0 && (shape.size() == 2 ? r < shape[0] : r == 0));
    if (!isPacked()) {
        std::memcpy(out, data.data() + size_t(r) * size_t(cols), size_t(cols) * sizeof(float));
        return;
    }
    const uint64_t rb = rowBytes();
    dequantizeGgml(ggmlType, packed.data() + uint64_t(r) * rb, rb, uint64_t(cols), out);
}

std::vector<float> HostTensor::toFloat() const
{
    if (!isPacked()) return data;
    std::vector<float> out(static_cast<size_t>(elements()));
    for (int64_t r = 0; r < shape[0]; ++r) readRow(r, out.data() + size_t(r) * size_t(shape[1]));
    return out;
}

namespace {

std::string layerName(int i, const char* rest)
{
    return "model.layers." + std::to_string(i) + "." + rest;
}

std::string baseName(const std::string& path)
{
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.find_last_of('/');
    std::string b = slash == std::string::npos ? p : p.substr(slash + 1);
    const size_t dot = b.find_last_of('.');
    if (dot != std::string::npos && dot > 0 && b.find('.') == dot) b = b.substr(0, dot);
    return b;
}

bool isDirectory(const std::string& path)
{
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool endsWith(const std::string& s, const std::string& suffix)
{
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "Q4_1 x 211, F32 x 61" from a count per type name.
std::string describeTypes(const std::map<std::string, int>& counts)
{
    std::string s;
    for (const auto& [name, n] : counts) s += (s.empty() ? "" : ", ") + name + " x " + std::to_string(n);
    return s;
}

void finish(LlamaWeights& w)
{
    w.spec.tiedEmbeddings = w.tensors.count("lm_head.weight") == 0;
    w.spec.qkvBias = w.tensors.count(layerName(0, "self_attn.q_proj.bias")) != 0;
    w.spec.parameters = 0;
    w.spec.weightBytes = 0;
    for (const auto& [name, t] : w.tensors) {
        w.spec.parameters += t.elements();
        w.spec.weightBytes += t.isPacked() ? t.packed.size() : t.data.size() * sizeof(float);
    }
    validateLlamaWeights(w);
}

// Splits a llama2.c (L, rows, cols) block into per-layer tensors.
void putLayers(LlamaWeights& w, const std::vector<float>& all, int layers, int64_t rows, int64_t cols,
               const char* name)
{
    const size_t per = size_t(rows) * size_t(cols);
    for (int l = 0; l < layers; ++l) {
        HostTensor t;
        t.shape = cols == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols};
        t.data.assign(all.begin() + std::ptrdiff_t(per * size_t(l)), all.begin() + std::ptrdiff_t(per * size_t(l + 1)));
        w.tensors[layerName(l, name)] = std::move(t);
    }
}

// Splits `fused` (rows, cols) into consecutive row blocks named `names` with `rows` rows each;
// throws when the row counts do not add up.
void splitRows(LlamaWeights& w, const std::string& fusedName, HostTensor fused,
               const std::vector<std::pair<std::string, int64_t>>& parts)
{
    int64_t total = 0;
    for (const auto& p : parts) total += p.second;
    if (fused.shape.size() != 2 || fused.shape[0] != total)
        throw inputError(w.spec.sourcePath, "tensor '" + fusedName + "'",
                         "fused projection has " + std::to_string(fused.shape.empty() ? 0 : fused.shape[0]) +
                             " rows, expected " + std::to_string(total));
    const int64_t cols = fused.shape[1];
    const int64_t rb = int64_t(fused.rowBytes());  // packed: bytes per row
    int64_t row = 0;
    for (const auto& [name, rows] : parts) {
        HostTensor t;
        t.shape = {rows, cols};
        if (fused.isPacked()) {
            t.ggmlType = fused.ggmlType;
            t.packed.assign(fused.packed.begin() + std::ptrdiff_t(row * rb), fused.packed.begin() + std::ptrdiff_t((row + rows) * rb));
        } else {
            t.data.assign(fused.data.begin() + std::ptrdiff_t(row * cols), fused.data.begin() + std::ptrdiff_t((row + rows) * cols));
        }
        w.tensors[name] = std::move(t);
        row += rows;
    }
}

// Phi-3 stores q/k/v and gate/up fused; this splits them under the names of the other models.
void splitFused(LlamaWeights& w, const std::string& name, HostTensor&& t)
{
    const ModelConfig& c = w.spec.config;
    const std::string prefix = name.substr(0, name.find(".self_attn.") != std::string::npos ? name.find(".self_attn.") + 1
                                                                                        : name.find(".mlp.") + 1);
    if (name.find("qkv_proj.weight") != std::string::npos) {
        const int64_t q = int64_t(c.numHeads) * c.headDim, kv = int64_t(c.numKvHeads) * c.headDim;
        splitRows(w, name, std::move(t),
                  {{prefix + "self_attn.q_proj.weight", q}, {prefix + "self_attn.k_proj.weight", kv},
                   {prefix + "self_attn.v_proj.weight", kv}});
    } else {
        splitRows(w, name, std::move(t),
                  {{prefix + "mlp.gate_proj.weight", c.intermediateSize}, {prefix + "mlp.up_proj.weight", c.intermediateSize}});
    }
}

// permuteInterleavedToRotateHalf on whole packed rows (a row's blocks move together).
void permutePackedRows(HostTensor& t, int headDim)
{
    const size_t rb = size_t(t.rowBytes());
    const int heads = int(t.shape[0] / headDim);
    std::vector<uint8_t> tmp(rb * size_t(headDim));
    for (int h = 0; h < heads; ++h) {
        uint8_t* head = t.packed.data() + size_t(h) * size_t(headDim) * rb;
        for (int p = 0; p < headDim; ++p)
            std::memcpy(tmp.data() + size_t(p) * rb, head + size_t(rotateHalfSourceRow(p, headDim)) * rb, rb);
        std::memcpy(head, tmp.data(), tmp.size());
    }
}

bool isFusedName(const std::string& name)
{
    return endsWith(name, ".self_attn.qkv_proj.weight") || endsWith(name, ".mlp.gate_up_proj.weight");
}

}  // namespace

void validateLlamaWeights(const LlamaWeights& w)
{
    const ModelConfig& c = w.spec.config;
    const std::string& path = w.spec.sourcePath;
    const int64_t hidden = c.hiddenSize, inter = c.intermediateSize, vocab = c.vocabSize;
    const int64_t qDim = int64_t(c.numHeads) * c.headDim, kvDim = int64_t(c.numKvHeads) * c.headDim;
    if (c.numHeads <= 0 || c.numKvHeads <= 0 || c.numHeads % c.numKvHeads != 0)
        throw inputError(path, "config", "num_key_value_heads " + std::to_string(c.numKvHeads) +
                                             " does not divide num_attention_heads " + std::to_string(c.numHeads));
    if (c.headDim <= 0 || c.headDim % 2 != 0)
        throw inputError(path, "config", "head_dim " + std::to_string(c.headDim) + " is not a positive even number");

    std::map<std::string, std::vector<int64_t>> expected;
    expected["model.embed_tokens.weight"] = {vocab, hidden};
    expected["model.norm.weight"] = {hidden};
    if (!w.spec.tiedEmbeddings) expected["lm_head.weight"] = {vocab, hidden};
    for (int l = 0; l < c.numLayers; ++l) {
        expected[layerName(l, "input_layernorm.weight")] = {hidden};
        expected[layerName(l, "post_attention_layernorm.weight")] = {hidden};
        expected[layerName(l, "self_attn.q_proj.weight")] = {qDim, hidden};
        expected[layerName(l, "self_attn.k_proj.weight")] = {kvDim, hidden};
        expected[layerName(l, "self_attn.v_proj.weight")] = {kvDim, hidden};
        expected[layerName(l, "self_attn.o_proj.weight")] = {hidden, qDim};
        expected[layerName(l, "mlp.gate_proj.weight")] = {inter, hidden};
        expected[layerName(l, "mlp.up_proj.weight")] = {inter, hidden};
        expected[layerName(l, "mlp.down_proj.weight")] = {hidden, inter};
        if (c.qkNorm) {
            expected[layerName(l, "self_attn.q_norm.weight")] = {int64_t(c.headDim)};
            expected[layerName(l, "self_attn.k_norm.weight")] = {int64_t(c.headDim)};
        }
        if (c.sandwichNorm) {
            expected[layerName(l, "pre_feedforward_layernorm.weight")] = {hidden};
            expected[layerName(l, "post_feedforward_layernorm.weight")] = {hidden};
        }
        if (w.spec.qkvBias) {
            expected[layerName(l, "self_attn.q_proj.bias")] = {qDim};
            expected[layerName(l, "self_attn.k_proj.bias")] = {kvDim};
            expected[layerName(l, "self_attn.v_proj.bias")] = {kvDim};
        }
    }
    auto shapeText = [](const std::vector<int64_t>& s) {
        std::string t = "(";
        for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
        return t + (s.size() == 1 ? ",)" : ")");
    };
    for (const auto& [name, shape] : expected) {
        const auto it = w.tensors.find(name);
        if (it == w.tensors.end()) throw inputError(path, "tensor '" + name + "'", "missing");
        if (it->second.shape != shape)
            throw inputError(path, "tensor '" + name + "'",
                             "shape " + shapeText(it->second.shape) + ", expected " + shapeText(shape));
        const HostTensor& t = it->second;
        KVSCOPE_ASSERT(t.isPacked() ? t.shape.size() == 2 && t.packed.size() == size_t(shape[0]) * t.rowBytes()
                                    : t.data.size() == t.elements());
    }
    for (const auto& [name, t] : w.tensors)
        if (!expected.count(name))
            throw inputError(path, "tensor '" + name + "'",
                             "unexpected (an architecture feature kvscope does not run)");
}

LlamaWeights loadLlama2cWeights(const std::string& path)
{
    Llama2cModel m = loadLlama2c(path, /*permuteRope=*/true);
    const Llama2cConfig& lc = m.config;
    LlamaWeights w;
    w.spec.name = baseName(path);
    w.spec.format = "llama2.c";
    w.spec.sourcePath = path;
    ModelConfig& c = w.spec.config;
    c.architecture = "LlamaForCausalLM";
    c.modelType = "llama";
    c.hiddenSize = lc.dim;
    c.intermediateSize = lc.hiddenDim;
    c.numLayers = lc.nLayers;
    c.numHeads = lc.nHeads;
    c.numKvHeads = lc.nKvHeads;
    c.headDim = lc.headSize();
    c.vocabSize = lc.vocabSize;
    c.rmsNormEps = 1e-5;  // run.c's constant
    c.ropeTheta = 10000.0;
    c.maxPositionEmbeddings = lc.seqLen;
    c.tieWordEmbeddings = lc.sharedClassifier;
    c.bosTokenId = 1;
    c.eosTokenId = 2;
    w.spec.weightTypes = "F32 (llama2.c v" + std::to_string(lc.version) + ")";

    const int L = lc.nLayers;
    const int64_t D = lc.dim, H = lc.hiddenDim;
    w.tensors["model.embed_tokens.weight"] = {{lc.vocabSize, D}, std::move(m.tokenEmbedding), {}, 0};
    putLayers(w, m.rmsAtt, L, D, 1, "input_layernorm.weight");
    putLayers(w, m.rmsFfn, L, D, 1, "post_attention_layernorm.weight");
    putLayers(w, m.wq, L, lc.qDim(), D, "self_attn.q_proj.weight");
    putLayers(w, m.wk, L, lc.kvDim(), D, "self_attn.k_proj.weight");
    putLayers(w, m.wv, L, lc.kvDim(), D, "self_attn.v_proj.weight");
    putLayers(w, m.wo, L, D, lc.qDim(), "self_attn.o_proj.weight");
    putLayers(w, m.w1, L, H, D, "mlp.gate_proj.weight");
    putLayers(w, m.w3, L, H, D, "mlp.up_proj.weight");
    putLayers(w, m.w2, L, D, H, "mlp.down_proj.weight");
    w.tensors["model.norm.weight"] = {{D}, std::move(m.rmsFinal), {}, 0};
    if (!lc.sharedClassifier) w.tensors["lm_head.weight"] = {{lc.vocabSize, D}, std::move(m.wcls), {}, 0};
    finish(w);
    return w;
}

LlamaWeights loadHfWeights(const std::string& folder)
{
    LlamaWeights w;
    w.spec.name = baseName(folder);
    w.spec.format = "safetensors";
    w.spec.sourcePath = folder;
    w.spec.config = loadHfConfig(folder + "/config.json");
    std::map<std::string, int> types;
    for (const std::string& shard : safetensorsShards(folder)) {
        const SafetensorsFile f = SafetensorsFile::open(folder + "/" + shard);
        for (const SafetensorsTensor& t : f.tensors()) {
            // Older checkpoints carry the RoPE frequencies as a buffer: derived, not a weight.
            if (endsWith(t.name, ".rotary_emb.inv_freq")) continue;
            if (w.tensors.count(t.name))
                throw inputError(f.path(), "tensor '" + t.name + "'", "present in two shards");
            HostTensor h;
            h.shape = t.shape;
            h.data = f.readF32(t);
            ++types[t.dtype];
            if (w.spec.config.normPlusOne && endsWith(t.name, "norm.weight"))
                for (float& v : h.data) v += 1.0f;
            if (w.spec.config.modelType == "phi3" && isFusedName(t.name)) {
                splitFused(w, t.name, std::move(h));
                continue;
            }
            w.tensors[t.name] = std::move(h);
        }
    }
    w.spec.weightTypes = describeTypes(types);
    finish(w);
    return w;
}

namespace {

// The model configuration from a GGUF file's metadata (`arch`: general.architecture).
ModelConfig ggufConfig(const GgufFile& f, const std::string& path, const std::string& arch)
{
    ModelConfig c;
    if (arch == "llama") {
        c.architecture = "LlamaForCausalLM";
        c.modelType = "llama";
    } else if (arch == "qwen2" || arch == "qwen3" || arch == "phi3" || arch == "gemma3") {
        // NEOX-style RoPE in llama.cpp: rows kept in the Hugging Face order.
        static const std::map<std::string, std::pair<const char*, const char*>> kArch = {
            {"qwen2", {"Qwen2ForCausalLM", "qwen2"}},
            {"qwen3", {"Qwen3ForCausalLM", "qwen3"}},
            {"phi3", {"Phi3ForCausalLM", "phi3"}},
            {"gemma3", {"Gemma3ForCausalLM", "gemma3_text"}},
        };
        c.architecture = kArch.at(arch).first;
        c.modelType = kArch.at(arch).second;
    } else {
        throw inputError(path, "metadata 'general.architecture'",
                         "unsupported architecture '" + arch + "' (supported: llama, qwen2, qwen3, phi3, gemma3)");
    }
    const std::string p = arch + ".";
    auto intKey = [&](const std::string& key, int64_t lo, int64_t hi) {
        const int64_t v = f.getInt(p + key);
        if (v < lo || v > hi)
            throw inputError(path, "metadata '" + p + key + "'", std::to_string(v) + " is out of range");
        return int(v);
    };
    c.hiddenSize = intKey("embedding_length", 1, 1 << 20);
    c.intermediateSize = intKey("feed_forward_length", 1, 1 << 22);
    c.numLayers = intKey("block_count", 1, 4096);
    c.numHeads = intKey("attention.head_count", 1, 4096);
    c.numKvHeads = f.has(p + "attention.head_count_kv") ? intKey("attention.head_count_kv", 1, 4096) : c.numHeads;
    c.headDim = f.has(p + "attention.key_length") ? intKey("attention.key_length", 2, 1 << 16)
                                                   : c.hiddenSize / c.numHeads;
    c.rmsNormEps = f.getFloat(p + "attention.layer_norm_rms_epsilon");
    c.ropeTheta = f.has(p + "rope.freq_base") ? f.getFloat(p + "rope.freq_base") : 10000.0;
    c.maxPositionEmbeddings = f.has(p + "context_length") ? intKey("context_length", 1, 1 << 30) : 2048;
    if (f.has(p + "rope.scaling.type")) {
        const std::string t = f.getString(p + "rope.scaling.type");
        if (t == "linear") {
            c.rope.type = "linear";
            c.rope.factor = f.getFloat(p + "rope.scaling.factor");
        } else if (t != "none") {
            throw inputError(path, "metadata '" + p + "rope.scaling.type'", "unsupported RoPE scaling '" + t + "'");
        }
    }
    if (f.find("rope_freqs.weight"))
        throw inputError(path, "tensor 'rope_freqs.weight'",
                         "per-frequency RoPE factors (Llama 3.1 GGUF) are not supported yet; use the Hugging Face folder");
    if (f.has(p + "attention.key_length") && f.has(p + "attention.value_length") &&
        f.getInt(p + "attention.value_length") != c.headDim)
        throw inputError(path, "metadata '" + p + "attention.value_length'", "differs from key_length");
    if (f.has("tokenizer.ggml.bos_token_id")) c.bosTokenId = int(f.getInt("tokenizer.ggml.bos_token_id"));
    if (f.has("tokenizer.ggml.eos_token_id")) c.eosTokenId = int(f.getInt("tokenizer.ggml.eos_token_id"));
    const GgufTensorInfo* embd = f.find("token_embd.weight");
    if (!embd || embd->dims.size() != 2) throw inputError(path, "tensor 'token_embd.weight'", "missing or not 2-D");
    c.vocabSize = int(embd->dims[1]);
    if (c.numHeads % c.numKvHeads != 0)
        throw inputError(path, "metadata '" + p + "attention.head_count_kv'", "does not divide head_count");
    c.tieWordEmbeddings = f.find("output.weight") == nullptr;
    if (f.has(p + "rope.dimension_count") && f.getInt(p + "rope.dimension_count") != c.headDim)
        throw inputError(path, "metadata '" + p + "rope.dimension_count'",
                         "partial rotary embeddings (" + std::to_string(f.getInt(p + "rope.dimension_count")) + " of " +
                             std::to_string(c.headDim) + " dims) are not supported");
    for (const char* longRope : {"rope_factors_long.weight", "rope_factors_short.weight"})
        if (f.find(longRope))
            throw inputError(path, std::string("tensor '") + longRope + "'",
                             "LongRoPE frequency factors (Phi-3 128k) are not supported");
    if (arch == "qwen3") c.qkNorm = true;
    if (arch == "phi3" && f.has(p + "attention.sliding_window"))
        c.slidingWindow = intKey("attention.sliding_window", 0, 1 << 30);
    if (arch == "gemma3") {
        // As llama.cpp runs Gemma 3: GeGLU, q/k and sandwich norms (their weights already hold the
        // 1 of Gemma's (1 + w)), embeddings scaled by sqrt(hidden), 5 sliding-window layers
        // (RoPE base 10000) then 1 global layer (rope.freq_base), scores scaled by
        // query_pre_attn_scalar^-1/2, which is head_dim except in the 27B model (hidden / heads).
        c.hiddenAct = "gelu_pytorch_tanh";
        c.qkNorm = true;
        c.sandwichNorm = true;
        c.embedScale = std::sqrt(double(c.hiddenSize));
        c.queryPreAttnScalar = c.numLayers == 62 ? double(c.hiddenSize / c.numHeads) : double(c.headDim);
        c.ropeLocalTheta = f.has(p + "rope.freq_base_swa") ? f.getFloat(p + "rope.freq_base_swa") : 10000.0;
        c.slidingWindow = intKey("attention.sliding_window", 1, 1 << 30);
        const int pattern = f.has(p + "attention.sliding_window_pattern")
                                ? intKey("attention.sliding_window_pattern", 1, 4096) : 6;
        c.slidingLayers.assign(size_t(c.numLayers), false);
        for (int l = 0; l < c.numLayers; ++l) c.slidingLayers[size_t(l)] = (l + 1) % pattern != 0;
        if (f.has(p + "attn_logit_softcapping")) c.attnSoftcap = f.getFloat(p + "attn_logit_softcapping");
        if (f.has(p + "final_logit_softcapping")) c.finalSoftcap = f.getFloat(p + "final_logit_softcapping");
    }
    return c;
}

// The Hugging Face name of a GGUF tensor; "" when kvscope does not know it.
std::string ggufHfName(const std::string& ggufName, bool gemma)
{
    // llama.cpp name -> Hugging Face name. ffn_norm is the norm before the MLP: Llama's
    // post_attention_layernorm, Gemma's pre_feedforward_layernorm (Gemma's post_attention_norm
    // is the norm on the attention output).
    const std::vector<std::pair<const char*, const char*>> kLayerNames = {
        {"attn_norm.weight", "input_layernorm.weight"},
        {"ffn_norm.weight", gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"},
        {"post_attention_norm.weight", "post_attention_layernorm.weight"},
        {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
        {"attn_q_norm.weight", "self_attn.q_norm.weight"},
        {"attn_k_norm.weight", "self_attn.k_norm.weight"},
        {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
        {"attn_q.bias", "self_attn.q_proj.bias"},
        {"attn_k.bias", "self_attn.k_proj.bias"},
        {"attn_v.bias", "self_attn.v_proj.bias"},
        {"attn_output.weight", "self_attn.o_proj.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},
        {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"},
    };
    if (ggufName == "token_embd.weight") return "model.embed_tokens.weight";
    if (ggufName == "output_norm.weight") return "model.norm.weight";
    if (ggufName == "output.weight") return "lm_head.weight";
    if (ggufName.rfind("blk.", 0) != 0) return "";
    const size_t dot = ggufName.find('.', 4);
    const std::string idx = dot == std::string::npos ? "" : ggufName.substr(4, dot - 4);
    const std::string rest = dot == std::string::npos ? "" : ggufName.substr(dot + 1);
    const bool digits = !idx.empty() && idx.size() < 6 &&
                        std::all_of(idx.begin(), idx.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits) return "";
    for (const auto& [from, to] : kLayerNames)
        if (rest == from) return layerName(std::stoi(idx), to);
    return "";
}

// One GGUF tensor in PyTorch order: a quantised matrix stays in its stored blocks (the runtime
// expands rows as it needs them), anything else becomes float32.
HostTensor readGgufTensor(const GgufFile& f, const GgufTensorInfo& t, const std::string& path)
{
    HostTensor h;
    for (auto it = t.dims.rbegin(); it != t.dims.rend(); ++it) h.shape.push_back(int64_t(*it));
    if (h.shape.size() == 2 && t.type != GgmlF32 && canDequantize(t.type)) {
        // The block count is checked here, as readTensorF32 would (a truncated tensor is refused).
        const uint64_t rb = ggmlRowBytes(t.type, uint64_t(h.shape[1]));
        if (rb == 0 || t.nbytes != rb * uint64_t(h.shape[0]))
            throw inputError(path, "tensor '" + t.name + "'",
                             std::string("ggml ") + ggmlTypeName(t.type) + ": " + std::to_string(t.nbytes) +
                                 " bytes for " + std::to_string(h.shape[0]) + " rows of " +
                                 std::to_string(h.shape[1]) + " values (truncated or mis-sized block data)");
        const uint8_t* src = f.tensorBytes(t);
        h.ggmlType = t.type;
        h.packed.assign(src, src + t.nbytes);
    } else {
        h.data = f.readTensorF32(t);
    }
    f.releaseTensorPages(t);
    return h;
}

}  // namespace

LlamaWeights loadGgufWeights(const std::string& path)
{
    const GgufFile f = GgufFile::open(path);
    const std::string arch = f.getString("general.architecture");
    LlamaWeights w;
    w.spec.format = "gguf";
    w.spec.sourcePath = path;
    w.spec.name = f.has("general.name") ? f.getString("general.name") : baseName(path);
    w.spec.config = ggufConfig(f, path, arch);
    const ModelConfig& c = w.spec.config;
    const bool permuteQk = arch == "llama";  // llama.cpp's converter stores q/k rows interleaved for these
    std::map<std::string, int> types;
    for (const GgufTensorInfo& t : f.tensors()) {
        std::string name = ggufHfName(t.name, arch == "gemma3");
        if (name.empty())
            throw inputError(path, "tensor '" + t.name + "'", "unexpected (an architecture feature kvscope does not run)");
        HostTensor h = readGgufTensor(f, t, path);
        ++types[ggmlTypeName(t.type)];
        // Phi-3: attn_qkv is fused, and ffn_up holds gate and up rows (gate first) when there is
        // no ffn_gate.
        if (arch == "phi3" && endsWith(name, "mlp.up_proj.weight") && h.shape.size() == 2 &&
            h.shape[0] == 2 * int64_t(c.intermediateSize))
            name = name.substr(0, name.size() - std::strlen("up_proj.weight")) + "gate_up_proj.weight";
        if (isFusedName(name)) {
            splitFused(w, name, std::move(h));
            continue;
        }
        if (permuteQk && h.shape.size() == 2 && h.shape[0] % c.headDim == 0) {
            const bool isQ = name.find("q_proj.weight") != std::string::npos;
            const bool isK = name.find("k_proj.weight") != std::string::npos;
            if ((isQ || isK) && h.isPacked())
                permutePackedRows(h, c.headDim);
            else if (isQ || isK)
                permuteInterleavedToRotateHalf(h.data.data(), int(h.shape[0] / c.headDim), c.headDim, int(h.shape[1]));
        }
        w.tensors[name] = std::move(h);
    }
    w.spec.weightTypes = describeTypes(types);
    finish(w);
    return w;
}

LlamaWeights loadLlamaWeights(const std::string& path)
{
    if (isDirectory(path)) return loadHfWeights(path);
    if (endsWith(path, ".bin") || endsWith(path, ".pt") || endsWith(path, ".pth")) {
        // llama2.c files end in .bin too; a PyTorch pickle is a zip ("PK") or starts with 0x80.
        FILE* fp = std::fopen(path.c_str(), "rb");
        unsigned char head[2] = {0, 0};
        if (fp) {
            (void)std::fread(head, 1, 2, fp);
            std::fclose(fp);
        }
        if ((head[0] == 'P' && head[1] == 'K') || head[0] == 0x80) refusePickleCheckpoint(path);
    }
    if (endsWith(path, ".safetensors"))
        throw inputError(path, "", "a .safetensors file alone has no config: open the model folder instead");
    if (isGgufFile(path)) return loadGgufWeights(path);
    return loadLlama2cWeights(path);
}

std::string weightsFingerprint(const LlamaWeights& w)
{
    uint64_t h = 1469598103934665603ull;  // FNV-1a 64
    auto mix = [&h](const void* p, size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    const ModelConfig& c = w.spec.config;
    const int dims[] = {c.hiddenSize, c.intermediateSize, c.numLayers, c.numHeads, c.numKvHeads, c.headDim, c.vocabSize};
    mix(dims, sizeof dims);
    for (const auto& [name, t] : w.tensors) {
        mix(name.data(), name.size());
        mix(t.shape.data(), t.shape.size() * sizeof(int64_t));
        // The same sample of float values whether the tensor is packed or not.
        const size_t n = size_t(t.elements()), step = std::max<size_t>(1, n / 256);
        if (!t.isPacked()) {
            for (size_t i = 0; i < n; i += step) mix(&t.data[i], sizeof(float));
            continue;
        }
        const size_t cols = size_t(t.shape[1]);
        std::vector<float> row(cols);
        int64_t have = -1;
        for (size_t i = 0; i < n; i += step) {
            const int64_t r = int64_t(i / cols);
            if (r != have) t.readRow(have = r, row.data());
            mix(&row[i % cols], sizeof(float));
        }
    }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

}  // namespace kvscope
