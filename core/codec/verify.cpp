#include "codec/verify.h"

namespace kvscope {

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
