// The adaptive streamer's planner: which chunks of a context are recomputed from text and which
// level each of the others is fetched at, chosen by model predictive control over the chunks not
// yet committed.
//
// READ ME FIRST
//  - Throughput estimate (RobustMPC, Yin et al., SIGCOMM 2015, with an outlier guard): the last
//    kHistory chunk goodputs, each clamped to [m / kBand, m x kBand] around m, the (lower) median
//    of those samples; their harmonic mean, divided by 1 + a discount for recent over-prediction.
//    A chunk's error is (predicted - clamped actual) / clamped actual when the prediction (the
//    estimate in force when the chunk was requested) was too HIGH, 0 when it was too low (a link
//    faster than predicted costs quality, not the SLO, and the harmonic mean already follows it),
//    counted as at most kMaxError; the discount is the largest of the recent errors, each scaled
//    by its age: 1 for the newest, (kHistory - a) / kHistory for the one a chunks older, so a
//    dip's error fades over kHistory chunks instead of halving the estimate for all of them
//    (RobustMPC's symmetric max held for kHistory chunks; measured: docs/streaming.md). One
//    sample cannot move the estimate by more than kBand: a reply that sat in the socket while the
//    client was busy (its span looks tiny: many times the link's rate) or a sender thread
//    descheduled for a few ms (a fraction of it; figures: docs/streaming.md) is held to the band,
//    while a lasting change moves the median and passes within ceil(kHistory / 2) samples. The
//    harmonic mean is dominated by the slow samples. (The streamer also caps the estimate with
//    the rate so far of a reply that has been arriving slowly for a while: streamer.h.)
//  - The first reply of a run (a new connection) has no earlier reply to time its start from:
//    its sample is its bytes over the span from its first byte to its end (the round trip and the
//    connection's setup excluded), held to at most kBand x its bytes over the whole round trip
//    (firstReplySample: a reader that came late finds the reply whole in the socket).
//  - Shape of a plan: text from the FRONT, fetches from the BACK. Recomputing a prefix of the
//    context needs no KV (chunk k's recompute attends to chunks < k, all recomputed before it), so
//    it can start at once and overlap every transfer; a recomputed chunk after fetched ones would
//    have to wait for them. So the streamer fetches the chunks from the last one backwards and
//    recomputes from chunk 0 forwards; the two fronts meet at a split point. The planner is given
//    the chunks not yet committed in fetch order (PlanInput::chunks: the next fetch first); the
//    last `textable` of them are the context's front (contiguous with the text already committed)
//    and may be recomputed instead, the last k of the list for a split of k. Only what is not yet
//    committed moves: the split is revised with every new estimate.
//  - Timeline model of a plan (everything the planner predicts): the link carries the replies one
//    after another at the estimated throughput; a reply cannot start before its request reached the
//    server and came back (now + RTT) nor before the link finished what is already in flight. One
//    worker runs the jobs (decode per fp16 byte, recompute per token at the prefill rate, measured
//    or modelled, at least recomputeFloorSeconds a chunk) in order of release: after the work already handed to it (workerBusyUntil), the k
//    text chunks (released now: their tokens are the client's own), then the decodes of the replies
//    in flight (PlanInput::owed: predicted arrival, duration), then those of the planned fetches at
//    their predicted arrivals. TTFT = the worker's end + the tail (cache load, question prefill and
//    first token, measured in prepare() or modelled).
//  - Search: for every split k in 0..textable, exhaustive over the levels of the next H fetches
//    (H = horizon, lowered until levels^H <= kMaxLeaves; fewer near the end), every fetch after the
//    horizon taking the horizon's last level; branch and bound on distortion and predicted TTFT
//    (both only grow along a plan). Among plans whose predicted TTFT meets the SLO, the one with
//    the least total distortion (sum over chunks of weight x tokens x the choice's distortion;
//    PlanChunk::weight) wins, ties
//    going to the earlier TTFT. When no plan meets the SLO, the plans that finish by now + (1 +
//    PlanInput::overrunMargin) x (the earliest TTFT - now) are searched again for the least distortion:
//    the estimate says the SLO is lost either way, and where the worker rather than the link
//    bounds the finish, the fastest plan (every fetch at level 1) is hardly faster than a better
//    one. The stretched target is held for the run (PlanInput::overrunDeadline) and moves later
//    only when the earliest TTFT passes it, so re-planning cannot stretch it step by step. The
//    streamer commits only the plan's next fetch (when its window has room) and its next text chunk
//    (only when the worker is about to run out of work, so that the split is decided as late as
//    possible), and plans again after every commit, arrival and wake-up (MPC): a plan chosen
//    under a low estimate is raised as soon as a higher estimate leaves room (slack is spent).
//  - Distortion of a level: the profile's measured mean KL (levels[*].measured.mean_kl, written by
//    `kvscope-cli tune`), else its measured KL ("kl"), else a fallback from the level's size:
//    4^-(bits per value), the rate-distortion law of a Gaussian source, so more bits always means
//    less distortion and the order is the bits-per-value order. Text recompute has distortion 0
//    (it reproduces the model's own cache). Measured and fallback figures are never mixed: a level
//    without a measured KL gets one interpolated from the measured ones (ln KL linear in bits per
//    value, the nearest measured pair; a shipped transform ladder measures only some levels), and
//    only with fewer than two measured levels does every level use the fallback.
//  - Safety: the streamer plans against 90% of the SLO (StreamOptions::plannerMargin 0.1): a request,
//    once sent, cannot be taken back.
//  - Before any chunk has been measured there is no estimate: the first request goes at the
//    file's default level and at most chunk 0 is recomputed meanwhile, unless a prior estimate (the
//    previous run's, kept by the Streamer) is given, which is then scaled by kPriorDiscount
//    (stream/stream_run.cpp; 1.0 now: the prior is taken as it is).
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
    static constexpr double kBand = 2.0;      // a sample counts as at most kBand x (at least 1/kBand x) the median
    static constexpr double kMaxError = 1.0;  // a prediction error counts as at most this (the discount at most halves)
    // A chunk's measured goodput and what the estimator predicted for it (<= 0: no prediction).
    void add(double measured, double predicted);
    bool valid() const { return !m_samples.empty(); }
    double median() const;        // lower median of the recent samples as measured
    double clamped(double sample) const;  // the sample held to the band around median()
    double harmonicMean() const;  // of the recent samples, each clamped
    // The discount's error: the largest recent over-prediction error scaled by its age (above).
    double maxRecentError() const;
    double estimate() const;  // harmonicMean / (1 + maxRecentError); 0 when !valid()
    // The same with the error counted as at most maxError (<= kMaxError): the discount a caller
    // states as its margin for estimate error.
    double estimate(double maxError) const;

