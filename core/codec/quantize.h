// Quantizers of the CacheGen codec on plain float blocks. A block is one (K or V, layer) of one
// chunk: x (heads, n, head_dim), n tokens of the chunk. Symbols are bytes in [0, 2*MAX].
//
// READ ME FIRST
// - Symmetric quantization: MAX = bins/2 - 1, q = clamp(round(x / scale), -MAX, MAX) + MAX.
// - Scales are stored as fp16 and rounded UP to the next fp16 so |x| / scale <= MAX still holds;
//   the encoder quantizes with the stored (rounded) scale, so encoder and decoder agree exactly.
//   An all-zero token or channel has scale 0 and decodes to exact zeros (CacheGen divides by zero).
// - Delta coding (paper §5.2): tokens are grouped by `deltaGroup` from the chunk start; the first
//   token of each group is the anchor, quantized with `anchorBins`; the others store
//   x - anchor_reconstructed (the reconstructed anchor, so errors do not drift along the group).
// - Per-token scales: one per token of the block (anchor tokens with their own bins). Per-channel
//   scales: one per channel for non-anchor tokens, then (delta on) one per channel for anchors.
#pragma once

#include "codec/profile.h"

#include <cstdint>

namespace kvscope::quant {

inline int maxLevel(int bins) { return bins / 2 - 1; }
inline int alphabetSize(int bins) { return 2 * maxLevel(bins) + 1; }

struct BlockSpec {
    int heads = 0, tokens = 0, headDim = 0;
    Quantizer quantizer = Quantizer::PerToken;
    int bins = 32;
    int anchorBins = 32;
    int deltaGroup = 0;  // < 2: no delta coding

    bool isAnchor(int t) const { return deltaGroup >= 2 && t % deltaGroup == 0; }
    int channels() const { return heads * headDim; }
    int numScales() const
    {
        if (quantizer == Quantizer::PerToken) return tokens;
        return deltaGroup >= 2 ? 2 * channels() : channels();
    }
    // The bins a token's symbols use.
    int binsFor(int t) const { return isAnchor(t) ? anchorBins : bins; }
};

// fp16 bits of the smallest fp16 scale s with absmax / s <= maxLevel (0 when absmax is 0).
uint16_t scaleFor(float absmax, int maxLevel);

// x: (heads, tokens, head_dim) -> sym: same shape, scales: (numScales) fp16 bits.
// Throws kvscope::Error when a value is not finite or too large for an fp16 scale.
void quantizeBlock(const BlockSpec& b, const float* x, uint8_t* sym, uint16_t* scales);

// The exact inverse used by every decoder: sym + scales -> out (heads, tokens, head_dim).
void dequantizeBlock(const BlockSpec& b, const uint8_t* sym, const uint16_t* scales, float* out);

}  // namespace kvscope::quant
