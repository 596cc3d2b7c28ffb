// The worker's side of a StreamRun: the decode and recompute jobs, their hand-over to the worker in
// the order they can run, the worker's predicted backlog, and the job timeline after the run.
#include "stream/stream_run.h"

#include <algorithm>
#include <cstring>

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

// A copy of a chunk's fetch fields only: the worker may be writing its job's fields now.
ChunkEvent fetchFields(const ChunkEvent& ev)
{
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
    return fetched;
}

}  // namespace

std::function<void()> StreamRun::decodeJob(int i, int level, std::vector<uint8_t> payload)
{
    return [this, i, level, payload = std::move(payload)]() {
        ChunkEvent& ev = m_res.chunks[size_t(i)];
        const double s = monoSeconds();
        if (m_chain) m_chain->push(i, level, payload.data(), payload.size(), m_assembled);  // decoded now, in chunk order
        else m_reader.decodePayloadInto(i, level, payload.data(), payload.size(), m_assembled);
        const double e = monoSeconds();
        ev.jobStartS = since(s);
        ev.decodedS = since(e);
        ev.jobSeconds = e - s;
        if (!m_modelDecode) m_decodePerToken = (e - s) / double(m_params.chunkLength(i));
    };
}

std::function<void()> StreamRun::recomputeJob(int i, std::vector<int32_t> tokens)
{
    return [this, i, tokens = std::move(tokens)]() {
        ChunkEvent& ev = m_res.chunks[size_t(i)];
        const double s = monoSeconds();
        const int start = m_params.chunkStart(i), n = m_params.chunkLength(i);
        if (m_chain) m_chain->giveUp(i);  // its chain cannot reach the chunks after it in its segment
        if (!m_sessionValid || m_recomputeSession->position() != start) {
            if (start == 0) {
                m_recomputeSession->truncate(0);
            } else {
                KvSet prefix(m_model.runtime().kvShape(start), DType::F16);
                copyTokens(m_assembled, 0, prefix, 0, start);
                prefix.tokens.assign(m_tokens.begin(), m_tokens.begin() + start);
                m_recomputeSession->loadKv(prefix);
            }
        }
        m_recomputeSession->append(tokens, nullptr);
        const KvSet all = m_recomputeSession->exportKv();
        copyTokens(all, start, m_assembled, start, n);
        m_sessionValid = true;
        const double e = monoSeconds();
        ev.jobStartS = since(s);
        ev.decodedS = since(e);
        ev.jobSeconds = e - s;
    };
}

std::vector<int32_t> StreamRun::localTokens(int i) const
{
    const int start = m_params.chunkStart(i), n = m_params.chunkLength(i);
    return std::vector<int32_t>(m_tokens.begin() + start, m_tokens.begin() + start + n);
}

double StreamRun::jobCost(int i, int level) const
{
    return level == 0 ? std::max(m_recomputeFloor, double(m_params.chunkLength(i)) * m_recomputePerToken)
                      : double(m_params.chunkLength(i)) * m_decodePerToken.load();
}

void StreamRun::submitOne(int i)
{
    const double predicted = m_jobPredicted[size_t(i)];
    m_modelWorkerEnd = std::max(m_modelWorkerEnd, m_t0 + m_res.chunks[size_t(i)].arrivedS) + predicted;
    {
        std::lock_guard<std::mutex> lock(m_owedMutex);
        m_owedSeconds += predicted;
    }
    m_submitted[size_t(i)] = 1;
    m_submitOrder.push_back(i);
    m_worker.submit([this, job = std::move(m_jobs[size_t(i)]), predicted] {
        struct Paid {
            std::mutex& m;
            double& owed;
            double p;
            ~Paid()
            {
                std::lock_guard<std::mutex> lock(m);
                owed -= p;
            }
        } paid{m_owedMutex, m_owedSeconds, predicted};
        job();
    });
    if (m_opt.onChunk && !m_opt.onChunk(fetchFields(m_res.chunks[size_t(i)]))) {
        m_worker.drain();  // the jobs hold references into this run
        throw Error("stream: cancelled");
    }
}

void StreamRun::submitReady()
{
    for (int i = m_prefixSubmitted; i < m_chunks; ++i) {
        // Decodes run as soon as they can, except a chain's, which run in chunk order like recomputes.
        const bool anyOrder = m_res.chunks[size_t(i)].level > 0 && !m_chained;
        if (!m_submitted[size_t(i)] && m_ready[size_t(i)] && (anyOrder || i == m_prefixSubmitted))
            submitOne(i);
        if (m_submitted[size_t(i)] && i == m_prefixSubmitted) ++m_prefixSubmitted;
    }
}

void StreamRun::giveUp(int i)
{
    ChunkEvent& ev = m_res.chunks[size_t(i)];
    ev.level = 0;
    ev.local = true;
    ev.bytes = 0;
    ev.sentS = ev.firstByteS = ev.arrivedS = since(monoSeconds());
    logLine("chunk " + std::to_string(i) + ": recomputed from local tokens");
    breakChain(i);
    m_jobs[size_t(i)] = recomputeJob(i, localTokens(i));
    m_jobPredicted[size_t(i)] = jobCost(i, 0);
    m_ready[size_t(i)] = 1;
}

