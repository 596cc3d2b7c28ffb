// The receiving side of the streaming lab: fetch a context's KV cache chunk by chunk from a
// ChunkServer (whose link is shaped), choose each chunk's level, decode on a worker thread while
// the next chunk travels, recompute text chunks with the model, then prefill the question and take
// the first token. Reports time-to-first-token part by part, a per-chunk event log, and the quality
// of the answer generated from the assembled cache against the original cache.
//
// READ ME FIRST
//  - Adaptation (CacheGen §5.3): before chunk i, throughput = the previous chunk's goodput
//    (payload bytes over its arrival time minus the smallest first-byte delay seen, our RTT
//    estimate); budget = (SLO - elapsed - predicted tail) / chunks left, the tail being the
//    question's prefill plus one chunk's decode; send the highest level whose predicted transfer
//    (RTT + bytes / throughput) fits the budget. When none fits, CacheGen sends text; we send text
//    when its predicted recompute is cheaper than the lowest level's transfer, else the lowest
//    level (on a CPU recompute can be slower than any transfer). The first chunk goes at the
//    file's default level (nothing is measured yet).
//  - Pipelining: one worker runs decode and recompute jobs in chunk order, so chunk i decodes while
//    chunk i+1 travels, and a recompute runs only after every chunk before it is in the cache.
//  - Text recompute: the chunk's tokens run through the model after the cache assembled so far
//    (InferenceSession::loadKv + append, then exportKv), so later tokens attend to the decoded,
//    lossy KV exactly as they would in serving.
//  - Faults: a failed fetch (closed or stalled connection, error frame, CRC mismatch) is retried
//    while the SLO has time left (at most maxAttempts); then the chunk is recomputed from the
//    tokens the client holds (it named the context by them). A server that refuses connections is
//    not asked again in that run. Every fetch has a deadline: nothing waits forever.
//  - Measured vs modelled: with TargetHardware set, decode and recompute durations and the
//    question's prefill are modelled (decode GB/s of fp16 KV, prefill tokens/s) and the job
//    timeline is replayed from the measured arrivals; transfer is always measured on the socket.
#pragma once

#include "codec/container.h"
#include "model/model.h"
#include "stream/client.h"
#include "stream/link.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct Policy {
    enum Kind { Adaptive, Text, Int8, Level } kind = Adaptive;
    int level = 0;  // Level only, 1-based
    std::string name() const;  // "adaptive", "text", "int8", "level:2"
};
// "adaptive", "text", "int8", "level:N"; throws kvscope::Error "--policy: ..." otherwise.
Policy parsePolicy(const std::string& text);

struct TargetHardware {
    double prefillTokensPerSecond = 0;  // recompute and question prefill
    double decodeGBps = 0;              // KV decode, GB of fp16 KV per second
    bool enabled() const { return prefillTokensPerSecond > 0 || decodeGBps > 0; }
};

struct ChunkEvent;

struct StreamOptions {
    Policy policy;
    double sloSeconds = 1.0;
    TargetHardware target;
    double stallTimeout = 2.0;   // a fetch with no byte for this long has stalled
    double fetchTimeout = 120;   // hard limit on one fetch
    int maxAttempts = 3;
    int qualityTokens = 32;      // greedy tokens generated to compare against the original
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
    std::vector<std::string> log;  // faults, retries, fallbacks, in order
    std::vector<int32_t> tokens;   // greedy answer from the assembled cache
    std::string text;
    double tokenAgreement = 0;     // positions equal to the reference answer, over its length
    bool firstTokenMatch = false;
};

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
    // Throws kvscope::Error when the server has no cachegen skeleton of this context.
    void prepare(const StreamOptions& quality, const std::string& logPrefix = "stream");
    bool hasInt8() const { return m_int8 != nullptr; }
    const KvcReader& cachegen() const { return *m_cachegen; }
    const std::string& contextName() const { return m_context; }
    const std::vector<int32_t>& referenceTokens() const { return m_refTokens; }
    const std::string& referenceText() const { return m_refText; }
    double measuredPrefillTokensPerSecond() const { return m_prefillRate; }

    // One run. When pacer is given, it is reset at the run's start with linkOffset (seconds into
    // the schedule), and the run reports the link's capacity. Throws kvscope::Error only for
    // misuse (int8 policy without an int8 encoding, a level the file lacks).
    StreamResult run(const StreamOptions& options, LinkPacer* pacer = nullptr, double linkOffset = 0);

private:
    struct Impl;
    std::unique_ptr<Impl> d_;
    const Model& m_model;
    std::string m_host;
    int m_port;
    std::vector<int32_t> m_tokens, m_question;
    const KvSet& m_original;
    std::string m_context;
    std::unique_ptr<KvcReader> m_cachegen, m_int8;
    std::vector<int32_t> m_refTokens;
    std::string m_refText;
    double m_prefillRate = 0;    // tokens/s of the question prefill after the whole context
    double m_prefillSeconds = 0; // that prefill
};

}  // namespace kvscope
