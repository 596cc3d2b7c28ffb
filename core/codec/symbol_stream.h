// A generic entropy coder for a matrix of byte symbols: rows x cols, row-major, where column c is
// coded with tables[c]. One stream per matrix, 4 interleaved rANS states (rans.h): symbol
// i = r * cols + c is coded by state i % 4. The stream is the four initial decoder states (u32,
// state 0 first) followed by renormalisation bytes, exactly like the CacheGen head streams
// (FORMAT.md "Entropy coding"); an empty matrix is an empty stream.
//
// A second layout, "rans32" (the 32-state v2 streams of rans.h w32, FORMAT.md "Entropy coding",
// version 2): symbol i = r * cols + c is coded by state i % 32 with tables[c]; the stream is the 32
// initial decoder states (u32, state 0 first) followed by 16-bit renormalisation words. Its
// decoder runs the SIMD row kernels of the CacheGen v2 streams (simdPath()) over the matrix taken
// as one flat sequence cut into rows of the least common multiple of cols and 16 symbols, each
// position's table given by a cyclic offset array; the scalar rows are the reference.
//
// The interface knows nothing about what the symbols mean, so the coder behind it can change
// (a SIMD decoder, another stream layout) without touching its callers.
#pragma once

#include "codec/prob_table.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

// Appends the stream of sym (rows x cols) to out. Every symbol must lie in its table's alphabet
// (the caller guarantees it; a symbol with frequency 0 would be a bug and aborts).
void encodeSymbolMatrix(const uint8_t* sym, int rows, int cols, const CodingTable* tables, std::vector<uint8_t>& out);

// Decodes exactly rows x cols symbols from [data, data + size) into sym. tables must be built for
// decoding (toCodingTable(..., true)). Throws kvscope::Error "where: entropy-coded stream is
// corrupt" when the stream is too short, too long, or does not end in the initial states.
void decodeSymbolMatrix(const uint8_t* data, size_t size, int rows, int cols, const CodingTable* tables, uint8_t* sym,
                        const std::string& where);

// The rans32 layout of the same matrix: identical symbols on every SIMD path (and identical
// bytes from every encoder path). Same contract and messages as the 4-state pair above.
void encodeSymbolMatrixW32(const uint8_t* sym, int rows, int cols, const CodingTable* tables, std::vector<uint8_t>& out);
void decodeSymbolMatrixW32(const uint8_t* data, size_t size, int rows, int cols, const CodingTable* tables, uint8_t* sym,
                           const std::string& where);

}  // namespace kvscope
