// The transform codec's default profile for a model: a shipped ladder of levels, calibrated on
// first use with the user's own checkpoint.
//
// READ ME FIRST
//  - The ladder (samples/profiles/<name>.transform.json whose model_fingerprint is the model's, else
//    samples/profiles/generic.transform.json for any model) holds the switches, the levels (water
//    levels chosen on tune genres, judged on genres they never saw) and "calibration.contexts":
//    the sample contexts (samples/contexts) the transform is fitted on, a generic corpus of other
//    genres than the held-out suites.
//  - The calibrated model (means, weights, PCA basis, tables: a few MB per model) is not shipped.
//    It is fitted once from those contexts (prefill, then fitTransform) and cached as a complete
//    profile in $XDG_CACHE_HOME/kvscope/profiles/<fingerprint>.transform.json. The fit is
//    deterministic for a given checkpoint, corpus and CPU path; a cached profile whose ladder
//    differs from the shipped one (a newer release) is refitted.
//  - Commands that hold a model (eval, stream, demo, the GUI) calibrate when the cache lacks it;
//    commands that read only a KV file (encode, bench) use the cached profile when it is there
//    and otherwise the uncalibrated transform (statistics from the cache itself).
#pragma once

#include "codec/profile.h"

#include <functional>
#include <string>
#include <vector>

namespace kvscope {

class Model;

struct DefaultTransform {
    std::string ladderPath;             // the shipped ladder this model uses
    std::string cachePath;              // where its calibrated profile lives (may not exist yet)
    std::vector<std::string> contexts;  // calibration sample ids
    std::string ladderDigest;           // of the ladder's levels and switches (refit when it changes)
    CodecProfile ladder;                // the shipped ladder as read from ladderPath
};

// The ladder for a model fingerprint (its own, else the generic one). Throws kvscope::Error when
// the samples or the ladder are missing or malformed.
DefaultTransform findDefaultTransform(const std::string& fingerprint);

// The cached calibrated profile's path when it exists and matches the shipped ladder, else "".
std::string cachedDefaultTransform(const std::string& fingerprint);
// The same for a ladder already found: d.cachePath when it holds a fit of d's ladder for this
// fingerprint, else "" (the ladder's default level, adapt_mean and measured figures are copied
// into the cache when they changed). These three need no model (transform_default.cpp).
std::string usableDefaultTransform(const DefaultTransform& d, const std::string& fingerprint);

// The calibrated profile's path: the cache when it matches, else fitted now (transform_default_fit.cpp) with `model` on the
// ladder's contexts and written (atomically) to the cache. `log` receives progress lines;
// `prefill` (done, total) the tokens of each context's prefill, and returning false cancels it
// (kvscope::Error, nothing written).
std::string ensureDefaultTransform(const Model& model, const std::function<void(const std::string&)>& log = {},
                                   const std::function<bool(int done, int total)>& prefill = {});

}  // namespace kvscope
