// The walker of kv_h5_bounds.h, shared by the files that check one family of HDF5 structures each:
//   kv_h5_bounds.cpp           the superblock, object headers and what an object's messages lead to
//   kv_h5_bounds_messages.cpp  dataspace, datatype, attribute, layout and link messages; fixed arrays
//   kv_h5_bounds_dense.cpp     new-style groups and attributes: fractal heaps and version 2 B-trees
//   kv_h5_bounds_groups.cpp    old-style groups: local heaps, version 1 B-trees and symbol nodes
// Structures and field layouts follow the HDF5 file format specification (superblock versions 0 to
// 3, object header versions 1 and 2, fractal heaps, version 1 and 2 B-trees, fixed arrays); all
// integers are little-endian, O and L are the superblock's sizes of offsets and lengths, and every
// address is relative to the base address (where the superblock's signature is).
// Internal to kvscope_kvio: no other stage includes it.
#pragma once

#include "common/error.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kvscope::h5bounds {

// Deflate's largest expansion (258-byte matches in 2-bit codes): a filtered structure holds at
// most this many bytes per stored byte.
inline constexpr uint64_t kMaxExpansion = 1032;
// What libhdf5's default chunk cache holds; a chunk or heap block up to this size costs no more
// than the cache does, so small files may declare blocks larger than themselves.
inline constexpr uint64_t kSlack = uint64_t(1) << 20;
// Structures one file may make the walk visit, and the metadata bytes it may make it read.
inline constexpr size_t kMaxStructures = 1 << 20;
// Groups within groups the walk follows (it recurses once per level).
inline constexpr int kMaxDepth = 256;

inline std::string hex(uint64_t v)
{
    char b[24];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return std::string(b);
}

// a * b, saturated at 2^64 - 1
inline uint64_t mulSat(uint64_t a, uint64_t b)
{
    if (a != 0 && b > ~uint64_t(0) / a) return ~uint64_t(0);
    return a * b;
}

// parent + "/" + a link's name for messages: control characters become '?', long names are cut.
inline std::string childName(const std::string& parent, const unsigned char* s, size_t n)
{
    std::string out = parent == "/" ? "/" : parent + "/";
    for (size_t i = 0; i < n && i < 64; ++i) out += s[i] < 0x20 || s[i] == 0x7f ? '?' : char(s[i]);
    if (n > 64) out += "...";
    return out;
}

class Walker;

// The bytes of one structure, read little-endian with bounds checks: running past the end is
// "truncated" at the structure's place.
class Bytes {
public:
    Bytes(const Walker& w, std::vector<unsigned char> data, std::string place)
        : m_w(w), m_data(std::move(data)), m_place(std::move(place))
    {
    }
    const std::string& place() const { return m_place; }
    size_t size() const { return m_data.size(); }
    size_t pos() const { return m_pos; }
    size_t left() const { return m_data.size() - m_pos; }
    const unsigned char* at(size_t i) const { return m_data.data() + i; }
    void seek(size_t p);
    void skip(size_t n) { seek(m_pos + n); }
    uint64_t u(size_t n);  // an n-byte unsigned integer (n <= 8)
    unsigned u8() { return unsigned(u(1)); }
    unsigned u16() { return unsigned(u(2)); }
    uint64_t u32() { return u(4); }
    uint64_t addr();
    uint64_t len();
    bool sig(const char* four) const
    {
        return m_data.size() >= 4 && std::memcmp(m_data.data(), four, 4) == 0;
    }
    // The next n bytes as their own structure (a message's data).
    Bytes sub(size_t n, std::string place);

private:
    const Walker& m_w;
    std::vector<unsigned char> m_data;
    std::string m_place;
    size_t m_pos = 0;
};

struct Message {
    unsigned type = 0;
    unsigned flags = 0;
    Bytes data;
};

class Walker {
public:
    Walker(const std::string& path, uint64_t fileSize);
    ~Walker();
    Walker(const Walker&) = delete;
    Walker& operator=(const Walker&) = delete;

    [[noreturn]] void fail(const std::string& place, const std::string& reason) const
    {
        throw inputError(m_path, place, reason);
    }

    void run()
    {
        superblock();
        if (m_ext != m_undef) objectHeader(m_ext, "superblock extension");
        objectHeader(m_root, "/");
    }

    int sizeOfOffsets() const { return m_o; }
    int sizeOfLengths() const { return m_l; }
    uint64_t undefined() const { return m_undef; }

private:
    // Up to n bytes at absolute file offset `at`; returns how many the file held.
    size_t readAbs(uint64_t at, unsigned char* buf, size_t n) const;

