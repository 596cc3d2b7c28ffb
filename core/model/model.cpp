#include "model/model.h"

#include "common/file_io.h"

#include "common/error.h"
#include "modelio/gguf.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace kvscope {

namespace {

bool isDir(const std::string& p)
{
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string defaultModelPath()
{
    if (const char* env = std::getenv("KVSCOPE_MODEL"); env && *env) return env;
    std::string cache;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) cache = xdg;
    else if (const char* home = std::getenv("HOME"); home && *home) cache = std::string(home) + "/.cache";
    else cache = "/tmp";
    return cache + "/kvscope/models/" + DefaultModel::fileName;
}

std::string resolveModelPath(const std::string& arg)
{
    if (!arg.empty() && arg != "sample" && arg != "default") return arg;
    const std::string path = defaultModelPath();
    if (!isRegularFile(path))
        throw inputError(path, "", std::string("the default model is not there; fetch it with `kvscope-cli fetch-model ") +
                                       DefaultModel::fetchName + "` (installer/fetch_model.sh in a source checkout)");
    return path;
}

std::unique_ptr<Model> Model::open(const std::string& pathOrAlias, const std::string& tokenizerPath,
                                   const RuntimeOptions& options)
{
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Model> m(new Model());
    m->path_ = resolveModelPath(pathOrAlias);
    LlamaWeights w = loadLlamaWeights(m->path_);
    const ModelConfig& c = w.spec.config;
    if (!tokenizerPath.empty()) {
        m->tokenizer_ = isGgufFile(tokenizerPath) ? tokenizerFromGguf(GgufFile::open(tokenizerPath))
                                              : loadTokenizer(tokenizerPath, c.vocabSize, c.eosTokenId);
    } else if (w.spec.format == "gguf") {
        m->tokenizer_ = tokenizerFromGguf(GgufFile::open(m->path_));
    } else if (isDir(m->path_)) {
        m->tokenizer_ = loadTokenizer(m->path_, c.vocabSize, c.eosTokenId);
    } else {
        throw inputError(m->path_, "", "a llama2.c checkpoint needs its tokenizer: pass --tokenizer tokenizer.bin");
    }
    if (m->tokenizer_->vocabSize() > c.vocabSize)
        throw inputError(tokenizerPath.empty() ? m->path_ : tokenizerPath, "tokenizer",
                         "vocabulary of " + std::to_string(m->tokenizer_->vocabSize()) +
                             " tokens does not fit the model's " + std::to_string(c.vocabSize));
    m->runtime_ = std::make_unique<LlamaRuntime>(std::move(w), options);
    m->loadSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return m;
}

std::vector<int32_t> Model::stopIds() const
{
    std::vector<int32_t> ids;
    auto add = [&ids](int32_t id) {
        if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    };
    add(tokenizer_->eosId());
    add(spec().config.eosTokenId);
    for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>"}) add(tokenizer_->specialId(t));
    return ids;
}

bool Model::isChat() const
{
    return tokenizer_->specialId("<|im_start|>") >= 0 && tokenizer_->specialId("<|im_end|>") >= 0;
}

std::vector<int32_t> Model::contextTokens(const std::string& context) const
{
    if (isChat()) return tokenizer_->encode("<|im_start|>user\n" + context, true);
    return tokenizer_->encode(context, true);
}

std::vector<int32_t> Model::questionTokens(const std::string& question) const
{
    if (isChat()) return tokenizer_->encode("\n\n" + question + "<|im_end|>\n<|im_start|>assistant\n", false);
    return tokenizer_->encode("\n\n" + question + "\n", false);
}

std::vector<int32_t> Model::promptTokens(const std::string& text, bool chat) const
{
    if (chat && isChat())
        return tokenizer_->encode("<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n", true);
    return tokenizer_->encode(text, true);
}

}  // namespace kvscope
