// The .kvc container's side of the transform codec's backward-adaptive basis ("adapt_basis",
// transform_adapt.h; FORMAT.md "Backward-adaptive basis"): files whose chunk n is coded in a
// basis derived from the symbols of the chunks before it at the same level, back to the last
// chain start (chunk 0, or a reset point every G chunks when the file has them).
//
// READ ME FIRST: such a file still stores every chunk at every level, but each level is one
// chain per segment [kG, (k+1)G) (one segment when G = 0). A chain start decodes alone (the
// calibrated model); any other chunk decodes only after the chunks before it in its segment, at
// ITS level, so a reader may change levels only at chain starts and must feed a segment's chunks
// in order: KvcReader::decodeAll with a level per chunk that is constant within segments, or
// KvcChainDecoder for payloads that arrive one at a time (a chunk server), which decodes each
// chunk as it is pushed. Everything else (decodeChunk, decodeChunkInto, decodePayloadInto on a
// chunk that does not start a chain; decodeAll with levels that change inside a segment) refuses
// with a one-line error instead of decoding garbage. The CUDA decoder refuses such files
// (gpu_decode.h).
#pragma once

#include "codec/container.h"
#include "codec/transform_adapt.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace kvscope {

// Every level's chain over kv: result[level - 1][chunk] is the payload that encodeAdaptiveChunks
// gives at that level (the bytes eval codes). `levelDone` is called after each level (the
// writer's progress; it may throw Cancelled). Throws kvscope::Error as encodeAdaptiveChunks.
std::vector<std::vector<std::vector<uint8_t>>> encodeChainLevels(const CodecParams& p, const KvSet& kv,
                                                                 const std::function<void()>& levelDone);

// Decodes the chunks of a chained .kvc as they arrive, one at a time, in order: push() decodes
// the chunk at once with the chain's state (the chunks before it since its chain's start), so
// decoding overlaps the transfer. The level may change only at a chain start.
class KvcChainDecoder {
public:
    // reader: the file or its skeleton (KvcReader::fromSkeleton), which must outlive this.
    // Throws kvscope::Error when the file does not chain its chunks.
    explicit KvcChainDecoder(const KvcReader& reader);
    ~KvcChainDecoder();

    int next() const { return m_next; }  // the chunk push() takes next (numChunks when done)
    int level() const;                   // the level of the chain in progress (0: none yet)
    bool done() const { return m_next == m_reader.params().numChunks(); }

    // Checks `data` as KvcReader::decodePayloadInto does (size and CRC against the index), that it
    // is chunk next() and, unless that chunk starts a chain, at level(); then decodes it into its
    // tokens of out (the file's shape and dtype). Returns done(). Throws kvscope::Error "name:
    // chunk C level L: reason" otherwise, decoding nothing. A corrupt chunk that the CRC missed
    // throws too, naming the chunk; the chain then resumes at the next chain start (next()).
    bool push(int chunk, int level, const uint8_t* data, size_t size, KvSet& out);

    // The consumer gives up chunk `chunk` (>= next(); a stream recomputes it from text): the chain
    // cannot reach the chunks after it in its segment, so push() resumes at the next chain start
    // after it (next() becomes that chunk, numChunks when there is none). Returns next().
    int giveUp(int chunk);

private:
    const KvcReader& m_reader;
    AdaptiveSettings m_settings;
    std::unique_ptr<AdaptiveChain> m_chain;  // the segment in progress
    int m_next = 0;
};

}  // namespace kvscope
