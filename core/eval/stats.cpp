#include "eval/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace kvscope {

Interval wilsonInterval(uint64_t k, uint64_t n, double z)
{
    if (n == 0) return {0.0, 1.0};
    const double nn = double(n), p = double(k) / nn, z2 = z * z;
    const double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
    const double half = z / (1 + z2 / nn) * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
    return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

double mcnemarExactP(uint64_t b, uint64_t c)
{
    const uint64_t n = b + c;
    if (n == 0) return 1.0;
    const uint64_t k = std::min(b, c);
    // P[X <= k] for X ~ Binomial(n, 1/2), summed in log space so large n does not underflow terms.
    double tail = 0.0;
    for (uint64_t i = 0; i <= k; ++i) {
        const double logTerm = std::lgamma(double(n) + 1) - std::lgamma(double(i) + 1) - std::lgamma(double(n - i) + 1) -
                               double(n) * std::log(2.0);
        tail += std::exp(logTerm);
    }
    return std::min(1.0, 2.0 * tail);
}

Interval bootstrapInterval(size_t n, const std::function<double(const std::vector<size_t>&)>& statistic, int resamples,
                           uint64_t seed, double alpha)
{
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (n == 0 || resamples < 1) return {nan, nan};
    std::mt19937_64 rng(seed);
    std::vector<size_t> units(n);
    std::vector<double> stats;
    stats.reserve(size_t(resamples));
    for (int r = 0; r < resamples; ++r) {
        for (size_t i = 0; i < n; ++i) units[i] = size_t(rng() % n);
        const double s = statistic(units);
        if (std::isfinite(s)) stats.push_back(s);
    }
    if (stats.empty()) return {nan, nan};
    std::sort(stats.begin(), stats.end());
    auto quantile = [&](double q) {
        const double pos = q * double(stats.size() - 1);
        const size_t lo = size_t(std::floor(pos));
        const size_t hi = std::min(stats.size() - 1, lo + 1);
        return stats[lo] + (pos - double(lo)) * (stats[hi] - stats[lo]);
    };
    return {quantile(alpha / 2), quantile(1 - alpha / 2)};
}

Interval bootstrapMean(const std::vector<double>& values, int resamples, uint64_t seed)
{
    return bootstrapInterval(
        values.size(),
        [&](const std::vector<size_t>& units) {
            double s = 0.0;
            for (size_t u : units) s += values[u];
            return s / double(units.size());
        },
        resamples, seed);
}

}  // namespace kvscope
