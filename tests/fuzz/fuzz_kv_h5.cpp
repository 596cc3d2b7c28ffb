// libFuzzer target for the HDF5 KV reader's validation (core/kvio/kv_h5.h): the input is written to
// an in-memory file and read with readKvH5Info (root attributes) and readKvH5 (attributes, shapes,
// dtypes, then the tensors). HDF5 itself is not instrumented: what this covers is kvscope's checks
// of what the library returns, and that a malformed file gives a kvscope::Error, not a crash.
//
// Contract: both readers either succeed or throw kvscope::Error. Only kvscope::Error is caught.
#include "common/error.h"
#include "fuzz_util.h"
#include "kvio/kv_h5.h"

#include <cstddef>
#include <cstdint>

using namespace kvscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    static fuzz::MemFile file("fuzz-kv.h5");
    const std::string& path = file.write(data, size);
    try {
        readKvH5Info(path);
    } catch (const Error&) {
    }
    try {
        readKvH5(path);
    } catch (const Error&) {
    }
    return 0;
}
