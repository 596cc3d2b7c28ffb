#include "stream/streamer.h"

#include "common/crc32.h"
#include "model/generate.h"
#include "transport/planner.h"
#include "transport/protocol.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

namespace kvscope {

namespace {

// Copies tokens [t0, t0 + n) of every (kind, layer, head) from src (starting at srcT0) into dst.
void copyTokens(const KvSet& src, int srcT0, KvSet& dst, int dstT0, int n)
{
    const KvShape& s = src.shape();
    const KvShape& d = dst.shape();
    KVSCOPE_ASSERT(s.numLayers == d.numLayers && s.numKvHeads == d.numKvHeads && s.headDim == d.headDim);
    KVSCOPE_ASSERT(srcT0 + n <= s.numTokens && dstT0 + n <= d.numTokens);
    std::vector<float> rows;
    for (int l = 0; l < s.numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            for (int h = 0; h < s.numKvHeads; ++h) {
                if (src.dtype() == dst.dtype()) {
                    const size_t row = size_t(s.headDim) * dtypeSize(src.dtype());
                    std::memcpy(dst.data(k, l) + (size_t(h) * d.numTokens + dstT0) * row,
                                src.data(k, l) + (size_t(h) * s.numTokens + srcT0) * row, size_t(n) * row);
                } else {
                    rows.resize(size_t(n) * s.headDim);
                    src.readRows(k, l, h, srcT0, n, rows.data());
                    dst.writeRows(k, l, h, dstT0, n, rows.data());
                }
            }
}

// Runs jobs one after another on its own thread, in submission order. A held worker queues jobs
// without starting them until release() (drain() releases it first); destroyed while held, it drops them.
class Worker {
public:
    explicit Worker(bool held = false) : m_held(held), m_thread([this] { loop(); }) {}
    void release()
    {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_held = false;
        }
        m_cv.notify_all();
    }
    ~Worker()
    {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_quit = true;
        }
        m_cv.notify_all();
        m_thread.join();
    }
    void submit(std::function<void()> job)
    {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_jobs.push_back(std::move(job));
        }
        m_cv.notify_all();
    }
    // Waits until every submitted job has run; rethrows the first job's exception.
    void drain()
    {
        release();
        std::unique_lock<std::mutex> lock(m_mutex);
        m_cv.wait(lock, [this] { return m_jobs.empty() && !m_busy; });
        if (m_error) {
            std::exception_ptr e = m_error;
            m_error = nullptr;
            std::rethrow_exception(e);
        }
    }

private:
    void loop()
    {
        std::unique_lock<std::mutex> lock(m_mutex);
        for (;;) {
            m_cv.wait(lock, [this] { return m_quit || (!m_held && !m_jobs.empty()); });
            if (m_jobs.empty() || m_held) return;
            std::function<void()> job = std::move(m_jobs.front());
            m_jobs.pop_front();
            m_busy = true;
            lock.unlock();
            try {
                job();
            } catch (...) {
                std::lock_guard<std::mutex> g(m_errMutex);
                if (!m_error) m_error = std::current_exception();
            }
            lock.lock();
            m_busy = false;
            m_cv.notify_all();
        }
    }
    std::mutex m_mutex, m_errMutex;
    std::condition_variable m_cv;
    std::deque<std::function<void()>> m_jobs;
    bool m_busy = false, m_quit = false, m_held = false;
    std::exception_ptr m_error;
    std::thread m_thread;
};

double agreement(const std::vector<int32_t>& ref, const std::vector<int32_t>& got)
{
    if (ref.empty()) return got.empty() ? 1.0 : 0.0;
    size_t same = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) same += ref[i] == got[i];
    return double(same) / double(std::max(ref.size(), got.size()));
}

}  // namespace


namespace {
const std::string kNoJson;
}

namespace {
constexpr int kMaxWindow = 8;          // requests in flight at most with an automatic window
constexpr double kPriorDiscount = 0.5; // a previous run's estimate, before anything is measured (planner.h)
constexpr double kSloSafety = 0.1;     // the planner aims at 90% of the SLO (planner.h)
constexpr double kProgressSeconds = 0.1;  // a reply read this long gives its rate so far to the planner
constexpr double kJitReplies = 5;        // just-in-time requests where a reply takes 5x the guard or more
}

Streamer::Streamer(const Model& model, std::string host, int port, std::vector<int32_t> contextTokens,
                   std::vector<int32_t> question, const KvSet& original)
    : m_model(model), m_host(std::move(host)), m_port(port), m_tokens(std::move(contextTokens)),
      m_question(std::move(question)), m_original(original)
{
    m_context = contextKey(model.runtime().fingerprint(), m_tokens);
}

Streamer::~Streamer() = default;

