// The adaptive streamer's planner: which level (or text recompute) each chunk of a context is
// fetched at, chosen by model predictive control over the chunks still to request.
//
// READ ME FIRST
//  - Throughput estimate (RobustMPC, Yin et al., SIGCOMM 2015): the harmonic mean of the last
//    kHistory chunk goodputs, divided by 1 + the largest relative prediction error of the last
//    kHistory chunks (|predicted - actual| / actual, the prediction being the estimate in force
//    when the chunk was requested). The harmonic mean is dominated by the slow samples; the
//    discount shrinks the estimate when the link has recently been less predictable.
//  - Timeline model of a plan (everything the planner predicts): the link carries the replies one
//    after another at the estimated throughput; a reply cannot start before its request reached the
//    server and came back (now + RTT) nor before the link finished what is already in flight; one
//    worker runs decode jobs (per fp16 byte, measured or modelled) and recompute jobs (tokens at the
//    prefill rate, measured or modelled) in chunk order, each no earlier than its chunk's arrival
//    and the previous job's end; TTFT = the last job's end + the tail (cache load, question prefill
//    and first token, measured in prepare() or modelled). A text chunk is recomputed from the
//    client's own tokens: no link time, only its recompute on the worker, so its cost is known
//    before it is chosen.
//  - Search: exhaustive over the (levels + 1)^H choices of the next H chunks (H = kHorizon, fewer
//    near the end); every chunk after the horizon takes the horizon's last choice, so a plan always
//    covers the whole context. Among plans whose predicted TTFT meets the SLO, the one with the
//    least total distortion (sum over chunks of tokens x the choice's distortion) wins, ties going
//    to the earlier TTFT; when no plan meets the SLO, the one with the earliest TTFT wins. Only the
//    first choice is committed; the plan is redone for every request with fresh estimates (MPC).
//  - Distortion of a level: the profile's measured mean KL (levels[*].measured.mean_kl, written by
//    `kvscope-cli tune`), else its measured KL ("kl"), else a fallback from the level's size:
//    4^-(bits per value), the rate-distortion law of a Gaussian source, so more bits always means
//    less distortion and the order is the bits-per-value order. Text recompute has distortion 0
//    (it reproduces the model's own cache). Measured and fallback figures are never mixed: when any
//    level lacks a measured KL, every level uses the fallback.
//  - Safety: the streamer plans against 90% of the SLO (kSloSafety in streamer.cpp): a request,
//    once sent, cannot be taken back, and a recompute chain after a fetched chunk waits for it, so
//    an estimate that is too high costs more than one that is too low.
//  - Before any chunk has been measured there is no estimate: the first request goes at the
//    file's default level, unless a prior estimate (the previous run's, kept by the Streamer) is
//    given, which is then discounted by kPriorDiscount.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace kvscope {

// Robust throughput estimate over recent chunks (bytes per second).
class ThroughputEstimator {
public:
    static constexpr int kHistory = 5;
    // A chunk's measured goodput and what the estimator predicted for it (<= 0: no prediction).
    void add(double measured, double predicted);
    bool valid() const { return !m_samples.empty(); }
    double harmonicMean() const;
    double maxRecentError() const;
    double estimate() const;  // harmonicMean / (1 + maxRecentError); 0 when !valid()

private:
    std::deque<double> m_samples, m_errors;
};

struct PlanChunk {
    int tokens = 0;
    std::vector<double> bytes;  // [choice]: 1..L = level; choice 0 = text, 0 bytes when recomputed
                                // from the client's own tokens (no request)
};

struct PlanInput {
    std::vector<PlanChunk> chunks;   // the chunks still to request, in order
    std::vector<double> distortion;  // [choice], choice 0 = text
    // Already committed: bytes in flight on the link, and the jobs still owed to the worker (their
    // arrival, predicted, and duration) before the planned chunks' jobs.
    double now = 0;
    double linkBusyUntil = 0;        // predicted end of the replies in flight
    double workerBusyUntil = 0;      // predicted end of the jobs queued or owed
    double throughput = 0;           // bytes/s (robust estimate)
    double rtt = 0;
    double decodeSecondsPerToken = 0;
    double recomputeSecondsPerToken = 0;
    double tailSeconds = 0;          // cache load + question prefill + first token
    double slo = 0;                  // in the same clock as now
    int horizon = 5;
    bool allowText = true;
};

struct PlanResult {
    int choice = 1;                 // for the first chunk of PlanInput::chunks
    std::vector<int> plan;          // the whole plan, one choice per chunk
    double predictedTtft = 0;       // same clock as PlanInput::now
    double distortion = 0;          // sum of tokens x distortion
    bool feasible = false;          // predicted TTFT <= slo
};

PlanResult planChunks(const PlanInput& in);

// Per-choice distortion for a cachegen file: measuredKl[l-1] when every level has one (> 0),
// else 4^-(bits per value) from the mean bytes per token of each level. Index 0 (text) is 0.
// `source` says which ("profile mean_kl" or "fallback 4^-bpv").
std::vector<double> levelDistortion(const std::vector<double>& measuredKl, const std::vector<double>& bitsPerValue,
                                    std::string* source);

}  // namespace kvscope
