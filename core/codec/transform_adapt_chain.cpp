// The backward-adaptive chain over a cache's chunks (transform_adapt.h): per chunk, a model
// derived from the calibrated one and the chain's state, the calibrated chunk coder on it, and
// the state advanced from the payload's symbols, which encoder and decoder read alike.
// Compiled with -ffp-contract=off. What must be the same bits on both sides is the state (R, the
// variances, hence the tables); the chunk's matrices A R^T and R A^{-1} only reconstruct and
// quantise, so they are float products (BLAS), as any transform model's matrices are float.
#include "codec/codec_detail.h"
#include "codec/escape_rules.h"
#include "codec/linalg.h"
#include "codec/symbol_stream.h"
#include "codec/transform_adapt.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

namespace kvscope {

namespace {

KvKind kindOf(int u, int L) { return u < L ? KvKind::Key : KvKind::Value; }

}  // namespace

AdaptiveSettings chainSettings(const CodecParams& p)
{
    KVSCOPE_ASSERT(p.chainsChunks());
    AdaptiveSettings s;
    s.priorTokens = p.profile.transform.adaptPriorTokens;
    s.sweeps = p.profile.transform.adaptSweeps;
    s.resetChunks = p.profile.transform.adaptResetChunks;
    return s;
}

int nextChainStart(const AdaptiveSettings& s, int chunk, int numChunks)
{
    if (s.resetChunks <= 0) return numChunks;
    return std::min(numChunks, (chunk / s.resetChunks + 1) * s.resetChunks);
}

struct AdaptiveChain::Impl {
    CodecParams p;  // a copy: the chain outlives no caller's params
    int level;
    AdaptiveSettings s;
    int next = 0;
    std::vector<AdaptiveBasis> state;  // per block u = kind * L + layer
    std::vector<double> theta;         // per block; +inf when the calibrated level codes nothing
    std::shared_ptr<TransformModel> work;  // the model of the chunks after a chain start, changed in place per chunk

    Impl(const CodecParams& params, int lv, const AdaptiveSettings& settings, int first)
        : p(params), level(lv), s(settings), next(first)
    {
        if (!p.transform) throw Error("adaptive basis: the transform codec needs its model");
        const TransformModel& m = *p.transform;
        if (!entropyUsesTables(m.settings.entropy))
            throw Error("adaptive basis: entropy \"fixed\" is not supported (the chain derives coding tables)");
        if (m.settings.tokenImportance) throw Error("adaptive basis: token_importance is not supported");
        if (m.settings.layerGroup != 1) throw Error("adaptive basis: layer_group > 1 is not supported");
        if (level < 1 || level > m.numLevels())
            throw Error("adaptive basis: level " + std::to_string(level) + " is outside 1.." + std::to_string(m.numLevels()));
        if (s.resetChunks < 0) throw Error("adaptive basis: reset_chunks must be 0 or more");
        if (first < 0 || first > p.numChunks() || (first < p.numChunks() && !chainStartsAt(s, first)))
            throw Error("adaptive basis: chunk " + std::to_string(first) + " does not start a chain (reset every " +
                        std::to_string(s.resetChunks) + " chunks)");
        const int B = 2 * m.numLayers;
        for (int u = 0; u < B; ++u) {
            double th = HUGE_VAL;
            for (float st : m.levels[size_t(level - 1)][size_t(u)].step)
                if (st > 0) {
                    th = double(st) * double(st) / 12.0;
                    break;
                }
            theta.push_back(th);
        }
    }

    // The state before a chain's first chunk: the calibrated model's.
    void restart()
    {
        const TransformModel& m = *p.transform;
        state.clear();
        for (int u = 0; u < 2 * m.numLayers; ++u) state.push_back(startAdaptiveBasis(m.blocks[size_t(u)].variance, s.priorTokens));
    }

