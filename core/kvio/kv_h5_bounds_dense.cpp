// The bounds walk (kv_h5_bounds_walk.h) of new-style groups and attributes: link and attribute
// info messages, the fractal heap that holds their entries and the version 2 B-trees that index it.
#include "kvio/kv_h5_bounds_walk.h"

#include <algorithm>

namespace kvscope::h5bounds {

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

}  // namespace kvscope::h5bounds
