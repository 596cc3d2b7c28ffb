// The metadata walk of kv_h5_bounds.h: the walker's reads, the superblock, object headers with
// their continuation blocks, and what one object's messages lead to. The walker and the files that
// check the other structures are listed in kv_h5_bounds_walk.h.
#include "kvio/kv_h5_bounds.h"
#include "kvio/kv_h5_bounds_walk.h"

#include <algorithm>
#include <cerrno>

#include <fcntl.h>
#include <unistd.h>

namespace kvscope::h5bounds {

Walker::Walker(const std::string& path, uint64_t fileSize) : m_path(path), m_fileSize(fileSize)
{
    m_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (m_fd < 0) fail("", std::string("cannot open: ") + std::strerror(errno));
}

Walker::~Walker()
{
    if (m_fd >= 0) ::close(m_fd);
}

size_t Walker::readAbs(uint64_t at, unsigned char* buf, size_t n) const
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

}  // namespace kvscope::h5bounds

namespace kvscope {

void checkH5Bounds(const std::string& path, uint64_t fileSize)
{
    h5bounds::Walker w(path, fileSize);
    w.run();
}

}  // namespace kvscope