    // The model chunk `chunk` is coded with: the calibrated one at a chain start, else one working copy
    // (made once) with, per block, the decode matrix A R^T (and, for the encoder, R A^{-1}) and the
    // derived level block. Its decoder's derived tables are reset (TransformDecodeSlot).
    std::shared_ptr<const TransformModel> modelFor(int chunk, bool encoder)
    {
        if (chainStartsAt(s, chunk)) return p.transform;
        if (!work) work = std::make_shared<TransformModel>(*p.transform);
        TransformModel& m = *work;
        const TransformModel& base = *p.transform;
        const int C = m.channels(), B = 2 * m.numLayers;
#pragma omp parallel for schedule(dynamic, 1)
        for (int u = 0; u < B; ++u) {
            TransformBlock& b = m.blocks[size_t(u)];
            const TransformBlock& b0 = base.blocks[size_t(u)];
            const std::vector<double>& R = state[size_t(u)].rotation;
            std::vector<float> r(R.begin(), R.end());
            detail::gemm(true, C, C, C, b0.decode.data(), r.data(), b.decode.data());  // A R^T
            prepareDecodeColumns(b);
            if (encoder) detail::gemm(false, C, C, C, r.data(), b0.encode.data(), b.encode.data());  // R A^{-1}
            for (int j = 0; j < C; ++j) b.variance[size_t(j)] = float(state[size_t(u)].variance[size_t(j)]);
            m.levels[size_t(level - 1)][size_t(u)] = std::isfinite(theta[size_t(u)])
                                                         ? adaptiveLevelBlock(state[size_t(u)], theta[size_t(u)])
                                                         : TransformLevelBlock{std::vector<float>(size_t(C), 0.0f),
                                                                               std::vector<uint8_t>(size_t(C), 0), {}};
        }
        m.decodeCache = TransformDecodeSlot{};
        return work;
    }

    // Advances every block's state with the symbols of `payload`, coded with params q.
    void advance(const CodecParams& q, const uint8_t* payload, size_t size, int chunk)
    {
        const TransformModel& m = *q.transform;
        const int L = m.numLayers, B = 2 * L, C = m.channels(), T = q.shape.numTokens;
        const int t0 = q.chunkStart(chunk), n = q.chunkLength(chunk);
        const std::string where = "chunk " + std::to_string(chunk);
        int raw = 0;
        for (int t = t0; t < t0 + n; ++t) raw += t < m.settings.sinkTokens || t >= T - m.settings.recentTokens;
        const int R = n - raw;
        if (size < 8 * size_t(B)) throw Error(where + ": the payload is shorter than its size arrays");
        std::vector<size_t> escOff(static_cast<size_t>(B)), strOff(static_cast<size_t>(B));
        size_t off = 8 * size_t(B) + size_t(raw) * C * 2 * size_t(B);
        for (int u = 0; u < B; ++u) {
            escOff[size_t(u)] = off;
            off += detail::getU32(payload + 4 * size_t(u));
            strOff[size_t(u)] = off;
            off += detail::getU32(payload + 4 * size_t(B + u));
        }
        if (off != size) throw Error(where + ": block sizes do not add up to the payload");
        std::string error;
#pragma omp parallel for schedule(dynamic, 1)
        for (int u = 0; u < B; ++u) {
            try {
                const TransformLevelBlock& lb = m.levels[size_t(level - 1)][size_t(u)];
                std::vector<int> M;
                for (int j = 0; j < C; ++j)
                    if (lb.step[size_t(j)] > 0) M.push_back(lb.maxQ[size_t(j)]);
                const int K = int(M.size());
                std::vector<int32_t> qs(size_t(R) * K);
                if (K > 0 && R > 0) {
                    std::vector<CodingTable> tables;
                    detail::transformCodingTables(q, kindOf(u, L), u % L, level, 0, true, tables);
                    std::vector<uint8_t> sym(size_t(R) * K);
                    const size_t strN = (u + 1 < B ? escOff[size_t(u + 1)] : size) - strOff[size_t(u)];
                    const std::string w = where + " block " + std::to_string(u);
                    if (m.settings.entropy == TransformEntropy::Rans32)
                        decodeSymbolMatrixW32(payload + strOff[size_t(u)], strN, R, K, tables.data(), sym.data(), w);
                    else
                        decodeSymbolMatrix(payload + strOff[size_t(u)], strN, R, K, tables.data(), sym.data(), w);
                    const uint8_t* esc = payload + escOff[size_t(u)];
                    const uint8_t* escEnd = payload + strOff[size_t(u)];
                    for (size_t i = 0; i < sym.size(); ++i) {
                        const int Mk = M[i % size_t(K)], v = int(sym[i]) - Mk;
                        if (v > -Mk && v < Mk) {
                            qs[i] = v;
                            continue;
                        }
                        int64_t e = 0;
                        if (hd::readEscape(esc, escEnd, int(sym[i]), Mk, &e) != hd::kEscapeOk)
                            throw Error(w + ": escape list is corrupt");
                        qs[i] = int32_t(e);
                    }
                }
                accumulateAdaptive(state[size_t(u)], lb, qs.data(), R);
                advanceAdaptiveBasis(state[size_t(u)], s.sweeps);
            } catch (const Error& e) {
#pragma omp critical
                if (error.empty()) error = e.what();
            }
        }
        if (!error.empty()) throw Error(error);
    }

