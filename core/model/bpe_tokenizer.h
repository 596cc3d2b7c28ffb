// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (the GPT-2 / Llama-3 family).
//
// Supported (anything else is refused with a kvscope::Error "path: place: reason", never silently
// mis-tokenised):
//  - model BPE: vocab, merges ("a b" strings or [a, b] pairs; rank = index), ignore_merges;
//    dropout null/0, no unk_token needed, no continuing_subword_prefix / end_of_word_suffix,
//    byte_fallback false;
//  - added_tokens: matched in the raw input before pre-tokenisation, leftmost-longest, they split
//    the text (lstrip / rstrip / single_word must be false);
//  - normalizer: null only (NFC and others are refused);
//  - pre_tokenizer: ByteLevel alone, or Sequence of Split (Regex pattern, behavior "Isolated",
//    invert false) steps ending in ByteLevel (add_prefix_space false; use_regex true applies the
//    GPT-2 pattern). Regexes run in PCRE2 with UTF + UCP;
//  - post_processor: null, ByteLevel (ids unchanged), TemplateProcessing (single template), or a
//    Sequence of those; applied when addSpecial is true;
//  - decoder: ByteLevel (reverse byte mapping; bytes that are not valid UTF-8 become U+FFFD, as in
//    Hugging Face `tokenizers`).
// encode() throws kvscope::Error on input that is not valid UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

class BpeTokenizer {
public:
    // Throws kvscope::Error naming the file and the unsupported feature or malformed field.
    static BpeTokenizer fromJsonFile(const std::string& path);

    std::vector<int32_t> encode(const std::string& utf8, bool addSpecial) const;
    // Throws kvscope::Error on an id outside the vocabulary.
    std::string decode(const std::vector<int32_t>& ids, bool skipSpecial) const;

    // Largest id + 1 over the model vocabulary and the added tokens.
    int vocabSize() const;
    // The special token the post-processor's single template puts first, or -1 when it adds none
    // (e.g. the early Llama-3 file whose post-processor is ByteLevel).
    int32_t bosId() const;

    struct Impl;

private:
    explicit BpeTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace kvscope
