// Hugging Face config.json parser: see hf_config.h.
#include "modelio/hf_config.h"

#include "common/error.h"
#include "common/file_io.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

namespace kvscope {

namespace {

using nlohmann::json;

constexpr size_t kMaxConfigBytes = 16u << 20;
constexpr int kMaxJsonDepth = 64;

struct Arch {
    const char* cls;
    const char* modelType;
};
const Arch kArchs[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
    {"Phi3ForCausalLM", "phi3"},
    {"Gemma3ForCausalLM", "gemma3_text"},
};
constexpr const char* kArchList =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma3ForCausalLM";
constexpr const char* kTypeList = "llama, mistral, qwen2, qwen3, phi3, gemma3_text";

class Reader {
public:
    Reader(const json& obj, std::string path, std::string prefix)
        : obj_(obj), path_(std::move(path)), prefix_(std::move(prefix)) {}

    std::string field(const std::string& key) const { return prefix_ + key; }
    const std::string& path() const { return path_; }
    [[noreturn]] void fail(const std::string& key, const std::string& why) const
    {
        throw inputError(path_, field(key), why);
    }
    // Present and not null.
    bool has(const std::string& key) const
    {
        auto it = obj_.find(key);
        return it != obj_.end() && !it->is_null();
    }
    const json& at(const std::string& key) const { return *obj_.find(key); }

    // An integer (or an integral number) within [lo, hi].
    int integer(const std::string& key, long long lo, long long hi) const
    {
        if (!has(key)) fail(key, "missing");
        return toInt(key, at(key), lo, hi);
    }
    int integer(const std::string& key, long long lo, long long hi, int def) const
    {
        return has(key) ? toInt(key, at(key), lo, hi) : def;
    }
    int toInt(const std::string& key, const json& v, long long lo, long long hi) const
    {
        long long x;
        if (v.is_number_integer() || v.is_number_unsigned()) {
            if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<long long>::max()))
                fail(key, "out of range");
            x = v.get<long long>();
        } else if (v.is_number_float()) {
            const double d = v.get<double>();
            if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) fail(key, "not an integer");
            x = static_cast<long long>(d);
        } else {
            fail(key, "not an integer");
        }
        if (x < lo || x > hi)
            fail(key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return int(x);
    }
    // A finite number > 0 (and < `below` when given).
    double positive(const std::string& key, double def, double below = INFINITY) const
    {
        if (!has(key)) return def;
        const json& v = at(key);
        if (!v.is_number()) fail(key, "not a number");
        const double d = v.get<double>();
        if (!std::isfinite(d) || d <= 0 || d >= below) fail(key, "must be a positive finite number" + std::string(std::isinf(below) ? "" : " below " + std::to_string(below)));
        return d;
    }
    bool boolean(const std::string& key, bool def) const
    {
        if (!has(key)) return def;
        if (!at(key).is_boolean()) fail(key, "not a boolean");
        return at(key).get<bool>();
    }
    std::string string(const std::string& key) const
    {
        if (!has(key)) return "";
        if (!at(key).is_string()) fail(key, "not a string");
        return at(key).get<std::string>();
    }
    // An integer, or the first of a list of integers; -1 when absent, null or an empty list.
    int tokenId(const std::string& key) const
    {
        if (!has(key)) return -1;
        const json& v = at(key);
        if (v.is_array()) {
            if (v.empty()) return -1;
            return toInt(key, v[0], 0, std::numeric_limits<int>::max());
        }
        return toInt(key, v, 0, std::numeric_limits<int>::max());
    }

private:
    const json& obj_;
    std::string path_;
    std::string prefix_;
};

constexpr long long kIntMax = std::numeric_limits<int>::max();

void readRope(const Reader& r, RopeScaling& rope, int maxPos)
{
    std::string type = r.string("rope_type");
    if (type.empty()) type = r.string("type");  // the older key
    if (type == "default") type = "";
    if (type.empty()) return;
    if (type != "llama3" && type != "linear" && type != "dynamic")
        r.fail("rope_type", "unsupported rope scaling type '" + type + "' (supported: default, linear, dynamic, llama3)");
    rope.type = type;
    if (!r.has("factor")) r.fail("factor", "missing");
    rope.factor = r.positive("factor", 1.0);
    if (type == "llama3") {
        rope.lowFreqFactor = r.positive("low_freq_factor", 1.0);
        rope.highFreqFactor = r.positive("high_freq_factor", 4.0);
        if (!r.has("low_freq_factor")) r.fail("low_freq_factor", "missing");
        if (!r.has("high_freq_factor")) r.fail("high_freq_factor", "missing");
        if (rope.highFreqFactor <= rope.lowFreqFactor)
            r.fail("high_freq_factor", "must be greater than low_freq_factor");
        rope.originalMaxPositionEmbeddings = r.integer("original_max_position_embeddings", 1, kIntMax);
    } else {
        rope.originalMaxPositionEmbeddings = r.integer("original_max_position_embeddings", 1, kIntMax, maxPos);
    }
}