    // A structure of `len` bytes at `addr`: refused unless it lies inside the file's data.
    Bytes read(uint64_t addr, uint64_t len, const std::string& place, const std::string& what)
    {
        checkRange(addr, len, place, what);
        if (++m_structures > kMaxStructures)
            fail(place, "more than " + std::to_string(kMaxStructures) + " metadata structures");
        m_bytesRead += len;
        if (m_bytesRead > 2 * m_fileSize + kSlack)
            fail(place, "metadata read so far exceeds twice the file's size (structures overlap)");
        std::vector<unsigned char> buf(static_cast<size_t>(len));
        if (readAbs(m_sigAt + addr, buf.data(), buf.size()) != buf.size())
            fail(place, "cannot read " + what + " at " + hex(addr));
        return Bytes(*this, std::move(buf), place);
    }
    // Like read, but only as much of `len` as the file holds (prefixes of variable size).
    Bytes readPrefix(uint64_t addr, uint64_t len, const std::string& place, const std::string& what)
    {
        checkRange(addr, 1, place, what);
        return read(addr, std::min(len, m_eof - addr), place, what);
    }
    void checkRange(uint64_t addr, uint64_t len, const std::string& place,
                    const std::string& what) const
    {
        if (addr == m_undef) fail(place, what + " address is undefined");
        if (addr >= m_eof || len > m_eof - addr)
            fail(place, what + " at " + hex(addr) + " (" + hex(len) +
                            " bytes) runs past the end of file (" + hex(m_eof) + ")");
    }

    void superblock();
    void objectHeader(uint64_t addr, const std::string& name);
    void chunkMessages(Bytes& b, size_t end, bool v2, unsigned hdrFlags, std::vector<Message>& out,
                       std::deque<std::pair<uint64_t, uint64_t>>& cont);
    void object(const std::string& place, const std::string& name, std::vector<Message>& msgs);
    uint64_t dataspacePoints(Bytes& b, bool* known);
    uint64_t datatypeSize(Bytes& b);
    void attribute(Bytes& b);
    void layout(Bytes& b, uint64_t points, uint64_t elemSize, bool filtered);
    void link(Bytes& b, const std::string& parent);
    // A fractal heap's doubling table, as fractalHeap read it from the header.
    struct Heap {
        uint64_t addr = 0, width = 0, start = 0, maxDirect = 0, root = 0, rows = 0;
        unsigned maxBits = 0, offSize = 0, lenSize = 0, maxDirectRows = 0, log2Width = 0;
        uint64_t directEntry = 0;
        bool filtered = false;
    };
    void denseStorage(Bytes& b, bool links, const std::string& name);
    Heap fractalHeap(uint64_t addr, const std::string& owner);
    uint64_t indirectSize(const Heap& h, uint64_t rows) const;
    Bytes heapObject(const Heap& h, const unsigned char* id, size_t n, const std::string& place);
    // Returns the tree's record type; with `records`, collects every record of the tree.
    unsigned btree2(uint64_t addr, const std::string& owner, std::vector<std::vector<unsigned char>>* records);
    void hugeObjects(uint64_t btree, bool filtered, const std::string& place);
    void fixedArray(uint64_t addr, uint64_t chunkBytes, bool filtered, const std::string& place);
    void group(uint64_t btree, uint64_t heap, const std::string& owner, const std::string& name);
    Bytes localHeap(uint64_t addr, const std::string& owner);
    void btree1(uint64_t addr, int type, int expectLevel, unsigned ndims, const Bytes* heap,
                const std::string& owner, const std::string& name);
    void symbolNode(uint64_t addr, const Bytes& heap, const std::string& name);

    const std::string& m_path;
    uint64_t m_fileSize;
    int m_fd = -1;
    uint64_t m_sigAt = 0;
    uint64_t m_eof = 0;  // relative to the base
    int m_o = 8, m_l = 8;
    uint64_t m_undef = ~uint64_t(0);
    uint64_t m_root = 0, m_ext = ~uint64_t(0);
    unsigned m_leafK = 4, m_internalK = 16, m_istoreK = 32;  // libhdf5's defaults
    size_t m_structures = 0;
    int m_depth = 0;
    uint64_t m_bytesRead = 0;
    std::set<uint64_t> m_headers, m_nodes;
    std::map<uint64_t, Bytes> m_iblocks;  // fractal heap indirect blocks already read
};

}  // namespace kvscope::h5bounds
