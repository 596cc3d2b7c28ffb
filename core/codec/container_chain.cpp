// Chained .kvc files (container_chain.h): the writer's per-level chains, the reader's whole-cache
// decode, and the decoder of chunks that arrive one at a time.
#include "codec/container_chain.h"

#include "common/crc32.h"
#include "common/error.h"

#include <string>

namespace kvscope {

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

// decodeAllInto for a chained file: a level per chunk, constant within each segment between chain
// starts, each segment decoded in order as its own chain.
void KvcReader::decodeChainInto(const std::vector<int>& levels, KvSet& out, const Progress& progress) const
{
    const AdaptiveSettings s = chainSettings(m_params);
    const int chunks = m_params.numChunks();
    auto levelOf = [&](int c) { return levels.size() == 1 ? levels[0] : levels[size_t(c)]; };
    for (int c = 1; c < chunks; ++c)
        if (!chainStartsAt(s, c) && levelOf(c) != levelOf(c - 1))
            throw Error(where("levels") + ": chunk " + std::to_string(c) + " at level " + std::to_string(levelOf(c)) +
                        " after chunk " + std::to_string(c - 1) + " at level " + std::to_string(levelOf(c - 1)) +
                        ": the chunks of an adaptive-basis file (transform.adapt_basis) chain at one level" +
                        (s.resetChunks > 0 ? " between reset points (every " + std::to_string(s.resetChunks) + " chunks)"
                                           : std::string()) +
                        ", so change levels only there");
    std::unique_ptr<AdaptiveChain> chain;
    for (int c = 0; c < chunks; ++c) {
        const int level = levelOf(c);
        if (chainStartsAt(s, c)) chain = std::make_unique<AdaptiveChain>(m_params, level, s, c);
        const std::vector<uint8_t> payload = readChunk(c, level);
        try {
            chain->decodeNext(payload.data(), payload.size(), out);
        } catch (const Cancelled&) {
            throw;
        } catch (const Error& e) {
            throw Error(where(std::string("level ") + std::to_string(level)) + ": " + e.what());
        }
        if (progress && !progress(double(c + 1) / chunks)) throw Cancelled();
    }
}

KvcChainDecoder::KvcChainDecoder(const KvcReader& reader) : m_reader(reader)
{
    if (!reader.params().chainsChunks())
        throw Error(reader.name() + ": header: the file's chunks do not chain (no transform.adapt_basis): decode them "
                                    "one by one");
    m_settings = chainSettings(reader.params());
}

KvcChainDecoder::~KvcChainDecoder() = default;

int KvcChainDecoder::level() const { return m_chain ? m_chain->level() : 0; }

bool KvcChainDecoder::push(int chunk, int level, const uint8_t* data, size_t size, KvSet& out)
{
    const CodecParams& p = m_reader.params();
    const std::string place = m_reader.name() + ": chunk " + std::to_string(chunk) + " level " + std::to_string(level);
    if (done()) throw Error(place + ": the chain decoded its last chunk already (" + std::to_string(m_next) + " chunks)");
    if (!(out.shape() == p.shape) || out.dtype() != p.dtype)
        throw Error(place + ": the cache to decode into is not of the file's shape and dtype");
    if (level < 1 || level > p.numLevels())
        throw Error(place + ": no such level (file has " + std::to_string(p.numLevels()) + ")");
    if (chunk != m_next) throw Error(place + ": " + chainedChunkReason(p, chunk, level) + " (expected chunk " + std::to_string(m_next) + ")");
    const bool starts = chainStartsAt(m_settings, chunk);
    if (!starts && level != m_chain->level())
        throw Error(place + ": this chain decodes level " + std::to_string(m_chain->level()) +
                    "; an adaptive-basis file's chunks chain at one level (transform.adapt_basis)" +
                    (m_settings.resetChunks > 0 ? ", which may change at reset points (every " +
                                                      std::to_string(m_settings.resetChunks) + " chunks)"
                                                : std::string()));
    if (size != m_reader.chunkBytes(chunk, level))
        throw Error(place + ": payload of " + std::to_string(size) + " bytes, the index says " +
                    std::to_string(m_reader.chunkBytes(chunk, level)));
    if (crc32(data, size) != m_reader.chunkCrc(chunk, level)) throw Error(place + ": CRC mismatch (corrupt chunk)");
    if (starts) m_chain = std::make_unique<AdaptiveChain>(p, level, m_settings, chunk);
    try {
        m_chain->decodeNext(data, size, out);
    } catch (const Error& e) {
        m_chain.reset();
        m_next = nextChainStart(m_settings, chunk, p.numChunks());
        throw Error(m_reader.name() + ": level " + std::to_string(level) + ": " + e.what());
    }
    ++m_next;
    return done();
}

int KvcChainDecoder::giveUp(int chunk)
{
    const int chunks = m_reader.params().numChunks();
    KVSCOPE_ASSERT(chunk >= 0 && chunk < chunks);
    if (chunk < m_next) return m_next;
    m_chain.reset();
    m_next = nextChainStart(m_settings, chunk, chunks);
    return m_next;
}

}  // namespace kvscope
