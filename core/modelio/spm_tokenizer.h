// SentencePiece `tokenizer.model` (Llama-1/2, Mistral, ...) through Debian's libsentencepiece, the
// reference implementation, so BPE and Unigram models, normalisation rules and byte fallback all
// behave exactly as upstream. The library is reached through the kvscope_spm plugin (spm_backend.h
// says why: its protobuf clashes with libtorch's), so no sentencepiece type appears here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

class SpmTokenizer {
public:
    // Throws kvscope::Error "path: ..." when the file cannot be read or is not a model.
    static SpmTokenizer load(const std::string& path);

    // addSpecial puts BOS first (as Hugging Face's LlamaTokenizer does) when the model has one.
    // Throws kvscope::Error on text that is not valid UTF-8.
    std::vector<int32_t> encode(const std::string& utf8, bool addSpecial) const;
    // Control tokens (<s>, </s>) are dropped when skipSpecial, else written as their piece.
    // Throws kvscope::Error on an id outside the vocabulary.
    std::string decode(const std::vector<int32_t>& ids, bool skipSpecial) const;

    int vocabSize() const;
    int32_t bosId() const;  // -1 when the model has none
    int32_t eosId() const;
    // Id of the piece spelled exactly `text` ("<s>"), or -1.
    int32_t specialId(const std::string& text) const;

    struct Impl;

private:
    explicit SpmTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace kvscope
