// The bounds walk (kv_h5_bounds_walk.h) of the messages that size data: dataspace, datatype,
// attribute, data layout (with the chunk index it names) and link messages.
#include "kvio/kv_h5_bounds_walk.h"

#include <algorithm>

namespace kvscope::h5bounds {

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

}  // namespace kvscope::h5bounds
