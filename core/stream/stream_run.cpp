// A StreamRun's fetch controller (the request window, the adaptive plan, reading and measuring
// replies) and, once fetching is over, the question and the answer's quality. The jobs and the
// worker are in stream_run_jobs.cpp.
#include "stream/stream_run.h"

#include "common/crc32.h"
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace kvscope {

namespace {

constexpr int kMaxWindow = 8;          // requests in flight at most with an automatic window
// A previous run's estimate, before anything is measured (planner.h), taken as it is: the first
// fetch is the last chunk, whose level weighs most on quality, and halving the prior (0.5 until
// issue 32) sent it at level 1 on links that carried level 3 (docs/streaming.md); the SLO target
// (StreamOptions::plannerMargin) and the re-plan after the first reply remain the margin.
constexpr double kPriorDiscount = 1.0;

constexpr double kProgressSeconds = 0.1;  // a reply read this long gives its rate so far to the planner
constexpr double kJitReplies = 5;        // just-in-time requests where a reply takes 5x the guard or more
// What the planner is told a level costs that a chained file's segment cannot take (another level
// than the one its first fetch set): no plan with it can meet any deadline.
constexpr double kUnaffordableBytes = 1e18;

double agreement(const std::vector<int32_t>& ref, const std::vector<int32_t>& got)
{
    if (ref.empty()) return got.empty() ? 1.0 : 0.0;
    size_t same = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) same += ref[i] == got[i];
    return double(same) / double(std::max(ref.size(), got.size()));
}

}  // namespace

const KvcReader& StreamRun::chooseReader(const Streamer& streamer, const Policy& policy)
{
    KVSCOPE_ASSERT(streamer.m_cachegen);
    if (policy.kind == Policy::Int8 && !streamer.m_int8)
        throw Error("--policy int8: the store has no int8 encoding of this context (encode the KV with --codec int8 "
                    "and add the file to --store)");
    const KvcReader& reader = policy.kind == Policy::Int8 ? *streamer.m_int8 : *streamer.m_cachegen;
    const int levels = reader.params().numLevels();
    if (policy.kind == Policy::Level && policy.level > levels)
        throw Error("--policy " + policy.name() + ": the file has " + std::to_string(levels) + " levels");
    if (policy.kind == Policy::Adaptive && reader.params().chainsChunks() && reader.params().profile.transform.adaptResetChunks == 0)
        throw Error("--policy adaptive: " + reader.name() + " codes its chunks with an adaptive basis (transform.adapt_basis) "
                    "without reset points: chunk n decodes only after chunks 0..n-1 at its level, so the planner cannot "
                    "switch levels; stream it with --policy level:N or text, or encode it with adapt_basis.reset_chunks");
    return reader;
}

