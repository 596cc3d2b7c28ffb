// Streaming policies: how the streamer chooses each chunk's level (adaptive, text recompute,
// int8, or one fixed level) and their command-line spelling.
#pragma once

#include <string>

namespace kvscope {

struct Policy {
    enum Kind { Adaptive, Text, Int8, Level } kind = Adaptive;
    int level = 0;  // Level only, 1-based
    std::string name() const;  // "adaptive", "text", "int8", "level:2"
};
// "adaptive", "text", "int8", "level:N"; throws kvscope::Error "--policy: ..." otherwise.
Policy parsePolicy(const std::string& text);

}  // namespace kvscope
