// llama2.c `tokenizer.bin`: a SentencePiece-style vocabulary with merge scores.
//
// Layout (little-endian): int32 max_token_length, then for every token until the end of the file:
// float32 score, int32 len, len bytes of the piece (not NUL-terminated). The file does not store
// the vocabulary size; pass the model's vocab_size to require exactly that many tokens.
//
// Semantics follow llama2.c's run.c:
//  - encode: optional BOS (id 1); when the text is non-empty the " " piece (dummy prefix) first;
//    each UTF-8 codepoint (up to 4 bytes) looked up as a piece, unknown ones fall back to one token
//    per byte, id = byte + 3; then repeatedly merge the adjacent pair whose concatenation is a piece
//    with the highest score (leftmost on ties) until no pair merges; optional EOS (id 2).
//  - decode(prev, token): the piece, without its leading space when prev is BOS; pieces of the form
//    "<0xXX>" decode to the raw byte XX.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvscope {

class Llama2cTokenizer {
public:
    static constexpr int kBos = 1;
    static constexpr int kEos = 2;
    static constexpr int kMaxTokens = 1 << 22;
    static constexpr int kMaxTokenLength = 1 << 16;

    // expectedVocabSize > 0 requires exactly that many tokens; 0 reads until the end of the file.
    // Throws kvscope::Error "path: place: reason" on bad input.
    static Llama2cTokenizer load(const std::string& path, int expectedVocabSize = 0);

    std::vector<int> encode(const std::string& text, bool bos, bool eos) const;
    // The bytes token `token` contributes after `prev`. Throws kvscope::Error on an id out of range.
    std::string decode(int prev, int token) const;
    // Concatenated decode of a sequence (prev of the first token is `prev`).
    std::string decodeAll(const std::vector<int>& tokens, int prev = -1) const;

    int vocabSize() const { return int(pieces_.size()); }
    int maxTokenLength() const { return maxTokenLength_; }
    const std::string& piece(int id) const { return pieces_.at(size_t(id)); }
    float score(int id) const { return scores_.at(size_t(id)); }
    int lookup(const std::string& piece) const;  // -1 when absent

private:
    std::vector<std::string> pieces_;
    std::vector<float> scores_;
    std::unordered_map<std::string, int> index_;  // first id of each piece
    int maxTokenLength_ = 0;
};

}  // namespace kvscope