    // The chunk coder's params for chunk next(), the state restarted first at a chain start.
    CodecParams paramsForNext(bool encoder)
    {
        if (next >= p.numChunks()) throw Error("adaptive basis: the chain is past its last chunk (" + std::to_string(next) + ")");
        if (chainStartsAt(s, next)) restart();
        CodecParams q = p;
        q.transform = modelFor(next, encoder);
        return q;
    }

    // After chunk next() was coded with q: the state advanced with its symbols, unless the next
    // chunk starts a chain (or there is none), where it would be thrown away.
    void finish(const CodecParams& q, const uint8_t* payload, size_t size)
    {
        const int c = next++;
        if (next < p.numChunks() && !chainStartsAt(s, next)) advance(q, payload, size, c);
    }
};

AdaptiveChain::AdaptiveChain(const CodecParams& p, int level, const AdaptiveSettings& s, int first)
    : m(std::make_unique<Impl>(p, level, s, first))
{
}
AdaptiveChain::~AdaptiveChain() = default;
AdaptiveChain::AdaptiveChain(AdaptiveChain&&) noexcept = default;
AdaptiveChain& AdaptiveChain::operator=(AdaptiveChain&&) noexcept = default;

int AdaptiveChain::level() const { return m->level; }
int AdaptiveChain::next() const { return m->next; }

std::vector<uint8_t> AdaptiveChain::encodeNext(const KvSet& kv)
{
    const CodecParams q = m->paramsForNext(true);
    std::vector<uint8_t> payload = detail::encodeTransformChunk(q, kv, m->next, m->level);
    m->finish(q, payload.data(), payload.size());
    return payload;
}

void AdaptiveChain::decodeNext(const uint8_t* data, size_t size, KvSet& out)
{
    const CodecParams q = m->paramsForNext(false);
    const std::string where = "chunk " + std::to_string(m->next);
    detail::decodeTransformChunk(q, data, size, m->next, m->level, out, where);
    m->finish(q, data, size);
}

std::vector<std::vector<uint8_t>> encodeAdaptiveChunks(const CodecParams& p, const KvSet& kv, int level,
                                                       const AdaptiveSettings& s)
{
    AdaptiveChain chain(p, level, s);
    std::vector<std::vector<uint8_t>> out;
    for (int c = 0; c < p.numChunks(); ++c) out.push_back(chain.encodeNext(kv));
    return out;
}

void decodeAdaptiveChunks(const CodecParams& p, const std::vector<std::vector<uint8_t>>& chunks, int level,
                          const AdaptiveSettings& s, KvSet& out)
{
    if (int(chunks.size()) != p.numChunks())
        throw Error("adaptive basis: " + std::to_string(chunks.size()) + " chunks, the cache has " + std::to_string(p.numChunks()));
    AdaptiveChain chain(p, level, s);
    for (int c = 0; c < p.numChunks(); ++c) chain.decodeNext(chunks[size_t(c)].data(), chunks[size_t(c)].size(), out);
}

}  // namespace kvscope
