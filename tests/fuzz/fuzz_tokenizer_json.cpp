// libFuzzer target for tokenizer.json (core/modelio/bpe_tokenizer.h): the model (BPE vocab and
// merges), added tokens, normalizer, pre-tokenizer, decoder and post-processor sections, then an
// encode and decode round with the tokenizer built from them.
//
// Contract: fromJsonFile either builds a tokenizer or throws kvscope::Error; encode and decode
// either answer or throw kvscope::Error. Only kvscope::Error is caught.
#include "common/error.h"
#include "fuzz_util.h"
#include "modelio/bpe_tokenizer.h"

#include <cstddef>
#include <cstdint>

using namespace kvscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    static fuzz::MemFile file("fuzz-tokenizer.json");
    const std::string& path = file.write(data, size);
    try {
        BpeTokenizer t = BpeTokenizer::fromJsonFile(path);
        t.vocabSize();
        t.bosId();
        t.specialId("<|endoftext|>");
        const auto ids = t.encode("Hello world! <s>caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd  12345\n\tx", true);
        t.decode(ids, false);
        t.decode(ids, true);
    } catch (const Error&) {
    }
    return 0;
}
