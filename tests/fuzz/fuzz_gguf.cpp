// libFuzzer target for the GGUF reader (core/modelio/gguf.h): header, metadata, tensor infos, the
// dequantizers of the supported types, and the tokenizer built from tokenizer.ggml.* metadata.
//
// Contract: GgufFile::open either opens the bytes or throws kvscope::Error; every accessor and
// readTensorF32 either answers or throws kvscope::Error. Only kvscope::Error is caught.
#include "common/error.h"
#include "fuzz_util.h"
#include "modelio/gguf.h"
#include "modelio/tokenizer.h"

#include <cstddef>
#include <cstdint>

using namespace kvscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    static fuzz::MemFile file("fuzz-gguf");
    const std::string& path = file.write(data, size);
    try {
        GgufFile g = GgufFile::open(path);
        for (const std::string& k : g.keys()) {
            const std::string t = g.typeName(k);
            try {
                if (t == "string") g.getString(k);
                else if (t == "array[string]") g.getStringArray(k);
                else if (t.rfind("array", 0) == 0) {
                    g.arrayLength(k);
                    try { g.getIntArray(k); } catch (const Error&) {}
                    g.getFloatArray(k);
                } else if (t == "bool") g.getBool(k);
                else {
                    g.getFloat(k);
                    g.getInt(k);
                }
            } catch (const Error&) {
            }
        }
        for (const GgufTensorInfo& t : g.tensors()) {
            if (t.elements() > (uint64_t(1) << 20)) continue;  // bounded work per input
            try { g.readTensorF32(t); } catch (const Error&) {}
        }
        if (g.has("tokenizer.ggml.model")) {
            auto tok = tokenizerFromGguf(g);
            const auto ids = tok->encode("Hello, world! 123", true);
            tok->decode(ids, false);
        }
    } catch (const Error&) {
    }
    return 0;
}
