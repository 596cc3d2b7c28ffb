// llama2.c checkpoints (A. Karpathy's llama2.c `run.c` / `export.py` formats), read without torch.
//
// Two on-disk formats, both little-endian fp32:
//
//  legacy v0: 7 int32 header  dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//             (vocab_size < 0 means an unshared classifier: wcls follows at the end), then
//               token_embedding (vocab, dim)
//               rms_att         (L, dim)
//               wq              (L, n_heads*hs, dim)      hs = dim / n_heads
//               wk              (L, n_kv_heads*hs, dim)
//               wv              (L, n_kv_heads*hs, dim)
//               wo              (L, dim, n_heads*hs)
//               rms_ffn         (L, dim)
//               w1              (L, hidden, dim)
//               w2              (L, dim, hidden)
//               w3              (L, hidden, dim)
//               rms_final       (dim)
//               freq_cis_real   (seq_len, hs/2)           skipped
//               freq_cis_imag   (seq_len, hs/2)           skipped
//               wcls            (vocab, dim)              only when unshared
//  v1:        uint32 magic 0x616b3432 ("ak42"), int32 version = 1, the same 7 int32 (vocab_size
//             positive), uint8 shared_classifier, zero padding to a 256-byte header, then
//               rms_att (L, dim), rms_ffn (L, dim), rms_final (dim), token_embedding (vocab, dim),
//               wq, wk, wv, wo, w1, w2, w3 (shapes as above), wcls (vocab, dim) only when unshared.
//
// Every matrix is in PyTorch Linear layout (out_features, in_features), row-major: y[i] =
// sum_j W[i*in + j] * x[j]. The file size must match the header exactly; nothing is read before
// that is checked, so a hostile header cannot make the reader allocate beyond the file's size.
//
// RoPE layout: llama2.c rotates interleaved pairs (2i, 2i+1) of each head. kvscope keeps every
// model's keys in the Hugging Face rotate_half layout, pairs (i, i + hs/2) (kv/kv_set.h), so by
// default the rows of wq and wk are permuted at load time within each head
// (permuteInterleavedToRotateHalf). The attention scores are unchanged (q and k get the same
// permutation); only the channel order of q and k differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct Llama2cConfig {
    int dim = 0;
    int hiddenDim = 0;
    int nLayers = 0;
    int nHeads = 0;
    int nKvHeads = 0;
    int vocabSize = 0;  // always positive here
    int seqLen = 0;
    bool sharedClassifier = true;
    int version = 0;  // 0 = legacy, 1 = "ak42" v1

    int headSize() const { return nHeads > 0 ? dim / nHeads : 0; }
    int qDim() const { return nHeads * headSize(); }
    int kvDim() const { return nKvHeads * headSize(); }
};

struct Llama2cModel {
    Llama2cConfig config;
    bool ropeRotateHalf = true;  // wq/wk rows permuted to the rotate_half layout

    std::vector<float> tokenEmbedding;  // (vocab, dim)
    std::vector<float> rmsAtt;          // (L, dim)
    std::vector<float> wq;              // (L, n_heads*hs, dim)
    std::vector<float> wk;              // (L, n_kv_heads*hs, dim)
    std::vector<float> wv;              // (L, n_kv_heads*hs, dim)
    std::vector<float> wo;              // (L, dim, n_heads*hs)
    std::vector<float> rmsFfn;          // (L, dim)
    std::vector<float> w1;              // (L, hidden, dim)   gate
    std::vector<float> w2;              // (L, dim, hidden)   down
    std::vector<float> w3;              // (L, hidden, dim)   up
    std::vector<float> rmsFinal;        // (dim)
    std::vector<float> wcls;            // (vocab, dim); empty when the classifier is shared

    // The output projection: wcls, or tokenEmbedding when shared. (vocab, dim).
    const float* classifier() const
    {
        return config.sharedClassifier ? tokenEmbedding.data() : wcls.data();
    }
};

// Limits a header must respect (anything larger is taken as corrupt).
constexpr int kLlama2cMaxDim = 1 << 16;
constexpr int kLlama2cMaxHidden = 1 << 18;
constexpr int kLlama2cMaxLayers = 1024;
constexpr int kLlama2cMaxHeads = 1024;
constexpr int kLlama2cMaxVocab = 1 << 22;
constexpr int kLlama2cMaxSeqLen = 1 << 24;
constexpr uint32_t kLlama2cMagic = 0x616b3432u;  // "ak42"
constexpr int kLlama2cV1HeaderBytes = 256;

// Reads a llama2.c checkpoint (v0 or v1). permuteRope = true (the default) permutes wq/wk rows to
// the rotate_half layout; false keeps llama2.c's interleaved order (for reference checks).
// Throws kvscope::Error "path: place: reason" on any bad input, including PyTorch pickles.
Llama2cModel loadLlama2c(const std::string& path, bool permuteRope = true);

// Source row, within one head, of row p after the permutation:
//   p <  hs/2  ->  2p          (first element of interleaved pair p)
//   p >= hs/2  ->  2(p-hs/2)+1 (second element of interleaved pair p-hs/2)
// so the interleaved pair (2i, 2i+1), rotated by angle pos*theta^(-2i/hs), becomes the rotate_half
// pair (i, i+hs/2) with the same angle. headSize must be even.
inline int rotateHalfSourceRow(int p, int headSize)
{
    const int half = headSize / 2;
    return p < half ? 2 * p : 2 * (p - half) + 1;
}

// Permutes, in place, the rows of a (nHeads*headSize, rowLen) row-major matrix (one layer of wq or
// wk) from the interleaved RoPE order to the rotate_half order: new row h*hs + p = old row
// h*hs + rotateHalfSourceRow(p, hs). Applying the same map to a vector (rowLen = 1) permutes the
// channels of a q or k computed with the unpermuted weights.
void permuteInterleavedToRotateHalf(float* rows, int nHeads, int headSize, int rowLen);

}  // namespace kvscope
