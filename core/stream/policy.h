// Streaming policies: how the streamer chooses each chunk's level (adaptive, text recompute,
// int8, or one fixed level), their command-line spelling, and the oracle a policy is judged
// against.
#pragma once

#include <string>
#include <vector>

namespace kvscope {

struct Policy {
    enum Kind { Adaptive, Text, Int8, Level } kind = Adaptive;
    int level = 0;  // Level only, 1-based
    std::string name() const;  // "adaptive", "text", "int8", "level:2"
};
// "adaptive", "text", "int8", "level:N"; throws kvscope::Error "--policy: ..." otherwise.
Policy parsePolicy(const std::string& text);

// The oracle of one run (issue 32): the fixed level with the lowest KL among those that met the
// SLO on that run's link. `stream` finds the outcomes by replaying the run's link offset once per
// fixed level (the same schedule from the same start, a fresh connection each time).
struct LevelOutcome {
    int level = 0;         // 1-based
    bool sloMet = false;
    double kl = -1;        // of the assembled cache; < 0 when not measured
};
struct Oracle {
    int level = 0;         // 0: no fixed level met the SLO with a measured KL
    double kl = -1;
};
// Ties in KL go to the lower level (fewer bytes on the link).
Oracle oracleOf(const std::vector<LevelOutcome>& outcomes);

}  // namespace kvscope