StreamRun::StreamRun(Streamer& streamer, const StreamOptions& options, LinkPacer* pacer, double linkOffset)
    : m_streamer(streamer), m_model(streamer.m_model), m_tokens(streamer.m_tokens), m_question(streamer.m_question),
      m_opt(options), m_policy(options.policy), m_pacer(pacer), m_linkOffset(linkOffset),
      m_reader(chooseReader(streamer, options.policy)), m_params(m_reader.params()),
      m_levels(m_params.numLevels()), m_chunks(m_params.numChunks()), m_hw(options.target),
      m_modelDecode(m_hw.decodeGBps > 0), m_modelPrefill(m_hw.prefillTokensPerSecond > 0),
      m_fp16BytesPerToken(size_t(fp16KvBytesPerToken(m_params.shape))),
      m_modelledDecodeBytesPerToken(m_hw.kvBytesPerToken > 0 ? m_hw.kvBytesPerToken : double(m_fp16BytesPerToken)),
      m_adaptive(m_policy.kind == Policy::Adaptive),
      m_chained(m_params.chainsChunks()),
      m_chain(m_chained && (m_policy.kind == Policy::Level || m_adaptive) ? std::make_unique<KvcChainDecoder>(m_reader) : nullptr),
      m_deferJobs(m_hw.decodeGBps > 0 && m_hw.prefillTokensPerSecond > 0),
      m_prior(streamer.m_priorThroughput * kPriorDiscount),
      m_tailPrefill(m_modelPrefill ? modelledPassSeconds(m_hw, int(m_question.size())) : streamer.m_tail.estimate()),
      m_tailSeconds(m_tailPrefill + streamer.m_firstTokenSeconds + (m_modelDecode ? 0.0 : streamer.m_kvLoadSeconds)),
      m_recomputePerToken(1.0 / std::max(1e-9, m_modelPrefill ? m_hw.prefillTokensPerSecond : streamer.m_prefillRate)),
      m_recomputeFloor(m_modelPrefill ? std::max(0.0, m_hw.weightPassSeconds) : 0.0),
      m_decodePerToken(m_modelDecode ? m_modelledDecodeBytesPerToken / (m_hw.decodeGBps * 1e9)
                                     : streamer.m_decodeSecondsPerToken),
      m_assembled(m_params.shape, DType::F16),
      m_recomputeSession(std::make_unique<InferenceSession>(m_model.runtime())),
      m_client(streamer.m_host, streamer.m_port, ClientOptions{2.0, options.stallTimeout}),
      m_jobs(size_t(m_chunks)), m_jobPredicted(size_t(m_chunks), 0.0), m_ready(size_t(m_chunks), 0),
      m_submitted(size_t(m_chunks), 0), m_attempts(size_t(m_chunks), 0), m_worker(m_deferJobs)
{
    m_res.policy = m_policy.name();
    m_res.sloSeconds = m_opt.sloSeconds;
    m_res.chunks.resize(size_t(m_chunks));
    if (m_chained) {
        m_resetChunks = m_params.profile.transform.adaptResetChunks;
        m_chainBrokenAt.assign(size_t(segmentOf(m_chunks - 1) + 1), std::numeric_limits<int>::max());
        m_segmentLevel.assign(m_chainBrokenAt.size(), 0);
    }
    m_assembled.tokens = m_tokens;
    for (int i = 0; i < m_chunks; ++i) {
        m_todo.push_back(m_adaptive ? m_chunks - 1 - i : i);
        m_res.chunks[size_t(i)].index = i;
    }
}

StreamResult StreamRun::run()
{
    if (m_pacer) m_pacer->reset(m_linkOffset);
    m_t0 = monoSeconds();
    fetchAll();
    settle();
    answer(replayJobs());
    return std::move(m_res);
}

void StreamRun::logLine(const std::string& s)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "t=%.3fs ", since(monoSeconds()));
    m_res.log.push_back(buf + s);
}

void StreamRun::note(int i, const std::string& what)
{
    ChunkEvent& ev = m_res.chunks[size_t(i)];
    ev.note += std::string(ev.note.empty() ? "" : "; ") + what;
}

// Chunk i (the next in m_todo) is given up when it has used its attempts, or the SLO has passed
// since it was first tried.
bool StreamRun::giveUpIfSpent(int i)
{
    const int tried = m_attempts[size_t(i)];
    if (tried < m_opt.maxAttempts && !(tried > 0 && since(monoSeconds()) >= m_opt.sloSeconds)) return false;
    if (tried < m_opt.maxAttempts) logLine("chunk " + std::to_string(i) + ": no SLO budget left for another attempt");
    m_todo.pop_front();
    giveUp(i);
    submitReady();
    return true;
}

double StreamRun::wireBytes(int i, int level) const
{
    return level == 0 ? 0.0 : double(kFrameHeaderBytes) + double(m_reader.chunkBytes(i, level));
}

// The chunks at the back of m_todo that continue the text prefix: they may be recomputed.
int StreamRun::textableCount() const
{
    int c = 0;
    for (auto it = m_todo.rbegin(); it != m_todo.rend() && *it == m_textFront + c; ++it) {
        // A chained file's segment with a fetch committed: its later chunks need this one decoded.
        if (m_chained && m_segmentLevel[size_t(segmentOf(*it))] > 0) break;
        ++c;
    }
    return c;
}