// Chunk i of a chained file is recomputed, not decoded: the later chunks of its segment cannot
// decode. Those fetched but not handed over (they wait for an earlier chunk) are given up now,
// those still to come when they arrive (chainBroken).
void StreamRun::breakChain(int i)
{
    if (!m_chained || m_chainBrokenAt[size_t(segmentOf(i))] <= i) return;
    m_chainBrokenAt[size_t(segmentOf(i))] = i;
    bool fetchedAfter = false;
    for (int k = i + 1; k < m_chunks && segmentOf(k) == segmentOf(i); ++k) fetchedAfter |= m_res.chunks[size_t(k)].level > 0;
    if (m_policy.kind != Policy::Level && !fetchedAfter) return;
    logLine("chunk " + std::to_string(i) + ": the adaptive-basis chain stops here; the later chunks of its segment are "
                                           "recomputed from text");
    for (int k = std::max(m_prefixSubmitted, i + 1); k < m_chunks && segmentOf(k) == segmentOf(i); ++k)
        if (m_ready[size_t(k)] && !m_submitted[size_t(k)] && m_res.chunks[size_t(k)].level > 0) {
            note(k, "its chain broke at chunk " + std::to_string(i));
            giveUp(k);
        }
}

// Text recompute costs no request (the client holds the context's tokens: it named the context
// by them), only the worker's time.
void StreamRun::commitText(int i)
{
    if (m_chain) breakChain(i);
    ChunkEvent& ev = m_res.chunks[size_t(i)];
    ev.level = 0;
    ev.sentS = ev.firstByteS = ev.arrivedS = since(monoSeconds());
    m_jobs[size_t(i)] = recomputeJob(i, localTokens(i));
    m_jobPredicted[size_t(i)] = jobCost(i, 0);
    m_ready[size_t(i)] = 1;
}

// Adaptive commits a text chunk only when the worker is about to run out of work, this much
// ahead (half the recompute, 2-20 ms), so that a wake-up late by a descheduled thread does not idle it.
double StreamRun::textLead(int i) const
{
    return std::clamp(0.5 * jobCost(i, 0), 0.002, 0.02);
}

// End (monotonic) of the work handed to the worker, and of the settled chunks held back for it;
// not the decodes of the replies still in flight.
double StreamRun::workerFreeAt(double now)
{
    double w;
    if (m_deferJobs) {
        w = std::max(now, m_modelWorkerEnd);
    } else {
        std::lock_guard<std::mutex> lock(m_owedMutex);
        w = now + std::max(0.0, m_owedSeconds);
    }
    for (int k = m_prefixSubmitted; k < m_chunks; ++k)
        if (m_ready[size_t(k)] && !m_submitted[size_t(k)]) w += m_jobPredicted[size_t(k)];
    return w;
}

// Job timeline: measured as it ran, or replayed with modelled durations from measured arrivals,
// in the order the worker ran the jobs. Then the critical path's transfer, decode and recompute
// parts. Returns when the assembled cache was ready (seconds since the run started).
double StreamRun::replayJobs()
{
    KVSCOPE_ASSERT(int(m_submitOrder.size()) == m_chunks);
    double prevEnd = 0;
    for (int idx : m_submitOrder) {
        ChunkEvent& ev = m_res.chunks[size_t(idx)];
        const bool isText = ev.level == 0;
        const int n = m_params.chunkLength(ev.index);
        if ((isText && m_modelPrefill) || (!isText && m_modelDecode)) {
            ev.jobSeconds = isText ? modelledPassSeconds(m_hw, n)
                                   : double(n) * m_modelledDecodeBytesPerToken / (m_hw.decodeGBps * 1e9);
            ev.jobStartS = std::max(ev.arrivedS, prevEnd);
            ev.decodedS = ev.jobStartS + ev.jobSeconds;
        }
        prevEnd = ev.decodedS;
        (isText ? m_res.recomputeBusySeconds : m_res.decodeBusySeconds) += ev.jobSeconds;
    }
    // Critical path: fetching ends when the last chunk arrived or was given up; what the worker
    // still had to do after that is the decode and recompute that pipelining could not hide.
    double settled = 0;
    for (const ChunkEvent& ev : m_res.chunks) settled = std::max(settled, ev.arrivedS);
    const double kvReady = std::max(prevEnd, settled);
    double recomputeTail = 0;
    for (const ChunkEvent& ev : m_res.chunks)
        if (ev.level == 0) recomputeTail += std::max(0.0, ev.decodedS - std::max(ev.jobStartS, settled));
    m_res.transfer = {settled, false};
    m_res.recompute = {recomputeTail, m_modelPrefill};
    m_res.decode = {std::max(0.0, kvReady - settled - recomputeTail), m_modelDecode};
    return kvReady;
}

}  // namespace kvscope
