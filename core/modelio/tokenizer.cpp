#include "modelio/tokenizer.h"

#include "common/error.h"
#include "modelio/bpe_tokenizer.h"
#include "modelio/gguf.h"
#include "modelio/gguf_tokenizer.h"
#include "modelio/llama2c_tokenizer.h"
#include "modelio/spm_tokenizer.h"
#include "modelio/utf8.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvscope {

namespace {

namespace fs = std::filesystem;

void requireUtf8(const std::string& text)
{
    const size_t bad = utf8FirstInvalid(text);
    if (bad != std::string::npos)
        throw Error("tokenizer input is not valid UTF-8 at byte " + std::to_string(bad));
}

// Wraps a family class that already has the Tokenizer methods under the same names.
template <class T>
class Forwarding : public Tokenizer {
public:
    Forwarding(T t, int32_t eos, std::string what) : t_(std::move(t)), eos_(eos), what_(std::move(what)) {}
    std::vector<int32_t> encode(const std::string& s, bool addSpecial) const override
    {
        return t_.encode(s, addSpecial);
    }
    std::string decode(const std::vector<int32_t>& ids, bool skipSpecial) const override
    {
        return t_.decode(ids, skipSpecial);
    }
    int vocabSize() const override { return t_.vocabSize(); }
    int32_t bosId() const override { return t_.bosId(); }
    int32_t eosId() const override { return eos_; }
    int32_t specialId(const std::string& text) const override { return t_.specialId(text); }
    std::string description() const override { return what_; }

private:
    T t_;
    int32_t eos_;
    std::string what_;
};

class Llama2c : public Tokenizer {
public:
    Llama2c(Llama2cTokenizer t, int32_t eos) : t_(std::move(t)), eos_(eos) {}
    std::vector<int32_t> encode(const std::string& s, bool addSpecial) const override
    {
        requireUtf8(s);
        const std::vector<int> ids = t_.encode(s, addSpecial, false);
        return std::vector<int32_t>(ids.begin(), ids.end());
    }
    std::string decode(const std::vector<int32_t>& ids, bool skipSpecial) const override
    {
        // Token by token: a piece after BOS loses its leading space even when BOS is skipped.
        std::string out;
        int prev = -1;
        for (int32_t id : ids) {
            const std::string piece = t_.decode(prev, id);
            if (!(skipSpecial && (id == Llama2cTokenizer::kBos || id == Llama2cTokenizer::kEos)))
                out += piece;
            prev = id;
        }
        return utf8Lossy(out);
    }
    int vocabSize() const override { return t_.vocabSize(); }
    int32_t bosId() const override { return Llama2cTokenizer::kBos; }
    int32_t eosId() const override { return eos_ >= 0 ? eos_ : Llama2cTokenizer::kEos; }
    int32_t specialId(const std::string& text) const override
    {
        const int id = t_.lookup(text);
        return id >= 0 && id <= Llama2cTokenizer::kEos ? id : -1;
    }
    std::string description() const override { return "SentencePiece-style (llama2.c tokenizer.bin)"; }

private:
    Llama2cTokenizer t_;
    int32_t eos_;
};

// eos_token of the tokenizer_config.json next to a tokenizer.json: a string or {"content": ...}.
// Returns "" when there is no such file or field; a malformed file is an error.
std::string configEosToken(const fs::path& tokenizerJson)
{
    const fs::path cfg = tokenizerJson.parent_path() / "tokenizer_config.json";
    std::ifstream in(cfg, std::ios::binary);
    if (!in) return std::string();
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
        throw inputError(cfg.string(), "", std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object() || !j.contains("eos_token")) return std::string();
    const auto& e = j["eos_token"];
    if (e.is_string()) return e.get<std::string>();
    if (e.is_object() && e.contains("content") && e["content"].is_string())
        return e["content"].get<std::string>();
    return std::string();
}

bool endsWith(const std::string& s, const std::string& suffix)
{
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<Tokenizer> loadJson(const std::string& path, int32_t eosHint)
{
    BpeTokenizer t = BpeTokenizer::fromJsonFile(path);
    int32_t eos = eosHint;
    if (eos < 0) {
        const std::string name = configEosToken(path);
        if (!name.empty()) eos = t.specialId(name);
    }
    const std::string what = t.isByteLevel() ? "byte-level BPE (tokenizer.json)"
                                             : "SentencePiece-style BPE (tokenizer.json)";
    return std::make_unique<Forwarding<BpeTokenizer>>(std::move(t), eos, what);
}

}  // namespace

std::unique_ptr<Tokenizer> loadTokenizer(const std::string& path, int expectedVocab, int32_t eosHint)
{
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
            const fs::path p = fs::path(path) / name;
            if (fs::exists(p, ec)) return loadTokenizer(p.string(), expectedVocab, eosHint);
        }
        throw inputError(path, "", "no tokenizer.json or tokenizer.model in this folder");
    }
    if (!fs::exists(path, ec)) throw inputError(path, "", "cannot open: no such file");
    if (endsWith(path, ".json")) return loadJson(path, eosHint);
    if (endsWith(path, ".model")) {
        SpmTokenizer t = SpmTokenizer::load(path);
        const int32_t eos = eosHint >= 0 ? eosHint : t.eosId();
        return std::make_unique<Forwarding<SpmTokenizer>>(std::move(t), eos, "SentencePiece (tokenizer.model)");
    }
    if (endsWith(path, ".bin"))
        return std::make_unique<Llama2c>(Llama2cTokenizer::load(path, expectedVocab), eosHint);
    if (endsWith(path, ".gguf")) return tokenizerFromGguf(GgufFile::open(path));
    throw inputError(path, "", "unknown tokenizer file type (expected tokenizer.json, "
                               "tokenizer.model, a llama2.c tokenizer .bin or a .gguf)");
}

std::unique_ptr<Tokenizer> tokenizerFromGguf(const GgufFile& file)
{
    if (!file.has("tokenizer.ggml.model"))
        throw inputError(file.path(), "metadata 'tokenizer.ggml.model'", "missing: no embedded tokenizer");
    const std::string model = file.getString("tokenizer.ggml.model");
    if (model == "gpt2") {
        BpeTokenizer t = BpeTokenizer::fromByteLevelSpec(ggufByteLevelSpec(file));
        int32_t eos = -1;
        if (file.has("tokenizer.ggml.eos_token_id")) {
            const int64_t id = file.getInt("tokenizer.ggml.eos_token_id");
            if (id < 0 || id >= t.vocabSize())
                throw inputError(file.path(), "metadata 'tokenizer.ggml.eos_token_id'", "out of range");
            eos = int32_t(id);
        }
        return std::make_unique<Forwarding<BpeTokenizer>>(std::move(t), eos, "byte-level BPE (GGUF, gpt2)");
    }
    if (model == "llama") {
        GgufSpmTokenizer t = GgufSpmTokenizer::fromGguf(file);
        const int32_t eos = t.eosId();
        return std::make_unique<Forwarding<GgufSpmTokenizer>>(std::move(t), eos, "SentencePiece (GGUF, llama)");
    }
    throw inputError(file.path(), "metadata 'tokenizer.ggml.model'",
                     "tokenizer model \"" + model + "\" not supported (only gpt2 and llama)");
}

}  // namespace kvscope
