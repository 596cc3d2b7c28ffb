// The .kvc container's side of the transform codec's backward-adaptive basis ("adapt_basis",
// transform_adapt.h; FORMAT.md "Backward-adaptive basis"): files whose chunk n is coded in a
// basis derived from the symbols of chunks 0..n-1 at the same level.
//
// READ ME FIRST: such a file still stores every chunk at every level, but each level is one
// chain. Chunk 0 of any level decodes alone (the calibrated model); chunk n > 0 decodes only
// after chunks 0..n-1 of ITS level, so a reader must not mix levels and must feed the chunks in
// order: KvcReader::decodeAll with one level, or KvcChainDecoder for payloads that arrive one at
// a time (a chunk server). Everything else (decodeChunk, decodeChunkInto, decodePayloadInto,
// decodeAll with a mix of levels) refuses chunk n > 0 with a one-line error instead of
// decoding garbage. The CUDA decoder refuses such files (gpu_decode.h).
#pragma once

#include "codec/container.h"
#include "codec/transform_adapt.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace kvscope {

// The chain's settings of a chained cache (p.chainsChunks()): the profile's or the file's.
AdaptiveSettings chainSettings(const CodecParams& p);

// Every level's chain over kv: result[level - 1][chunk] is the payload that encodeAdaptiveChunks
// gives at that level (the bytes eval codes). `levelDone` is called after each level (the
// writer's progress; it may throw Cancelled). Throws kvscope::Error as encodeAdaptiveChunks.
std::vector<std::vector<std::vector<uint8_t>>> encodeChainLevels(const CodecParams& p, const KvSet& kv,
                                                                 const std::function<void()>& levelDone);

// Decodes the chunks of one level of a chained .kvc as they arrive, in order. The chain coder of
// transform_adapt.h decodes a whole level at once, so the payloads are held (checked) until the
// last one arrives, and add() then decodes every chunk: decoding does not overlap the transfer.
class KvcChainDecoder {
public:
    // reader: the file or its skeleton (KvcReader::fromSkeleton), which must outlive this.
    // Throws kvscope::Error when the file does not chain its chunks or has no such level.
    KvcChainDecoder(const KvcReader& reader, int level);

    int level() const { return m_level; }
    int next() const { return int(m_payloads.size()); }  // the chunk add() takes next
    bool done() const { return next() == m_reader.params().numChunks(); }

    // Checks `data` as KvcReader::decodePayloadInto does (size and CRC against the index) and that
    // it is chunk next() at level(); throws kvscope::Error "name: chunk C level L: reason"
    // otherwise, holding nothing of it. After the last chunk it decodes the whole level into out
    // (the file's shape and dtype) and returns true, else false. A corrupt chunk that the CRC
    // missed throws from that call, naming the chunk, with the chunks before it decoded into out.
    bool add(int chunk, int level, const uint8_t* data, size_t size, KvSet& out);

    // Decodes the chunks held (0..next()-1) into out, for a consumer that gives up the rest of the
    // level (a stream that recomputes them from text); add() refuses any chunk after it. Does
    // nothing when the level was decoded whole, or a second time. Throws like add().
    void decodeHeld(KvSet& out);
    bool closed() const { return m_closed; }

private:
    const KvcReader& m_reader;
    int m_level;
    std::vector<std::vector<uint8_t>> m_payloads;
    bool m_closed = false;  // decodeHeld ran
};

}  // namespace kvscope
