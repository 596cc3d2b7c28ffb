// The metadata walk of kv_h5_bounds.h. Structures and field layouts follow the HDF5 file format
// specification (superblock versions 0 to 3, object header versions 1 and 2, fractal heaps,
// version 1 and 2 B-trees, fixed arrays); all integers are little-endian, O and L are the
// superblock's sizes of offsets and lengths, and every address is relative to the base address
// (where the superblock's signature is).
#include "kvio/kv_h5_bounds.h"

#include "common/error.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace kvscope {

namespace {

// Deflate's largest expansion (258-byte matches in 2-bit codes): a filtered structure holds at
// most this many bytes per stored byte.
constexpr uint64_t kMaxExpansion = 1032;
// What libhdf5's default chunk cache holds; a chunk or heap block up to this size costs no more
// than the cache does, so small files may declare blocks larger than themselves.
constexpr uint64_t kSlack = uint64_t(1) << 20;
// Structures one file may make the walk visit, and the metadata bytes it may make it read.
constexpr size_t kMaxStructures = 1 << 20;
// Groups within groups the walk follows (it recurses once per level).
constexpr int kMaxDepth = 256;

std::string hex(uint64_t v)
{
    char b[24];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return std::string(b);
}

// a * b, saturated at 2^64 - 1
uint64_t mulSat(uint64_t a, uint64_t b)
{
    if (a != 0 && b > ~uint64_t(0) / a) return ~uint64_t(0);
    return a * b;
}

// parent + "/" + a link's name for messages: control characters become '?', long names are cut.
std::string childName(const std::string& parent, const unsigned char* s, size_t n)
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
    Walker(const std::string& path, uint64_t fileSize) : m_path(path), m_fileSize(fileSize)
    {
        m_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (m_fd < 0) fail("", std::string("cannot open: ") + std::strerror(errno));
    }
    ~Walker()
    {
        if (m_fd >= 0) ::close(m_fd);
    }
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
    size_t readAbs(uint64_t at, unsigned char* buf, size_t n) const
    {
        size_t got = 0;
        while (got < n) {
            const ssize_t r = ::pread(m_fd, buf + got, n - got, off_t(at + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += size_t(r);
        }
        return got;
    }

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

void Bytes::seek(size_t p)
{
    if (p > m_data.size())
        m_w.fail(m_place, "truncated (needs " + std::to_string(p) + " of " +
                              std::to_string(m_data.size()) + " bytes)");
    m_pos = p;
}

uint64_t Bytes::u(size_t n)
{
    const size_t start = m_pos;
    seek(m_pos + n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(m_data[start + i]) << (8 * i);
    return v;
}

uint64_t Bytes::addr()
{
    const uint64_t v = u(size_t(m_w.sizeOfOffsets()));
    return m_w.sizeOfOffsets() < 8 && v == (uint64_t(1) << (8 * m_w.sizeOfOffsets())) - 1
               ? m_w.undefined()
               : v;
}

uint64_t Bytes::len() { return u(size_t(m_w.sizeOfLengths())); }

Bytes Bytes::sub(size_t n, std::string place)
{
    const size_t start = m_pos;
    seek(m_pos + n);
    return Bytes(m_w, std::vector<unsigned char>(m_data.begin() + long(start),
                                                 m_data.begin() + long(start + n)),
                 std::move(place));
}

// The superblock, checked against the file's real size. libhdf5 takes its addresses at their
// word: a forged end-of-file or object address sends it to read (and allocate for) structures far
// beyond the file.
//
// Layout:
//   0  signature "\211HDF\r\n\032\n" at 0, 512, 1024, 2048, ... (a user block may precede it)
//   8  version
//   version 0/1: 9 free-space version, 10 root symbol table entry version, 11 reserved,
//     12 shared header version, 13 O, 14 L, 15 reserved, 16 group leaf node K (2),
//     18 group internal node K (2), 20 consistency flags (4), version 1 only: indexed storage
//     internal node K (2) + reserved (2); then base address, free-space info address, end-of-file
//     address, driver information block address, root group symbol table entry (link name
//     offset, object header address, cache type (4), reserved (4), scratch pad (16)).
//   version 2/3: 9 O, 10 L, 11 consistency flags, then base address, superblock extension
//     address, end-of-file address, root group object header address, checksum (4).
// Addresses are relative to the base address, which libhdf5 takes as where the signature is;
// all ones is the undefined address.
void Walker::superblock()
{
    static const unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    uint64_t sigAt = 0;
    bool found = false;
    unsigned char sb[8 + 16 + 4 + 4 * 8 + 2 * 8 + 24] = {};  // the largest: version 1 with O = 8
    for (uint64_t at = 0; at + 8 <= m_fileSize; at = at == 0 ? 512 : at * 2) {
        unsigned char sig[8];
        if (readAbs(at, sig, 8) == 8 && std::memcmp(sig, kSig, 8) == 0) {
            sigAt = at;
            found = true;
            break;
        }
    }
    if (!found) fail("", "not an HDF5 file (no HDF5 signature)");
    const size_t have = readAbs(sigAt, sb, sizeof sb);
    const std::string place = "superblock";
    if (have < 9) fail(place, "truncated after the signature");
    const int version = sb[8];
    if (version > 3) fail(place, "version " + std::to_string(version) + " is not one of 0 to 3");
    const size_t offsetsAt = version <= 1 ? 13 : 9;
    if (have < offsetsAt + 2) fail(place, "truncated (" + std::to_string(have) + " bytes)");
    const int sizeOfOffsets = sb[offsetsAt];
    const int sizeOfLengths = sb[offsetsAt + 1];
    for (const auto& [what, n] : {std::pair<const char*, int>{"offsets", sizeOfOffsets},
                                  std::pair<const char*, int>{"lengths", sizeOfLengths}})
        if (n != 2 && n != 4 && n != 8)
            fail(place, std::string("size of ") + what + " " + std::to_string(n) + " is not 2, 4 or 8");
    const size_t o = size_t(sizeOfOffsets);
    const size_t addrAt = version == 0 ? 24 : version == 1 ? 28 : 12;
    // Addresses by index: 0 base, 2 end of file; version 0/1: 1 free space, 3 driver block, 4 and 5
    // the root entry's link name offset and object header; version 2/3: 1 superblock extension,
    // 3 root object header, then the checksum.
    const size_t need = version <= 1 ? addrAt + 4 * o + 2 * o + 24 : addrAt + 4 * o + 4;
    if (have < need)
        fail(place, "truncated (" + std::to_string(have) + " of the " + std::to_string(need) +
                        " bytes of a version " + std::to_string(version) + " superblock)");
    auto u16 = [&](size_t at) { return unsigned(sb[at]) | unsigned(sb[at + 1]) << 8; };
    auto addr = [&](size_t index) {
        uint64_t v = 0;
        for (size_t i = 0; i < o; ++i) v |= uint64_t(sb[addrAt + index * o + i]) << (8 * i);
        return v;
    };
    const uint64_t undefined = o == 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * o)) - 1;
    if (version <= 1) {
        if (u16(16) == 0) fail(place, "group leaf node K is 0");
        if (u16(18) == 0) fail(place, "group internal node K is 0");
        if (version == 1 && u16(24) == 0) fail(place, "indexed storage internal node K is 0");
        m_leafK = u16(16);
        m_internalK = u16(18);
        if (version == 1) m_istoreK = u16(24);
    }
    // The stored end-of-file address counts from the start of the file (a user block included);
    // libhdf5 moves the base to where the signature is and shifts the end of file by as much.
    // The other addresses count from the base.
    const uint64_t base = addr(0);
    if (base == undefined) fail(place, "base address is undefined");
    if (addr(2) == undefined) fail(place, "end-of-file address is undefined");
    const uint64_t eofAbs = addr(2) + sigAt - base;
    if (eofAbs > m_fileSize)
        fail(place, "end-of-file address " + hex(eofAbs) + " is beyond the file's " +
                        std::to_string(m_fileSize) + " bytes (truncated or forged)");
    if (eofAbs < sigAt + need)
        fail(place, "end-of-file address " + hex(eofAbs) + " is inside the superblock");
    const uint64_t eof = eofAbs - sigAt;
    struct Named {
        const char* what;
        size_t index;
        bool required;
    };
    const std::vector<Named> addresses =
        version <= 1 ? std::vector<Named>{{"free-space info address", 1, false},
                                          {"driver information block address", 3, false},
                                          {"root group object header address", 5, true}}
                     : std::vector<Named>{{"superblock extension address", 1, false},
                                          {"root group object header address", 3, true}};
    for (const Named& a : addresses) {
        const uint64_t v = addr(a.index);
        if (v == undefined) {
            if (a.required) fail(place, std::string(a.what) + " is undefined");
            continue;
        }
        if (v < need || v >= eof)
            fail(place, std::string(a.what) + " " + hex(v) + " is outside the file's data (" +
                            hex(need) + " to " + hex(eof) + ")");
    }
    m_sigAt = sigAt;
    m_eof = eof;
    m_o = sizeOfOffsets;
    m_l = sizeOfLengths;
    m_undef = undefined;
    m_root = addr(version <= 1 ? 5 : 3);
    m_ext = version <= 1 ? undefined : addr(1);
}

// One object header (version 1, or version 2 "OHDR") and its continuation blocks; then what its
// messages lead to. Version 1: version (1), reserved (1), message count (2), reference count (4),
// chunk 0 size (4), padding to 16; messages type (2), size (2), flags (1), reserved (3), data.
// Version 2: "OHDR", version, flags, [times 16 if flags & 0x20], [attribute phase change 4 if
// flags & 0x10], chunk 0 size (1 << (flags & 3) bytes); messages type (1), size (2), flags (1),
// [creation order (2) if flags & 4], data; checksum (4). Continuation blocks of version 2 start
// with "OCHK" and end with a checksum.
void Walker::objectHeader(uint64_t addr, const std::string& name)
{
    if (!m_headers.insert(addr).second) return;
    const std::string place = "object header " + hex(addr) + " (" + name + ")";
    if (m_depth >= kMaxDepth)
        fail(place, "objects nested more than " + std::to_string(kMaxDepth) + " deep");
    struct Depth {
        int& d;
        explicit Depth(int& x) : d(x) { ++d; }
        ~Depth() { --d; }
    } depth(m_depth);
    Bytes head = readPrefix(addr, 4 + 2 + 16 + 4 + 8, place, "object header");
    std::vector<Message> msgs;
    std::deque<std::pair<uint64_t, uint64_t>> cont;
    bool v2 = false;
    unsigned hdrFlags = 0;
    if (head.sig("OHDR")) {
        v2 = true;
        head.seek(4);
        const unsigned version = head.u8();
        if (version != 2) fail(place, "version " + std::to_string(version) + ", expected 2");
        hdrFlags = head.u8();
        if (hdrFlags & 0x20) head.skip(16);
        if (hdrFlags & 0x10) head.skip(4);
        const uint64_t size = head.u(size_t(1) << (hdrFlags & 3));
        const uint64_t start = addr + head.pos();
        if (size > m_eof) fail(place, "chunk 0 size " + hex(size) + " is larger than the file");
        Bytes chunk = read(start, size + 4, place, "chunk 0");
        chunkMessages(chunk, size_t(size), true, hdrFlags, msgs, cont);
    } else {
        head.seek(0);
        const unsigned version = head.u8();
        if (version != 1)
            fail(place, "not an object header (version " + std::to_string(version) + ")");
        head.skip(1 + 2 + 4);
        const uint64_t size = head.u32();
        Bytes chunk = read(addr + 16, size, place, "chunk 0");
        chunkMessages(chunk, chunk.size(), false, 0, msgs, cont);
    }
    std::set<uint64_t> seenBlocks;
    while (!cont.empty()) {
        const auto [at, length] = cont.front();
        cont.pop_front();
        if (!seenBlocks.insert(at).second) fail(place, "continuation block " + hex(at) + " is listed twice");
        Bytes block = read(at, length, place, "continuation block");
        if (v2) {
            if (!block.sig("OCHK")) fail(place, "continuation block " + hex(at) + " has no OCHK signature");
            if (length < 8) fail(place, "continuation block " + hex(at) + " is shorter than 8 bytes");
            block.seek(4);
            chunkMessages(block, size_t(length - 4), true, hdrFlags, msgs, cont);
        } else {
            chunkMessages(block, block.size(), false, 0, msgs, cont);
        }
    }
    object(place, name, msgs);
}

void Walker::chunkMessages(Bytes& b, size_t end, bool v2, unsigned hdrFlags,
                           std::vector<Message>& out, std::deque<std::pair<uint64_t, uint64_t>>& cont)
{
    const size_t hdr = v2 ? 4 + ((hdrFlags & 0x04) ? 2 : 0) : 8;
    while (end - b.pos() >= hdr) {
        const unsigned type = v2 ? b.u8() : b.u16();
        const size_t size = b.u16();
        const unsigned flags = b.u8();
        b.skip(v2 ? ((hdrFlags & 0x04) ? 2 : 0) : 3);
        if (size > end - b.pos())
            fail(b.place(), "message of type " + std::to_string(type) + " (" + std::to_string(size) +
                                " bytes) runs past its block");
        Bytes data = b.sub(size, b.place());
        if (type == 0x10) {  // continuation: offset (O), length (L)
            const uint64_t at = data.addr();
            const uint64_t length = data.len();
            checkRange(at, length, b.place(), "continuation block");
            if (cont.size() + out.size() > kMaxStructures) fail(b.place(), "too many messages");
            cont.emplace_back(at, length);
        }
        out.push_back(Message{type, flags, std::move(data)});
    }
}

// Dataspace message: version 1: version, rank, flags, reserved (5), dims (L each), [max dims];
// version 2: version, rank, flags, type (0 scalar, 1 simple, 2 null), dims, [max dims].
uint64_t Walker::dataspacePoints(Bytes& b, bool* known)
{
    const unsigned version = b.u8();
    const unsigned rank = b.u8();
    b.u8();
    if (version != 1 && version != 2)
        fail(b.place(), "dataspace version " + std::to_string(version) + " is not 1 or 2");
    if (rank > 32) fail(b.place(), "dataspace rank " + std::to_string(rank) + " exceeds 32");
    unsigned type = rank == 0 ? 0 : 1;
    if (version == 1) {
        b.skip(5);
    } else {
        type = b.u8();
    }
    if (type == 2) return 0;
    uint64_t n = 1;
    for (unsigned i = 0; i < rank; ++i) n = mulSat(n, b.len());
    *known = true;
    return n;
}

// Datatype message: class and version (1), bit fields (3), size (4), properties.
uint64_t Walker::datatypeSize(Bytes& b)
{
    b.skip(4);
    return b.u32();
}

// Attribute message: version 1: version, reserved, name size (2), datatype size (2), dataspace
// size (2), then name, datatype and dataspace each padded to 8 bytes, then the data; version 2:
// flags instead of reserved, no padding; version 3: a name encoding byte after the sizes. libhdf5
// allocates points x element size for the data; it must be what the message holds.
void Walker::attribute(Bytes& b)
{
    const unsigned version = b.u8();
    if (version < 1 || version > 3)
        fail(b.place(), "attribute message version " + std::to_string(version) + " is not 1 to 3");
    const unsigned flags = b.u8();
    const size_t nameSize = b.u16(), typeSize = b.u16(), spaceSize = b.u16();
    if (version == 3) b.u8();
    auto pad = [&](size_t n) { return version == 1 ? (n + 7) / 8 * 8 : n; };
    if (nameSize > b.left()) fail(b.place(), "attribute name of " + std::to_string(nameSize) + " bytes runs past its message");
    const std::string name = childName("", b.at(b.pos()), strnlen(reinterpret_cast<const char*>(b.at(b.pos())), nameSize));
    b.skip(pad(nameSize));
    Bytes type = b.sub(typeSize, b.place());
    b.skip(pad(typeSize) - typeSize);
    Bytes space = b.sub(spaceSize, b.place());
    b.skip(pad(spaceSize) - spaceSize);
    if (flags & 0x03) return;  // a shared datatype or dataspace: its size is elsewhere
    bool known = false;
    const uint64_t points = dataspacePoints(space, &known);
    const uint64_t bytes = mulSat(points, datatypeSize(type));
    if (bytes > b.left())
        fail(b.place(), "attribute " + name.substr(1) + " declares " + std::to_string(bytes) +
                            " bytes of data, its message holds " + std::to_string(b.left()));
}

// Data layout message. Version 3/4: version, class (0 compact, 1 contiguous, 2 chunked, 3 virtual);
// contiguous: address (O), size (L); chunked version 3: rank + 1 (1), B-tree address (O), chunk
// dims (4 each, the last the element size); chunked version 4: flags, rank + 1, bytes per dim,
// dims, index type (1 single chunk, 2 implicit, 3 fixed array, 4 extensible array, 5 v2 B-tree)
// with its parameters, index address (O). Versions 1/2: version, rank + 1, class, reserved (5),
// [address], dims (4 each), [element size (4) when chunked].
void Walker::layout(Bytes& b, uint64_t points, uint64_t elemSize, bool filtered)
{
    const std::string& place = b.place();
    const unsigned version = b.u8();
    if (version == 5)  // HDF5 2.0 writes it for libver 'latest' (h5py >= 3.15 from PyPI bundles 2.0)
        fail(place, "data layout version 5 (HDF5 2.0's newest format) is not 1 to 4: write the file with HDF5 1.x, or "
                    "with h5py's libver=('earliest', 'v114')");
    if (version < 1 || version > 4)
        fail(place, "data layout version " + std::to_string(version) + " is not 1 to 4");
    unsigned cls = 0, ndims = 0;
    std::vector<uint64_t> dims;
    uint64_t index = m_undef;
    unsigned indexType = 0;
    if (version <= 2) {
        ndims = b.u8();
        cls = b.u8();
        b.skip(5);
        if (cls != 0) index = b.addr();
        for (unsigned i = 0; i < ndims; ++i) dims.push_back(b.u32());
        if (cls == 2) dims.push_back(b.u32());
        if (cls == 1 && index != m_undef)
            checkRange(index, mulSat(points, elemSize), place, "contiguous data");
    } else {
        cls = b.u8();
        if (cls == 3) fail(place, "a virtual dataset: its data lies in other files, which are not read");
        if (cls == 1) {
            const uint64_t at = b.addr();
            const uint64_t size = b.len();
            if (at != m_undef) checkRange(at, size, place, "contiguous data");
            return;
        }
        if (cls != 2) return;
        unsigned flags = 0;
        if (version == 3) {
            ndims = b.u8();
            index = b.addr();
            for (unsigned i = 0; i < ndims; ++i) dims.push_back(b.u32());
        } else {
            flags = b.u8();
            ndims = b.u8();
            const unsigned enc = b.u8();
            if (enc < 1 || enc > 8) fail(place, "chunk dimension size of " + std::to_string(enc) + " bytes");
            for (unsigned i = 0; i < ndims; ++i) dims.push_back(b.u(enc));
            indexType = b.u8();
            uint64_t filteredSize = 0;
            if (indexType == 1 && (flags & 0x02)) {
                filteredSize = b.len();
                b.skip(4);
            } else if (indexType == 3) {
                b.skip(1);
            } else if (indexType == 4) {
                b.skip(5);
            } else if (indexType == 5) {
                const uint64_t nodeSize = b.u32();
                b.skip(2);
                if (nodeSize > m_eof) fail(place, "chunk index B-tree node size " + hex(nodeSize) + " is larger than the file");
            } else if (indexType < 1 || indexType > 5) {
                fail(place, "chunk index type " + std::to_string(indexType) + " is not 1 to 5");
            }
            index = b.addr();
            if (indexType == 1 && index != m_undef && filteredSize != 0)
                checkRange(index, filteredSize, place, "chunk");
        }
    }
    if (cls != 2) return;
    if (ndims < 2 || ndims > 33) fail(place, "chunk rank " + std::to_string(ndims) + " is not 1 to 32 (+1)");
    uint64_t chunkBytes = 1;
    for (uint64_t d : dims) {
        if (d == 0) fail(place, "a chunk dimension is 0");
        chunkBytes = mulSat(chunkBytes, d);
    }
    const uint64_t limit = (filtered ? kMaxExpansion : 1) * m_fileSize + kSlack;
    if (chunkBytes > limit)
        fail(place, "data layout: a chunk of " + std::to_string(chunkBytes) + " bytes is more than a " +
                        (filtered ? "filtered" : "plain") + " chunk of this " + std::to_string(m_fileSize) +
                        "-byte file can hold (" + std::to_string(limit) + ")");
    if (index == m_undef) return;
    if (version <= 3) {
        btree1(index, 1, -1, ndims, nullptr, place, "");
    } else if (indexType == 1 && !filtered) {
        checkRange(index, chunkBytes, place, "chunk");
    } else if (indexType == 5) {
        btree2(index, place, nullptr);
    } else if (indexType == 3) {
        fixedArray(index, chunkBytes, filtered, place);
    } else {
        checkRange(index, 1, place, "chunk index");
    }
}

// Link message: version 1, flags, [type (1) if flags & 8], [creation order (8) if flags & 4],
// [charset (1) if flags & 0x10], name length (1 << (flags & 3) bytes), name, then for a hard link
// (type 0) the object header address.
void Walker::link(Bytes& b, const std::string& parent)
{
    const unsigned version = b.u8();
    if (version != 1) fail(b.place(), "link message version " + std::to_string(version) + " is not 1");
    const unsigned flags = b.u8();
    unsigned type = 0;
    if (flags & 0x08) type = b.u8();
    if (flags & 0x04) b.skip(8);
    if (flags & 0x10) b.skip(1);
    const uint64_t nameLen = b.u(size_t(1) << (flags & 3));
    if (nameLen > b.left()) fail(b.place(), "link name of " + std::to_string(nameLen) + " bytes runs past its message");
    const std::string name = childName(parent, b.at(b.pos()), size_t(nameLen));
    b.skip(size_t(nameLen));
    if (type == 0) objectHeader(b.addr(), name);
}

// The fixed array chunk index of layout version 4 (chunked datasets of fixed size in the latest
// format). Header "FAHD": version, client (0 plain chunks, 1 filtered), entry size (1), page bits
// (1), entries (L), data block address (O), checksum. Data block "FADB": version, client, header
// address (O), then, when entries fit one page (entries <= 2^page bits), the entries themselves:
// a chunk's address (O), for filtered chunks also its stored size and filter mask (4). libhdf5
// allocates the data block for all entries, so they must fit in the file; each plain chunk must
// lie inside it too. Paged data blocks are bounded by their size only.
void Walker::fixedArray(uint64_t addr, uint64_t chunkBytes, bool filtered, const std::string& owner)
{
    const std::string place = owner + ": fixed array " + hex(addr);
    Bytes h = read(addr, 8 + size_t(m_l) + size_t(m_o) + 4, place, "fixed array header");
    if (!h.sig("FAHD")) fail(place, "no FAHD signature");
    h.seek(5);
    const unsigned client = h.u8();
    const uint64_t entrySize = h.u8();
    const unsigned pageBits = h.u8();
    const uint64_t entries = h.len();
    const uint64_t block = h.addr();
    if (client > 1 || (client == 1) != filtered)
        fail(place, "client " + std::to_string(client) + " does not match the dataset's filters");
    const uint64_t minEntry = uint64_t(m_o) + (filtered ? 4 + 1 : 0);
    if (entrySize < minEntry) fail(place, "entry size " + std::to_string(entrySize) + " is below " + std::to_string(minEntry));
    if (pageBits == 0 || pageBits > 32) fail(place, "page bits " + std::to_string(pageBits) + " is not 1 to 32");
    const uint64_t bytes = mulSat(entries, entrySize);
    if (bytes > m_eof) fail(place, std::to_string(entries) + " entries of " + std::to_string(entrySize) + " bytes are more than the file holds");
    if (block == m_undef) return;
    const uint64_t prefix = 6 + uint64_t(m_o);
    if (entries > (uint64_t(1) << pageBits)) {
        checkRange(block, prefix + (entries >> pageBits) / 8 + 1 + 4, place, "fixed array data block");
        return;
    }
    Bytes b = read(block, prefix + bytes + 4, place, "fixed array data block");
    if (!b.sig("FADB")) fail(place, "data block " + hex(block) + " has no FADB signature");
    b.seek(size_t(prefix));
    for (uint64_t i = 0; i < entries; ++i) {
        const size_t at = b.pos();
        const uint64_t chunk = b.addr();
        if (!filtered && chunk != m_undef) checkRange(chunk, chunkBytes, place, "chunk");
        if (filtered && chunk != m_undef) {
            const uint64_t stored = b.u(size_t(entrySize) - size_t(m_o) - 4);
            checkRange(chunk, stored, place, "chunk");
        }
        b.seek(at + size_t(entrySize));
    }
}

// Link info (links = true) and attribute info messages: version 0, flags, [max creation index:
// 8 bytes for links, 2 for attributes, if flags & 1], fractal heap address, name index v2 B-tree
// address, [creation order index address if flags & 2]. The name index lists every link or
// attribute by its heap ID; each is read from the heap and checked like a message in a header
// (a link's object header is walked, an attribute's data size bounded).
void Walker::denseStorage(Bytes& b, bool links, const std::string& name)
{
    const unsigned version = b.u8();
    if (version != 0) fail(b.place(), std::string(links ? "link" : "attribute") + " info version " + std::to_string(version) + " is not 0");
    const unsigned flags = b.u8();
    if (flags & 0x01) b.skip(links ? 8 : 2);
    const uint64_t heapAddr = b.addr();
    const uint64_t names = b.addr();
    const uint64_t order = (flags & 0x02) ? b.addr() : m_undef;
    if (order != m_undef) btree2(order, b.place(), nullptr);
    if (heapAddr == m_undef) return;
    const Heap heap = fractalHeap(heapAddr, b.place());
    if (names == m_undef) return;
    std::vector<std::vector<unsigned char>> ids;
    btree2(names, b.place(), &ids);
    const std::string place = b.place() + ": fractal heap " + hex(heapAddr);
    for (const std::vector<unsigned char>& id : ids) {
        // type 5 (links): name hash (4), heap ID (7); type 8 (attributes): heap ID (8), message
        // flags (1), creation order (4), name hash (4)
        const size_t at = links ? 4 : 0;
        const size_t n = links ? 7 : 8;
        if (id.size() < at + n) fail(place, "B-tree record of " + std::to_string(id.size()) + " bytes is too short for a heap ID");
        if (!links && (id[8] & 0x02)) continue;  // a shared attribute: its message lives elsewhere
        Bytes object = heapObject(heap, id.data() + at, n, place);
        if (object.size() == 0) continue;  // huge, tiny or filtered: not followed
        if (links)
            link(object, name);
        else
            attribute(object);
    }
}

// Fractal heap header "FRHP": version, heap ID length (2), filter info length (2), flags, max
// managed object size (4), next huge ID (L), huge object B-tree (O), free space (L), free-space
// manager (O), managed space (L), allocated (L), iterator offset (L), managed objects (L), huge
// size (L), huge count (L), tiny size (L), tiny count (L), table width (2), starting block size
// (L), max direct block size (L), max heap size in bits (2), starting rows (2), root block (O),
// current rows (2), [filtered root size (L), filter mask (4), filter info], checksum. libhdf5
// allocates each direct block at its size and the root indirect block at rows x width entries.
Walker::Heap Walker::fractalHeap(uint64_t addr, const std::string& owner)
{
    const std::string place = owner + ": fractal heap " + hex(addr);
    const size_t O = size_t(m_o), L = size_t(m_l);
    Bytes b = read(addr, 22 + 12 * L + 3 * O + 4, place, "fractal heap header");
    if (!b.sig("FRHP")) fail(place, "no FRHP signature");
    b.seek(4);
    b.u8();
    b.u16();
    const unsigned filterLen = b.u16();
    b.u8();
    const uint64_t maxManaged = b.u32();
    b.len();
    const uint64_t huge = b.addr();
    b.len();
    b.addr();
    for (int i = 0; i < 8; ++i) b.len();
    Heap h;
    h.addr = addr;
    h.width = b.u16();
    h.start = b.len();
    h.maxDirect = b.len();
    h.maxBits = b.u16();
    b.u16();
    h.root = b.addr();
    h.rows = b.u16();
    h.filtered = filterLen > 0;
    const uint64_t limit = (h.filtered ? kMaxExpansion : 1) * m_fileSize + kSlack;
    auto pow2 = [](uint64_t v) { return v != 0 && (v & (v - 1)) == 0; };
    if (!pow2(h.width)) fail(place, "table width " + std::to_string(h.width) + " is not a power of 2");
    if (!pow2(h.start) || !pow2(h.maxDirect) || h.start > h.maxDirect)
        fail(place, "block sizes " + hex(h.start) + " to " + hex(h.maxDirect) + " are not powers of 2 in order");
    if (h.maxDirect > limit) fail(place, "direct block size " + hex(h.maxDirect) + " is larger than the file can hold");
    if (h.maxBits == 0 || h.maxBits > 64) fail(place, "heap size of " + std::to_string(h.maxBits) + " bits is not 1 to 64");
    auto log2 = [](uint64_t v) {
        unsigned r = 0;
        while (v >>= 1) ++r;
        return r;
    };
    h.offSize = (h.maxBits + 7) / 8;
    const unsigned dirOffSize = (log2(h.maxDirect) + 7) / 8;
    const unsigned manLenSize = log2(maxManaged) / 8 + 1;
    h.lenSize = std::min(dirOffSize, manLenSize);
    h.maxDirectRows = log2(h.maxDirect) - log2(h.start) + 2;
    h.log2Width = log2(h.width);
    h.directEntry = O + (h.filtered ? L + 4 : 0);
    if (h.root != m_undef) {
        if (h.rows == 0) {
            if (!h.filtered) checkRange(h.root, h.start, place, "root direct block");
        } else {
            checkRange(h.root, indirectSize(h, h.rows), place, "root indirect block");
        }
    }
    if (huge != m_undef) hugeObjects(huge, h.filtered, place);
    return h;
}

uint64_t Walker::indirectSize(const Heap& h, uint64_t rows) const
{
    const uint64_t direct = std::min<uint64_t>(rows, h.maxDirectRows);
    const uint64_t entries = mulSat(direct, mulSat(h.width, h.directEntry)) +
                             mulSat(rows - direct, mulSat(h.width, uint64_t(m_o)));
    return 4 + 1 + uint64_t(m_o) + h.offSize + entries + 4;
}

// A managed object of the heap by its ID: version/type byte (type 0 managed), offset (offSize
// bytes), length (lenSize bytes). The offset is found in the doubling table: row 0 and 1 hold
// blocks of the starting size, each later row blocks twice the size of the row before, width
// blocks a row; rows up to maxDirectRows are direct blocks, later ones indirect blocks of their
// own (r - log2(width) rows). Huge and tiny objects (IDs of other types) are not followed.
Bytes Walker::heapObject(const Heap& h, const unsigned char* id, size_t n, const std::string& place)
{
    Bytes ib(*this, std::vector<unsigned char>(id, id + n), place);
    const unsigned flags = ib.u8();
    if ((flags >> 6) != 0) fail(place, "heap ID version " + std::to_string(flags >> 6) + " is not 0");
    const unsigned idType = (flags >> 4) & 3;
    if (idType == 1 && !h.filtered && n - 1 >= size_t(m_o + m_l)) {
        // a huge object addressed directly by its ID: address (O), length (L)
        const uint64_t at = ib.addr();
        const uint64_t len = ib.len();
        checkRange(at, len, place, "huge object");
        return Bytes(*this, {}, place);
    }
    if (idType != 0 || h.filtered) return Bytes(*this, {}, place);
    if (h.offSize + h.lenSize > n - 1) fail(place, "heap ID of " + std::to_string(n) + " bytes cannot hold its offset and length");
    const uint64_t off = ib.u(h.offSize);
    const uint64_t len = ib.u(h.lenSize);
    if (h.root == m_undef) fail(place, "object at heap offset " + hex(off) + " in an empty heap");
    uint64_t block = h.root, blockOff = 0, blockSize = h.start;
    uint64_t rows = h.rows;
    for (int depth = 0; rows > 0; ++depth) {
        if (depth > 64) fail(place, "indirect blocks nested more than 64 deep");
        const uint64_t ibSize = indirectSize(h, rows);
        auto it = m_iblocks.find(block);
        if (it == m_iblocks.end()) {
            Bytes bytes = read(block, ibSize, place, "indirect block");
            if (!bytes.sig("FHIB")) fail(place, "indirect block " + hex(block) + " has no FHIB signature");
            it = m_iblocks.emplace(block, std::move(bytes)).first;
        }
        const Bytes& ibytes = it->second;
        if (ibytes.size() != ibSize) fail(place, "indirect block " + hex(block) + " is reached with two sizes");
        const uint64_t rel = off - blockOff;
        const uint64_t rowSpan0 = h.width * h.start;
        uint64_t r = 0, rowStart = 0, size = h.start;
        if (off < blockOff) fail(place, "object offset " + hex(off) + " precedes its block");
        if (rel >= rowSpan0) {
            uint64_t q = rel / rowSpan0;
            r = 1;
            while (q >>= 1) ++r;
            if (r > 62) fail(place, "object offset " + hex(off) + " beyond any row");
            rowStart = rowSpan0 << (r - 1);
            size = h.start << (r - 1);
        }
        if (r >= rows) fail(place, "object offset " + hex(off) + " lies beyond the block's " + std::to_string(rows) + " rows");
        const uint64_t col = (rel - rowStart) / size;
        const uint64_t direct = std::min<uint64_t>(r, h.maxDirectRows);
        uint64_t pos = 4 + 1 + uint64_t(m_o) + h.offSize + direct * h.width * h.directEntry +
                       (r - direct) * h.width * uint64_t(m_o);
        pos += col * (r < h.maxDirectRows ? h.directEntry : uint64_t(m_o));
        uint64_t child = 0;
        for (int i = 0; i < m_o; ++i) child |= uint64_t(*ibytes.at(size_t(pos) + size_t(i))) << (8 * i);
        if (m_o < 8 && child == (uint64_t(1) << (8 * m_o)) - 1) child = m_undef;
        if (child == m_undef) fail(place, "object offset " + hex(off) + " lies in an unallocated block");
        block = child;
        blockOff += rowStart + col * size;
        blockSize = size;
        rows = r < h.maxDirectRows ? 0 : r - h.log2Width;
    }
    checkRange(block, blockSize, place, "direct block");
    if (off - blockOff > blockSize || len > blockSize - (off - blockOff))
        fail(place, "object at heap offset " + hex(off) + " (" + std::to_string(len) + " bytes) runs past its direct block");
    return read(block + (off - blockOff), len, place, "heap object");
}

// Version 2 B-tree header "BTHD": version, type, node size (4), record size (2), depth (2),
// split and merge percent, root node address (O), records in root (2), total records (L),
// checksum. libhdf5 allocates every node of the tree at the node size. With `records`, every
// record of the tree is collected: leaf "BTLF" and internal "BTIN" nodes hold signature, version,
// type, then their records; an internal node then points to nrec + 1 children, each as address
// (O), records in the child and, above depth 1, records below the child, in as many bytes as the
// largest such counts need (libhdf5's node_info).
unsigned Walker::btree2(uint64_t addr, const std::string& owner, std::vector<std::vector<unsigned char>>* records)
{
    const std::string place = owner + ": B-tree " + hex(addr);
    Bytes b = read(addr, 16 + size_t(m_o) + 2 + size_t(m_l) + 4, place, "v2 B-tree header");
    if (!b.sig("BTHD")) fail(place, "no BTHD signature");
    b.seek(5);
    const unsigned type = b.u8();
    const uint64_t nodeSize = b.u32();
    const uint64_t recordSize = b.u16();
    const unsigned depth = b.u16();
    b.skip(2);
    const uint64_t root = b.addr();
    const uint64_t rootRecords = b.u16();
    if (recordSize == 0 || nodeSize < 16 + recordSize)
        fail(place, "node size " + hex(nodeSize) + " cannot hold a record of " + std::to_string(recordSize) + " bytes");
    if (nodeSize > m_eof) fail(place, "node size " + hex(nodeSize) + " is larger than the file");
    if (root == m_undef) return type;
    checkRange(root, nodeSize, place, "root node");
    if (!records) return type;
    if (depth > 16) fail(place, "depth " + std::to_string(depth) + " exceeds 16");
    auto encSize = [](uint64_t v) {
        unsigned r = 0;
        while (v >>= 1) ++r;
        return r / 8 + 1;
    };
    // records per node and the byte widths of the child counts, by depth
    const uint64_t leafMax = (nodeSize - 10) / recordSize;
    const unsigned nrecSize = encSize(leafMax);
    std::vector<uint64_t> maxRec{leafMax}, cumMax{leafMax};
    std::vector<unsigned> cumSize{0};
    for (unsigned d = 1; d <= depth; ++d) {
        const uint64_t ptr = uint64_t(m_o) + nrecSize + cumSize[d - 1];
        if (nodeSize < 10 + ptr) fail(place, "node size " + hex(nodeSize) + " cannot hold a child pointer");
        const uint64_t m = (nodeSize - (10 + ptr)) / (recordSize + ptr);
        maxRec.push_back(m);
        cumMax.push_back(mulSat(m + 1, cumMax[d - 1]) + m);
        cumSize.push_back(encSize(cumMax[d]));
    }
    struct Node {
        uint64_t addr, nrec;
        unsigned depth;
    };
    std::vector<Node> todo{{root, rootRecords, depth}};
    std::set<uint64_t> seen;
    while (!todo.empty()) {
        const Node node = todo.back();
        todo.pop_back();
        if (!seen.insert(node.addr).second) fail(place, "node " + hex(node.addr) + " is reached twice");
        if (node.nrec > maxRec[node.depth])
            fail(place, "node " + hex(node.addr) + " holds " + std::to_string(node.nrec) + " records, at most " +
                            std::to_string(maxRec[node.depth]) + " fit");
        Bytes n = read(node.addr, nodeSize, place, "B-tree node");
        if (!n.sig(node.depth == 0 ? "BTLF" : "BTIN"))
            fail(place, "node " + hex(node.addr) + " has no " + (node.depth == 0 ? "BTLF" : "BTIN") + " signature");
        n.seek(6);
        for (uint64_t i = 0; i < node.nrec; ++i) {
            const size_t at = n.pos();
            n.skip(size_t(recordSize));
            records->emplace_back(n.at(at), n.at(at) + recordSize);
        }
        if (node.depth == 0) continue;
        for (uint64_t i = 0; i <= node.nrec; ++i) {
            const uint64_t child = n.addr();
            const uint64_t childRecords = n.u(nrecSize);
            if (node.depth > 1) n.u(cumSize[node.depth - 1]);
            todo.push_back({child, childRecords, node.depth - 1});
        }
    }
    return type;
}

// The huge objects of a fractal heap (objects above its managed size, e.g. attributes over
// 64 KiB): a v2 B-tree of type 1 (address (O), length (L), ID (L)), 2 (address, stored length,
// filter mask (4), length after the filters (L), ID), 3 (address, length) or 4 (address, stored
// length, mask, length after the filters). libhdf5 allocates an object's length before it reads
// the object, so every one must lie inside the file (after filters: 1032 x its stored length).
void Walker::hugeObjects(uint64_t btree, bool filtered, const std::string& place)
{
    std::vector<std::vector<unsigned char>> records;
    const unsigned type = btree2(btree, place, &records);
    if (type < 1 || type > 4) fail(place, "huge object B-tree of type " + std::to_string(type) + ", expected 1 to 4");
    const bool withFilters = type == 2 || type == 4;
    if (withFilters != filtered) fail(place, "huge object B-tree type " + std::to_string(type) + " does not match the heap's filters");
    for (const std::vector<unsigned char>& r : records) {
        Bytes b(*this, r, place + ": huge object");
        const uint64_t at = b.addr();
        const uint64_t stored = b.len();
        checkRange(at, stored, b.place(), "huge object");
        if (withFilters) {
            b.u32();
            const uint64_t size = b.len();
            if (size > stored * kMaxExpansion + kSlack)
                fail(b.place(), "huge object of " + std::to_string(stored) + " stored bytes claims " + std::to_string(size) + " after its filters");
        }
    }
}

// Local heap "HEAP": version (0), reserved (3), data segment size (L), free list offset (L), data
// segment address (O). libhdf5 allocates the data segment at its stated size. Returns the data
// segment (the names of the group's links).
Bytes Walker::localHeap(uint64_t addr, const std::string& owner)
{
    const std::string place = owner + ": local heap " + hex(addr);
    Bytes b = read(addr, 8 + 2 * size_t(m_l) + size_t(m_o), place, "local heap");
    if (!b.sig("HEAP")) fail(place, "no HEAP signature");
    b.seek(8);
    const uint64_t size = b.len();
    b.len();
    const uint64_t data = b.addr();
    return read(data, size, place, "data segment");
}

// A group's symbol table: a version 1 B-tree of type 0 over symbol nodes, names in a local heap.
void Walker::group(uint64_t btree, uint64_t heap, const std::string& owner, const std::string& name)
{
    const Bytes names = localHeap(heap, owner);
    btree1(btree, 0, -1, 0, &names, owner, name);
}

// Version 1 B-tree node "TREE": type (0 group, 1 chunk), level, entries used (2), left and right
// siblings (O each), then keys and children alternating, one more key than children. libhdf5 reads
// the node at its full size: header + 2K children + (2K + 1) keys, K from the superblock (group
// internal K, or indexed storage K for chunks). Group keys are a heap offset (L); chunk keys are
// the chunk's stored size (4), filter mask (4) and ndims offsets (8 each); a leaf's children are
// symbol nodes (groups) or the chunks themselves.
void Walker::btree1(uint64_t addr, int type, int expectLevel, unsigned ndims, const Bytes* heap,
                    const std::string& owner, const std::string& name)
{
    if (!m_nodes.insert(addr).second) fail(owner, "B-tree node " + hex(addr) + " is reached twice");
    const std::string place = owner + ": B-tree node " + hex(addr);
    const uint64_t K = type == 0 ? m_internalK : m_istoreK;
    const uint64_t keySize = type == 0 ? uint64_t(m_l) : 8 + 8 * uint64_t(ndims);
    const uint64_t size = 8 + 2 * uint64_t(m_o) + 2 * K * uint64_t(m_o) + (2 * K + 1) * keySize;
    Bytes b = read(addr, size, place, "B-tree node");
    if (!b.sig("TREE")) fail(place, "no TREE signature");
    b.seek(4);
    const unsigned nodeType = b.u8();
    const int level = int(b.u8());
    const unsigned entries = b.u16();
    if (int(nodeType) != type)
        fail(place, "node type " + std::to_string(nodeType) + ", expected " + std::to_string(type));
    if (expectLevel >= 0 && level != expectLevel)
        fail(place, "level " + std::to_string(level) + ", expected " + std::to_string(expectLevel));
    if (entries > 2 * K) fail(place, std::to_string(entries) + " entries, more than 2K = " + std::to_string(2 * K));
    b.addr();
    b.addr();
    for (unsigned i = 0; i < entries; ++i) {
        uint64_t chunkSize = 0;
        if (type == 0) {
            b.len();
        } else {
            chunkSize = b.u32();
            b.skip(size_t(keySize) - 4);
        }
        const uint64_t child = b.addr();
        if (level > 0)
            btree1(child, type, level - 1, ndims, heap, owner, name);
        else if (type == 0)
            symbolNode(child, *heap, name);
        else
            checkRange(child, chunkSize, place, "chunk");
    }
}

// Symbol table node "SNOD": version (1), reserved, symbols (2), then 2 x group leaf K entries:
// link name offset (L), object header address (O), cache type (4), reserved (4), scratch (16).
void Walker::symbolNode(uint64_t addr, const Bytes& heap, const std::string& name)
{
    if (!m_nodes.insert(addr).second) fail("symbol node " + hex(addr), "reached twice");
    const std::string place = "symbol node " + hex(addr);
    const uint64_t entry = uint64_t(m_l) + uint64_t(m_o) + 24;
    Bytes b = read(addr, 8 + 2 * uint64_t(m_leafK) * entry, place, "symbol node");
    if (!b.sig("SNOD")) fail(place, "no SNOD signature");
    b.seek(6);
    const unsigned n = b.u16();
    if (n > 2 * m_leafK) fail(place, std::to_string(n) + " symbols, more than 2K = " + std::to_string(2 * m_leafK));
    std::vector<std::pair<uint64_t, std::string>> children;
    for (unsigned i = 0; i < n; ++i) {
        const uint64_t off = b.len();
        if (off >= heap.size())
            fail(place, "link name offset " + hex(off) + " is outside its heap (" + hex(heap.size()) + " bytes)");
        const unsigned char* s = heap.at(size_t(off));
        const size_t len = strnlen(reinterpret_cast<const char*>(s), heap.size() - size_t(off));
        const uint64_t child = b.addr();
        children.emplace_back(child, childName(name, s, len));
        b.skip(24);
    }
    for (const auto& [c, childPath] : children) objectHeader(c, childPath);
}

// What one object's messages lead to, and the dataset checks that need several messages.
void Walker::object(const std::string& place, const std::string& name, std::vector<Message>& msgs)
{
    uint64_t points = 0, elemSize = 0;
    bool haveSpace = false, filtered = false;
    for (Message& m : msgs) {
        const bool shared = (m.flags & 0x02) != 0;
        switch (m.type) {
        case 0x01:
            if (!shared) points = dataspacePoints(m.data, &haveSpace);
            break;
        case 0x03:
            if (!shared) elemSize = datatypeSize(m.data);
            break;
        case 0x07: fail(place, "data in external files, which are not read");
        case 0x0B: filtered = true; break;
        default: break;
        }
    }
    for (Message& m : msgs) {
        if (m.flags & 0x02) continue;  // shared: the message lives elsewhere
        switch (m.type) {
        case 0x02: denseStorage(m.data, true, name); break;
        case 0x06: link(m.data, name); break;
        case 0x08: layout(m.data, haveSpace ? points : 0, elemSize, filtered); break;
        case 0x0C: attribute(m.data); break;
        case 0x11: {
            const uint64_t btree = m.data.addr();
            const uint64_t heap = m.data.addr();
            group(btree, heap, place, name);
            break;
        }
        case 0x15: denseStorage(m.data, false, name); break;
        case 0x13: {  // B-tree 'K' values (superblock extension): version, istore K, group K's
            m.data.u8();
            const unsigned istore = m.data.u16(), internal = m.data.u16(), leaf = m.data.u16();
            if (istore == 0 || internal == 0 || leaf == 0) fail(place, "a B-tree K value is 0");
            m_istoreK = istore;
            m_internalK = internal;
            m_leafK = leaf;
            break;
        }
        default: break;
        }
    }
}

}  // namespace

void checkH5Bounds(const std::string& path, uint64_t fileSize)
{
    Walker w(path, fileSize);
    w.run();
}

}  // namespace kvscope
