// libFuzzer target for codec profiles (core/codec/profile.h profileFromJson, from memory), and for
// what the codec does with a profile it accepted: write it back, read that again (the round trip
// must give the same text) and turn every level into LMCache's layer ranges.
//
// Contract: profileFromJson either returns a validated profile or throws kvscope::Error. Only
// kvscope::Error is caught; a round trip that changes the profile aborts.
#include "codec/profile.h"
#include "common/error.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

using namespace kvscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    CodecProfile p;
    try {
        p = profileFromJson(std::string(reinterpret_cast<const char*>(data), size), "profile.json");
    } catch (const Error&) {
        return 0;
    }
    const std::string text = profileToJson(p);
    const CodecProfile again = profileFromJson(text, "round trip");  // must not throw
    if (profileToJson(again) != text) std::abort();
    for (const CodecLevel& l : p.levels) {
        toLayerRanges(l.keyBins);
        toLayerRanges(l.valueBins);
        lmcacheConfigPython(l);
    }
    return 0;
}
