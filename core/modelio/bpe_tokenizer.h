// BPE tokenizer read from a Hugging Face `tokenizer.json`, both families, or built from a GGUF
// vocabulary. One pipeline, the one Hugging Face `tokenizers` runs: added tokens split the raw text,
// then per piece normalizer -> pre-tokenizer -> BPE model; post-processor; decoder on the way back.
//
//  - byte-level (GPT-2 / Llama-3 / SmolLM): bytes are spelled as printable characters (GPT-2's
//    bytes_to_unicode) before BPE, so every byte has a token and nothing is unknown;
//  - SentencePiece-style (Llama-2 / Mistral): spaces become "▁" (normalizer Prepend + Replace, or
//    pre-tokenizer Metaspace), BPE runs on characters, a character outside the vocabulary becomes
//    its UTF-8 bytes as "<0xXX>" tokens (byte_fallback) or the unk token (fuse_unk joins runs).
//
// Supported (anything else is refused with a kvscope::Error "path: place: reason", never silently
// mis-tokenised):
//  - model BPE: vocab, merges ("a b" strings or [a, b] pairs; rank = index), ignore_merges,
//    byte_fallback, unk_token, fuse_unk; dropout null/0; no continuing_subword_prefix /
//    end_of_word_suffix;
//  - added_tokens: matched in the raw input before anything else, leftmost-longest, they split the
//    text (lstrip / rstrip / single_word must be false; normalized=true only without normalizer);
//  - normalizer: null, NFC / NFD / NFKC / NFKD (ICU), Prepend, Replace (String pattern), or a
//    Sequence of those;
//  - pre_tokenizer: Split (Regex pattern, behavior Isolated, invert false; PCRE2 with UTF + UCP),
//    Digits, ByteLevel (last step; add_prefix_space false; use_regex true applies the GPT-2
//    pattern), Metaspace (prepend_scheme always / first / never, split), or a Sequence of those;
//  - post_processor: null, ByteLevel (ids unchanged), TemplateProcessing (single template), or a
//    Sequence of those; applied when addSpecial is true;
//  - decoder: ByteLevel, or a Sequence of Replace (String), ByteFallback, Fuse, Strip, Metaspace
//    (Hugging Face semantics, invalid UTF-8 bytes become U+FFFD).
// The family is fixed by the pre-tokenizer: a ByteLevel step makes it byte-level; then Metaspace,
// Prepend, Replace and byte_fallback are refused, and a SentencePiece-style file must not use
// ByteLevel anywhere.
// encode() throws kvscope::Error on input that is not valid UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

// A byte-level BPE vocabulary given in memory (tokenizerFromGguf builds one from tokenizer.ggml.*).
struct ByteLevelBpeSpec {
    std::string source;                      // file name for error messages
    std::vector<std::string> tokens;         // id -> token, in byte-level spelling
    std::vector<std::string> merges;         // "a b", rank = index
    std::vector<std::string> splitPatterns;  // pre-tokenizer regexes, each applied Isolated, in order
    std::vector<int32_t> specialIds;  // matched whole in the text, dropped by decode(skipSpecial)
    std::vector<int32_t> userIds;     // matched whole in the text, kept by decode
    int32_t bos = -1;                 // prepended by encode(addSpecial) when addBos
    bool addBos = false;
};

class BpeTokenizer {
public:
    // Throws kvscope::Error naming the file and the unsupported feature or malformed field.
    static BpeTokenizer fromJsonFile(const std::string& path);
    static BpeTokenizer fromByteLevelSpec(const ByteLevelBpeSpec& spec);

    std::vector<int32_t> encode(const std::string& utf8, bool addSpecial) const;
    // Throws kvscope::Error on an id outside the vocabulary.
    std::string decode(const std::vector<int32_t>& ids, bool skipSpecial) const;

    // Largest id + 1 over the model vocabulary and the added tokens.
    int vocabSize() const;
    // The special token the post-processor's single template puts first, or -1 when it adds none
    // (e.g. the early Llama-3 file whose post-processor is ByteLevel).
    int32_t bosId() const;
    // Id of the added token whose content is exactly `text`, or -1.
    int32_t specialId(const std::string& text) const;
    bool isByteLevel() const;

    struct Impl;

private:
    explicit BpeTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace kvscope
