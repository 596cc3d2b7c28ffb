// The tokenizer embedded in a GGUF file (tokenizer.ggml.*), with llama.cpp's semantics, which is
// what a GGUF's author tested against:
//  - model "gpt2": byte-level BPE. Tokens are spelled in GPT-2's byte alphabet, merges are ranked
//    by position, and tokenizer.ggml.pre names the pre-tokenizer; ggufPreTokenizerRegexes turns
//    that name into the regexes llama.cpp uses (unknown names are refused, never guessed). The
//    pipeline itself is BpeTokenizer's (bpe_tokenizer.h).
//  - model "llama": SentencePiece with scores (GgufSpmTokenizer below): spaces become "▁" (one
//    first when add_space_prefix, also after a control token), then the adjacent pair whose
//    concatenation is a token with the highest score merges first (leftmost on ties), until none
//    does; a character with no token becomes its bytes as "<0xXX>" tokens.
// Token types (tokenizer.ggml.token_type): 1 normal, 2 unknown, 3 control, 4 user-defined,
// 5 unused, 6 byte. Control and user-defined tokens are matched whole in the text before anything
// else; decode(skipSpecial) drops control tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

class GgufFile;
struct ByteLevelBpeSpec;

// Regexes (each applied Isolated, in order) for a tokenizer.ggml.pre name. Throws kvscope::Error
// "path: tokenizer.ggml.pre: ..." for a name this table does not know.
std::vector<std::string> ggufPreTokenizerRegexes(const std::string& pre, const std::string& path);

// Reads a "gpt2" vocabulary into the spec BpeTokenizer::fromByteLevelSpec builds from.
ByteLevelBpeSpec ggufByteLevelSpec(const GgufFile& file);

class GgufSpmTokenizer {
public:
    // Throws kvscope::Error "path: metadata 'tokenizer.ggml.*': reason" on a malformed vocabulary.
    static GgufSpmTokenizer fromGguf(const GgufFile& file);

    // Throws kvscope::Error on text that is not valid UTF-8.
    std::vector<int32_t> encode(const std::string& utf8, bool addSpecial) const;
    // Throws kvscope::Error on an id outside the vocabulary.
    std::string decode(const std::vector<int32_t>& ids, bool skipSpecial) const;

    int vocabSize() const;
    int32_t bosId() const;
    int32_t eosId() const;
    int32_t specialId(const std::string& text) const;  // control / user-defined token, or -1

    struct Impl;

private:
    explicit GgufSpmTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace kvscope
