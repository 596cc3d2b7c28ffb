// A check of an HDF5 file's metadata against the file's size, made before libhdf5 opens it.
//
// libhdf5 (1.10 at least) allocates some structures at the length the file states before it
// compares that length with the end of file: an object header continuation block, a local heap's
// data segment, a chunk, a fractal heap's huge object. A forged length of up to 2^64 bytes then
// reaches malloc. This walk reads the superblock and every object reachable from the root group:
// object headers (versions 1 and 2) with their continuation blocks; old-style groups (local heap,
// version 1 B-tree, symbol nodes); new-style groups and attributes (links in the header, or in a
// fractal heap indexed by a v2 B-tree); attribute messages; dataset layouts with their chunk
// B-trees or fixed arrays. It refuses the file unless every length and address it finds lies
// inside the file, so what libhdf5 then allocates is bounded by the file's size.
//
// Needs no HDF5 headers: it reads the bytes as the HDF5 file format specification lays them out.
#pragma once

#include <cstdint>
#include <string>

namespace kvscope {

// Throws kvscope::Error "path: place: reason" (place "superblock" or "object header 0x...", and
// so on, with addresses relative to the superblock) for the first structure that does not fit.
void checkH5Bounds(const std::string& path, uint64_t fileSize);

}  // namespace kvscope
