// libFuzzer target for link schedules (core/transport/link.h): Mahimahi traces (LinkSchedule::
// loadTrace) and --bandwidth texts (LinkSchedule::parse), then the schedule's arithmetic that the
// pacer relies on: capacity over intervals, the time to carry a number of bytes, the mean rate.
//
// The first byte chooses the reader ('t' or anything else: trace; 'b': bandwidth text), the rest
// is the text. Contract: the readers either return a schedule or throw kvscope::Error; for a
// schedule, capacityBytes is never negative, never decreases as the interval grows, and
// capacityBytes(0, timeForBytes(0, c)) >= c (to a relative 1e-9). Only kvscope::Error is caught;
// a broken property aborts.
#include "common/error.h"
#include "fuzz_util.h"
#include "transport/link.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

using namespace kvscope;

namespace {

void check(bool ok)
{
    if (!ok) std::abort();
}

void exercise(const LinkSchedule& s)
{
    s.describe();
    const double mean = s.meanBytesPerSecond();
    check(std::isfinite(mean) && mean > 0);
    double last = 0;
    for (double t1 : {0.0005, 0.001, 0.01, 0.1, 1.0, 2.5, 10.0}) {
        const double c = s.capacityBytes(0.0, t1);
        check(c >= 0 && std::isfinite(c) && c >= last);
        last = c;
        // timeForBytes is the earliest time by which the link carried c bytes. Checked in bytes, to
        // a relative 1e-9: in seconds, one ulp of a large cumulative count at a slow later rate is
        // arbitrarily long.
        const double t = s.timeForBytes(0.0, c);
        check(std::isfinite(t) && s.capacityBytes(0.0, t) >= c * (1 - 1e-9));
        const double shifted = s.capacityBytes(0.3, 0.3 + t1);
        check(shifted >= 0 && std::isfinite(shifted));
    }
    check(s.timeForBytes(1.0, 0) == 1.0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    static fuzz::MemFile file("fuzz-trace");
    if (size == 0) return 0;
    const char mode = char(data[0]);
    try {
        if (mode == 'b') {
            exercise(LinkSchedule::parse(std::string(reinterpret_cast<const char*>(data + 1), size - 1)));
        } else {
            const std::string& path = file.write(data + 1, size - 1);
            exercise(LinkSchedule::loadTrace(path, 1.0));
            exercise(LinkSchedule::loadTrace(path, 0.25));
        }
    } catch (const Error&) {
    }
    return 0;
}
