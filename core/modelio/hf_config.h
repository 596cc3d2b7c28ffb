// Hugging Face config.json -> a plain, validated model description (no third-party type here).
//
// Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// Phi3ForCausalLM, Gemma3ForCausalLM (model_type llama, mistral, qwen2, qwen3, phi3, gemma3_text).
// Anything else is refused by name, and so is every config feature the runtime would not honour
// (Phi-3's LongRoPE, partial rotary embeddings, Qwen's per-layer sliding windows, ...). Both the classic top-level "rope_theta" +
// "rope_scaling" form and the newer "rope_parameters" form (rope_type / rope_theta inside) are
// read. Every input error throws kvscope::Error "path: field: reason".
#pragma once

#include <string>
#include <vector>

namespace kvscope {

struct RopeScaling {
    std::string type;                   // "" (none / "default"), "llama3", "linear", "dynamic"
    double factor = 1.0;
    double lowFreqFactor = 1.0;         // llama3 only
    double highFreqFactor = 4.0;        // llama3 only
    int originalMaxPositionEmbeddings = 0;  // llama3 (required) and dynamic (optional)
};

struct ModelConfig {
    std::string architecture;  // "architectures"[0], or derived from model_type
    std::string modelType;     // "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text"
    int hiddenSize = 0;
    int intermediateSize = 0;
    int numLayers = 0;
    int numHeads = 0;
    int numKvHeads = 0;        // default numHeads
    int headDim = 0;           // explicit "head_dim", else hiddenSize / numHeads
    int vocabSize = 0;
    double rmsNormEps = 1e-6;
    double ropeTheta = 10000.0;
    bool tieWordEmbeddings = false;
    int maxPositionEmbeddings = 2048;
    int slidingWindow = 0;     // 0 = full attention; Mistral's "sliding_window" when set
    RopeScaling rope;          // applies to the global (full-attention) layers
    // Features beyond Llama; the defaults are Llama's.
    std::string hiddenAct = "silu";  // MLP gate: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma)
    bool qkNorm = false;       // RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3)
    bool sandwichNorm = false; // Gemma: RMSNorm on the attention output and before and after the MLP
    bool normPlusOne = false;  // Gemma: RMSNorm multiplies by (1 + w); loaders fold the 1 into w
    double embedScale = 1.0;   // embeddings are multiplied by this (Gemma: sqrt(hidden_size))
    double queryPreAttnScalar = 0;  // scores scaled by its -1/2 power; 0 = head_dim (Gemma sets it)
    double attnSoftcap = 0;    // scores -> cap * tanh(scores / cap) when > 0 (Gemma 2 style)
    double finalSoftcap = 0;   // logits -> cap * tanh(logits / cap) when > 0
    // Per layer: true when the layer attends within slidingWindow only ("sliding_attention").
    // Empty: every layer does when slidingWindow > 0. Gemma 3 interleaves 5 local : 1 global.
    std::vector<bool> slidingLayers;
    double ropeLocalTheta = 0; // RoPE base of the sliding layers; 0 = ropeTheta (Gemma 3: 10000)

    bool layerIsSliding(int layer) const
    {
        if (slidingWindow <= 0) return false;
        return slidingLayers.empty() || (layer >= 0 && size_t(layer) < slidingLayers.size() && slidingLayers[size_t(layer)]);
    }
    int bosTokenId = -1;       // -1 when absent / null; the first entry of a list
    int eosTokenId = -1;
};

// True for the architecture class names (and model_type names) this project can run.
bool isSupportedArchitecture(const std::string& nameOrModelType);

// Parses config.json text; `path` only names the source in errors.
ModelConfig parseHfConfig(const std::string& jsonText, const std::string& path);
// Reads and parses `path` (a config.json file; at most 16 MiB).
ModelConfig loadHfConfig(const std::string& path);

}  // namespace kvscope
