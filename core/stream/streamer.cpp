#include "stream/streamer.h"

#include "common/crc32.h"
#include "model/generate.h"
#include "stream/protocol.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace kvscope {

std::string Policy::name() const
{
    switch (kind) {
    case Adaptive: return "adaptive";
    case Text: return "text";
    case Int8: return "int8";
    case Level: return "level:" + std::to_string(level);
    }
    return "?";
}

Policy parsePolicy(const std::string& text)
{
    Policy p;
    if (text == "adaptive") p.kind = Policy::Adaptive;
    else if (text == "text") p.kind = Policy::Text;
    else if (text == "int8") p.kind = Policy::Int8;
    else if (text.rfind("level:", 0) == 0) {
        p.kind = Policy::Level;
        const std::string n = text.substr(6);
        char* end = nullptr;
        const long v = std::strtol(n.c_str(), &end, 10);
        if (n.empty() || *end || v < 1 || v > 64) throw inputError("--policy", "'" + text + "'", "level:N needs N in 1..64");
        p.level = int(v);
    } else {
        throw inputError("--policy", "'" + text + "'", "expected adaptive, text, int8 or level:N");
    }
    return p;
}

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

// Runs jobs one after another on its own thread, in submission order.
class Worker {
public:
    Worker() : m_thread([this] { loop(); }) {}
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
            m_cv.wait(lock, [this] { return m_quit || !m_jobs.empty(); });
            if (m_jobs.empty()) return;
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
    bool m_busy = false, m_quit = false;
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

struct Streamer::Impl {};

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
            if (codec == CodecId::CacheGen)
                throw Error("chunk server: " + std::string(rep.payload.begin(), rep.payload.end()));
            return nullptr;
        }
        return KvcReader::fromSkeleton(rep.payload, std::string("context ") + m_context + " (" + codecName(codec) + ")");
    };
    try {
        m_cachegen = fetch(CodecId::CacheGen);
        m_int8 = fetch(CodecId::Int8);
    } catch (const NetError& e) {
        throw Error(m_host + ":" + std::to_string(m_port) + ": " + e.what());
    }
    const KvShape& s = m_cachegen->params().shape;
    if (!(s == m_model.runtime().kvShape(int(m_tokens.size()))))
        throw Error("context " + m_context + ": the stored cache's shape does not fit the model and context");
    if (m_int8 && !(m_int8->params().shape == s)) m_int8.reset();

    // The reference answer, and the prefill rate of the question after the whole context.
    InferenceSession session(m_model.runtime());
    session.loadKv(m_original);
    std::vector<float> logits;
    session.append(m_question, &logits);  // warm-up: the first forward pays one-time costs
    session.truncate(int(m_tokens.size()));
    const double t0 = monoSeconds();
    session.append(m_question, &logits);
    m_prefillSeconds = monoSeconds() - t0;
    m_prefillRate = double(m_question.size()) / std::max(1e-6, m_prefillSeconds);
    session.truncate(int(m_tokens.size()));
    const Generation g = generate(session, m_question, options.qualityTokens, SamplingOptions{}, m_model.stopIds());
    m_refTokens = g.tokens;
    m_refText = m_model.tokenizer().decode(g.tokens, true);
    std::fprintf(stderr, "%s: context %s, %d chunks of %d tokens, %s; question prefill %.3f s (%.0f tokens/s)\n",
                 logPrefix.c_str(), m_context.c_str(), m_cachegen->params().numChunks(),
                 m_cachegen->params().profile.chunkTokens, m_int8 ? "cachegen + int8" : "cachegen only",
                 m_prefillSeconds, m_prefillRate);
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
    const size_t fp16BytesPerToken = size_t(params.shape.numLayers) * 2 * params.shape.channels() * 2;

    StreamResult res;
    res.policy = policy.name();
    res.sloSeconds = opt.sloSeconds;
    res.chunks.resize(size_t(chunks));

    // Preallocated like a serving engine's cache: not part of the TTFT.
    KvSet assembled(params.shape, DType::F16);
    assembled.tokens = m_tokens;
    auto recomputeSession = std::make_unique<InferenceSession>(m_model.runtime());
    bool sessionValid = false;  // recomputeSession holds exactly assembled's first position() tokens

    Worker worker;
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
    double rttEstimate = -1;          // smallest first-byte delay seen
    double throughput = -1;           // bytes/s of the latest chunk fetched
    double decodeSecondsPerByte = -1; // per fp16 byte, from finished decode jobs (worker-written)
    std::mutex estimateMutex;
    const double recomputeRate = modelPrefill ? hw.prefillTokensPerSecond : m_prefillRate;
    const double tailPrefill = modelPrefill ? double(m_question.size()) / hw.prefillTokensPerSecond : m_prefillSeconds;
    bool serverDown = false;
    uint64_t delivered = 0;
    double lastArrival = 0;

    auto decodeJob = [&, fp16BytesPerToken](int i, int level, std::vector<uint8_t> payload) {
        return [&, i, level, fp16BytesPerToken, payload = std::move(payload)]() {
            ChunkEvent& ev = res.chunks[size_t(i)];
            const double s = monoSeconds();
            reader.decodePayloadInto(i, level, payload.data(), payload.size(), assembled);
            const double e = monoSeconds();
            ev.jobStartS = since(s);
            ev.decodedS = since(e);
            ev.jobSeconds = e - s;
            std::lock_guard<std::mutex> lock(estimateMutex);
            decodeSecondsPerByte = (e - s) / double(size_t(params.chunkLength(i)) * fp16BytesPerToken);
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

    for (int i = 0; i < chunks; ++i) {
        ChunkEvent& ev = res.chunks[size_t(i)];
        ev.index = i;
        const int start = params.chunkStart(i), n = params.chunkLength(i);
        const std::vector<int32_t> localTokens(m_tokens.begin() + start, m_tokens.begin() + start + n);
        bool done = false;
        for (int attempt = 1; attempt <= opt.maxAttempts && !serverDown && !done; ++attempt) {
            if (attempt > 1 && since(monoSeconds()) >= opt.sloSeconds) {
                logLine("chunk " + std::to_string(i) + ": no SLO budget left for another attempt");
                break;
            }
            // Choose the level (0 = text).
            int level = 0;
            switch (policy.kind) {
            case Policy::Text: level = 0; break;
            case Policy::Int8: level = 1; break;
            case Policy::Level: level = policy.level; break;
            case Policy::Adaptive: {
                if (throughput <= 0) {
                    level = params.profile.defaultLevel;
                    break;
                }
                double decodeEst;
                {
                    std::lock_guard<std::mutex> lock(estimateMutex);
                    decodeEst = decodeSecondsPerByte;
                }
                const double chunkDecode = modelDecode ? double(n * fp16BytesPerToken) / (hw.decodeGBps * 1e9)
                                                       : std::max(0.0, decodeEst) * double(n * fp16BytesPerToken);
                const double tail = tailPrefill + chunkDecode;
                const double budget = (opt.sloSeconds - since(monoSeconds()) - tail) / double(chunks - i);
                const double rtt = std::max(0.0, rttEstimate);
                level = 0;
                for (int l = levels; l >= 1; --l)
                    if (rtt + reader.chunkBytes(i, l) / throughput <= budget) {
                        level = l;
                        break;
                    }
                if (level == 0) {
                    const double textCost = double(n) / std::max(1e-9, recomputeRate);
                    const double lowest = rtt + reader.chunkBytes(i, 1) / throughput;
                    if (lowest < textCost) level = 1;
                }
                break;
            }
            }
            Request rq;
            rq.type = level == 0 ? FrameType::TextRequest : FrameType::ChunkRequest;
            rq.codec = params.codec;
            rq.context = m_context;
            rq.chunk = uint32_t(i);
            rq.level = uint32_t(level);
            const uint64_t expected = level == 0 ? uint64_t(n) * 4 : reader.chunkBytes(i, level);
            ev.attempts = attempt;
            Reply rep;
            try {
                rep = client.request(rq, expected, monoSeconds() + opt.fetchTimeout);
            } catch (const std::exception& e) {
                const NetError* ne = dynamic_cast<const NetError*>(&e);
                const bool refused = ne && ne->kind() == NetError::Failed && !client.connected();
                ev.note += std::string(ev.note.empty() ? "" : "; ") + "attempt " + std::to_string(attempt) + ": " + e.what();
                logLine("chunk " + std::to_string(i) + " attempt " + std::to_string(attempt) + ": " + e.what());
                if (refused) {
                    serverDown = true;
                    logLine("server unreachable: the remaining chunks are recomputed from local tokens");
                }
                continue;
            }
            delivered += rep.wireBytes;
            lastArrival = std::max(lastArrival, since(rep.arrivedAt));
            if (rep.type == FrameType::Error) {
                const std::string msg(rep.payload.begin(), rep.payload.end());
                ev.note += std::string(ev.note.empty() ? "" : "; ") + "server: " + msg;
                logLine("chunk " + std::to_string(i) + ": server error: " + msg);
                break;  // asking again would get the same answer
            }
            if (level > 0 && (rep.payload.size() != expected ||
                              crc32(rep.payload.data(), rep.payload.size()) != reader.chunkCrc(i, level))) {
                ev.note += std::string(ev.note.empty() ? "" : "; ") + "attempt " + std::to_string(attempt) + ": CRC mismatch";
                logLine("chunk " + std::to_string(i) + " level " + std::to_string(level) + ": CRC mismatch, retrying");
                continue;
            }
            // Success: measure, then hand the chunk to the worker.
            const double firstDelay = rep.firstByteAt - rep.sentAt;
            rttEstimate = rttEstimate < 0 ? firstDelay : std::min(rttEstimate, firstDelay);
            const double span = rep.arrivedAt - rep.sentAt - std::max(0.0, rttEstimate);
            if (level > 0 && rep.payload.size() >= 1024 && span > 0) throughput = double(rep.wireBytes) / span;
            ev.level = level;
            ev.bytes = rep.payload.size();
            ev.sentS = since(rep.sentAt);
            ev.firstByteS = since(rep.firstByteAt);
            ev.arrivedS = since(rep.arrivedAt);
            if (level == 0) {
                std::vector<int32_t> tokens = decodeTokens(rep.payload.data(), rep.payload.size(), "text reply");
                if (tokens != localTokens) {
                    logLine("chunk " + std::to_string(i) + ": the server's tokens differ from ours; using ours");
                    tokens = localTokens;
                }
                worker.submit(recomputeJob(i, std::move(tokens)));
            } else {
                worker.submit(decodeJob(i, level, std::move(rep.payload)));
            }
            done = true;
        }
        if (!done) {
            ev.level = 0;
            ev.local = true;
            ev.sentS = ev.firstByteS = ev.arrivedS = since(monoSeconds());
            logLine("chunk " + std::to_string(i) + ": recomputed from local tokens");
            worker.submit(recomputeJob(i, localTokens));
        }
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
        if (opt.onChunk && !opt.onChunk(fetched)) {
            worker.drain();  // the jobs hold references into this frame
            throw Error("stream: cancelled");
        }
    }
    worker.drain();
    if (pacer) {
        res.linkSeconds = std::max(lastArrival, 1e-9);
        res.capacityBytes = pacer->schedule().capacityBytes(linkOffset, linkOffset + lastArrival);
    }
    res.deliveredBytes = delivered;

    // Job timeline: measured as it ran, or replayed with modelled durations from measured arrivals.
    double prevEnd = 0;
    for (ChunkEvent& ev : res.chunks) {
        const bool isText = ev.level == 0;
        const int n = params.chunkLength(ev.index);
        if ((isText && modelPrefill) || (!isText && modelDecode)) {
            ev.jobSeconds = isText ? double(n) / hw.prefillTokensPerSecond
                                   : double(size_t(n) * fp16BytesPerToken) / (hw.decodeGBps * 1e9);
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
