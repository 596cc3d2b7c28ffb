#include "transport/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace kvscope {

void ThroughputEstimator::add(double measured, double predicted)
{
    if (!(measured > 0) || !std::isfinite(measured)) return;
    m_samples.push_back(measured);
    while (int(m_samples.size()) > kHistory) m_samples.pop_front();
    const double actual = clamped(measured);
    // Only an over-prediction is an error (planner.h): a link faster than predicted costs quality, not the SLO.
    m_errors.push_back(predicted > actual ? std::min(kMaxError, (predicted - actual) / actual) : 0.0);
    while (int(m_errors.size()) > kHistory) m_errors.pop_front();
}

double ThroughputEstimator::median() const
{
    if (m_samples.empty()) return 0;
    std::vector<double> v(m_samples.begin(), m_samples.end());
    std::sort(v.begin(), v.end());
    return v[(v.size() - 1) / 2];
}

double ThroughputEstimator::clampTo(double sample, double m)
{
    return m > 0 ? std::clamp(sample, m / kBand, m * kBand) : sample;
}

double ThroughputEstimator::clamped(double sample) const { return clampTo(sample, median()); }

double ThroughputEstimator::harmonicMean() const
{
    if (m_samples.empty()) return 0;
    const double m = median();  // once: every sample is held to the same band
    double inv = 0;
    for (double s : m_samples) inv += 1.0 / clampTo(s, m);
    return double(m_samples.size()) / inv;
}

double ThroughputEstimator::maxRecentError() const
{
    // The newest error counts whole, the one a chunks older (kHistory - a) / kHistory of itself.
    double e = 0;
    const int n = int(m_errors.size());
    for (int i = 0; i < n; ++i) {
        const int age = n - 1 - i;
        e = std::max(e, m_errors[size_t(i)] * double(kHistory - age) / kHistory);
    }
    return e;
}

double firstReplySample(double bytes, double sent, double firstByte, double arrived)
{
    if (!(arrived > sent) || !(bytes > 0)) return 0;
    const double whole = bytes / (arrived - sent);  // a lower bound: the round trip and the setup included
    const double body = arrived > firstByte ? bytes / (arrived - firstByte) : std::numeric_limits<double>::infinity();
    return std::clamp(body, whole, ThroughputEstimator::kBand * whole);
}

void TailEstimator::add(double seconds)
{
    if (!(seconds >= 0) || !std::isfinite(seconds)) return;
    m_samples.push_back(seconds);
    while (int(m_samples.size()) > kHistory) m_samples.pop_front();
}

