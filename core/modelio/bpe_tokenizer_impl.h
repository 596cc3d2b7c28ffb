// Internal to modelio/: the state of a BpeTokenizer, shared by the encoder (bpe_tokenizer.cpp, which
// also defines these methods) and the tokenizer.json reader (bpe_tokenizer_json.cpp) that fills it.
// Not a public header: it carries PCRE2 and ICU types.
#pragma once

#include "modelio/bpe_tokenizer.h"

#include "common/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/normalizer2.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvscope {

struct BpeTokenizer::Impl {
    std::string path;
    bool byteLevel = false;

    // --- model ---
    std::unordered_map<std::string, int32_t> vocab;
    std::vector<std::string> idToToken;  // model tokens (as spelled in the vocab) and added content
    std::vector<uint8_t> isAdded;        // per id: 1 added, 2 added + special
    struct Merge {
        int32_t rank;
        int32_t newId;
    };
    std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> merge
    bool ignoreMerges = false;
    bool byteFallback = false;
    bool fuseUnk = false;
    int32_t unk = -1;
    int32_t byteIds[256];  // id of "<0xXX>" for byte_fallback, -1 when absent

    // --- added tokens ---
    struct Added {
        std::string content;
        int32_t id;
    };
    std::vector<Added> added;                       // sorted longest first
    std::vector<std::vector<size_t>> addedByFirst;  // first byte -> indices into `added`

    // --- normalizer ---
    struct Norm {
        enum Kind { Unicode, Prepend, Replace } kind;
        const icu::Normalizer2* unicode = nullptr;  // NFC / NFD / NFKC / NFKD
        std::string a, b;                           // Prepend: a; Replace: a -> b
    };
    std::vector<Norm> norms;

    // --- pre-tokenizer ---
    std::vector<std::shared_ptr<pcre2_code>> splits;  // Isolated splits, in order
    bool metaspace = false;
    std::string metaReplacement;
    enum class Prepend { Always, First, Never } metaPrepend = Prepend::Always;
    bool metaSplit = true;
    std::string byteToUnicode[256];
    std::unordered_map<uint32_t, uint8_t> unicodeToByte;

    // --- post-processor ---
    bool template_ = false;
    std::vector<std::vector<int32_t>> templateItems;  // empty vector marks the sequence slot
    int32_t bos = -1;

    // --- decoder ---
    struct Dec {
        enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
        std::string a, b;  // Replace: a -> b; Strip: a = content; Metaspace: a = replacement
        int start = 0, stop = 0;
        bool prepend = true;  // Metaspace: prepend_scheme != never
    };
    std::vector<Dec> decoders;

    int vocabSize = 0;

    Error err(const std::string& place, const std::string& reason) const
    {
        return inputError(path, place, reason);
    }

    std::shared_ptr<pcre2_code> compile(const std::string& pattern, const std::string& place) const;

    void setupByteLevelTables();

    void addMerge(size_t rank, const std::string& a, const std::string& b, const std::string& place);

    void addAdded(const std::string& content, int32_t id, bool special);

    void indexAdded();

    // Final checks shared by every way of building a tokenizer. GGUF vocabularies may lack a few
    // control bytes (SmolLM2 has no token for byte 4), so for them a missing byte is an error only
    // when the text contains it.
    void finish(bool requireAllBytes);

    // ----- encoding -----

    // Isolated split: every match and every gap between matches is its own piece.
    void split(const pcre2_code* re, pcre2_match_data* md, const std::string& text,
               std::vector<std::string>& out) const;

    // The initial symbols of a word: one per character, or its bytes / unk when unknown.
    void initialSymbols(const std::string& word, std::vector<int32_t>& syms) const;

    // Merges adjacent symbols by rank (lowest first, leftmost on ties) until no merge applies.
    void bpe(const std::string& word, std::vector<int32_t>& out) const;

    std::string normalize(std::string text) const;

    // One piece of text between added tokens; `atStart` when it begins the input.
    void encodePlain(const std::string& raw, bool atStart, pcre2_match_data* md,
                     std::vector<int32_t>& out) const;

    // ----- decoding -----

    // Hugging Face decoders work on the list of token strings; each step maps the list.
    std::string runDecoders(std::vector<std::string> toks) const;
};

}  // namespace kvscope