private:
    // sample held to [m / kBand, m x kBand] (unchanged when m is 0: no samples).
    static double clampTo(double sample, double m);
    std::deque<double> m_samples, m_errors;  // m_errors: one per sample, 0 without a prediction
};

// The first reply of a connection: bytes over (arrived - firstByte), at least bytes over (arrived
// - sent) and at most kBand x that (READ ME FIRST). Times in seconds on one clock; 0 when arrived
// <= sent.
double firstReplySample(double bytes, double sent, double firstByte, double arrived);

// The question's prefill as the planner predicts it (the tail of every plan): the median of the
// last kHistory measurements (the streamer's own before the first run, then each run's; of an
// even count the mean of the middle two). On a loaded CPU one measurement is noise (the same
// question's prefill varies severalfold: docs/streaming.md): the median follows the load without
// taking a single spike for the rule.
class TailEstimator {
public:
    static constexpr int kHistory = 5;
    void add(double seconds);
    double estimate() const;  // 0 with no measurement
private:
    std::deque<double> m_samples;
};

struct PlanChunk {
    int tokens = 0;
    std::vector<double> bytes;  // [choice]: 1..L = level (bytes on the wire); [0] unused (text: no request)
    double weight = 1;          // how much a token's distortion here counts (the context's last chunk: more)
};

// A job owed to the worker: the decode of a reply in flight.
struct PlanJob {
    double release = 0;  // predicted arrival
    double seconds = 0;
};

struct PlanInput {
    std::vector<PlanChunk> chunks;   // the chunks not yet committed, in fetch order (next fetch first)
    int textable = 0;                // the last `textable` of them may be recomputed (the context's front)
    std::vector<double> distortion;  // [choice], choice 0 = text
    std::vector<PlanJob> owed;       // decodes of the replies in flight, in arrival order
    double now = 0;
    double linkBusyUntil = 0;        // predicted end of the replies in flight
    double workerBusyUntil = 0;      // end of the work already handed to the worker
    double throughput = 0;           // bytes/s (robust estimate)
    double rtt = 0;
    double decodeSecondsPerToken = 0;
    double recomputeSecondsPerToken = 0;
    double recomputeFloorSeconds = 0;  // the least one chunk's recompute takes (a pass reads the weights once)
    double tailSeconds = 0;          // cache load + question prefill + first token
    double slo = 0;                  // in the same clock as now
    int horizon = 5;
    bool allowText = true;
    // No plan meets slo: take the least distortion among plans with TTFT - now <= (1 +
    // overrunMargin) x (the earliest TTFT - now) (0: the earliest TTFT alone, ties to less
    // distortion), or by overrunDeadline
    // (the target an earlier plan of this run stretched to; 0: none) when that is earlier and
    // still reachable.
    double overrunMargin = 0;
    double overrunDeadline = 0;
};

struct PlanResult {
    int choice = 1;                 // the next fetch's level (chunks[0]); 0 when every chunk is text
    int textChunks = 0;             // the split: the last textChunks of PlanInput::chunks are text
    std::vector<int> plan;          // one choice per chunk of PlanInput::chunks (0 = text)
    double predictedTtft = 0;       // same clock as PlanInput::now
    double distortion = 0;          // sum of weight x tokens x distortion
    bool feasible = false;          // predicted TTFT <= slo
    double deadline = 0;            // what the plan was chosen against: slo, or the stretched target when !feasible
};

PlanResult planChunks(const PlanInput& in);

// Per-choice distortion for a level-coded file: measuredKl[l-1] where it is > 0 and finite (NaN or
// 0: not measured), the missing ones interpolated in ln KL over bitsPerValue (the file's bits per
// value per level, increasing) when at least two levels are measured; else 4^-(bits per value)
// for every level. Index 0 (text) is 0. `source` says which ("profile mean_kl", with the
// interpolated levels named, or "fallback 4^-bpv").
std::vector<double> levelDistortion(const std::vector<double>& measuredKl, const std::vector<double>& bitsPerValue,
                                    std::string* source);

}  // namespace kvscope
