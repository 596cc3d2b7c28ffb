// Modelled target hardware: the prefill rate, KV decode rate and weight-read floor of a GPU
// serving a 7B/8B model, so that a TTFT measured on this machine can be restated for that target.
#pragma once

#include "kv/kv_set.h"

#include <string>
#include <vector>

namespace kvscope {

struct TargetHardware {
    std::string name;                   // preset name, or "custom"; empty when measured here
    double prefillTokensPerSecond = 0;  // recompute and question prefill
    double decodeGBps = 0;              // KV decode, GB of fp16 KV per second
    // The least any forward pass takes: reading the fp16 weights once at HBM bandwidth. A pass
    // over a few tokens (the question) is memory-bound and takes this long; a long chunk's
    // recompute is compute-bound (tokens / prefillTokensPerSecond). Modelled passes take the
    // larger of the two (a roofline); < 0: no floor.
    double weightPassSeconds = -1;
    // fp16 KV bytes per token of the target's model (layers x 2 x KV heads x head dim x 2 bytes);
    // 0: the served model's own. Modelled decode is charged for these bytes, and kvLinkScale()
    // tells a caller how to slow the link so that the served model's (smaller) chunks take as long
    // as the target model's would.
    double kvBytesPerToken = 0;
    std::string citation;               // where the preset's figures come from
    bool enabled() const { return prefillTokensPerSecond > 0 || decodeGBps > 0; }
};
// "a100-7b", "h100-8b" (see target.cpp for the figures and their sources); throws
// kvscope::Error "--target: ..." for other names.
TargetHardware targetPreset(const std::string& name);
std::vector<std::string> targetPresetNames();
// A modelled forward pass over `tokens` tokens on the target (prefillTokensPerSecond > 0): the
// larger of its compute (tokens / prefill rate) and one read of the weights (weightPassSeconds).
double modelledPassSeconds(const TargetHardware& target, int tokens);
// The factor to multiply a link's rates by so that a chunk of the served model (fp16 KV of
// servedBytesPerToken per token) crosses it in the time the same chunk of the target's model
// would take on the unscaled link: servedBytesPerToken / target.kvBytesPerToken, every codec
// being assumed to shrink both models' KV by the same ratio. 1 when the target names no KV size.
double kvLinkScale(const TargetHardware& target, double servedBytesPerToken);
// Bytes of fp16 KV one token takes in a cache of this shape: K and V of every layer, 2 bytes a value.
double fp16KvBytesPerToken(const KvShape& shape);

}  // namespace kvscope
