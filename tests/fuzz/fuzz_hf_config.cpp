// libFuzzer target for config.json (core/modelio/hf_config.h parseHfConfig, from memory).
//
// Contract: parseHfConfig either returns a ModelConfig or throws kvscope::Error. Only
// kvscope::Error is caught.
#include "common/error.h"
#include "modelio/hf_config.h"

#include <cstddef>
#include <cstdint>
#include <string>

using namespace kvscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    try {
        const ModelConfig c = parseHfConfig(std::string(reinterpret_cast<const char*>(data), size), "config.json");
        isSupportedArchitecture(c.architecture);
    } catch (const Error&) {
    }
    return 0;
}
