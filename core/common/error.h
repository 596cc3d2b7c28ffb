// Two channels, never mixed:
//  - bad input (a corrupt file, a malformed profile, an impossible option) throws kvscope::Error
//    whose message names the file, the place and the reason; callers show it as one line;
//  - a broken internal invariant is a bug: KVSCOPE_ASSERT aborts with the location.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace kvscope {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// "file: place: reason" — the one-line shape every input error takes.
inline Error inputError(const std::string& file, const std::string& place, const std::string& reason)
{
    std::string msg = file;
    if (!place.empty()) msg += (msg.empty() ? "" : ": ") + place;
    msg += (msg.empty() ? "" : ": ") + reason;
    return Error(msg);
}

}  // namespace kvscope

#define KVSCOPE_ASSERT(cond)                                                                     \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            std::fprintf(stderr, "kvscope: internal error: %s at %s:%d\n", #cond, __FILE__,      \
                         __LINE__);                                                              \
            std::abort();                                                                        \
        }                                                                                        \
    } while (0)
