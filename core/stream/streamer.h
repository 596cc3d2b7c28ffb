// The receiving side of the streaming lab: fetch a context's KV cache chunk by chunk from a
// ChunkServer (whose link is shaped), choose each chunk's level, decode on a worker thread while
// the next chunk travels, recompute text chunks with the model, then prefill the question and take
// the first token. Reports time-to-first-token part by part, a per-chunk event log, and the quality
// of the answer generated from the assembled cache against the original cache.
//
// READ ME FIRST
//  - Pipelining: up to StreamOptions::window requests are in flight on the one connection (the
//    server answers them in order), so the next reply is already queued at the server when the
//    current one ends and the link never idles for a round trip between chunks. Fixed policies
//    keep 8 requests in flight; adaptive keeps at most the bandwidth-delay product's worth (each
//    request commits a level), only 1 until this run has measured a chunk, and sends each request
//    just in time where replies are long (5x that margin or more): when the replies in flight are
//    predicted to end within 2 x (RTT + 2 ms), so a chunk's level is chosen after the chunk before
//    it has measured the link.
//  - Adaptation (policy adaptive): text is recomputed from the front of the context and the rest
//    fetched from the back (planner.h): the first fetch measures the link while chunk 0
//    recomputes. Every decision comes from the planner (RobustMPC throughput estimate with an
//    outlier guard, model predictive control over the chunks not yet committed, distortion from
//    the profile's measured KL), given what is committed: the replies in flight (their bytes and
//    decodes) and the work handed to the worker. A fetch is committed when the window has room; a
//    text chunk only when the worker is about to run out of work (half the recompute
//    ahead, 2-20 ms), the run breaking off reading a reply for it (ChunkClient::receivePart), so
//    the split between text and fetched chunks moves with every new sample until the two meet.
//    The first reply on a new connection is timed from its first byte (its delay includes the
//    connection's setup), at most twice its bytes over its whole round trip (planner.h). A reply
//    that has been arriving for 0.1 s (kProgressSeconds) more slowly than the estimate caps it
//    with its rate so far, and the planner replays only its bytes left. The tail the planner
//    counts is the median of the question prefills measured so far (planner.h TailEstimator).
//  - One worker runs the jobs in the order they can run: a decode when its chunk has arrived, a
//    recompute once every chunk before it has been handed over (it attends to them), so chunk i
//    decodes while chunk i+1 travels. A chunk that has to be fetched again (CRC mismatch) holds
//    back only the recompute jobs after it.
//  - Text recompute: the chunk's tokens run through the model after the cache assembled so far
//    (InferenceSession::loadKv + append, then exportKv), so later tokens attend to the decoded,
//    lossy KV exactly as they would in serving.
//  - Faults: a failed fetch (closed or stalled connection, error frame, CRC mismatch) is retried
//    while the SLO has time left (at most maxAttempts); the requests in flight behind it on the same
//    connection are sent again without counting an attempt. Then the chunk is recomputed from the
//    tokens the client holds (it named the context by them). A server that refuses connections is
//    not asked again in that run. Every fetch has a deadline: nothing waits forever.
//  - Measured vs modelled: with TargetHardware set, decode and recompute durations and the
//    question's prefill are modelled (decode GB/s of fp16 KV, prefill tokens/s) and the job
//    timeline is replayed from the measured arrivals; transfer is always measured on the socket.
//    Presets (targetPreset) name published figures for a GPU serving a 7B/8B model.
#pragma once

#include "codec/container.h"
#include "model/model.h"
#include "transport/client.h"
#include "transport/link.h"
#include "transport/planner.h"
#include "transport/target.h"
#include "stream/policy.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct ChunkEvent;

