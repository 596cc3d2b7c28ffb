// The byte layout of a .kvc file (FORMAT.md) as the writer (container.cpp) and the parser
// (container_parse.cpp) both need it: the magic, the section slots, little-endian byte readers
// and writers. Internal to kvscope_codec.
#pragma once

#include "common/error.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::kvc {

inline constexpr uint8_t kMagic[8] = {0x89, 'K', 'V', 'C', '\r', '\n', 0x1a, '\n'};

// Section slots in the header, in this order, 16 bytes each from offset 72.
enum Section { kLevels = 0, kMeta = 1, kTables = 2, kIndex = 3, kNumSections = 4 };
inline const char* const kSectionNames[kNumSections] = {"levels section", "metadata section", "tables section",
                                                        "chunk index"};
inline constexpr size_t kIndexEntryBytes = 16;
inline constexpr size_t kMaxMetaString = size_t(1) << 30;

struct ByteWriter {
    std::vector<uint8_t> b;
    void u8(uint8_t v) { b.push_back(v); }
    void u16(uint16_t v) { for (int i = 0; i < 2; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void u32(uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void u64(uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void bytes(const void* p, size_t n) { b.insert(b.end(), (const uint8_t*)p, (const uint8_t*)p + n); }
    void str(const std::string& s) { u32(uint32_t(s.size())); bytes(s.data(), s.size()); }
};

struct ByteReader {
    const uint8_t* p;
    const uint8_t* end;
    std::string where;  // "file: section"

    const uint8_t* take(size_t n)
    {
        if (size_t(end - p) < n) throw Error(where + ": truncated");
        const uint8_t* r = p;
        p += n;
        return r;
    }
    uint8_t u8() { return *take(1); }
    uint16_t u16() { const uint8_t* q = take(2); return uint16_t(q[0] | q[1] << 8); }
    uint32_t u32() { const uint8_t* q = take(4); return uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24; }
    uint64_t u64() { uint64_t lo = u32(); return lo | uint64_t(u32()) << 32; }
    std::string str()
    {
        const uint32_t n = u32();
        if (n > kMaxMetaString) throw Error(where + ": string length " + std::to_string(n) + " is implausible");
        const uint8_t* q = take(n);
        return std::string((const char*)q, n);
    }
};

struct SectionRef {
    uint64_t offset = 0;
    uint32_t size = 0;
    uint32_t crc = 0;
};

}  // namespace kvscope::kvc
