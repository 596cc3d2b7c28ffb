#include "model/generate.h"

#include "common/error.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace kvscope {

int32_t argmax(const float* values, size_t n)
{
    KVSCOPE_ASSERT(n > 0);
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
        if (values[i] > values[best]) best = i;
    return int32_t(best);
}

void logSoftmax(const float* logits, size_t n, std::vector<double>& out)
{
    const double mx = logits[argmax(logits, n)];
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = double(logits[i]) - lse;
}

double logSoftmaxAt(const float* logits, size_t n, int32_t id)
{
    KVSCOPE_ASSERT(id >= 0 && size_t(id) < n);
    const double mx = logits[argmax(logits, n)];
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
    return double(logits[id]) - mx - std::log(sum);
}

TokenSampler::TokenSampler(const SamplingOptions& options) : opt_(options), rng_(options.seed)
{
    if (!(options.temperature >= 0.0)) throw Error("temperature must be >= 0");
    if (!(options.topP > 0.0 && options.topP <= 1.0)) throw Error("top-p must be in (0, 1]");
}

int32_t TokenSampler::next(const std::vector<float>& logits)
{
    if (opt_.temperature == 0.0) return argmax(logits.data(), logits.size());
    const size_t n = logits.size();
    const double mx = logits[size_t(argmax(logits.data(), n))];
    std::vector<double> p(n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += (p[i] = std::exp((double(logits[i]) - mx) / opt_.temperature));
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    // Most probable first; ids break ties so the order is the same everywhere.
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] > p[size_t(b)] : a < b; });
    size_t keep = 0;
    double mass = 0.0;
    while (keep < n && (keep == 0 || mass < opt_.topP * sum)) mass += p[size_t(order[keep++])];
    const double u = double(rng_() >> 11) * 0x1.0p-53 * mass;
    double acc = 0.0;
    for (size_t i = 0; i < keep; ++i) {
        acc += p[size_t(order[i])];
        if (u < acc) return order[i];
    }
    return order[keep - 1];
}

Generation generate(InferenceSession& session, const std::vector<int32_t>& input, int maxNew,
                    const SamplingOptions& sampling, const std::vector<int32_t>& stopIds)
{
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    TokenSampler sampler(sampling);
    Generation g;
    std::vector<float> logits;
    session.append(input, &logits);
    for (int i = 0; i < maxNew; ++i) {
        const int32_t t = sampler.next(logits);
        g.tokens.push_back(t);
        if (i == 0) g.firstTokenSeconds = std::chrono::duration<double>(Clock::now() - t0).count();
        if (std::find(stopIds.begin(), stopIds.end(), t) != stopIds.end()) {
            g.stoppedAtEos = true;
            break;
        }
        if (i + 1 < maxNew) session.append({t}, &logits);
    }
    g.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return g;
}

}  // namespace kvscope