StreamRun::AdaptivePlan StreamRun::planAdaptive(double now)
{
    AdaptivePlan ap;
    PlanResult& pr = ap.plan;
    const int textable = textableCount();
    double thr = m_estimator.valid() ? m_estimator.estimate(m_opt.estimateErrorMargin) : m_prior;
    // When the replies in flight end (the just-in-time request's timing) is predicted at the
    // harmonic mean, not the discounted estimate: the discount is the plan's margin for the SLO,
    // and a predicted end that late sends the next request after the link has run dry (a round
    // trip idle at a chunk boundary; measured: docs/streaming.md).
    double thrEnd = m_estimator.valid() ? m_estimator.harmonicMean() : thr;
    // A reply that has been arriving for a while more slowly than the estimate is the newest
    // evidence of the link: its rate so far caps the estimate. Only after kProgressSeconds,
    // so that a reply of a few milliseconds (reads in bursts) never counts.
    const double rttKnown = std::max(0.0, rttOrUpper());
    if (thr > 0 && m_client.receiving() && !m_inflight.empty()) {
        const double elapsed = now - std::max(m_prevReplyEnd, m_inflight.front().sentAt + rttKnown);
        if (elapsed >= kProgressSeconds) {
            thr = std::min(thr, double(m_client.partialBytes()) / elapsed);
            thrEnd = std::min(thrEnd, double(m_client.partialBytes()) / elapsed);
        }
    }
    pr.predictedTtft = 0;
    if (thr <= 0) {
        // Nothing known of the link (the command's first run): assume it is just fast enough for
        // every chunk at the file's default level within the planner's target. The plan then
        // spends that budget where it counts most (the context's last chunk, fetched first:
        // lastChunkWeight) instead of sending the blind first fetch at the default level.
        double bytes = 0, decode = 0;
        for (int k : m_todo) {
            bytes += wireBytes(k, std::clamp(m_params.defaultLevel(), 1, m_levels));
            decode = double(m_params.chunkLength(k)) * m_decodePerToken.load();  // the last decode is not hidden
        }
        const double budget = m_opt.sloSeconds * (1.0 - m_opt.plannerMargin) - m_tailSeconds - decode;
        if (m_inflight.empty()) thr = budget > 0 ? bytes / budget : 0.0;
    }
    if (thr <= 0) {
        // Nothing known of the link: the next fetch at the file's default level, and chunk 0
        // recomputed meanwhile if that alone fits the SLO (it overlaps the first fetch).
        pr.choice = std::clamp(m_params.defaultLevel(), 1, m_levels);
        const bool chunk0 = m_textFront == 0 && textable > 0 &&
                            jobCost(0, 0) + m_tailSeconds <= m_opt.sloSeconds * (1.0 - m_opt.plannerMargin);
        pr.textChunks = chunk0 ? 1 : 0;
        if (pr.textChunks == int(m_todo.size())) pr.choice = 0;
        return ap;
    }
    const double rtt = std::max(0.0, m_rttEstimate);
    const double dpt = m_decodePerToken.load();
    PlanInput in;
    // Replay what is committed: the replies in flight on the link, their decodes owed.
    double link = m_prevReplyEnd > 0 ? m_prevReplyEnd : now, linkEnd = link;
    for (const InFlight& f : m_inflight) {
        // The reply being read has only its rest to cross.
        const bool reading = &f == &m_inflight.front() && m_client.receiving();
        const double bytes = wireBytes(f.chunk, f.level) - (&f == &m_inflight.front() ? double(m_client.partialBytes()) : 0.0);
        link = reading ? now + std::max(0.0, bytes) / thr : std::max(link, f.sentAt + rtt) + bytes / thr;
        linkEnd = reading ? now + std::max(0.0, bytes) / thrEnd : std::max(linkEnd, f.sentAt + rtt) + bytes / thrEnd;
        in.owed.push_back({since(std::max(link, now)), double(m_params.chunkLength(f.chunk)) * dpt});
    }
    in.distortion = m_streamer.m_distortion;
    for (int k : m_todo) {
        PlanChunk pc;
        pc.tokens = m_params.chunkLength(k);
        pc.weight = k == m_chunks - 1 ? m_opt.lastChunkWeight : 1.0;
        const int pinned = m_chained ? m_segmentLevel[size_t(segmentOf(k))] : 0;
        for (int c = 0; c <= m_levels; ++c) pc.bytes.push_back(pinned > 0 && c > 0 && c != pinned ? kUnaffordableBytes : wireBytes(k, c));
        in.chunks.push_back(pc);
    }
    in.textable = textable;
    in.now = since(now);
    in.linkBusyUntil = since(std::max(link, now));
    if (!m_inflight.empty()) {
        ap.linkEnd = std::max(linkEnd, now);
        ap.lastReplySeconds = wireBytes(m_inflight.back().chunk, m_inflight.back().level) / thrEnd;
    }
    in.workerBusyUntil = since(workerFreeAt(now));
    in.throughput = thr;
    in.rtt = rtt;
    in.decodeSecondsPerToken = dpt;
    in.recomputeSecondsPerToken = m_recomputePerToken;
    in.recomputeFloorSeconds = m_recomputeFloor;
    in.tailSeconds = m_tailSeconds;
    in.slo = m_opt.sloSeconds * (1.0 - m_opt.plannerMargin);
    in.horizon = m_opt.horizon;
    in.overrunMargin = m_opt.overrunMargin;
    in.overrunDeadline = m_overrunDeadline;
    pr = planChunks(in);
    if (!pr.feasible) m_overrunDeadline = pr.deadline;
    ap.throughput = thr;
    return ap;
}

