// The bounds walk (kv_h5_bounds_walk.h) of old-style groups: a symbol table message leads to a
// local heap of link names and a version 1 B-tree over symbol nodes (also the chunk index of
// datasets in the old layout).
#include "kvio/kv_h5_bounds_walk.h"

namespace kvscope::h5bounds {

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

}  // namespace kvscope::h5bounds