double TailEstimator::estimate() const
{
    if (m_samples.empty()) return 0;
    std::vector<double> v(m_samples.begin(), m_samples.end());
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ThroughputEstimator::estimate() const
{
    return estimate(kMaxError);
}

double ThroughputEstimator::estimate(double maxError) const
{
    return valid() ? harmonicMean() / (1.0 + std::clamp(maxRecentError(), 0.0, std::max(0.0, maxError))) : 0.0;
}

namespace {
constexpr int kMaxLeaves = 4096;  // level choices enumerated per split at most (bounds the horizon)
// Plans this close count as equal: TTFTs that differ only by rounding (a level that arrives while
// the worker is still busy costs no time), distortions relative to their size.
constexpr double kTtftTolerance = 1e-9;
constexpr double kDistTolerance = 1e-12;
}

PlanResult planChunks(const PlanInput& in)
{
    PlanResult best;
    const int n = int(in.chunks.size());
    if (n == 0) return best;
    const int choices = int(in.distortion.size());
    const int levels = choices - 1;
    const int textable = in.allowText ? std::clamp(in.textable, 0, n) : 0;
    const double thr = std::max(in.throughput, 1.0);
    const double earliestReply = in.now + in.rtt;
    const double worker0 = std::max(in.now, in.workerBusyUntil);

    double minLevelDist = std::numeric_limits<double>::infinity();
    for (int c = 1; c < choices; ++c) minLevelDist = std::min(minLevelDist, in.distortion[size_t(c)]);
    if (levels < 1) minLevelDist = 0;
    int horizon = std::max(1, in.horizon);
    if (levels > 1) {
        double leaves = 1;
        int h = 0;
        while (h < horizon && leaves * levels <= kMaxLeaves) {
            leaves *= levels;
            ++h;
        }
        horizon = std::max(1, h);
    }
    // suffixTokens[j]: weighted tokens of chunks j..n-1, for the distortion bound.
    auto weighted = [&](int j) { return double(in.chunks[size_t(j)].tokens) * std::max(0.0, in.chunks[size_t(j)].weight); };
    std::vector<double> suffixTokens(size_t(n) + 1, 0.0);
    for (int j = n - 1; j >= 0; --j) suffixTokens[size_t(j)] = suffixTokens[size_t(j) + 1] + weighted(j);

    // Plans are judged against `deadline`: the SLO, or in the second pass the stretched target.
    double deadline = in.slo;
    double bestTtft = std::numeric_limits<double>::infinity(), bestDist = bestTtft;
    bool bestFeasible = false;
    std::vector<int> plan(size_t(n), 1);

    auto consider = [&](double ttft, double dist, int k) {
        const bool feasible = ttft <= deadline + kTtftTolerance;
        bool better;
        const double distTol = kDistTolerance * std::max(1.0, std::abs(bestDist));
        if (feasible != bestFeasible) better = feasible;
        else if (feasible) better = dist < bestDist - distTol || (std::abs(dist - bestDist) <= distTol && ttft < bestTtft);
        else better = ttft < bestTtft - kTtftTolerance || (std::abs(ttft - bestTtft) <= kTtftTolerance && dist < bestDist - distTol);
        if (better) {
            bestFeasible = feasible;
            bestTtft = ttft;
            bestDist = dist;
            best.plan = plan;
            best.textChunks = k;
        }
    };
    // Neither distortion nor TTFT can shrink as a plan grows: a partial plan that already loses is cut.
    auto hopeless = [&](double partialTtft, double partialDist, int j, int m) {
        const double rest = (suffixTokens[size_t(j)] - suffixTokens[size_t(m)]) * minLevelDist;
        const double distTol = kDistTolerance * std::max(1.0, std::abs(bestDist));
        if (bestFeasible) return partialTtft > deadline + kTtftTolerance || partialDist + rest > bestDist + distTol;
        return partialTtft > deadline + kTtftTolerance && partialTtft > bestTtft + kTtftTolerance;
    };
    // One fetched chunk's step of the timeline.
    auto step = [&](int j, int c, double& link, double& worker, double& dist) {
        const PlanChunk& ch = in.chunks[size_t(j)];
        link = std::max(link, earliestReply) + ch.bytes[size_t(c)] / thr;
        worker = std::max(worker, link) + double(ch.tokens) * in.decodeSecondsPerToken;
        dist += weighted(j) * in.distortion[size_t(c)];
    };

    auto search = [&]() {
        for (int k = 0; k <= textable; ++k) {
            const int m = n - k;  // chunks fetched: the first m of the list
            // The k text chunks first (released now), then the decodes owed for the replies in flight.
            double worker = worker0, textDist = 0;
            for (int j = m; j < n; ++j) {
                worker += std::max(in.recomputeFloorSeconds, double(in.chunks[size_t(j)].tokens) * in.recomputeSecondsPerToken);
                textDist += weighted(j) * in.distortion[0];
                plan[size_t(j)] = 0;
            }
            for (const PlanJob& o : in.owed) worker = std::max(worker, o.release) + o.seconds;
            const double link0 = std::max(in.now, in.linkBusyUntil);
            if (m == 0 || levels < 1) {
                if (m == 0) consider(worker + in.tailSeconds, textDist, k);
                continue;
            }
            const int h = std::min(horizon, m);
            std::function<void(int, double, double, double)> dfs = [&](int j, double link, double w, double dist) {
                if (hopeless(w + in.tailSeconds, dist + textDist, j, m)) return;
                if (j == h) {
                    // The fetches after the horizon repeat its last level.
                    const int last = plan[size_t(h - 1)];
                    for (int q = h; q < m; ++q) {
                        step(q, last, link, w, dist);
                        plan[size_t(q)] = last;
                    }
                    consider(w + in.tailSeconds, dist + textDist, k);
                    return;
                }
                for (int c = 1; c < choices; ++c) {
                    double l = link, ww = w, d = dist;
                    step(j, c, l, ww, d);
                    plan[size_t(j)] = c;
                    dfs(j + 1, l, ww, d);
                }
            };
            dfs(0, link0, worker, 0.0);
        }
    };
    search();
    best.deadline = in.slo;
    if (!bestFeasible && in.overrunMargin > 0 && std::isfinite(bestTtft)) {
        // Nothing meets the SLO: among the plans whose remaining time is within overrunMargin of
        // the fastest's (or that finish by the target an earlier plan of this run stretched to,
        // when that is earlier and still reachable), the least distortion. Where the worker, not
        // the link, bounds the finish, every level finishes about as early, and the fastest plan's
        // level 1 buys nothing. The margin is of the time left, not of the TTFT: near the end of a
        // run a tenth of the TTFT would be most of the work left (measured: docs/streaming.md).
        const double fastest = bestTtft;
        const double stretched = in.now + (fastest - in.now) * (1.0 + in.overrunMargin);
        deadline = in.overrunDeadline >= fastest - kTtftTolerance ? std::min(stretched, in.overrunDeadline) : stretched;
        bestTtft = bestDist = std::numeric_limits<double>::infinity();
        search();
        best.deadline = deadline;
        bestFeasible = false;  // against the SLO
    }
    best.choice = best.plan.empty() ? 1 : best.plan.front();
    best.predictedTtft = bestTtft;
    best.distortion = bestDist;
    best.feasible = bestFeasible;
    return best;
}

std::vector<double> levelDistortion(const std::vector<double>& measuredKl, const std::vector<double>& bitsPerValue,
                                    std::string* source)
{
    const size_t levels = std::max(measuredKl.size(), bitsPerValue.size());
    std::vector<double> d(levels + 1, 0.0);
    auto bpv = [&](size_t l) { return l < bitsPerValue.size() ? bitsPerValue[l] : 0.0; };
    auto has = [&](size_t l) { return l < measuredKl.size() && measuredKl[l] > 0 && std::isfinite(measuredKl[l]); };
    std::vector<size_t> known;  // measured levels, in level order
    for (size_t l = 0; l < levels; ++l)
        if (has(l)) known.push_back(l);
    // Fewer than two measured points (or two at the same size) give no slope: the size fallback alone.
    bool usable = known.size() == levels && levels > 0;
    if (!usable && known.size() >= 2 && bitsPerValue.size() == levels) {
        usable = true;
        for (size_t i = 1; i < known.size(); ++i) usable = usable && bpv(known[i]) > bpv(known[i - 1]);
    }
    if (!usable) {
        for (size_t l = 0; l < levels; ++l) d[l + 1] = std::pow(4.0, -bpv(l));
        if (source) *source = "fallback 4^-bpv";
        return d;
    }
    std::string interpolated;
    for (size_t l = 0; l < levels; ++l) {
        if (has(l)) {
            d[l + 1] = measuredKl[l];
            continue;
        }
        // ln KL linear in bits per value between the measured levels around l (the nearest pair
        // at either end): a straight line in the rate-distortion law's coordinates.
        size_t hi = 1;
        while (hi + 1 < known.size() && bpv(known[hi]) < bpv(l)) ++hi;
        const size_t a = known[hi - 1], b = known[hi];
        double slope = (std::log(measuredKl[b]) - std::log(measuredKl[a])) / (bpv(b) - bpv(a));
        if (!(slope < 0)) slope = -std::log(4.0);  // noisy figures that rise with size: the law's slope keeps the order
        d[l + 1] = std::exp(std::log(measuredKl[a]) + slope * (bpv(l) - bpv(a)));
        interpolated += (interpolated.empty() ? "" : ",") + std::to_string(l + 1);
    }
    if (source)
        *source = interpolated.empty() ? "profile mean_kl"
                                       : "profile mean_kl; levels " + interpolated +
                                             " interpolated (ln KL linear in bits per value through the measured levels)";
    return d;
}

}  // namespace kvscope