// Requests to keep in flight. A fixed policy has nothing to decide: kMaxWindow requests (the
// server queues up to kMaxPipelined per connection), so the link never waits for a request. Adaptive
// commits a level with every request, so it keeps only what covers one round trip at the
// estimated throughput (the bandwidth-delay product) behind the current reply, plus the reply;
// until this run has measured a chunk it sends one request (a prior estimate from an earlier
// run, at another point of the link, may be wrong by several times: ATT's trace swings 5x
// within seconds), so at most one fetch is committed on a guess.
int StreamRun::windowNow() const
{
    if (m_policy.kind != Policy::Adaptive) return m_opt.window > 0 ? m_opt.window : kMaxWindow;
    if (!m_estimator.valid()) return 1;
    if (m_opt.window > 0) return m_opt.window;
    const double thr = m_estimator.harmonicMean();
    if (m_rttEstimate < 0 || m_lastReplyBytes <= 0) return 2;
    return std::clamp(2 + int(std::ceil(thr * m_rttEstimate / m_lastReplyBytes)), 2, kMaxWindow);
}

void StreamRun::fetchAll()
{
    while (!m_todo.empty() || !m_inflight.empty()) {
        const double wakeAt = fillWindow();
        if (m_serverDown) {
            for (int k : m_todo) giveUp(k);
            m_todo.clear();
            submitReady();
            continue;
        }
        if (m_inflight.empty()) {
            submitReady();
            continue;
        }
        readFront(wakeAt);
    }
    submitReady();
}

// Keeps the window full; adaptive also commits its next text chunk when it is due. Returns when
// the next text chunk or fetch falls due (adaptive; monotonic; 0: none).
double StreamRun::fillWindow()
{
    const int window = windowNow();
    double wakeAt = 0;
    while (!m_serverDown && !m_todo.empty()) {
        const int i = m_todo.front();
        if (giveUpIfSpent(i)) continue;
        int level = 0;
        const Step step = m_adaptive ? adaptiveStep(window, wakeAt, level) : fixedStep(window, level);
        if (step == Step::Next) continue;
        if (step == Step::Stop) break;
        sendRequest(i, level);
    }
    return wakeAt;
}

StreamRun::Step StreamRun::fixedStep(int window, int& level)
{
    if (int(m_inflight.size()) >= window) return Step::Stop;
    switch (m_policy.kind) {
    case Policy::Text: level = 0; break;
    case Policy::Int8: level = 1; break;
    case Policy::Level: level = m_policy.level; break;
    case Policy::Adaptive: break;
    }
    if (chainBroken(m_todo.front())) level = 0;
    if (level == 0) {
        commitText(m_todo.front());
        m_todo.pop_front();
        submitReady();
        return Step::Next;
    }
    return Step::Send;
}

