// Internal to codec/: the transform decoder's kernels (transform_kernels.cpp) as
// transform_chunk.cpp's decodeBlock calls them: a row's dequantisation (symbols and escapes to
// components) and a tile's inverse transform, scalar, AVX2 or AVX-512 (simd_path.h). Every path
// gives the same bytes (transform_chunk.cpp says why).
#pragma once

#include "codec/escape_rules.h"
#include "codec/simd_path.h"
#include "common/error.h"

#include <cstdint>
#include <string>

namespace kvscope::detail {

constexpr int kTileTokens = 8;  // tokens whose sums share one read of each decode column

// For each token i < nt of the tile and each component k < K in ascending order with
// z = zq[i * K + k] != 0: v[i * C + c] += col[k][c] * z for c in [lo[k], hi[k]), one rounded
// multiply and one rounded add per term. The paths differ only in how many channels one
// instruction takes.
struct Tile {
    float* v;
    const float* const* col;  // K decode columns (TransformBlock::columns rows), C channels each
    const float* zq;
    const int* lo;
    const int* hi;
    int nt, K, C;
    // Every column and zq value finite and no mean -0: a term with z = 0 leaves a sum unchanged,
    // so a path may add it instead of skipping it (the AVX-512 sums do).
    bool plain;
};

// The block's escape list, read in the stream's order (token by token, k ascending).
struct EscapeReader {
    const uint8_t* p;
    const uint8_t* end;
    const std::string* where;

    // q of an escaped symbol s (0 or 2M) of a component with folded max M.
    int64_t next(int s, int M)
    {
        int64_t q = 0;
        const int status = hd::readEscape(p, end, s, M, &q);
        if (status == hd::kEscapeMalformed) throw Error(*where + ": escape list is truncated or malformed");
        if (status == hd::kEscapeMismatch) throw Error(*where + ": escape value does not match its symbol");
        return q;
    }
};

// The decoder's kernels on a SIMD path (simd_path.h): a row's dequantisation and a tile's
// inverse transform.
struct TileKernels {
    void (*dequant)(const uint8_t* sym, const int* M, const float* step, float mult, int K, float* z, EscapeReader& esc);
    void (*accumulate)(const Tile&);
};

TileKernels kernelsFor(SimdPath path);

}  // namespace kvscope::detail
