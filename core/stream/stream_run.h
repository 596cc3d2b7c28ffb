// One Streamer::run: the run's state as members and each step of the controller as a method
// (streamer.h's READ ME FIRST tells the story). Private to kvscope_stream.
//
// The steps, in the order a run takes them: fetchAll() keeps the request window full
// (fillWindow: fixedStep or adaptiveStep, then sendRequest) and reads the reply at its front
// (readFront, measureReply), handing each settled chunk's job to the worker (submitReady); then
// settle() waits for the worker and reads the link's figures, replayJobs() builds the job timeline
// and the critical path, and answer() prefills the question and measures the answer's quality.
// stream_run.cpp holds the fetch controller and the answer, stream_run_jobs.cpp the jobs and the
// hand-over to the worker.
#pragma once

#include "codec/container_chain.h"
#include "stream/streamer.h"
#include "stream/worker.h"
#include "transport/planner.h"
#include "transport/protocol.h"

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvscope {

class StreamRun {
public:
    // Throws kvscope::Error for misuse: an int8 policy without an int8 encoding, a level the file lacks.
    StreamRun(Streamer& streamer, const StreamOptions& options, LinkPacer* pacer, double linkOffset);
    // Once per StreamRun.
    StreamResult run();

private:
    struct InFlight {
        int chunk, level;
        uint64_t expected;
        double sentAt, predictedThroughput;
        bool fresh;       // sent on a new connection
    };
    // The adaptive plan for the chunks in m_todo (planner.h), given what is in flight and owed.
    struct AdaptivePlan {
        PlanResult plan;
        double throughput = 0;        // the estimate it used (bytes/s)
        // Predicted at the harmonic mean, undiscounted (planAdaptive): when the replies in flight
        // end (monotonic; 0: none or no estimate), and the time the last of them takes on the link.
        double linkEnd = 0;
        double lastReplySeconds = 0;
    };
    // What one step of filling the window did: go on with the next chunk, stop, or send a request.
    enum class Step { Next, Stop, Send };

    static const KvcReader& chooseReader(const Streamer& streamer, const Policy& policy);
    double since(double mono) const { return mono - m_t0; }
    void logLine(const std::string& s);
    void note(int i, const std::string& what);
    // The RTT as best known: the measured one, else the upper bound (-1: neither yet).
    double rttOrUpper() const { return m_rttEstimate >= 0 ? m_rttEstimate : m_rttUpper; }

    // Jobs and the worker.
    std::function<void()> decodeJob(int i, int level, std::vector<uint8_t> payload);
    std::function<void()> recomputeJob(int i, std::vector<int32_t> tokens);
    std::vector<int32_t> localTokens(int i) const;
    double jobCost(int i, int level) const;
    void submitOne(int i);
    void submitReady();
    void giveUp(int i);
    bool giveUpIfSpent(int i);
    void commitText(int i);
    void breakChain(int i);
    double textLead(int i) const;
    double workerFreeAt(double now);

    // Fetching.
    double wireBytes(int i, int level) const;
    int textableCount() const;
    AdaptivePlan planAdaptive(double now);
    int windowNow() const;
    void fetchAll();
    double fillWindow();
    Step fixedStep(int window, int& level);
    Step adaptiveStep(int window, double& wakeAt, int& level);
    void sendRequest(int i, int level);
    void requeueInflight(int failedChunk);
    void readFront(double wakeAt);
    void measureReply(const InFlight& f, const Reply& rep, double replyStart);

    // After fetching.
    void settle();
    double replayJobs();
    void answer(double kvReady);

    // What the streamer prepared; the run updates only its prior throughput.
    Streamer& m_streamer;
    const Model& m_model;
    const std::vector<int32_t>& m_tokens;
    const std::vector<int32_t>& m_question;

    const StreamOptions& m_opt;
    const Policy& m_policy;
    LinkPacer* m_pacer;
    const double m_linkOffset;
    const KvcReader& m_reader;
    const CodecParams& m_params;
    const int m_levels, m_chunks;
    const TargetHardware& m_hw;
    const bool m_modelDecode, m_modelPrefill;
    const size_t m_fp16BytesPerToken;
    // Modelled decode writes the target model's fp16 KV, which may be larger than the served one's.
    const double m_modelledDecodeBytesPerToken;
    // Fixed policies fetch in chunk order. Adaptive fetches from the last chunk backwards
    // (m_todo.front() is the next fetch) and recomputes text from chunk 0 forwards (m_todo.back(),
    // while it is m_textFront): see planner.h.
    const bool m_adaptive;
    // A file whose chunks chain (container_chain.h): its decodes are handed to the worker in chunk
    // order, into m_chain, which decodes each as it comes; once a chunk is given up or recomputed
    // from text the chain is broken up to the next reset point: the later chunks of its segment
    // are recomputed from text (a fetched one too), and the chain resumes at the next segment.
    // Adaptive streams only files with reset points, one level per segment: the first fetch of a
    // segment (its last chunk: fetches go backwards) sets it, the planner sees the other levels of
    // that segment's chunks as unaffordable, and its chunks are no longer textable (the text
    // split stays out of a segment once a fetch of it is committed).
    const bool m_chained;
    std::unique_ptr<KvcChainDecoder> m_chain;
    int m_resetChunks = 0;              // the file's reset_chunks (0: one segment)
    std::vector<int> m_chainBrokenAt;   // per segment: the first chunk given up (INT_MAX: none)
    std::vector<int> m_segmentLevel;    // per segment: the level its fetches use (0: none yet)
    int segmentOf(int i) const { return m_resetChunks > 0 ? i / m_resetChunks : 0; }
    bool chainBroken(int i) const { return m_chained && m_chainBrokenAt[size_t(segmentOf(i))] < i; }
    // When decode and recompute are both modelled, their real runs on this CPU only build the
    // cache (their durations are replayed from the model after the run), so the worker is held
    // until the last reply has arrived: the real jobs then cannot slow this machine's transfer,
    // and the planner follows the modelled worker timeline (m_modelWorkerEnd) instead of the real one.
    const bool m_deferJobs;
    const double m_prior;  // the previous run's estimate, discounted
    double m_overrunDeadline = 0;  // the target the planner stretched to when nothing met the SLO (run clock; 0: none)
    const double m_tailPrefill, m_tailSeconds;
    const double m_recomputePerToken, m_recomputeFloor;
    std::atomic<double> m_decodePerToken;

    StreamResult m_res;
    // Preallocated like a serving engine's cache: not part of the TTFT.
    KvSet m_assembled;
    std::unique_ptr<InferenceSession> m_recomputeSession;
    bool m_sessionValid = false;  // m_recomputeSession holds exactly m_assembled's first position() tokens
    ChunkClient m_client;
    double m_t0 = 0;

    // Estimates the controller learns as the run goes.
    double m_rttEstimate = -1;  // smallest first-byte delay seen (not counting a new connection's first reply)
    double m_rttUpper = -1;     // a new connection's first reply's delay: at least the RTT
    ThroughputEstimator m_estimator;
    double m_lastReplyBytes = 0;
    bool m_serverDown = false;
    uint64_t m_delivered = 0;
    double m_lastArrival = 0, m_firstByte = -1;

    // Jobs are handed to the worker as soon as they can run: a decode when its chunk has arrived
    // (decoding needs no other chunk), a recompute once every chunk before it has been handed over
    // (it attends to them). m_owedSeconds is the predicted work the worker still owes.
    std::vector<std::function<void()>> m_jobs;
    std::vector<double> m_jobPredicted;
    std::vector<char> m_ready;      // fetched or given up, job built
    std::vector<char> m_submitted;  // handed to the worker
    std::vector<int> m_submitOrder; // the worker's job order
    std::vector<int> m_attempts;
    std::mutex m_owedMutex;
    double m_owedSeconds = 0;
    int m_prefixSubmitted = 0;      // chunks [0, m_prefixSubmitted) are all handed over
    double m_modelWorkerEnd = 0;    // m_deferJobs: monotonic end of the modelled jobs handed over so far

    std::deque<InFlight> m_inflight;
    std::deque<int> m_todo;
    int m_textFront = 0;         // adaptive: chunks [0, m_textFront) are committed to text recompute
    double m_prevReplyEnd = 0;   // monotonic end of the previous reply on this connection (0: none)
    double m_frontDeadline = 0;  // the hard limit on the reply being read

    // Last: destroyed first, as its jobs refer to the members above.
    Worker m_worker;
};

}  // namespace kvscope