// The planner's decision for the next chunk: commit the next text chunk when it is due (Next),
// wait (Stop: the window is full, only text is left, or the next request is not due yet), or
// fetch m_todo.front() at level (Send).
StreamRun::Step StreamRun::adaptiveStep(int window, double& wakeAt, int& level)
{
    if (chainBroken(m_todo.front())) {  // its chain broke at an earlier chunk of its segment: no use fetching it
        commitText(m_todo.front());
        m_todo.pop_front();
        submitReady();
        return Step::Next;
    }
    ChunkEvent& ev = m_res.chunks[size_t(m_todo.front())];
    const double now = monoSeconds();
    const AdaptivePlan ap = planAdaptive(now);
    const PlanResult& pr = ap.plan;
    const double thr = ap.throughput;
    wakeAt = 0;
    const bool allText = pr.textChunks >= int(m_todo.size());
    if (pr.textChunks > 0) {
        // Due when the worker is about to run dry; until then the loop reads replies
        // and wakes up at that moment (wakeAt).
        const int t = m_todo.back();
        const double free = workerFreeAt(now);
        if (free <= now + textLead(t) || (allText && m_inflight.empty())) {
            commitText(t);
            m_res.chunks[size_t(t)].throughputEstimate = thr;
            m_res.chunks[size_t(t)].predictedTtftS = pr.predictedTtft;
            m_todo.pop_back();
            ++m_textFront;
            submitReady();
            return Step::Next;
        }
        wakeAt = free - textLead(t);
    }
    if (allText || int(m_inflight.size()) >= window) return Step::Stop;
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
            return Step::Stop;
        }
    }
    level = std::max(1, pr.choice);
    if (m_chained) {  // one level per segment of a chained file
        int& pinned = m_segmentLevel[size_t(segmentOf(m_todo.front()))];
        if (pinned == 0) pinned = level;
        level = pinned;
    }
    ev.throughputEstimate = thr;
    ev.predictedTtftS = pr.predictedTtft;
    return Step::Send;
}

void StreamRun::sendRequest(int i, int level)
{
    ChunkEvent& ev = m_res.chunks[size_t(i)];
    Request rq;
    rq.type = level == 0 ? FrameType::TextRequest : FrameType::ChunkRequest;
    rq.codec = m_params.codec;
    rq.context = m_streamer.m_context;
    rq.chunk = uint32_t(i);
    rq.level = uint32_t(level);
    const uint64_t expected = level == 0 ? uint64_t(m_params.chunkLength(i)) * 4 : m_reader.chunkBytes(i, level);
    const int attempt = ++m_attempts[size_t(i)];
    ev.attempts = attempt;
    try {
        const bool fresh = !m_client.connected();  // this request opens the connection
        const double sentAt = m_client.send(rq);
        // A prior from an earlier run is a guess, not this estimator's prediction: its miss
        // does not count as the estimator's error.
        m_inflight.push_back({i, level, expected, sentAt, m_estimator.valid() ? ev.throughputEstimate : 0.0, fresh});
        m_todo.pop_front();
    } catch (const std::exception& e) {
        const NetError* ne = dynamic_cast<const NetError*>(&e);
        const bool refused = ne && ne->kind() == NetError::Failed && !m_client.connected();
        note(i, "attempt " + std::to_string(attempt) + ": " + e.what());
        logLine("chunk " + std::to_string(i) + " attempt " + std::to_string(attempt) + ": " + e.what());
        // The connection is gone and with it the requests in flight: ask for them again.
        requeueInflight(-1);
        if (refused) {
            m_serverDown = true;
            logLine("server unreachable: the remaining chunks are recomputed from local tokens");
        }
    }
}

// The connection is lost: every request in flight goes back to the front of m_todo, in order;
// only failedChunk's (when it is one of them) counts as an attempt.
void StreamRun::requeueInflight(int failedChunk)
{
    for (auto it = m_inflight.rbegin(); it != m_inflight.rend(); ++it) {
        if (it->chunk != failedChunk) --m_attempts[size_t(it->chunk)];  // lost with the connection, not failed
        m_todo.push_front(it->chunk);
    }
    m_inflight.clear();
    m_prevReplyEnd = 0;
}