// What Qwen3, Phi-3 and Gemma 3 add to the Llama block, and the keys of features the runtime does
// not run (refused by key).
void readArchitectureFeatures(const Reader& r, ModelConfig& c)
{
    const std::string act = r.has("hidden_activation") ? r.string("hidden_activation") : r.string("hidden_act");
    if (!act.empty()) {
        if (act != "silu" && act != "gelu_pytorch_tanh")
            r.fail(r.has("hidden_activation") ? "hidden_activation" : "hidden_act",
                   "unsupported activation '" + act + "' (supported: silu, gelu_pytorch_tanh)");
        c.hiddenAct = act;
    }
    if (r.has("partial_rotary_factor") && r.at("partial_rotary_factor") != 1.0)
        r.fail("partial_rotary_factor", "partial rotary embeddings are not supported");
    if (c.modelType == "qwen3") c.qkNorm = true;
    if (c.modelType == "phi3") {
        if (c.rope.type == "dynamic" || c.rope.type == "llama3")
            r.fail("rope_scaling", "Phi-3 with '" + c.rope.type + "' RoPE scaling is not supported");
    }
    if (c.modelType != "gemma3_text") {
        for (const char* k : {"final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar",
                              "layer_types", "sliding_window_pattern"})
            if (r.has(k)) r.fail(k, std::string("not supported for ") + c.modelType);
        return;
    }
    // Gemma 3 (text): GeGLU, (1 + w) RMSNorm with q/k norms and sandwich norms, embeddings scaled by
    // sqrt(hidden), local sliding-window layers with their own RoPE base between global ones.
    c.hiddenAct = act.empty() ? "gelu_pytorch_tanh" : act;
    c.qkNorm = true;
    c.sandwichNorm = true;
    c.normPlusOne = true;
    c.embedScale = std::sqrt(double(c.hiddenSize));
    c.tieWordEmbeddings = r.boolean("tie_word_embeddings", true);
    c.queryPreAttnScalar = r.positive("query_pre_attn_scalar", double(c.headDim));
    c.attnSoftcap = r.positive("attn_logit_softcapping", 0.0);
    c.finalSoftcap = r.positive("final_logit_softcapping", 0.0);
    c.ropeLocalTheta = r.positive("rope_local_base_freq", 10000.0);
    // Newer configs give each layer type its own "rope_parameters" entry.
    if (r.has("rope_parameters") && r.at("rope_parameters").is_object()) {
        const json& rp = r.at("rope_parameters");
        if (rp.contains("full_attention") && rp["full_attention"].is_object()) {
            const Reader fr(rp["full_attention"], r.path(), "rope_parameters.full_attention.");
            c.ropeTheta = fr.positive("rope_theta", c.ropeTheta);
            readRope(fr, c.rope, c.maxPositionEmbeddings);
        }
        if (rp.contains("sliding_attention") && rp["sliding_attention"].is_object()) {
            const Reader sr(rp["sliding_attention"], r.path(), "rope_parameters.sliding_attention.");
            c.ropeLocalTheta = sr.positive("rope_theta", c.ropeLocalTheta);
            RopeScaling local;
            readRope(sr, local, c.maxPositionEmbeddings);
            if (!local.type.empty()) sr.fail("rope_type", "RoPE scaling on sliding layers is not supported");
        }
    }
    c.slidingWindow = r.integer("sliding_window", 1, kIntMax, 4096);
    c.slidingLayers.assign(size_t(c.numLayers), false);
    if (r.has("layer_types")) {
        const json& lt = r.at("layer_types");
        if (!lt.is_array() || lt.size() != size_t(c.numLayers))
            r.fail("layer_types", "not a list of " + std::to_string(c.numLayers) + " layer types");
        for (size_t l = 0; l < lt.size(); ++l) {
            const std::string t = lt[l].is_string() ? lt[l].get<std::string>() : "";
            if (t != "sliding_attention" && t != "full_attention")
                r.fail("layer_types", "entry " + std::to_string(l) + " is not sliding_attention or full_attention");
            c.slidingLayers[l] = t == "sliding_attention";
        }
    } else {
        const int pattern = r.integer("sliding_window_pattern", 1, 4096, 6);
        for (int l = 0; l < c.numLayers; ++l) c.slidingLayers[size_t(l)] = (l + 1) % pattern != 0;
    }
}

}  // namespace

bool isSupportedArchitecture(const std::string& name)
{
    for (const Arch& a : kArchs)
        if (name == a.cls || name == a.modelType) return true;
    return false;
}

