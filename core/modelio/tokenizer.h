// One interface over every tokenizer kvscope reads, so the runtime, the CLI and the GUI never care
// which family a model uses.
//
// Families (each in its own file; this header only dispatches):
//  - tokenizer.json, byte-level BPE (GPT-2 / Llama-3 style) and
//    SentencePiece-style BPE (Llama-2 / Mistral style): one pipeline   bpe_tokenizer.h
//  - tokenizer.model through Debian's libsentencepiece                 spm_tokenizer.h
//  - llama2.c tokenizer.bin                                            llama2c_tokenizer.h
//  - the vocabulary embedded in a GGUF file (tokenizer.ggml.*)         gguf_tokenizer.h
//
// Every error throws kvscope::Error "path: place: reason"; an unsupported feature is named.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

class GgufFile;

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Token ids of `utf8`. addSpecial applies the family's template (BOS for Llama-style models).
    // Throws kvscope::Error on text that is not valid UTF-8.
    virtual std::vector<int32_t> encode(const std::string& utf8, bool addSpecial) const = 0;
    // Text of `ids`; skipSpecial drops control tokens (BOS, EOS, ...). Throws on an id outside
    // the vocabulary.
    virtual std::string decode(const std::vector<int32_t>& ids, bool skipSpecial) const = 0;

    virtual int vocabSize() const = 0;
    virtual int32_t bosId() const = 0;  // -1 when the family has none
    virtual int32_t eosId() const = 0;  // -1 when unknown; generation stops on it
    // Id of a special / added token spelled exactly `text` ("<|im_start|>"), or -1.
    virtual int32_t specialId(const std::string& text) const = 0;
    // Short human description: "byte-level BPE (tokenizer.json)", "SentencePiece (tokenizer.model)".
    virtual std::string description() const = 0;
};

// Opens a tokenizer file (tokenizer.json, tokenizer.model, llama2.c tokenizer.bin) or a model
// folder (tokenizer.json preferred over tokenizer.model). expectedVocab > 0 is checked against
// formats that do not store their size (tokenizer.bin). eosHint >= 0 overrides the EOS id (from a
// model's config.json).
std::unique_ptr<Tokenizer> loadTokenizer(const std::string& path, int expectedVocab = 0,
                                         int32_t eosHint = -1);

// The tokenizer embedded in a GGUF file: tokenizer.ggml.model "gpt2" (byte-level BPE with merges
// and the pre-tokenizer named by tokenizer.ggml.pre) or "llama" (SentencePiece with scores).
std::unique_ptr<Tokenizer> tokenizerFromGguf(const GgufFile& file);

}  // namespace kvscope
