// CRC-32 (ISO-HDLC, the zlib/PNG polynomial) over a byte range; used by the .kvc container.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvscope {

uint32_t crc32(const void* data, size_t size, uint32_t seed = 0);

}  // namespace kvscope
