// libFuzzer target for the safetensors reader (core/modelio/safetensors.h): the 8-byte header
// length, the JSON header (dtypes, shapes, offsets, __metadata__) and the F32/F16/BF16 reads; and
// the same bytes as model.safetensors.index.json for safetensorsShards().
//
// Contract: open and safetensorsShards either succeed or throw kvscope::Error; readF32 and raw of
// every tensor either answer or throw kvscope::Error. Only kvscope::Error is caught.
#include "common/error.h"
#include "fuzz_util.h"
#include "modelio/safetensors.h"

#include <cstddef>
#include <cstdint>

using namespace kvscope;

namespace {

// A checkpoint folder whose index the input replaces. Two shard files exist (named as
// Hugging Face names them) so that an index naming them gets past the existence check.
const fuzz::TempDir& folder()
{
    static const fuzz::TempDir* dir = [] {
        auto* d = new fuzz::TempDir;
        const uint8_t empty[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
        d->write("model-00001-of-00002.safetensors", empty, sizeof empty);
        d->write("model-00002-of-00002.safetensors", empty, sizeof empty);
        std::atexit([] { delete dir; });
        return d;
    }();
    return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    static fuzz::MemFile file("fuzz-safetensors");
    const std::string& path = file.write(data, size);
    try {
        SafetensorsFile f = SafetensorsFile::open(path);
        f.metadata();
        for (const SafetensorsTensor& t : f.tensors()) {
            f.find(t.name);
            f.raw(t);
            try { f.readF32(t); } catch (const Error&) {}
        }
    } catch (const Error&) {
    }
    // The index: only when the input looks like JSON, so that this half costs a file write only
    // for inputs that can reach its parser.
    if (size > 0 && data[0] == '{') {
        folder().write("model.safetensors.index.json", data, size);
        try { safetensorsShards(folder().path()); } catch (const Error&) {}
    }
    return 0;
}
