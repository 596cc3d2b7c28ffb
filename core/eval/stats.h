// Intervals and paired tests for the quality suite (suite.h): what turns a handful of
// questions into a claim with its uncertainty.
//  - Wilson score interval for a proportion k/n (accuracy, exact match): well behaved at 0, n
//    and small n, unlike the normal approximation.
//  - Percentile bootstrap with a fixed seed (deterministic on every platform: std::mt19937_64 is
//    specified bit for bit, and indices are drawn as rng() % n, not through a distribution).
//  - Exact McNemar test on paired outcomes: only the discordant pairs count, and under the null
//    each one goes either way with probability 1/2, so the two-sided p-value is a binomial tail.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace kvscope {

struct Interval {
    double low = 0.0, high = 0.0;
};

// 95% (z = 1.959964) Wilson interval of k successes in n trials; [0, 1] when n is 0.
Interval wilsonInterval(uint64_t k, uint64_t n, double z = 1.959963984540054);

// Two-sided exact McNemar p-value for b pairs (reference right, candidate wrong) and c pairs
// (reference wrong, candidate right): min(1, 2 * P[X <= min(b, c)]) with X ~ Binomial(b + c, 1/2).
// 1 when there is no discordant pair.
double mcnemarExactP(uint64_t b, uint64_t c);

// Percentile bootstrap of `statistic` over n units: `resamples` draws of n unit indices with
// replacement; the interval is the (alpha/2, 1 - alpha/2) quantiles of the statistic (linear
// interpolation between order statistics). With n == 0 the interval is {NaN, NaN}.
Interval bootstrapInterval(size_t n, const std::function<double(const std::vector<size_t>& units)>& statistic,
                           int resamples = 1000, uint64_t seed = 20240601, double alpha = 0.05);

// Bootstrap interval of the mean of `values` (the common case).
Interval bootstrapMean(const std::vector<double>& values, int resamples = 1000, uint64_t seed = 20240601);

}  // namespace kvscope