ModelConfig parseHfConfig(const std::string& text, const std::string& path)
{
    if (jsonNestingDepth(text.data(), text.size(), kMaxJsonDepth) > kMaxJsonDepth)
        throw inputError(path, "config", "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    json root;
    try {
        root = json::parse(text);
    } catch (const json::exception& e) {
        throw inputError(path, "config", std::string("invalid JSON: ") + e.what());
    }
    if (!root.is_object()) throw inputError(path, "config", "JSON is not an object");
    const Reader r(root, path, "");
    ModelConfig c;

    c.modelType = r.string("model_type");
    if (r.has("architectures")) {
        const json& a = r.at("architectures");
        if (!a.is_array() || a.empty() || !a[0].is_string())
            r.fail("architectures", "not a non-empty list of strings");
        c.architecture = a[0].get<std::string>();
    }
    if (c.architecture.empty() && c.modelType.empty())
        r.fail("architectures", "missing (and no model_type either)");
    if (!c.architecture.empty() && !isSupportedArchitecture(c.architecture))
        r.fail("architectures", "unsupported architecture '" + c.architecture + "' (supported: " + kArchList + ")");
    if (!c.modelType.empty() && !isSupportedArchitecture(c.modelType))
        r.fail("model_type", "unsupported model type '" + c.modelType + "' (supported: " + kTypeList + ")");
    for (const Arch& a : kArchs) {
        if (c.architecture.empty() && c.modelType == a.modelType) c.architecture = a.cls;
        if (c.modelType.empty() && c.architecture == a.cls) c.modelType = a.modelType;
    }

    c.hiddenSize = r.integer("hidden_size", 1, 1 << 20);
    c.intermediateSize = r.integer("intermediate_size", 1, 1 << 22);
    c.numLayers = r.integer("num_hidden_layers", 1, 4096);
    c.numHeads = r.integer("num_attention_heads", 1, 4096);
    c.numKvHeads = r.integer("num_key_value_heads", 1, 4096, c.numHeads);
    c.vocabSize = r.integer("vocab_size", 1, 1 << 24);
    c.maxPositionEmbeddings = r.integer("max_position_embeddings", 1, kIntMax, 2048);
    if (r.has("head_dim")) {
        c.headDim = r.integer("head_dim", 1, 1 << 16);
    } else {
        if (c.hiddenSize % c.numHeads != 0)
            r.fail("num_attention_heads", std::to_string(c.numHeads) + " does not divide hidden_size " + std::to_string(c.hiddenSize));
        c.headDim = c.hiddenSize / c.numHeads;
    }
    if (c.headDim % 2 != 0) r.fail("head_dim", std::to_string(c.headDim) + " is odd (rotary embeddings need an even head size)");
    if (c.numHeads % c.numKvHeads != 0)
        r.fail("num_key_value_heads", std::to_string(c.numKvHeads) + " does not divide num_attention_heads " + std::to_string(c.numHeads));
    c.rmsNormEps = r.positive("rms_norm_eps", 1e-6, 1.0);
    c.ropeTheta = r.positive("rope_theta", 10000.0);
    c.tieWordEmbeddings = r.boolean("tie_word_embeddings", false);
    // Mistral: "sliding_window" (int or null). Qwen2 carries one too but applies it only when
    // "use_sliding_window" is true, and then only from max_window_layers on: refused, not mis-run.
    if (c.modelType == "qwen2" || c.modelType == "qwen3") {
        if (r.boolean("use_sliding_window", false))
            r.fail("use_sliding_window", "true is not supported (per-layer sliding windows of Qwen2)");
    } else if (r.has("sliding_window") && !r.at("sliding_window").is_null()) {
        c.slidingWindow = r.integer("sliding_window", 1, kIntMax);
    }
    c.bosTokenId = r.tokenId("bos_token_id");
    c.eosTokenId = r.tokenId("eos_token_id");

    // Newer transformers write "rope_parameters" (with rope_theta inside); older "rope_scaling".
    if (r.has("rope_parameters")) {
        const json& p = r.at("rope_parameters");
        if (!p.is_object()) r.fail("rope_parameters", "not an object");
        const Reader pr(p, path, "rope_parameters.");
        c.ropeTheta = pr.positive("rope_theta", c.ropeTheta);
        readRope(pr, c.rope, c.maxPositionEmbeddings);
    } else if (r.has("rope_scaling")) {
        const json& s = r.at("rope_scaling");
        if (!s.is_object()) r.fail("rope_scaling", "not an object");
        readRope(Reader(s, path, "rope_scaling."), c.rope, c.maxPositionEmbeddings);
    }
    readArchitectureFeatures(r, c);
    return c;
}

ModelConfig loadHfConfig(const std::string& path)
{
    const std::string text = readSmallFile(path, kMaxConfigBytes);
    return parseHfConfig(text, path);
}

}  // namespace kvscope
