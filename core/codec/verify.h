// Integrity check of a whole .kvc file: every chunk at every level has its CRC checked and is
// decoded. Decoding one level (what a streamer does) checks only the bytes that level reads, so a
// damaged level of a chunk can sit unnoticed in a file until someone asks for it; this finds it.
#pragma once

#include "codec/container.h"

#include <string>
#include <vector>

namespace kvscope {

struct KvcDamage {
    int chunk = 0;
    int level = 0;        // 1-based
    std::string reason;   // "name: chunk C level L: ..." as the reader reports it
};

struct KvcVerifyReport {
    int chunks = 0;
    int levels = 0;
    int checked = 0;                  // (chunk, level) payloads read and decoded
    std::vector<KvcDamage> damaged;   // in chunk-major order
    bool ok() const { return damaged.empty(); }
};

// Reads and decodes every (chunk, level) of `reader` into one scratch cache of the file's shape
// (refused, like decodeAll, when larger than reader.maxOutputBytes()). A damaged payload is
// recorded and the check goes on with the next one. Progress as in container.h; cancelling throws
// Cancelled.
KvcVerifyReport verifyKvc(const KvcReader& reader, const Progress& progress = {});

}  // namespace kvscope
