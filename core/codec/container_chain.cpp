// Chained .kvc files (container_chain.h): the writer's per-level chains, the reader's whole-level
// decode, and the decoder of chunks that arrive one at a time.
#include "codec/container_chain.h"

#include "common/crc32.h"
#include "common/error.h"

#include <string>

namespace kvscope {

AdaptiveSettings chainSettings(const CodecParams& p)
{
    KVSCOPE_ASSERT(p.chainsChunks());
    AdaptiveSettings s;
    s.priorTokens = p.profile.transform.adaptPriorTokens;
    s.sweeps = p.profile.transform.adaptSweeps;
    return s;
}

std::vector<std::vector<std::vector<uint8_t>>> encodeChainLevels(const CodecParams& p, const KvSet& kv,
                                                                 const std::function<void()>& levelDone)
{
    std::vector<std::vector<std::vector<uint8_t>>> out;
    for (int l = 1; l <= p.numLevels(); ++l) {
        out.push_back(encodeAdaptiveChunks(p, kv, l, chainSettings(p)));
        KVSCOPE_ASSERT(int(out.back().size()) == p.numChunks());
        if (levelDone) levelDone();
    }
    return out;
}

// decodeAllInto for a chained file: one level for every chunk, decoded in order.
void KvcReader::decodeChainInto(const std::vector<int>& levels, KvSet& out, const Progress& progress) const
{
    const int chunks = m_params.numChunks();
    for (size_t c = 1; c < levels.size(); ++c)
        if (levels[c] != levels[0])
            throw Error(where("levels") + ": chunk " + std::to_string(c) + " at level " + std::to_string(levels[c]) +
                        " after chunk 0 at level " + std::to_string(levels[0]) +
                        ": the chunks of an adaptive-basis file (transform.adapt_basis) chain at one level, so "
                        "decode every chunk at one level");
    const int level = levels[0];
    std::vector<std::vector<uint8_t>> payloads;
    for (int c = 0; c < chunks; ++c) payloads.push_back(readChunk(c, level));
    try {
        decodeAdaptiveChunks(m_params, payloads, level, chainSettings(m_params), out);
    } catch (const Cancelled&) {
        throw;
    } catch (const Error& e) {
        throw Error(where(std::string("level ") + std::to_string(level)) + ": " + e.what());
    }
    if (progress && !progress(1.0)) throw Cancelled();
}

KvcChainDecoder::KvcChainDecoder(const KvcReader& reader, int level) : m_reader(reader), m_level(level)
{
    const CodecParams& p = reader.params();
    if (!p.chainsChunks())
        throw Error(reader.name() + ": header: the file's chunks do not chain (no transform.adapt_basis): decode them "
                                    "one by one");
    if (level < 1 || level > p.numLevels())
        throw Error(reader.name() + ": level " + std::to_string(level) + ": no such level (file has " +
                    std::to_string(p.numLevels()) + ")");
}

bool KvcChainDecoder::add(int chunk, int level, const uint8_t* data, size_t size, KvSet& out)
{
    const CodecParams& p = m_reader.params();
    const std::string place = m_reader.name() + ": chunk " + std::to_string(chunk) + " level " + std::to_string(level);
    if (done() || m_closed) throw Error(place + ": the chain was decoded already (" + std::to_string(next()) + " chunks)");
    if (!(out.shape() == p.shape) || out.dtype() != p.dtype)
        throw Error(place + ": the cache to decode into is not of the file's shape and dtype");
    if (level != m_level)
        throw Error(place + ": this chain decodes level " + std::to_string(m_level) +
                    "; an adaptive-basis file's chunks chain at one level (transform.adapt_basis)");
    if (chunk != next()) throw Error(place + ": " + chainedChunkReason(chunk, level) + " (expected chunk " + std::to_string(next()) + ")");
    if (size != m_reader.chunkBytes(chunk, level))
        throw Error(place + ": payload of " + std::to_string(size) + " bytes, the index says " +
                    std::to_string(m_reader.chunkBytes(chunk, level)));
    if (crc32(data, size) != m_reader.chunkCrc(chunk, level)) throw Error(place + ": CRC mismatch (corrupt chunk)");
    m_payloads.emplace_back(data, data + size);
    if (!done()) return false;
    try {
        decodeAdaptiveChunks(p, m_payloads, m_level, chainSettings(p), out);
    } catch (const Error& e) {
        throw Error(m_reader.name() + ": level " + std::to_string(m_level) + ": " + e.what());
    }
    return true;
}

void KvcChainDecoder::decodeHeld(KvSet& out)
{
    if (done() || m_closed) return;
    m_closed = true;
    if (m_payloads.empty()) return;
    const CodecParams& p = m_reader.params();
    if (!(out.shape() == p.shape) || out.dtype() != p.dtype)
        throw Error(m_reader.name() + ": level " + std::to_string(m_level) + ": the cache to decode into is not of the file's shape and dtype");
    // transform_adapt.h decodes whole levels only: the chunks not held go in empty, and the chain
    // stops at the first of them (chunk next()) with the ones before it decoded.
    std::vector<std::vector<uint8_t>> all = m_payloads;
    all.resize(size_t(p.numChunks()));
    const std::string stop = "chunk " + std::to_string(next()) + ":";
    try {
        decodeAdaptiveChunks(p, all, m_level, chainSettings(p), out);
    } catch (const Error& e) {
        if (std::string(e.what()).rfind(stop, 0) != 0)
            throw Error(m_reader.name() + ": level " + std::to_string(m_level) + ": " + e.what());
        return;
    }
    KVSCOPE_ASSERT(false && "the chain decoded a chunk it was not given");
}

}  // namespace kvscope
