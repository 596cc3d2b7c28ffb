// Auto-tuning of a CacheGen profile for one model: per-layer bins (K and V apart) that minimise
// size under quality budgets, one profile level per budget (`kvscope-cli tune`).
//
// READ ME FIRST — the method, in four steps over several tuning contexts:
//  1. Sensitivity: each layer's K and V is quantized alone at `probeBins` and scored
//     (sensitivity.h): KL_i(probe) per tensor i, per context.
//  2. Rate and error per bins choice: the cache is encoded once per bins choice b with every layer
//     at b; that gives each tensor's bytes_i(b) (from the chunk layout) and its reconstruction RMS
//     error rms_i(b). The distortion model is KL_i(b) = KL_i(probe) * (rms_i(b) / rms_i(probe))^2:
//     KL is second order in small perturbations, and the RMS ratio captures clamping and delta
//     coding that a step-size formula would miss.
//  3. Allocation: for a Lagrange multiplier lambda every tensor takes the b minimising
//     bytes_i(b) + lambda * KL_i(b) (summed over contexts); a log grid of lambdas gives a chain of
//     configurations from smallest to best.
//  4. Verification: for each budget, a binary search along that chain measures real configurations
//     (encode, decode, score every context) and keeps the smallest one whose worst-context
//     delta_ppl_pct, or worst-context KL (`metric`), and, when asked, mean token agreement, meets
//     the budget. The model only orders
//     candidates; every level's reported size and quality are measured.
// Levels come out ordered from smallest (loosest budget) to best, as profiles expect. With
// TableMode::Shared the final levels carry tables calibrated on all tuning caches.
#pragma once

#include "codec/chunk_codec.h"
#include "eval/quality.h"
#include "eval/sensitivity.h"

#include <functional>
#include <string>
#include <vector>

namespace kvscope {

struct TuneContext {
    std::string name;
    const QualityReference* ref = nullptr;  // must have a continuation
    const KvSet* kv = nullptr;              // the original cache of ref's context
};

// Throws unless there is at least one context, each with a cache and a continuation to score, all
// of one model's shape (both tuners start with this).
void checkTuneContexts(const std::vector<TuneContext>& contexts);

// What a budget bounds, on the worst tuning context. delta_ppl_pct is what users quote, but below
// about 0.5 % it is within the noise of a few hundred scored tokens; KL (nats per token) keeps
// ordering configurations there.
enum class TuneMetric { DeltaPplPct, Kl };
const char* tuneMetricName(TuneMetric m);  // "delta_ppl_pct" | "kl"

struct TuneOptions {
    CodecProfile base;  // chunking, delta coding, quantizers, table mode; its levels are ignored
    TuneMetric metric = TuneMetric::DeltaPplPct;
    std::vector<double> budgets = {0.5, 1.0, 2.0, 5.0};  // in `metric`'s unit, one level each
    double minAgreement = 0.0;  // also require mean token agreement >= this (0: not checked)
    std::vector<int> binChoices = {4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128};
    int probeBins = 8;
    int lambdaSteps = 48;  // points on the lambda grid
};

struct TunedLevel {
    double budget = 0.0;            // in the options' metric
    bool met = false;               // false: even the best candidate missed the budget
    CodecLevel level;               // bins per layer, measuredJson filled
    uint64_t bytes = 0;             // summed over the tuning contexts
    double bitsPerValue = 0.0;      // over all tuning contexts' values
    double ratioVsInt8 = 0.0;
    double meanDeltaPplPct = 0.0, maxDeltaPplPct = 0.0, maxAbsDeltaPplPct = 0.0, meanKl = 0.0, maxKl = 0.0, meanAgreement = 1.0;
};

struct TuneResult {
    CodecProfile profile;  // levels from smallest to best; fingerprint and budgets recorded
    std::vector<std::vector<LayerSensitivity>> sensitivity;  // per context
    std::vector<TunedLevel> levels;                          // same order as profile.levels
    int measuredCandidates = 0;                              // real configurations scored
};

// Stage names passed to progress: "sensitivity", "rates", "search", "final". Returning false
// cancels (throws kvscope::Error "cancelled").
using TuneProgress = std::function<bool(const std::string& stage, int done, int total)>;

// Throws kvscope::Error for no contexts, a context without continuation, contexts of different
// models (layer/head shapes), budgets not positive, bins outside 4..256 or odd.
TuneResult tuneProfile(const std::string& modelFingerprint, const std::vector<TuneContext>& contexts,
                       const TuneOptions& options, const TuneProgress& progress = {});

}  // namespace kvscope