// Reads the reply at the front of the window (breaking off at wakeAt, when a text chunk or fetch
// falls due), checks it, measures the link with it and hands the chunk's job on.
void StreamRun::readFront(double wakeAt)
{
    const InFlight f = m_inflight.front();
    ChunkEvent& ev = m_res.chunks[size_t(f.chunk)];
    Reply rep;
    try {
        if (!m_client.receiving()) m_frontDeadline = monoSeconds() + m_opt.fetchTimeout;
        if (!m_client.receivePart(rep, f.expected, m_frontDeadline,
                                  wakeAt > 0 ? wakeAt : std::numeric_limits<double>::infinity()))
            return;
    } catch (const std::exception& e) {
        const std::string attempt = std::to_string(m_attempts[size_t(f.chunk)]);
        note(f.chunk, "attempt " + attempt + ": " + e.what());
        logLine("chunk " + std::to_string(f.chunk) + " attempt " + attempt + ": " + e.what());
        requeueInflight(f.chunk);
        return;
    }
    m_inflight.pop_front();
    m_delivered += rep.wireBytes;
    m_lastArrival = std::max(m_lastArrival, since(rep.arrivedAt));
    if (m_firstByte < 0) m_firstByte = since(rep.firstByteAt);
    const double replyStart = std::max(m_prevReplyEnd, rep.sentAt + std::max(0.0, m_rttEstimate));
    m_prevReplyEnd = rep.arrivedAt;
    if (rep.type != FrameType::Error && rep.wireBytes > 1024) m_lastReplyBytes = double(rep.wireBytes);
    if (rep.type == FrameType::Error) {
        const std::string msg(rep.payload.begin(), rep.payload.end());
        note(f.chunk, "server: " + msg);
        logLine("chunk " + std::to_string(f.chunk) + ": server error: " + msg);
        giveUp(f.chunk);  // asking again would get the same answer
        submitReady();
        return;
    }
    if (f.level > 0 && (rep.payload.size() != f.expected ||
                        crc32(rep.payload.data(), rep.payload.size()) != m_reader.chunkCrc(f.chunk, f.level))) {
        note(f.chunk, "attempt " + std::to_string(m_attempts[size_t(f.chunk)]) + ": CRC mismatch");
        logLine("chunk " + std::to_string(f.chunk) + " level " + std::to_string(f.level) + ": CRC mismatch, retrying");
        m_todo.push_front(f.chunk);
        return;
    }
    measureReply(f, rep, replyStart);
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
        m_jobs[size_t(f.chunk)] = recomputeJob(f.chunk, std::move(tokens));
    } else if (chainBroken(f.chunk)) {
        note(f.chunk, "its chain broke at an earlier chunk");
        giveUp(f.chunk);
        submitReady();
        return;
    } else {
        m_jobs[size_t(f.chunk)] = decodeJob(f.chunk, f.level, std::move(rep.payload));
    }
    m_jobPredicted[size_t(f.chunk)] = jobCost(f.chunk, f.level);
    m_ready[size_t(f.chunk)] = 1;
    submitReady();
}

// A good reply's RTT and throughput samples. The first reply on a new connection also waited for
// the connection's setup (and a reader that comes late finds it whole in the socket: 431 KB "in
// 0.2 ms"): its delay is no RTT. Its sample is its bytes from its first byte to its end, held to
// at most twice its bytes over the whole round trip (planner.h firstReplySample; the whole round
// trip alone is a lower bound that starts every run cautious: docs/streaming.md); it holds the
// next samples to the estimator's band (a second reply read late looked 4x too fast).
void StreamRun::measureReply(const InFlight& f, const Reply& rep, double replyStart)
{
    const double firstDelay = rep.firstByteAt - rep.sentAt;
    if (!f.fresh) m_rttEstimate = m_rttEstimate < 0 ? firstDelay : std::min(m_rttEstimate, firstDelay);
    else m_rttUpper = m_rttUpper < 0 ? firstDelay : std::min(m_rttUpper, firstDelay);
    if (f.level == 0 || rep.payload.size() < 1024) return;
    if (f.fresh) {
        const double sample = firstReplySample(double(rep.wireBytes), rep.sentAt, rep.firstByteAt, rep.arrivedAt);
        if (!m_estimator.valid() && sample > 0) m_estimator.add(sample, 0);
        return;
    }
    const double span = rep.arrivedAt - std::max(replyStart, rep.sentAt + std::max(0.0, m_rttEstimate));
    if (span > 0) m_estimator.add(double(rep.wireBytes) / span, f.predictedThroughput);
}

