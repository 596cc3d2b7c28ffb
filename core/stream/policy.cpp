#include "stream/policy.h"

#include "common/error.h"

#include <cstdlib>

namespace kvscope {

std::string Policy::name() const
{
    switch (kind) {
    case Adaptive: return "adaptive";
    case Text: return "text";
    case Int8: return "int8";
    case Level: return "level:" + std::to_string(level);
    }
    return "?";
}

Policy parsePolicy(const std::string& text)
{
    Policy p;
    if (text == "adaptive") p.kind = Policy::Adaptive;
    else if (text == "text") p.kind = Policy::Text;
    else if (text == "int8") p.kind = Policy::Int8;
    else if (text.rfind("level:", 0) == 0) {
        p.kind = Policy::Level;
        const std::string n = text.substr(6);
        char* end = nullptr;
        const long v = std::strtol(n.c_str(), &end, 10);
        if (n.empty() || *end || v < 1 || v > 64) throw inputError("--policy", "'" + text + "'", "level:N needs N in 1..64");
        p.level = int(v);
    } else {
        throw inputError("--policy", "'" + text + "'", "expected adaptive, text, int8 or level:N");
    }
    return p;
}

Oracle oracleOf(const std::vector<LevelOutcome>& outcomes)
{
    Oracle best;
    for (const LevelOutcome& o : outcomes) {
        if (!o.sloMet || o.kl < 0) continue;
        if (best.level == 0 || o.kl < best.kl || (o.kl == best.kl && o.level < best.level)) {
            best.level = o.level;
            best.kl = o.kl;
        }
    }
    return best;
}

}  // namespace kvscope
