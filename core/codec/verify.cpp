#include "codec/verify.h"

#include "codec/container_chain.h"

#include <algorithm>

namespace kvscope {

namespace {

// A chained file (container_chain.h), level by level in chunk order: every payload's CRC, and
// every chunk decoded through the level's chain as it is pushed; after a damaged chunk the rest of
// its segment is checked by CRC only, and the chain resumes at the next reset point.
void verifyChains(const KvcReader& reader, KvSet& scratch, KvcVerifyReport& r, const Progress& progress)
{
    const int total = r.chunks * r.levels;
    for (int l = 1; l <= r.levels; ++l) {
        KvcChainDecoder chain(reader);
        for (int c = 0; c < r.chunks; ++c) {
            try {
                const std::vector<uint8_t> b = reader.readChunk(c, l);
                if (c == chain.next()) chain.push(c, l, b.data(), b.size(), scratch);
            } catch (const Cancelled&) {
                throw;
            } catch (const Error& e) {
                r.damaged.push_back({c, l, e.what()});
                chain.giveUp(c);
            }
            ++r.checked;
            if (progress && !progress(double(r.checked) / total)) throw Cancelled();
        }
    }
    std::stable_sort(r.damaged.begin(), r.damaged.end(),
                     [](const KvcDamage& a, const KvcDamage& b) { return a.chunk < b.chunk; });
}

}  // namespace

KvcVerifyReport verifyKvc(const KvcReader& reader, const Progress& progress)
{
    const CodecParams& p = reader.params();
    KvcVerifyReport r;
    r.chunks = p.numChunks();
    r.levels = p.numLevels();
    const uint64_t outBytes = uint64_t(p.shape.totalValues()) * dtypeSize(p.dtype);
    if (outBytes > reader.maxOutputBytes())
        throw Error(reader.name() + ": header: the decoded cache would take " + std::to_string(outBytes) +
                    " bytes, over the limit of " + std::to_string(reader.maxOutputBytes()));
    KvSet scratch(p.shape, p.dtype);
    const int total = r.chunks * r.levels;
    if (p.chainsChunks()) {
        verifyChains(reader, scratch, r, progress);
        return r;
    }
    for (int c = 0; c < r.chunks; ++c)
        for (int l = 1; l <= r.levels; ++l) {
            try {
                reader.decodeChunkInto(c, l, scratch);
            } catch (const Cancelled&) {
                throw;
            } catch (const Error& e) {
                r.damaged.push_back({c, l, e.what()});
            }
            ++r.checked;
            if (progress && !progress(double(r.checked) / total)) throw Cancelled();
        }
    return r;
}

}  // namespace kvscope