// Fetching is over: the estimate for the next run, the worker's last jobs, the link's figures.
void StreamRun::settle()
{
    if (m_estimator.valid()) m_streamer.m_priorThroughput = m_estimator.harmonicMean();
    m_res.distortionSource = m_streamer.m_distortionSource;
    m_res.plannedTailSeconds = m_tailSeconds;
    m_worker.drain();
    if (m_pacer) {
        m_res.linkSeconds = std::max(m_lastArrival, 1e-9);
        m_res.capacityBytes = m_pacer->schedule().capacityBytes(m_linkOffset, m_linkOffset + m_lastArrival);
        m_res.idleLostBytes = m_pacer->idleLostBytes();
        m_res.busyLostBytes = m_pacer->busyLostBytes();
        m_res.busyCapacityBytes = m_pacer->busyCapacityBytes();
        if (m_firstByte >= 0) {
            m_res.backloggedCapacityBytes =
                m_pacer->schedule().capacityBytes(m_linkOffset + m_firstByte, m_linkOffset + m_lastArrival);
            m_res.backloggedDeliveredBytes = m_delivered;
        }
    }
    m_res.deliveredBytes = m_delivered;
}

// The question: load the assembled cache, prefill the question, take the first token; then the
// rest of a greedy answer, against the reference from the original cache.
void StreamRun::answer(double kvReady)
{
    std::unique_ptr<InferenceSession> session;
    double s = monoSeconds();
    if (m_sessionValid && m_recomputeSession->position() == m_params.shape.numTokens) {
        session = std::move(m_recomputeSession);  // the last chunks were recomputed: the cache is already there
    } else {
        session = std::make_unique<InferenceSession>(m_model.runtime());
        session->loadKv(m_assembled);
    }
    const double kvLoad = monoSeconds() - s;
    std::vector<float> logits;
    s = monoSeconds();
    session->append(m_question, &logits);
    const double prefill = monoSeconds() - s;
    s = monoSeconds();
    const int32_t first = argmax(logits.data(), logits.size());
    const double firstToken = monoSeconds() - s;
    m_res.kvLoad = {m_modelDecode ? 0.0 : kvLoad, m_modelDecode};
    m_res.prefill = {m_modelPrefill ? m_tailPrefill : prefill, m_modelPrefill};
    if (!m_modelPrefill) m_streamer.m_tail.add(prefill);  // the next runs' planner tail
    m_res.firstToken = {firstToken, false};
    m_res.ttftSeconds = kvReady + m_res.kvLoad.seconds + m_res.prefill.seconds + m_res.firstToken.seconds;
    m_res.sloMet = m_res.ttftSeconds <= m_opt.sloSeconds;
    if (m_opt.keepCache) m_res.cache = std::make_shared<KvSet>(std::move(m_assembled));

    m_res.tokens.push_back(first);
    const std::vector<int32_t> stops = m_model.stopIds();
    if (std::find(stops.begin(), stops.end(), first) == stops.end() && m_opt.qualityTokens > 1) {
        const Generation g = generate(*session, {first}, m_opt.qualityTokens - 1, SamplingOptions{}, stops);
        m_res.tokens.insert(m_res.tokens.end(), g.tokens.begin(), g.tokens.end());
    }
    m_res.text = m_model.tokenizer().decode(m_res.tokens, true);
    m_res.tokenAgreement = agreement(m_streamer.m_refTokens, m_res.tokens);
    m_res.firstTokenMatch = !m_streamer.m_refTokens.empty() && m_streamer.m_refTokens[0] == first;
}

}  // namespace kvscope