void Streamer::prepare(const StreamOptions& options, const std::string& logPrefix)
{
    ChunkClient client(m_host, m_port);
    auto fetch = [&](CodecId codec) -> std::unique_ptr<KvcReader> {
        Request r;
        r.type = FrameType::SkeletonRequest;
        r.codec = codec;
        r.context = m_context;
        const Reply rep = client.request(r, uint64_t(256) << 20, monoSeconds() + 60);
        if (rep.type == FrameType::Error) {
            if (codec == m_codec)
                throw Error("chunk server: " + std::string(rep.payload.begin(), rep.payload.end()));
            return nullptr;
        }
        return KvcReader::fromSkeleton(rep.payload, std::string("context ") + m_context + " (" + codecName(codec) + ")");
    };
    try {
        m_cachegen = fetch(m_codec);
        m_int8 = fetch(CodecId::Int8);
    } catch (const NetError& e) {
        throw Error(m_host + ":" + std::to_string(m_port) + ": " + e.what());
    }
    const KvShape& s = m_cachegen->params().shape;
    if (!(s == m_model.runtime().kvShape(int(m_tokens.size()))))
        throw Error("context " + m_context + ": the stored cache's shape does not fit the model and context");
    if (m_int8 && !(m_int8->params().shape == s)) m_int8.reset();

    // The planner's distortion per level: the profile's measured KL, else the size fallback.
    {
        const CodecParams& p = m_cachegen->params();
        std::vector<double> kl, bpv;
        const double valuesPerToken = double(p.shape.numLayers) * 2 * p.shape.channels();
        for (int l = 1; l <= p.numLevels(); ++l) {
            // A transform file's levels are its transformLevels; a cachegen file's, its levels.
            const size_t li = size_t(l - 1);
            const std::string& mj = p.codec == CodecId::Transform
                                        ? (li < p.profile.transformLevels.size() ? p.profile.transformLevels[li].measuredJson : kNoJson)
                                        : (li < p.profile.levels.size() ? p.profile.levels[li].measuredJson : kNoJson);
            const nlohmann::json j = mj.empty() ? nlohmann::json() : nlohmann::json::parse(mj, nullptr, false);
            if (j.is_object() && j.contains("mean_kl") && j["mean_kl"].is_number()) kl.push_back(j["mean_kl"].get<double>());
            else if (j.is_object() && j.contains("kl") && j["kl"].is_number()) kl.push_back(j["kl"].get<double>());
            double bytes = 0;
            for (int c = 0; c < p.numChunks(); ++c) bytes += m_cachegen->chunkBytes(c, l);
            bpv.push_back(8.0 * bytes / (valuesPerToken * double(p.shape.numTokens)));
        }
        if (int(m_levelKl.size()) == p.numLevels()) kl = m_levelKl;  // figures for another level set do not apply
        if (int(kl.size()) != p.numLevels()) kl.clear();
        m_distortion = kvscope::levelDistortion(kl, bpv, &m_distortionSource);
    }
    // The decode rate here: chunk 0 at the default level, decoded twice (the first pays one-time costs).
    {
        const CodecParams& p = m_cachegen->params();
        const int level = std::clamp(p.defaultLevel(), 1, p.numLevels());
        Request r;
        r.type = FrameType::ChunkRequest;
        r.codec = m_codec;
        r.context = m_context;
        r.chunk = 0;
        r.level = uint32_t(level);
        try {
            const Reply rep = client.request(r, m_cachegen->chunkBytes(0, level), monoSeconds() + 60);
            if (rep.type == FrameType::Chunk) {
                KvSet scratch(p.shape, DType::F16);
                double best = 1e30;
                for (int k = 0; k < 2; ++k) {
                    const double t0 = monoSeconds();
                    m_cachegen->decodePayloadInto(0, level, rep.payload.data(), rep.payload.size(), scratch);
                    best = std::min(best, monoSeconds() - t0);
                }
                m_decodeSecondsPerToken = best / double(p.chunkLength(0));
            }
        } catch (const std::exception&) {
            m_decodeSecondsPerToken = 0;  // learnt during the first run instead
        }
    }

    // The reference answer, and the prefill rate of the question after the whole context.
    InferenceSession session(m_model.runtime());
    const double l0 = monoSeconds();
    session.loadKv(m_original);
    m_kvLoadSeconds = monoSeconds() - l0;
    std::vector<float> logits;
    session.append(m_question, &logits);  // warm-up: the first forward pays one-time costs
    session.truncate(int(m_tokens.size()));
    const double t0 = monoSeconds();
    session.append(m_question, &logits);
    m_prefillSeconds = monoSeconds() - t0;
    m_prefillRate = double(m_question.size()) / std::max(1e-6, m_prefillSeconds);
    {
        const double f0 = monoSeconds();
        (void)argmax(logits.data(), logits.size());
        m_firstTokenSeconds = monoSeconds() - f0;
    }
    session.truncate(int(m_tokens.size()));
    const Generation g = generate(session, m_question, options.qualityTokens, SamplingOptions{}, m_model.stopIds());
    m_refTokens = g.tokens;
    m_refText = m_model.tokenizer().decode(g.tokens, true);
    std::fprintf(stderr,
                 "%s: context %s, %d chunks of %d tokens, %s; question prefill %.3f s (%.0f tokens/s), "
                 "decode %.2f ms/chunk, cache load %.3f s; level distortion from %s\n",
                 logPrefix.c_str(), m_context.c_str(), m_cachegen->params().numChunks(),
                 m_cachegen->params().profile.chunkTokens,
                 (std::string(codecName(m_codec)) + (m_int8 ? " + int8" : " only")).c_str(),
                 m_prefillSeconds, m_prefillRate, 1e3 * m_decodeSecondsPerToken * m_cachegen->params().profile.chunkTokens,
                 m_kvLoadSeconds, m_distortionSource.c_str());
}