struct StreamOptions {
    Policy policy;
    double sloSeconds = 1.0;
    TargetHardware target;
    double stallTimeout = 2.0;   // a fetch with no byte for this long has stalled
    double fetchTimeout = 120;   // hard limit on one fetch
    int maxAttempts = 3;
    int qualityTokens = 32;      // greedy tokens generated to compare against the original
    int window = 0;              // requests in flight at most (1 = stop-and-wait; 0 = automatic: 8 for
                                 // fixed policies; adaptive: 1 until a chunk is measured, then the
                                 // bandwidth-delay product over the last reply's size, plus 2, at most 8)
    int horizon = 5;             // planner look-ahead, chunks
    // The adaptive planner's constants (planner.h; how they were set: docs/streaming.md).
    // plannerMargin: plans must meet (1 - margin) x the SLO, the room left for estimate error
    // (a request, once sent, cannot be taken back). lastChunkWeight: the context's last chunk's
    // distortion counts this many times a middle chunk's (PlanChunk::weight): the question and
    // the continuation attend most to the tokens just before them. Set on the development cell
    // (gpl9k, T-Mobile x4, transform ladder; docs/streaming.md): the last chunk at level 4 with the
    // rest at level 7 raised the KL by 0.028, six middle chunks at level 1 by 0.023 (0.004 each),
    // so the last chunk weighs about 20 middle ones at equal distortion; 16 is a round figure below.
    // estimateErrorMargin: the throughput estimate is the recent goodputs' harmonic mean divided
    // by 1 + their largest recent relative prediction error, that error counted as at most this
    // (planner.h ThroughputEstimator: over-predictions only, fading with age; 1.0 there: the
    // estimate at most halved).
    double plannerMargin = 0.1;
    double lastChunkWeight = 16.0;
    double estimateErrorMargin = 1.0;
    // overrunMargin: when no plan meets the SLO, the least distortion among plans whose time left
    // is within this fraction of the fastest plan's (PlanInput::overrunMargin; 0: the fastest
    // plan). 0.1: the run is late by the estimate anyway, and a tenth more lets the
    // planner keep quality where the worker, not the link, bounds the finish (docs/streaming.md).
    double overrunMargin = 0.1;
    bool keepCache = false;      // return the assembled cache in StreamResult::cache
    // Optional, for live views: called on the run's thread once each chunk's fetch is settled,
    // with the fetch's fields (level, bytes, sent/arrived; job fields 0: its decode may still be
    // queued). Returning false stops the run: run() lets the queued jobs finish and throws
    // kvscope::Error "stream: cancelled".
    std::function<bool(const ChunkEvent&)> onChunk;
};

struct ChunkEvent {
    int index = 0;
    int level = 0;             // 0 = text
    bool local = false;        // recomputed from the client's own tokens after fetching failed
    uint64_t bytes = 0;        // payload bytes of the fetch that succeeded (0 when local)
    double sentS = 0, firstByteS = 0, arrivedS = 0;  // seconds since the run started
    double jobStartS = 0, decodedS = 0;              // decode or recompute job
    double jobSeconds = 0;     // duration of the job (measured or modelled)
    int attempts = 0;
    double throughputEstimate = 0;  // bytes/s the planner used for this chunk (adaptive; 0 otherwise)
    double predictedTtftS = 0;      // the planner's TTFT prediction when it chose this chunk
    std::string note;          // what went wrong, when something did
};

struct TtftPart {
    double seconds = 0;
    bool modelled = false;
};

struct StreamResult {
    std::string policy;
    double sloSeconds = 0, ttftSeconds = 0;
    bool sloMet = false;
    // Critical path; they add up to ttftSeconds. kvLoad: copying the assembled cache into the
    // runtime's session (an artefact of this runtime; modelled as 0 on target hardware).
    TtftPart transfer, decode, recompute, kvLoad, prefill, firstToken;
    double decodeBusySeconds = 0, recomputeBusySeconds = 0;  // whole jobs, hidden or not
    std::vector<ChunkEvent> chunks;
    uint64_t deliveredBytes = 0;   // every byte the client read in the run, headers and retries included
    double capacityBytes = 0;      // what the link could carry from the run's start to the last arrival
    double linkSeconds = 0;
    // The same from the first reply's first byte to the last arrival: the link's use while the
    // client kept it backlogged (the first round trip excluded).
    double backloggedCapacityBytes = 0;
    uint64_t backloggedDeliveredBytes = 0;
    std::string distortionSource;  // the planner's level distortion figures (planner.h)
    double plannedTailSeconds = 0; // the tail (kv load, question prefill, first token) the run's plans counted
    // The pacer's view (in-process pacer only): capacity lost while no reply was being sent, and
    // credit left unused within busy periods, up to the end of the run's fetching.
    double idleLostBytes = 0, busyLostBytes = 0;
    double busyCapacityBytes = 0;  // capacity inside the pacer's busy periods (a reply being sent)
    std::shared_ptr<KvSet> cache;  // the assembled cache (StreamOptions::keepCache)
    std::vector<std::string> log;  // faults, retries, fallbacks, in order
    std::vector<int32_t> tokens;   // greedy answer from the assembled cache
    std::string text;
    double tokenAgreement = 0;     // positions equal to the reference answer, over its length
    bool firstTokenMatch = false;
};

