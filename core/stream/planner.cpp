#include "stream/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace kvscope {

void ThroughputEstimator::add(double measured, double predicted)
{
    if (!(measured > 0) || !std::isfinite(measured)) return;
    m_samples.push_back(measured);
    if (predicted > 0) m_errors.push_back(std::abs(predicted - measured) / measured);
    while (int(m_samples.size()) > kHistory) m_samples.pop_front();
    while (int(m_errors.size()) > kHistory) m_errors.pop_front();
}

double ThroughputEstimator::harmonicMean() const
{
    if (m_samples.empty()) return 0;
    double inv = 0;
    for (double s : m_samples) inv += 1.0 / s;
    return double(m_samples.size()) / inv;
}

double ThroughputEstimator::maxRecentError() const
{
    double e = 0;
    for (double x : m_errors) e = std::max(e, x);
    return e;
}

double ThroughputEstimator::estimate() const
{
    return valid() ? harmonicMean() / (1.0 + maxRecentError()) : 0.0;
}

PlanResult planChunks(const PlanInput& in)
{
    PlanResult best;
    const int n = int(in.chunks.size());
    if (n == 0) return best;
    const int choices = int(in.distortion.size());
    const int h = std::max(1, std::min(in.horizon, n));
    const double thr = std::max(in.throughput, 1.0);
    const double earliestReply = in.now + in.rtt;

    double bestTtft = std::numeric_limits<double>::infinity(), bestDist = bestTtft;
    bool bestFeasible = false;
    std::vector<int> plan(size_t(n), 1);

    // One chunk's step of the timeline.
    auto step = [&](int j, int c, double& link, double& worker, double& dist) {
        const PlanChunk& ch = in.chunks[size_t(j)];
        double arrival = in.now;  // nothing to fetch (text from the client's own tokens)
        if (ch.bytes[size_t(c)] > 0) arrival = link = std::max(link, earliestReply) + ch.bytes[size_t(c)] / thr;
        const double job = double(ch.tokens) * (c == 0 ? in.recomputeSecondsPerToken : in.decodeSecondsPerToken);
        worker = std::max(worker, arrival) + job;
        dist += double(ch.tokens) * in.distortion[size_t(c)];
    };
    std::function<void(int, double, double, double)> dfs = [&](int j, double link, double worker, double dist) {
        if (j == h) {
            // The chunks after the horizon repeat its last choice.
            const int last = plan[size_t(h - 1)];
            for (int k = h; k < n; ++k) {
                step(k, last, link, worker, dist);
                plan[size_t(k)] = last;
            }
            const double ttft = worker + in.tailSeconds;
            const bool feasible = ttft <= in.slo;
            bool better;
            if (feasible != bestFeasible) better = feasible;
            else if (feasible) better = dist < bestDist - 1e-15 || (std::abs(dist - bestDist) <= 1e-15 && ttft < bestTtft);
            else better = ttft < bestTtft;
            if (better) {
                bestFeasible = feasible;
                bestTtft = ttft;
                bestDist = dist;
                best.plan = plan;
            }
            return;
        }
        for (int c = in.allowText ? 0 : 1; c < choices; ++c) {
            double l = link, w = worker, d = dist;
            step(j, c, l, w, d);
            plan[size_t(j)] = c;
            dfs(j + 1, l, w, d);
        }
    };
    dfs(0, std::max(in.now, in.linkBusyUntil), std::max(in.now, in.workerBusyUntil), 0.0);
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
    bool measured = measuredKl.size() == levels && levels > 0;
    for (double k : measuredKl) measured = measured && k > 0 && std::isfinite(k);
    for (size_t l = 0; l < levels; ++l)
        d[l + 1] = measured ? measuredKl[l] : std::pow(4.0, -(l < bitsPerValue.size() ? bitsPerValue[l] : 0.0));
    if (source) *source = measured ? "profile mean_kl" : "fallback 4^-bpv";
    return d;
}

}  // namespace kvscope
