#include "common/crc32.h"

#include <zlib.h>

#include <algorithm>

namespace kvscope {

uint32_t crc32(const void* data, size_t size, uint32_t seed)
{
    // zlib's crc32 takes a uInt length; feed large ranges in pieces.
    auto p = static_cast<const Bytef*>(data);
    uLong crc = seed;
    while (size > 0) {
        const uInt n = uInt(std::min<size_t>(size, 1u << 30));
        crc = ::crc32(crc, p, n);
        p += n;
        size -= n;
    }
    return uint32_t(crc);
}

}  // namespace kvscope
