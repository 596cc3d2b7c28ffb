// Internal to codec/: the transform codec's kernels (transform_kernels.cpp) as transform_chunk.cpp
// calls them: for the decoder a row's dequantisation (symbols and escapes to components) and a
// tile's inverse transform, for the encoder a tile's forward transform and a row's quantisation;
// scalar, AVX2 or AVX-512 (simd_path.h). The encoder's paths give the same bytes, the decoder's
// stay within FORMAT.md's tolerance (transform_chunk.cpp says why).
#pragma once

#include "codec/escape_rules.h"
#include "codec/simd_path.h"
#include "common/error.h"
#include "kv/kv_set.h"

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

namespace kvscope::detail {

constexpr int kTileTokens = 64;  // tokens whose sums share one read of each decode column

// An allocator of 64-byte aligned storage: the AMX tiles' rows are read and written 64 bytes at a
// time, and a tile load whose rows straddle two cache lines took 6 times as long on Sapphire
// Rapids (docs/transform.md, "Speed"). malloc aligns to 16 only.
template <class T>
struct CacheLineAllocator {
    using value_type = T;
    CacheLineAllocator() = default;
    template <class U>
    CacheLineAllocator(const CacheLineAllocator<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
    void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
    bool operator==(const CacheLineAllocator&) const { return true; }
    bool operator!=(const CacheLineAllocator&) const { return false; }
};
template <class T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;

// For each token i < nt of the tile and each component k < K in ascending order with
// z = zq[i * K + k] != 0: v[i * C + c] += col[k * C + c] * z for c in [lo[k], hi[k]), one rounded
// multiply and one rounded add per term. The paths differ only in how many channels one
// instruction takes.
struct Tile {
    float* v;
    const float* col;  // (K, C): the decode columns of the coded components (TransformBlock::columns rows)
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

// The encoder's forward transform over a tile of tokens: z[i * Kp + k] = sum over c ascending of
// eT[c * Kp + k] * v[i * C + c] for i < nt, k < Kp, starting from +0, each term one fused
// multiply-add (s = fma(eT, v, s)): one fixed order and rounding, so every path gives its bytes.
// eT is the encode rows of the coded components, transposed (C, Kp); Kp = K rounded up to a
// multiple of 8, the padding columns 0.
struct ForwardTile {
    const float* v;   // (nt, C) x - mean, keys with RoPE undone
    const float* eT;  // (C, Kp)
    float* z;         // (nt, Kp)
    int nt, C, Kp;
};
constexpr int forwardStride(int K) { return (K + 7) / 8 * 8; }
// eT (C, Kp) of ForwardTile from the encode matrix `encode` (rows of C floats): eT[c * Kp + k] =
// encode[coded[k] * C + c] for k < K, 0 for K <= k < Kp; in blocks of channels, so each row of
// `encode` is read a cache line at a time.
void transposeCodedRows(const float* encode, int C, const int* coded, int K, int Kp, float* eT);
// Whether none of x[0, n) is infinite or NaN.
bool allFinite(const float* x, size_t n);
// v[d] = x[d] - mean[d] for d < n (a token's row of ForwardTile::v).
void centreRow(const float* __restrict x, const float* __restrict mean, int n, float* __restrict v);

// The codec's kernels on a SIMD path (simd_path.h).
struct TileKernels {
    // Decoder: a row's dequantisation and a tile's inverse transform.
    void (*dequant)(const uint8_t* sym, const int* M, const float* step, float mult, int K, float* z, EscapeReader& esc);
    void (*accumulate)(const Tile&);
    // Encoder: a tile's forward transform, and a row's quantisation with rounding to nearest:
    // sym[k] = rint(z[k] / div[k]) + M[k] (div = step 2^class, the division in double), the edge
    // symbol and a zigzag varint appended to escapes when |q| >= M[k], in k order. inv[k] = 1 /
    // div[k] in double: a path may multiply by it where that provably rounds to the same q.
    void (*forward)(const ForwardTile&);
    void (*quantize)(const float* z, const double* div, const double* inv, const int* M, int K, uint8_t* sym,
                     std::vector<uint8_t>& escapes);
};

TileKernels kernelsFor(SimdPath path);

// The inverse transform on Intel AMX tiles (transform_amx.cpp), taken by the AVX-512 path when
// the CPU has AMX-BF16 and the kernel grants the tile state: v (rows of stride Cp, the means
// preloaded) += Z B with Z = q 2^class in bfloat16 (exact) and B = A step split into two
// bfloat16 per value. Not bit-identical to the scalar reference: within FORMAT.md's tolerance.
// Whether it may is amxEnabled() (simd_path.h).

// An escape whose q 2^class does not fit bfloat16 exactly: added in float32 after the product.
struct AmxFixup {
    int row, k, cls;
    int64_t q;
};

struct AmxProduct {
    int K = 0, C = 0, Kp = 0, Cp = 0;  // Kp: K rounded up to 32, Cp: C to 16
    CacheLineVector<uint16_t> b;       // tiles (Kp / 32, Cp / 16, hi | lo) of 16 x 32 bfloat16
    CacheLineVector<float> mean16;     // (16, Cp): the block's mean in every row, the sums' start
    // B from the coded decode columns col (K, C) and their steps, and the mean (C); false when a
    // product is too large for the split (the caller takes the vector path).
    bool prepare(const float* col, const float* step, const float* mean, int K, int C);
    bool prepareTiles(const float* col, const float* step);  // prepare's B, once K, C, Kp, Cp are set
    // Row `row` of Z (Kp bfloat16; the caller zeroes the padding) from its symbols, folded
    // maxima M and class; escapes read in order, those that do not fit appended to fixups.
    void dequantRow(const uint8_t* sym, const int* M, int cls, int row, uint16_t* zrow, EscapeReader& esc,
                    std::vector<AmxFixup>& fixups) const;
    // v (rows of Cp floats, nt rounded up to 16 of them in the buffer) = mean + Z B; fastest with v
    // and z 64-byte aligned (CacheLineVector), correct either way.
    void accumulate(float* v, const uint16_t* z, int nt) const;
    void applyFixups(float* v, const float* col, const float* step, const std::vector<AmxFixup>& fixups) const;
};

// One block's coded tokens for the decoder's tile loop (transform_decode.cpp): their symbols
// (R x K) and classes, what dequantises and multiplies them, and where their rows go.
struct InverseJob {
    int R, K, C, H, D;
    const uint8_t* sym;       // (R, K)
    const uint8_t* rowClass;  // (R)
    const int* folded;        // (4, K): each class's folded max |q|
    const float* step;        // (K)
    const float* col;         // (K, C): Tile::col
    const int* lo;
    const int* hi;
    bool plain;               // Tile::plain
    const float* mean;        // (C)
    const AmxProduct* amx;    // the AMX tiles when they take the product, else null
    const int* tokens;        // (R) each coded token's index in the chunk
    const double* rope;       // the chunk's RoPE table (keys of a model that undoes RoPE), else null
    KvKind kind;
    int layer, G, Hc, t0;     // block head h is head h % Hc of layer layer * G + h / Hc
};
// Decodes the job's tokens into out (escapes read in the stream's order): dequantisation, the
// inverse transform, RoPE re-applied, the output dtype; FORMAT.md "Chunk payloads (transform)".
void inverseTiles(const InverseJob& job, EscapeReader& escapes, KvSet& out);

}  // namespace kvscope::detail