StreamResult Streamer::run(const StreamOptions& opt, LinkPacer* pacer, double linkOffset)
{
    KVSCOPE_ASSERT(m_cachegen);
    const Policy& policy = opt.policy;
    if (policy.kind == Policy::Int8 && !m_int8)
        throw Error("--policy int8: the store has no int8 encoding of this context (encode the KV with --codec int8 "
                    "and add the file to --store)");
    const KvcReader& reader = policy.kind == Policy::Int8 ? *m_int8 : *m_cachegen;
    const CodecParams& params = reader.params();
    const int levels = params.numLevels();
    if (policy.kind == Policy::Level && policy.level > levels)
        throw Error("--policy " + policy.name() + ": the file has " + std::to_string(levels) + " levels");
    const int chunks = params.numChunks();
    const TargetHardware& hw = opt.target;
    const bool modelDecode = hw.decodeGBps > 0, modelPrefill = hw.prefillTokensPerSecond > 0;
    const size_t fp16BytesPerToken = size_t(fp16KvBytesPerToken(params.shape));
    // Modelled decode writes the target model's fp16 KV, which may be larger than the served one's.
    const double modelledDecodeBytesPerToken = hw.kvBytesPerToken > 0 ? hw.kvBytesPerToken : double(fp16BytesPerToken);

    StreamResult res;
    res.policy = policy.name();
    res.sloSeconds = opt.sloSeconds;
    res.chunks.resize(size_t(chunks));

    // Preallocated like a serving engine's cache: not part of the TTFT.
    KvSet assembled(params.shape, DType::F16);
    assembled.tokens = m_tokens;
    auto recomputeSession = std::make_unique<InferenceSession>(m_model.runtime());
    bool sessionValid = false;  // recomputeSession holds exactly assembled's first position() tokens

    // When decode and recompute are both modelled, their real runs on this CPU only build the
    // cache (their durations are replayed from the model after the run), so the worker is held
    // until the last reply has arrived: the real jobs then cannot slow this machine's transfer,
    // and the planner follows the modelled worker timeline (modelWorkerEnd) instead of the real one.
    const bool deferJobs = hw.decodeGBps > 0 && hw.prefillTokensPerSecond > 0;
    Worker worker(deferJobs);
    double modelWorkerEnd = 0;  // deferJobs: monotonic end of the modelled jobs handed over so far
    ChunkClient client(m_host, m_port, ClientOptions{2.0, opt.stallTimeout});
    if (pacer) pacer->reset(linkOffset);
    const double t0 = monoSeconds();
    auto since = [t0](double mono) { return mono - t0; };
    auto logLine = [&](const std::string& s) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "t=%.3fs ", since(monoSeconds()));
        res.log.push_back(buf + s);
    };

    // Estimates the controller learns as the run goes.
    double rttEstimate = -1;  // smallest first-byte delay seen (not counting a new connection's first reply)
    double rttUpper = -1;     // a new connection's first reply's delay: at least the RTT
    // The RTT as best known: the measured one, else the upper bound (-1: neither yet).
    auto rttOrUpper = [&] { return rttEstimate >= 0 ? rttEstimate : rttUpper; };
    ThroughputEstimator estimator;
    bool provisional = false;  // the estimator holds only a new connection's first reply
    const double prior = m_priorThroughput * kPriorDiscount;
    const double recomputeRate = modelPrefill ? hw.prefillTokensPerSecond : m_prefillRate;
    const double tailPrefill = modelPrefill ? modelledPassSeconds(hw, int(m_question.size())) : m_prefillSeconds;
    const double tailSeconds = tailPrefill + m_firstTokenSeconds + (modelDecode ? 0.0 : m_kvLoadSeconds);
    std::atomic<double> decodePerToken{modelDecode ? modelledDecodeBytesPerToken / (hw.decodeGBps * 1e9)
                                                   : m_decodeSecondsPerToken};
    const double recomputePerToken = 1.0 / std::max(1e-9, recomputeRate);
    const double recomputeFloor = modelPrefill ? std::max(0.0, hw.weightPassSeconds) : 0.0;
    bool serverDown = false;
    uint64_t delivered = 0;
    double lastArrival = 0, firstByte = -1;

    auto decodeJob = [&, fp16BytesPerToken](int i, int level, std::vector<uint8_t> payload) {
        return [&, i, level, fp16BytesPerToken, payload = std::move(payload)]() {
            ChunkEvent& ev = res.chunks[size_t(i)];
            const double s = monoSeconds();
            reader.decodePayloadInto(i, level, payload.data(), payload.size(), assembled);
            const double e = monoSeconds();
            ev.jobStartS = since(s);
            ev.decodedS = since(e);
            ev.jobSeconds = e - s;
            if (!modelDecode) decodePerToken = (e - s) / double(params.chunkLength(i));
        };
    };
    auto recomputeJob = [&](int i, std::vector<int32_t> tokens) {
        return [&, i, tokens = std::move(tokens)]() {
            ChunkEvent& ev = res.chunks[size_t(i)];
            const double s = monoSeconds();
            const int start = params.chunkStart(i), n = params.chunkLength(i);
            if (!sessionValid || recomputeSession->position() != start) {
                if (start == 0) {
                    recomputeSession->truncate(0);
                } else {
                    KvSet prefix(m_model.runtime().kvShape(start), DType::F16);
                    copyTokens(assembled, 0, prefix, 0, start);
                    prefix.tokens.assign(m_tokens.begin(), m_tokens.begin() + start);
                    recomputeSession->loadKv(prefix);
                }
            }
            recomputeSession->append(tokens, nullptr);
            const KvSet all = recomputeSession->exportKv();
            copyTokens(all, start, assembled, start, n);
            sessionValid = true;
            const double e = monoSeconds();
            ev.jobStartS = since(s);
            ev.decodedS = since(e);
            ev.jobSeconds = e - s;
        };
    };

    // Jobs are handed to the worker as soon as they can run: a decode when its chunk has arrived
    // (decoding needs no other chunk), a recompute once every chunk before it has been handed over
    // (it attends to them). owedSeconds is the predicted work the worker still owes.
    std::vector<std::function<void()>> jobs(static_cast<size_t>(chunks));
    std::vector<double> jobPredicted(size_t(chunks), 0.0);
    std::vector<char> ready(size_t(chunks), 0);      // fetched or given up, job built
    std::vector<char> submitted(size_t(chunks), 0);  // handed to the worker
    std::vector<int> submitOrder;                    // the worker's job order
    std::vector<int> attempts(size_t(chunks), 0);
    std::mutex owedMutex;
    double owedSeconds = 0;
    int prefixSubmitted = 0;  // chunks [0, prefixSubmitted) are all handed over
    auto localTokens = [&](int i) {
        const int start = params.chunkStart(i), n = params.chunkLength(i);
        return std::vector<int32_t>(m_tokens.begin() + start, m_tokens.begin() + start + n);
    };
    auto jobCost = [&](int i, int level) {
        return level == 0 ? std::max(recomputeFloor, double(params.chunkLength(i)) * recomputePerToken)
                          : double(params.chunkLength(i)) * decodePerToken.load();
    };
    auto submitOne = [&](int i) {
        const double predicted = jobPredicted[size_t(i)];
        modelWorkerEnd = std::max(modelWorkerEnd, t0 + res.chunks[size_t(i)].arrivedS) + predicted;
        {
            std::lock_guard<std::mutex> lock(owedMutex);
            owedSeconds += predicted;
        }
        submitted[size_t(i)] = 1;
        submitOrder.push_back(i);
        worker.submit([&, job = std::move(jobs[size_t(i)]), predicted] {
            struct Paid {
                std::mutex& m;
                double& owed;
                double p;
                ~Paid()
                {
                    std::lock_guard<std::mutex> lock(m);
                    owed -= p;
                }
            } paid{owedMutex, owedSeconds, predicted};
            job();
        });
        const ChunkEvent& ev = res.chunks[size_t(i)];
        // A copy of the fetch's fields only: the worker may be writing the job's fields now.
        ChunkEvent fetched;
        fetched.index = ev.index;
        fetched.level = ev.level;
        fetched.local = ev.local;
        fetched.bytes = ev.bytes;
        fetched.sentS = ev.sentS;
        fetched.firstByteS = ev.firstByteS;
        fetched.arrivedS = ev.arrivedS;
        fetched.attempts = ev.attempts;
        fetched.note = ev.note;
        fetched.throughputEstimate = ev.throughputEstimate;
        fetched.predictedTtftS = ev.predictedTtftS;
        if (opt.onChunk && !opt.onChunk(fetched)) {
            worker.drain();  // the jobs hold references into this frame
            throw Error("stream: cancelled");
        }
    };
    auto submitReady = [&] {
        for (int i = prefixSubmitted; i < chunks; ++i) {
            if (!submitted[size_t(i)] && ready[size_t(i)] && (res.chunks[size_t(i)].level > 0 || i == prefixSubmitted))
                submitOne(i);
            if (submitted[size_t(i)] && i == prefixSubmitted) ++prefixSubmitted;
        }
    };
    auto giveUp = [&](int i) {
        ChunkEvent& ev = res.chunks[size_t(i)];
        ev.level = 0;
        ev.local = true;
        ev.bytes = 0;
        ev.sentS = ev.firstByteS = ev.arrivedS = since(monoSeconds());
        logLine("chunk " + std::to_string(i) + ": recomputed from local tokens");
        jobs[size_t(i)] = recomputeJob(i, localTokens(i));
        jobPredicted[size_t(i)] = jobCost(i, 0);
        ready[size_t(i)] = 1;
    };
    auto note = [&](int i, const std::string& what) {
        ChunkEvent& ev = res.chunks[size_t(i)];
        ev.note += std::string(ev.note.empty() ? "" : "; ") + what;
    };

    struct InFlight {
        int chunk, level;
        uint64_t expected;
        double sentAt, predictedThroughput;
        bool fresh;  // sent on a new connection
        bool lowerBound;  // predictedThroughput came from the provisional sample alone
    };
    std::deque<InFlight> inflight;
    // Fixed policies fetch in chunk order. Adaptive fetches from the last chunk backwards
    // (todo.front() is the next fetch) and recomputes text from chunk 0 forwards (todo.back(),
    // while it is textFront): see planner.h.
    const bool adaptive = policy.kind == Policy::Adaptive;
    std::deque<int> todo;
    for (int i = 0; i < chunks; ++i) {
        todo.push_back(adaptive ? chunks - 1 - i : i);
        res.chunks[size_t(i)].index = i;
    }
    int textFront = 0;  // adaptive: chunks [0, textFront) are committed to text recompute
    double prevReplyEnd = 0;  // monotonic end of the previous reply on this connection (0: none)
    auto wireBytes = [&](int i, int level) {
        return level == 0 ? 0.0 : double(kFrameHeaderBytes) + double(reader.chunkBytes(i, level));
    };

    // End (monotonic) of the work handed to the worker, and of the settled chunks held back for
    // it; not the decodes of the replies still in flight.
    auto workerFreeAt = [&](double now) {
        double w;
        if (deferJobs) {
            w = std::max(now, modelWorkerEnd);
        } else {
            std::lock_guard<std::mutex> lock(owedMutex);
            w = now + std::max(0.0, owedSeconds);
        }
        for (int k = prefixSubmitted; k < chunks; ++k)
            if (ready[size_t(k)] && !submitted[size_t(k)]) w += jobPredicted[size_t(k)];
        return w;
    };
    // The chunks at the back of todo that continue the text prefix: they may be recomputed.
    auto textableCount = [&] {
        int c = 0;
        for (auto it = todo.rbegin(); it != todo.rend() && *it == textFront + c; ++it) ++c;
        return c;
    };

    // The adaptive plan for the chunks in todo (planner.h), given what is in flight and owed.
    struct AdaptivePlan {
        PlanResult plan;
        double throughput = 0;   // the estimate it used (bytes/s)
        double linkEnd = 0;      // predicted end of the replies in flight (monotonic; 0: none or no estimate)
        double lastReplySeconds = 0;  // predicted time the last reply in flight takes on the link
    };
    auto planAdaptive = [&](double now) {
        AdaptivePlan ap;
        PlanResult& pr = ap.plan;
        const int textable = textableCount();
        double thr = estimator.valid() ? estimator.estimate() : prior;
        // A reply that has been arriving for a while more slowly than the estimate is the newest
        // evidence of the link: its rate so far caps the estimate. Only after kProgressSeconds,
        // so that a reply of a few milliseconds (reads in bursts) never counts.
        const double rttKnown = std::max(0.0, rttOrUpper());
        if (thr > 0 && client.receiving() && !inflight.empty()) {
            const double elapsed = now - std::max(prevReplyEnd, inflight.front().sentAt + rttKnown);
            if (elapsed >= kProgressSeconds) thr = std::min(thr, double(client.partialBytes()) / elapsed);
        }
        pr.predictedTtft = 0;
        if (thr <= 0) {
            // Nothing known of the link: the next fetch at the file's default level, and chunk 0
            // recomputed meanwhile if that alone fits the SLO (it overlaps the first fetch).
            pr.choice = std::clamp(params.defaultLevel(), 1, levels);
            const bool chunk0 = textFront == 0 && textable > 0 &&
                                jobCost(0, 0) + tailSeconds <= opt.sloSeconds * (1.0 - kSloSafety);
            pr.textChunks = chunk0 ? 1 : 0;
            if (pr.textChunks == int(todo.size())) pr.choice = 0;
            return ap;
        }
        const double rtt = std::max(0.0, rttEstimate);
        const double dpt = decodePerToken.load();
        PlanInput in;
        // Replay what is committed: the replies in flight on the link, their decodes owed.
        double link = prevReplyEnd > 0 ? prevReplyEnd : now;
        for (const InFlight& f : inflight) {
            // The reply being read has only its rest to cross.
            const double bytes = wireBytes(f.chunk, f.level) - (&f == &inflight.front() ? double(client.partialBytes()) : 0.0);
            link = &f == &inflight.front() && client.receiving() ? now + std::max(0.0, bytes) / thr
                                                                 : std::max(link, f.sentAt + rtt) + bytes / thr;
            in.owed.push_back({since(std::max(link, now)), double(params.chunkLength(f.chunk)) * dpt});
        }
        in.distortion = m_distortion;
        for (int k : todo) {
            PlanChunk pc;
            pc.tokens = params.chunkLength(k);
            for (int c = 0; c <= levels; ++c) pc.bytes.push_back(wireBytes(k, c));
            in.chunks.push_back(pc);
        }
        in.textable = textable;
        in.now = since(now);
        in.linkBusyUntil = since(std::max(link, now));
        if (!inflight.empty()) {
            ap.linkEnd = std::max(link, now);
            ap.lastReplySeconds = wireBytes(inflight.back().chunk, inflight.back().level) / thr;
        }
        in.workerBusyUntil = since(workerFreeAt(now));
        in.throughput = thr;
        in.rtt = rtt;
        in.decodeSecondsPerToken = dpt;
        in.recomputeSecondsPerToken = recomputePerToken;
        in.recomputeFloorSeconds = recomputeFloor;
        in.tailSeconds = tailSeconds;
        in.slo = opt.sloSeconds * (1.0 - kSloSafety);
        in.horizon = opt.horizon;
        pr = planChunks(in);
        ap.throughput = thr;
        return ap;
    };

    // Requests to keep in flight. A fixed policy has nothing to decide: kMaxWindow requests (the
    // server queues up to kMaxPipelined per connection), so the link never waits for a request. Adaptive
    // commits a level with every request, so it keeps only what covers one round trip at the
    // estimated throughput (the bandwidth-delay product) behind the current reply, plus the reply;
    // until this run has measured a chunk it sends one request (a prior estimate from an earlier
    // run, at another point of the link, may be wrong by several times: ATT's trace swings 5x
    // within seconds), so at most one fetch is committed on a guess.
    double lastReplyBytes = 0;
    auto windowNow = [&] {
        if (policy.kind != Policy::Adaptive) return opt.window > 0 ? opt.window : kMaxWindow;
        if (!estimator.valid()) return 1;
        if (opt.window > 0) return opt.window;
        const double thr = estimator.harmonicMean();
        if (rttEstimate < 0 || lastReplyBytes <= 0) return 2;
        return std::clamp(2 + int(std::ceil(thr * rttEstimate / lastReplyBytes)), 2, kMaxWindow);
    };

    // Text recompute costs no request (the client holds the context's tokens: it named the context
    // by them), only the worker's time.
    auto commitText = [&](int i) {
        ChunkEvent& ev = res.chunks[size_t(i)];
        ev.level = 0;
        ev.sentS = ev.firstByteS = ev.arrivedS = since(monoSeconds());
        jobs[size_t(i)] = recomputeJob(i, localTokens(i));
        jobPredicted[size_t(i)] = jobCost(i, 0);
        ready[size_t(i)] = 1;
    };
    // Adaptive commits a text chunk only when the worker is about to run out of work, this much
    // ahead (half the recompute, 2-20 ms), so that a wake-up late by a descheduled thread does not idle it.
    auto textLead = [&](int i) { return std::clamp(0.5 * jobCost(i, 0), 0.002, 0.02); };

    double frontDeadline = 0;  // the hard limit on the reply being read
    while (!todo.empty() || !inflight.empty()) {
        // Keep the window full; adaptive also commits its next text chunk when it is due.
        const int window = windowNow();
        double wakeAt = 0;  // adaptive: when the next text chunk or fetch falls due (monotonic; 0: none)
        while (!serverDown && !todo.empty()) {
            const int i = todo.front();
            ChunkEvent& ev = res.chunks[size_t(i)];
            if (attempts[size_t(i)] >= opt.maxAttempts ||
                (attempts[size_t(i)] > 0 && since(monoSeconds()) >= opt.sloSeconds)) {
                if (attempts[size_t(i)] < opt.maxAttempts)
                    logLine("chunk " + std::to_string(i) + ": no SLO budget left for another attempt");
                todo.pop_front();
                giveUp(i);
                submitReady();
                continue;
            }
            int level = 0;
            if (adaptive) {
                const double now = monoSeconds();
                const AdaptivePlan ap = planAdaptive(now);
                const PlanResult& pr = ap.plan;
                const double thr = ap.throughput;
                wakeAt = 0;
                const bool allText = pr.textChunks >= int(todo.size());
                if (pr.textChunks > 0) {
                    // Due when the worker is about to run dry; until then the loop reads replies
                    // and wakes up at that moment (wakeAt).
                    const int t = todo.back();
                    const double free = workerFreeAt(now);
                    if (free <= now + textLead(t) || (allText && inflight.empty())) {
                        commitText(t);
                        res.chunks[size_t(t)].throughputEstimate = thr;
                        res.chunks[size_t(t)].predictedTtftS = pr.predictedTtft;
                        todo.pop_back();
                        ++textFront;
                        submitReady();
                        continue;
                    }
                    wakeAt = free - textLead(t);
                }
                if (allText || int(inflight.size()) >= window) break;
                // Just in time: the next request need only reach the server before the link runs
                // out of replies, so it is committed when the replies in flight are predicted to
                // end within 2 x (RTT + 2 ms) (twice, for an estimate up to 2x low), not a whole
                // reply ahead: on a link that dips, the level of the next chunk is then chosen
                // after the current one has measured the dip. Only where a reply takes at least
                // kJitReplies times that guard: on a fast link an estimate several times low
                // (replies of milliseconds, read in bursts) would leave the link idle for a round
                // trip before every reply, and there is little to learn by waiting.
                const double rttJit = rttOrUpper();
                const double guard = 2 * (rttJit + 0.002);
                if (ap.linkEnd > 0 && rttJit >= 0 && ap.lastReplySeconds >= kJitReplies * guard) {
                    const double due = ap.linkEnd - guard;
                    if (now < due) {
                        wakeAt = wakeAt > 0 ? std::min(wakeAt, due) : due;
                        break;
                    }
                }
                level = std::max(1, pr.choice);
                ev.throughputEstimate = thr;
                ev.predictedTtftS = pr.predictedTtft;
            } else {
                if (int(inflight.size()) >= window) break;
                switch (policy.kind) {
                case Policy::Text: level = 0; break;
                case Policy::Int8: level = 1; break;
                case Policy::Level: level = policy.level; break;
                case Policy::Adaptive: break;
                }
                if (level == 0) {
                    commitText(i);
                    todo.pop_front();
                    submitReady();
                    continue;
                }
            }
            Request rq;
            rq.type = level == 0 ? FrameType::TextRequest : FrameType::ChunkRequest;
            rq.codec = params.codec;
            rq.context = m_context;
            rq.chunk = uint32_t(i);
            rq.level = uint32_t(level);
            const uint64_t expected = level == 0 ? uint64_t(params.chunkLength(i)) * 4 : reader.chunkBytes(i, level);
            const int attempt = ++attempts[size_t(i)];
            ev.attempts = attempt;
            try {
                const bool fresh = !client.connected();  // this request opens the connection
                const double sentAt = client.send(rq);
                // A prior from an earlier run is a guess, not this estimator's prediction: its miss
                // does not count as the estimator's error. A provisional sample is a lower bound:
                // only a reply slower than predicted from it counts.
                inflight.push_back({i, level, expected, sentAt, estimator.valid() ? ev.throughputEstimate : 0.0, fresh,
                                    provisional});
                todo.pop_front();
            } catch (const std::exception& e) {
                const NetError* ne = dynamic_cast<const NetError*>(&e);
                const bool refused = ne && ne->kind() == NetError::Failed && !client.connected();
                note(i, "attempt " + std::to_string(attempt) + ": " + e.what());
                logLine("chunk " + std::to_string(i) + " attempt " + std::to_string(attempt) + ": " + e.what());
                // The connection is gone and with it the requests in flight: ask for them again.
                for (auto it = inflight.rbegin(); it != inflight.rend(); ++it) {
                    --attempts[size_t(it->chunk)];
                    todo.push_front(it->chunk);
                }
                inflight.clear();
                prevReplyEnd = 0;
                if (refused) {
                    serverDown = true;
                    logLine("server unreachable: the remaining chunks are recomputed from local tokens");
                }
            }
        }
        if (serverDown) {
            for (int k : todo) giveUp(k);
            todo.clear();
            submitReady();
            continue;
        }
        if (inflight.empty()) {
            submitReady();
            continue;
        }
        const InFlight f = inflight.front();
        ChunkEvent& ev = res.chunks[size_t(f.chunk)];
        Reply rep;
        try {
            if (!client.receiving()) frontDeadline = monoSeconds() + opt.fetchTimeout;
            // Read the reply, but break off when a text chunk or fetch falls due (wakeAt): commit it, then read on.
            if (!client.receivePart(rep, f.expected, frontDeadline,
                                    wakeAt > 0 ? wakeAt : std::numeric_limits<double>::infinity()))
                continue;
        } catch (const std::exception& e) {
            note(f.chunk, "attempt " + std::to_string(attempts[size_t(f.chunk)]) + ": " + e.what());
            logLine("chunk " + std::to_string(f.chunk) + " attempt " + std::to_string(attempts[size_t(f.chunk)]) + ": " +
                    e.what());
            for (auto it = inflight.rbegin(); it != inflight.rend(); ++it) {
                if (it->chunk != f.chunk) --attempts[size_t(it->chunk)];  // lost with the connection, not failed
                todo.push_front(it->chunk);
            }
            inflight.clear();
            prevReplyEnd = 0;
            continue;
        }
        inflight.pop_front();
        delivered += rep.wireBytes;
        lastArrival = std::max(lastArrival, since(rep.arrivedAt));
        if (firstByte < 0) firstByte = since(rep.firstByteAt);
        const double replyStart = std::max(prevReplyEnd, rep.sentAt + std::max(0.0, rttEstimate));
        prevReplyEnd = rep.arrivedAt;
        if (rep.type != FrameType::Error && rep.wireBytes > 1024) lastReplyBytes = double(rep.wireBytes);
        if (rep.type == FrameType::Error) {
            const std::string msg(rep.payload.begin(), rep.payload.end());
            note(f.chunk, "server: " + msg);
            logLine("chunk " + std::to_string(f.chunk) + ": server error: " + msg);
            giveUp(f.chunk);  // asking again would get the same answer
            submitReady();
            continue;
        }
        if (f.level > 0 && (rep.payload.size() != f.expected ||
                            crc32(rep.payload.data(), rep.payload.size()) != reader.chunkCrc(f.chunk, f.level))) {
            note(f.chunk, "attempt " + std::to_string(attempts[size_t(f.chunk)]) + ": CRC mismatch");
            logLine("chunk " + std::to_string(f.chunk) + " level " + std::to_string(f.level) + ": CRC mismatch, retrying");
            todo.push_front(f.chunk);
            continue;
        }
        // Success: measure, then hand the chunk on.
        // The first reply on a new connection also waited for the connection's setup (and a reader
        // that comes late finds it whole in the socket: 431 KB "in 0.2 ms"): its delay is no RTT and
        // its span no measure of the link. It gives a provisional sample, its bytes over the whole
        // round trip (a lower bound on the rate): it ages out like any other, and until then holds
        // the next samples to the estimator's band (a second reply read late looked 4x too fast).
        // A reply requested on it alone counts a prediction error only when slower than predicted.
        const double firstDelay = rep.firstByteAt - rep.sentAt;
        if (!f.fresh) rttEstimate = rttEstimate < 0 ? firstDelay : std::min(rttEstimate, firstDelay);
        else rttUpper = rttUpper < 0 ? firstDelay : std::min(rttUpper, firstDelay);
        if (f.level > 0 && rep.payload.size() >= 1024) {
            if (f.fresh) {
                if (!estimator.valid() && rep.arrivedAt > rep.sentAt) {
                    estimator.add(double(rep.wireBytes) / (rep.arrivedAt - rep.sentAt), 0);
                    provisional = true;
                }
            } else {
                const double span = rep.arrivedAt - std::max(replyStart, rep.sentAt + std::max(0.0, rttEstimate));
                if (span > 0) {
                    provisional = false;
                    const double sample = double(rep.wireBytes) / span;
                    estimator.add(sample, f.lowerBound && sample >= f.predictedThroughput ? 0.0 : f.predictedThroughput);
                }
            }
        }
        ev.level = f.level;
        ev.bytes = rep.payload.size();
        ev.sentS = since(rep.sentAt);
        ev.firstByteS = since(rep.firstByteAt);
        ev.arrivedS = since(rep.arrivedAt);
        if (f.level == 0) {
            std::vector<int32_t> tokens = decodeTokens(rep.payload.data(), rep.payload.size(), "text reply");
            if (tokens != localTokens(f.chunk)) {
                logLine("chunk " + std::to_string(f.chunk) + ": the server's tokens differ from ours; using ours");
                tokens = localTokens(f.chunk);
            }
            jobs[size_t(f.chunk)] = recomputeJob(f.chunk, std::move(tokens));
        } else {
            jobs[size_t(f.chunk)] = decodeJob(f.chunk, f.level, std::move(rep.payload));
        }
        jobPredicted[size_t(f.chunk)] = jobCost(f.chunk, f.level);
        ready[size_t(f.chunk)] = 1;
        submitReady();
    }
    submitReady();
    if (estimator.valid()) m_priorThroughput = estimator.harmonicMean();
    res.distortionSource = m_distortionSource;
    worker.drain();
    if (pacer) {
        res.linkSeconds = std::max(lastArrival, 1e-9);
        res.capacityBytes = pacer->schedule().capacityBytes(linkOffset, linkOffset + lastArrival);
        res.idleLostBytes = pacer->idleLostBytes();
        res.busyLostBytes = pacer->busyLostBytes();
        res.busyCapacityBytes = pacer->busyCapacityBytes();
        if (firstByte >= 0) {
            res.backloggedCapacityBytes = pacer->schedule().capacityBytes(linkOffset + firstByte, linkOffset + lastArrival);
            res.backloggedDeliveredBytes = delivered;
        }
    }
    res.deliveredBytes = delivered;

    // Job timeline: measured as it ran, or replayed with modelled durations from measured arrivals,
    // in the order the worker ran the jobs.
    KVSCOPE_ASSERT(int(submitOrder.size()) == chunks);
    double prevEnd = 0;
    for (int idx : submitOrder) {
        ChunkEvent& ev = res.chunks[size_t(idx)];
        const bool isText = ev.level == 0;
        const int n = params.chunkLength(ev.index);
        if ((isText && modelPrefill) || (!isText && modelDecode)) {
            ev.jobSeconds = isText ? modelledPassSeconds(hw, n)
                                   : double(n) * modelledDecodeBytesPerToken / (hw.decodeGBps * 1e9);
            ev.jobStartS = std::max(ev.arrivedS, prevEnd);
            ev.decodedS = ev.jobStartS + ev.jobSeconds;
        }
        prevEnd = ev.decodedS;
        (isText ? res.recomputeBusySeconds : res.decodeBusySeconds) += ev.jobSeconds;
    }
    // Critical path: fetching ends when the last chunk arrived or was given up; what the worker
    // still had to do after that is the decode and recompute that pipelining could not hide.
    double settled = 0;
    for (const ChunkEvent& ev : res.chunks) settled = std::max(settled, ev.arrivedS);
    const double kvReady = std::max(prevEnd, settled);
    double recomputeTail = 0;
    for (const ChunkEvent& ev : res.chunks)
        if (ev.level == 0) recomputeTail += std::max(0.0, ev.decodedS - std::max(ev.jobStartS, settled));
    res.transfer = {settled, false};
    res.recompute = {recomputeTail, modelPrefill};
    res.decode = {std::max(0.0, kvReady - settled - recomputeTail), modelDecode};

    // The question: load the assembled cache, prefill the question, take the first token.
    std::unique_ptr<InferenceSession> session;
    double s = monoSeconds();
    if (sessionValid && recomputeSession->position() == params.shape.numTokens) {
        session = std::move(recomputeSession);  // the last chunks were recomputed: the cache is already there
    } else {
        session = std::make_unique<InferenceSession>(m_model.runtime());
        session->loadKv(assembled);
    }
    const double kvLoad = monoSeconds() - s;
    std::vector<float> logits;
    s = monoSeconds();
    session->append(m_question, &logits);
    const double prefill = monoSeconds() - s;
    s = monoSeconds();
    const int32_t first = argmax(logits.data(), logits.size());
    const double firstToken = monoSeconds() - s;
    res.kvLoad = {modelDecode ? 0.0 : kvLoad, modelDecode};
    res.prefill = {modelPrefill ? tailPrefill : prefill, modelPrefill};
    res.firstToken = {firstToken, false};
    res.ttftSeconds = kvReady + res.kvLoad.seconds + res.prefill.seconds + res.firstToken.seconds;
    res.sloMet = res.ttftSeconds <= opt.sloSeconds;
    if (opt.keepCache) res.cache = std::make_shared<KvSet>(std::move(assembled));

    // Quality: the rest of a greedy answer, against the reference from the original cache.
    res.tokens.push_back(first);
    const std::vector<int32_t> stops = m_model.stopIds();
    if (std::find(stops.begin(), stops.end(), first) == stops.end() && opt.qualityTokens > 1) {
        const Generation g = generate(*session, {first}, opt.qualityTokens - 1, SamplingOptions{}, stops);
        res.tokens.insert(res.tokens.end(), g.tokens.begin(), g.tokens.end());
    }
    res.text = m_model.tokenizer().decode(res.tokens, true);
    res.tokenAgreement = agreement(m_refTokens, res.tokens);
    res.firstTokenMatch = !m_refTokens.empty() && m_refTokens[0] == first;
    return res;
}

}  // namespace kvscope
