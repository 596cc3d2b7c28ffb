// Which level-coded encoding `kvscope-cli stream` and the GUI's race stream when the user names
// neither --codec nor --profile (issue 32).
//
// The rule: the transform codec's calibrated ladder when the model has a ladder of its own
// (samples/profiles/<name>.transform.json with its fingerprint: levels tuned and measured on that
// model, eval/transform_default.h), else CacheGen's three levels. The generic ladder is not used
// here: its levels were never measured on the model, so the planner would order them by size only.
#pragma once

#include "codec/chunk_codec.h"

#include <functional>
#include <string>

namespace kvscope {

class Model;

struct StreamCodecChoice {
    CodecId codec = CodecId::CacheGen;
    std::string profilePath;  // the calibrated ladder (transform), "" for CacheGen's default levels
    std::string reason;       // one sentence: why this encoding
};

// The ladder of the model with this fingerprint when it has its own ("" and why not otherwise).
// Needs no model; never throws (missing samples are a reason, not an error).
std::string ownTransformLadder(const std::string& fingerprint, std::string* why);

// The choice for `model`: ownTransformLadder's, calibrated now when the profile cache lacks it
// (ensureDefaultTransform; `log` gets its progress lines). A failed calibration throws
// kvscope::Error: the user asked for nothing else, so a silent fallback would hide it.
StreamCodecChoice defaultStreamCodec(const Model& model, const std::function<void(const std::string&)>& log = {});

}  // namespace kvscope
