// Tuning of the transform codec's water levels (`kvscope-cli tune --codec transform`): the two
// relative levels t_key, t_value and a factor per (kind, layer), learnt on tuning contexts under
// quality budgets, one profile level per budget.
//
// READ ME FIRST — the method (the codec's math is in codec/transform.h).
//  1. Fit: the transform (means, bases, variances lambda_j) is fitted once on the tuning caches;
//     every candidate level below reuses it (fitTransformLevel: steps and counted tables).
//  2. Sensitivity: the whole cache is coded at the probe level (every block at theta_u = probe
//     multiple of the base level); then each block u = (kind, layer) alone is put back into the
//     original cache and the continuation scored: KL_u. The block's weighted distortion per token
//     is known from the water-filling model, D_u = sum_j min(lambda_j, theta_u). With KL second
//     order in small errors, KL ~ sum_u s_u D_u with s_u = KL_u / D_u (summed over contexts).
//  3. Per-layer levels. Minimising the rate sum_u sum_j max(0, 1/2 log2(lambda_j / theta_u)) under
//     sum_u s_u D_u(theta_u) <= budget gives, by the Lagrange condition on every coded component
//     (dR/dD = -1 / (2 ln 2 theta_u) = -mu s_u), theta_u = c / s_u: every block's water level is
//     inversely proportional to its sensitivity. Since s_u comes from one probe and the model is
//     approximate, the tuner interpolates in the log domain between the base shape (exponent 0:
//     t_key, t_value of the base level, factors 1) and the theory (exponent 1):
//       theta_u(alpha, m) = m * theta0_u^(1 - alpha) * (kappa / s_u)^alpha,
//     with kappa making the geometric mean of kappa / s_u equal that of theta0_u (so m means the
//     same for every alpha). A level is stored as t_kind = geometric mean over layers of
//     theta_u / lambda_bar_kind and layer_scale_u = theta_u / (t_kind lambda_bar_kind).
//  4. Search: for every alpha, the multiplier grid is measured from the coarsest m down (stopping
//     once the tightest budget is met): encode, decode and score every tuning context; pooled
//     delta PPL (or pooled KL, `metric`) over all continuation tokens. Per budget the candidate of
//     fewest bytes that meets it wins; `refine` bisection steps (geometric) between it and the next
//     coarser multiplier of the same alpha then look for a smaller one.
// Every reported figure is measured (tables counted on the tuning caches, as shipped); the final
// profile carries the model calibrated on the tuning caches with the chosen levels, smallest first.
#pragma once

#include "codec/chunk_codec.h"
#include "eval/layer_sensitivity.h"
#include "eval/quality.h"
#include "eval/tune.h"

#include <string>
#include <vector>

namespace kvscope {

struct TransformTuneOptions {
    CodecProfile base;  // transform switches and chunking; its levels and model are ignored
    TuneMetric metric = TuneMetric::DeltaPplPct;  // bounds the pooled value over the tuning contexts
    std::vector<double> budgets = {0.5, 1.0, 2.0};
    double keyTheta = 0.03, valueTheta = 0.003;  // the base level (exponent 0, multiplier 1)
    double probe = 3.0;                          // the sensitivity probe at probe x the base level
    // s_u below floor x the largest s_u is raised to it: a block whose KL the probe cannot resolve
    // still gets a finite water level. Lower it when the probe resolves the small blocks (their
    // KL_u well above zero): the late layers' values of SmolLM2 sit at 1e-3.
    double sensitivityFloor = 1e-3;
    std::vector<double> exponents = {0.0, 0.5, 1.0};
    std::vector<double> multipliers = {0.5, 0.71, 1.0, 1.41, 2.0, 2.83, 4.0};
    int refine = 2;
};

struct TransformTuneCandidate {
    double exponent = 0.0, multiplier = 1.0;
    uint64_t bytes = 0;
    double bitsPerValue = 0.0, deltaPplPct = 0.0, kl = 0.0;
};

struct TransformTunedLevel {
    double budget = 0.0;
    bool met = false;
    TransformLevel level;  // measuredJson filled
    TransformTuneCandidate figures;
    double ratioVsInt8 = 0.0;
};

struct TransformTuneResult {
    CodecProfile profile;  // transform levels from smallest to best, calibrated model
    // Pooled over contexts, one entry per layer: keyKl/valueKl = KL_u at the probe (summed over
    // contexts), keyRms/valueRms = s_u (KL per unit weighted distortion).
    std::vector<LayerSensitivity> sensitivity;
    std::vector<TransformTuneCandidate> candidates;  // every measured configuration, in order
    std::vector<TransformTunedLevel> levels;
};

// Throws kvscope::Error for no contexts, a context without continuation, contexts of different
// shapes, budgets not positive, an empty grid or a transform fit error.
TransformTuneResult tuneTransformProfile(const std::string& modelFingerprint, const std::vector<TuneContext>& contexts,
                                         const TransformTuneOptions& options, const TuneProgress& progress = {});

// The level of (alpha, multiplier) for a fit and sensitivities s[kind * L + layer] (exposed for tests).
TransformLevel transformLevelFor(const TransformFit& fit, const std::vector<double>& s, double keyTheta, double valueTheta,
                                 double alpha, double multiplier);

}  // namespace kvscope