// The measured KL of each level of a profile for the codec that streams it (transform:
// transform.levels[*].measured.mean_kl, else levels[*].measured.mean_kl, written by `tune` and the
// held-out suites), NaN where a level has none; empty when no level has one. For setLevelKl.
std::vector<double> measuredLevelKl(const CodecProfile& profile, CodecId codec);

// One context served by one ChunkServer (host, port), prepared once, then streamed many times.
class Streamer {
public:
    // contextTokens: the context as the model tokenizes it (it also names the context on the
    // server); question: the tokens after it. original: the cache prefilled from the context, the
    // reference for quality.
    Streamer(const Model& model, std::string host, int port, std::vector<int32_t> contextTokens,
             std::vector<int32_t> question, const KvSet& original);
    ~Streamer();

    // Fetches the skeletons (cachegen, and int8 when the store has it), generates the reference
    // answer from the original cache and measures the model's prefill rate. Not part of any TTFT.
    // Throws kvscope::Error when the server has no skeleton of this codec (setCodec) of this context.
    void prepare(const StreamOptions& quality, const std::string& logPrefix = "stream");
    // The measured KL of each level (a profile's levels[*].measured.mean_kl, or its
    // transform.levels[*]; NaN for a level without one; a .kvc need not carry them). Call before
    // prepare(); without it the planner uses the file's figures, the missing ones interpolated,
    // else the size fallback (planner.h levelDistortion).
    void setLevelKl(std::vector<double> klPerLevel) { m_levelKl = std::move(klPerLevel); }
    // The level-coded encoding the policies adaptive, text and level:N fetch: cachegen (default)
    // or transform (codec 6, whose skeleton carries the transform section: basis, steps, tables).
    // Call before prepare().
    void setCodec(CodecId codec) { m_codec = codec; }
    CodecId codec() const { return m_codec; }
    bool hasInt8() const { return m_int8 != nullptr; }
    // The level-coded reader (cachegen or transform, see setCodec).
    const KvcReader& cachegen() const { return *m_cachegen; }
    const std::string& contextName() const { return m_context; }
    const std::vector<int32_t>& referenceTokens() const { return m_refTokens; }
    const std::string& referenceText() const { return m_refText; }
    double measuredPrefillTokensPerSecond() const { return m_prefillRate; }
    double measuredDecodeSecondsPerToken() const { return m_decodeSecondsPerToken; }
    double measuredKvLoadSeconds() const { return m_kvLoadSeconds; }
    // Per choice (0 = text, 1..L = cachegen level): the planner's distortion, and its source.
    const std::vector<double>& levelDistortion() const { return m_distortion; }
    const std::string& distortionSource() const { return m_distortionSource; }

    // One run. When pacer is given, it is reset at the run's start with linkOffset (seconds into
    // the schedule), and the run reports the link's capacity. Throws kvscope::Error only for
    // misuse (int8 policy without an int8 encoding, a level the file lacks).
    StreamResult run(const StreamOptions& options, LinkPacer* pacer = nullptr, double linkOffset = 0);

private:
    friend class StreamRun;  // one run's state and steps (stream_run.h)
    const Model& m_model;
    std::string m_host;
    int m_port;
    std::vector<int32_t> m_tokens, m_question;
    const KvSet& m_original;
    std::string m_context;
    CodecId m_codec = CodecId::CacheGen;
    std::unique_ptr<KvcReader> m_cachegen, m_int8;  // m_cachegen: the level-coded one (m_codec)
    std::vector<int32_t> m_refTokens;
    std::string m_refText;
    double m_prefillRate = 0;    // tokens/s of the question prefill after the whole context
    double m_prefillSeconds = 0; // that prefill
    // The planner's question prefill: prepare()'s measurement, then every run's (planner.h).
    TailEstimator m_tail;
    double m_decodeSecondsPerToken = 0;  // one chunk's decode at the default level, per token
    double m_kvLoadSeconds = 0;          // loading the whole cache into a session
    double m_firstTokenSeconds = 0;
    std::vector<double> m_distortion, m_levelKl;
    std::string m_distortionSource;
    double m_priorThroughput = 0;        // the previous run's harmonic mean, bytes/s
};

}  // namespace kvscope
