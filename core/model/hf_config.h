// Hugging Face config.json -> a plain, validated model description (no third-party type here).
//
// Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (model_type llama, mistral,
// qwen2). Anything else is refused by name. Both the classic top-level "rope_theta" +
// "rope_scaling" form and the newer "rope_parameters" form (rope_type / rope_theta inside) are
// read. Every input error throws kvscope::Error "path: field: reason".
#pragma once

#include <string>

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
    std::string modelType;     // "llama", "mistral", "qwen2"
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
    RopeScaling rope;
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
