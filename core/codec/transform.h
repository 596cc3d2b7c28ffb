// The transform codec (`--codec transform`): keys with RoPE undone, a calibrated linear transform
// per (kind, layer), bits allocated by reverse water-filling on attention-weighted variances,
// uniform quantization and per-component rANS tables. Every stage is a switch in the profile
// (TransformSettings) so that each can be ablated.
//
// READ ME FIRST: the math, in the order the encoder applies it to one (kind, layer) block.
//
// 1. RoPE undo (keys, rope_undo). The cache holds keys after RoPE in the rotate_half layout: for
//    pair i (dims i and i + D/2) of token t at position p = position0 + t, with a = p * inv_freq[i]
//    (computed in double), y_i = x_i cos a - x_{i+D/2} sin a and y_{i+D/2} = x_{i+D/2} cos a +
//    x_i sin a. The encoder applies the inverse rotation (angle -a), the decoder re-applies it to
//    its float32 reconstruction. inv_freq (D/2 floats, scaling already applied) and position0 come
//    from the cache (KvSet::ropeInvFreq) and travel in the container.
//
// 2. Weighting. The error that matters is not |x - x^|^2 but what attention sees:
//    - keys: the score error q . (k - k^). With RoPE undone the query is rotated against the key by
//      the relative angle, and averaged over relative positions a pair's cross terms vanish, so
//      E[(q.e)^2] = sum_d w_d e_d^2 with w_i = w_{i+D/2} = (E q_i^2 + E q_{i+D/2}^2) / 2 summed over
//      the query heads of the GQA group (KvSet::querySq, captured during prefill). Without RoPE
//      undo, w_d = E q_d^2 (the diagonal of the query second moments).
//    - values: the output error goes through o_proj: |W_o (e)|^2 = e^T M_g e per KV head g, with
//      M_g = sum_{h in g} W_o,h^T W_o,h (D x D, KvSet::valueWeight, computed from the weights at
//      capture). W = block-diag(M_g).
//    - weighting "mse": W = I.
//    The codec works in the weighted domain x' = W^{1/2} (x - mean), where squared error is the
//    weighted error; W^{1/2} is the symmetric square root (Jacobi eigendecomposition).
//
// 3. Transform. basis "pca": the eigenvectors of the covariance of x' over the calibration tokens
//    (across all heads, C = H*D dims, or one D x D block per head when across_heads is false),
//    sorted by eigenvalue; "hadamard": a randomized Hadamard rotation per head (signs seeded by
//    kind, layer and head; D a power of two), used when no calibration exists; "none": identity.
//    Component j of a token is z_j = (B W^{1/2} (x - mean))_j; its variance is lambda_j. The
//    decoder computes x^ = mean + A z^ with A = W^{-1/2} B^T, stored as float32 (C x C); the
//    encoder uses the exact inverse of the stored A, so encoder and decoder agree to rounding
//    (blocks of 1024 channels and more: A^T W, within the fp16 rounding of A; transform_wide.h).
//
// 4. Bit allocation (reverse water-filling). At water level theta, the components with
//    lambda_j > theta are coded, all with the same uniform step Delta = sqrt(12 theta) (the
//    high-rate optimum for entropy-coded uniform quantizers: each coded component then has error
//    ~Delta^2/12 = theta); the others take 0 bits, are not coded and reconstruct as the mean.
//    theta = t_kind * layer_scale[l] * lambda_bar_kind, where lambda_bar_kind is the mean of
//    lambda over every layer and component of that kind (so t is dimensionless) and t, layer_scale
//    are the level's settings (`tune --codec transform` learns t and layer_scale on tuning
//    contexts: theta per (kind, layer) ~ 1 / its measured KL per unit distortion, eval/tune_transform.h).
//    allocation "uniform" instead codes every component at the same rate:
//    Delta_j = sqrt(12 theta lambda_j / lambda_bar_block) (same mean error, equal bits).
//
// 5. Quantization and coding. q_j = rint(z_j / Delta_j), symbol = clamp(q_j, -M_j, M_j) + M_j with
//    M_j = clamp(ceil(6 sigma_j / Delta_j), 1, 127) (alphabet <= 255). The edge symbols 0 and 2 M_j
//    are escapes: their exact q travels as a zigzag LEB128 varint in the block's escape list, so no
//    value is ever clipped. entropy "rans": one symbol_stream.h stream per block (4 states),
//    component j coded with its calibrated table; "rans32": the same with the 32-state layout (counts on the calibration caches; parametric Laplace when the
//    statistics come from the cache itself); entropy "fixed": ceil(log2(2 M_j + 1)) bits per
//    symbol, packed LSB first (the TurboQuant-like baseline: hadamard + uniform + fixed).
//
// 6. Sinks and recent tokens: the first sink_tokens and the last recent_tokens tokens of the cache
//    are stored as fp16, untouched (attention sinks carry outsized norms; recent tokens matter most).
//
// 7. Token importance (token_importance, off by default). An error in token t's key or value
//    reaches the output in proportion to the attention t receives (mass is concentrated on few
//    tokens). With w_t = sum over KV heads of KvSet::attnMass (mean probability t receives in the
//    prefill) and w_ref the importance_quantile of w over the layer's coded tokens, token t gets
//    class c_t = clamp(rint(importance_power * log2(w_ref / w_t)), 0, 3) in its layer (keys and
//    values alike) and every coded component of it the step 2^c_t Delta_j. With weight w_t on
//    its distortion, the optimum is theta_t ~ theta / w_t, i.e. power 0.5. Classes travel as 2 bits
//    per coded token at the head of each block's stream; each class's rows are one symbol stream
//    whose tables are the level's tables folded for the coarser step (symbol q -> rint(q / 2^c),
//    escapes to escapes), so the decoder derives them without side information.
//
// 8. Rate-distortion optimised rounding (rdo_lambda = kappa, off by default; encoder only, the
//    payload and the decoder are unchanged). Rounding to nearest minimises distortion only. With
//    the component's table, the code length bits(q) = -log2 p(q) is known to the encoder, and the
//    cost to minimise is D + lambda R. On the water-filling curve dD/dR = -2 ln 2 theta per
//    component, so lambda = 2 ln 2 theta; in units of Delta^2 = 12 theta (class c: both theta and
//    Delta^2 scale by 4^c) the cost of q is (z / Delta - q)^2 + (ln 2 / 6) bits(q), the same for
//    every component and class. kappa scales the rate term (1 = the theory). The candidates are
//    the nearest q and the one next to it toward zero (never an escape); ties keep the nearest.
//    This is a deadzone that adapts to each component's statistics: near-zero values of flat
//    components go to 0, which is cheap, while peaked components keep nearest rounding. The
//    calibrated tables are counted twice: with nearest rounding, then with this rule and the
//    first tables' lengths.
//
// 9. Per-cache means (adapt_mean, off by default; encoder only, the decoder is unchanged). Text of
//    another genre shifts the mean of many channels away from the calibration's (measured on
//    SmolLM2: the shift is most of what a second-moment estimate about the calibrated mean
//    loses). With adapt_mean the block's mean becomes the mean of the cache's coded tokens (RoPE
//    undone for keys); basis, variances, steps and tables stay calibrated. The C means of every
//    block are counted in the size (transformSideBytes), as 4-byte floats, the form they travel in.
//
// 10. Layer groups (layer_group = G, 1 by default). Adjacent layers carry correlated keys and
//    values (the residual stream changes little from one layer to the next), which a PCA per layer
//    cannot use. With G > 1 the layers jG .. jG + G - 1 form one block: its channels are those of
//    its layers side by side (G * H heads, layer-major: block head h' is head h' % H of layer
//    jG + h' / H), and one PCA, one water level and one symbol stream serve them all. The model
//    then has L / G layers of G * H heads (G is implied by the cache's shape; L % G == 0). A
//    level's per-layer scales keep their meaning: the calibration divides each member layer's
//    weights by rel_l = scale_l / (the geometric mean of the group's scales), taken from the
//    first level, so that one water level theta_group = t * (that geometric mean) * lambda_bar
//    is theta_group * rel_l in layer l's own weighted units, as without groups. The cost is on
//    the decoder: each coded component spans G * C channels, G times the multiply-adds.
//
// Where the side information lives: a TransformModel (means, A, steps, tables per level) is fitted
// by `kvscope-cli calibrate --codec transform` on calibration caches and stored in the profile;
// the container carries the model it was encoded with (transform section, FORMAT.md) so every
// .kvc decodes by itself. Sizes in eval count the model only when it was fitted on the cache being
// coded (no calibration); a calibrated model is per-model data, like calibrated CacheGen tables.
#pragma once

#include "kv/kv_set.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvscope {

struct CodecParams;

enum class TransformBasis : uint8_t { None = 0, Hadamard = 1, Pca = 2 };
enum class TransformWeighting : uint8_t { Mse = 0, Attention = 1 };
enum class TransformAllocation : uint8_t { Uniform = 0, Waterfill = 1 };
// rans: one 4-state stream per symbol matrix; rans32: the same tables, one 32-state stream
// (16-bit renormalisation) that SIMD lanes or a GPU warp decode in lock step; fixed: no tables.
enum class TransformEntropy : uint8_t { Fixed = 0, Rans = 1, Rans32 = 2 };
// Whether the entropy choice codes with calibrated tables (rans, rans32: the same tables).
inline bool entropyUsesTables(TransformEntropy e) { return e != TransformEntropy::Fixed; }

const char* basisName(TransformBasis b);             // "none" | "hadamard" | "pca"
const char* weightingName(TransformWeighting w);     // "mse" | "attention"
const char* allocationName(TransformAllocation a);   // "uniform" | "waterfill"
const char* entropyName(TransformEntropy e);         // "fixed" | "rans" | "rans32"

// The largest "adapt_basis" reset_chunks a profile or a .kvc may give (chunks are >= 16 tokens).
constexpr int kMaxAdaptResetChunks = 1 << 20;

// The switches of the transform codec ("transform" object of a profile).
struct TransformSettings {
    bool ropeUndo = true;
    TransformBasis basis = TransformBasis::Pca;
    bool acrossHeads = true;
    TransformWeighting weighting = TransformWeighting::Attention;
    TransformAllocation allocation = TransformAllocation::Waterfill;
    TransformEntropy entropy = TransformEntropy::Rans;
    int sinkTokens = 4;    // 0..4096
    int recentTokens = 0;  // 0..65536
    // Token importance (READ ME FIRST, 7): per-token step multipliers from the attention mass each
    // token received. Encoder-side choices; only the flag changes the payload layout. operator==
    // ignores these (a calibrated model serves with and without them).
    bool tokenImportance = false;
    double importanceQuantile = 0.75;  // w_ref = this quantile of the layer's token importance, 0..1
    double importancePower = 0.5;      // log2 multiplier = power * log2(w_ref / w_t), rounded, 0..3
    // Rate-distortion optimised rounding (READ ME FIRST, 8), encoder-side like the above: 0 = round
    // to nearest (default), kappa > 0 = choose between nearest and one step toward zero by
    // (z/Delta - q)^2 + kappa (ln 2 / 6) bits(q). Calibration counts its tables with the same rule.
    double rdoLambda = 0.0;  // 0..16
    // Per-cache means (READ ME FIRST, 9), encoder-side like the above: the calibrated model's means
    // are replaced by the means of the cache being coded; the new means travel in the container's
    // model and count as side information (4 bytes per channel and block).
    bool adaptMean = false;
    // Layers per block (READ ME FIRST, 10): 1..64, dividing the cache's layers.
    int layerGroup = 1;
    // Backward-adaptive basis (codec/transform_adapt.h, "adapt_basis"): 0 = off, else the prior's
    // weight in tokens and the Jacobi sweeps per block and chunk. Chunk n depends on chunks 0..n-1
    // at one level, so only whole levels code it (eval, writeKvc: container_chain.h); encodeChunk
    // refuses it. A .kvc carries both in its model (version 3). operator== ignores these.
    double adaptPriorTokens = 0;
    int adaptSweeps = 3;
    // Reset points: chunks n % G == 0 restart the chain from the calibrated model (0: never). A
    // .kvc with G > 0 carries it in its model (version 4).
    int adaptResetChunks = 0;  // 0..kMaxAdaptResetChunks
    bool operator==(const TransformSettings& o) const;
};

// One level: relative water levels per kind and a factor per layer (see READ ME FIRST, 4).
struct TransformLevel {
    std::string name;
    double keyTheta = 0.01, valueTheta = 0.01;   // t_kind, > 0
    std::vector<double> keyLayerScale;           // (num_layers), empty = all 1
    std::vector<double> valueLayerScale;
    std::string measuredJson;                    // opaque JSON object text, kept on round trips
};

// Per (kind, layer): mean, decode matrix (stored as fp16 values, held here as the floats they
// round to) and component variances.
struct TransformBlock {
    std::vector<float> mean;      // (C)
    std::vector<float> decode;    // A: (C, C) row-major, x_c = mean_c + sum_j A[c][j] z_j
    std::vector<float> variance;  // lambda_j (C), in the weighted domain
    std::vector<float> encode;    // A^{-1} (C, C), computed by prepareTransform (not serialised)
    // What the decoder reads of A, derived once by prepareDecodeColumns (not serialised): column j
    // of A as row j of `columns` (C, C), the channels [colLo[j], colHi[j]) outside which column j
    // is +-0 (empty range 0, 0 for a zero column), and whether every entry of A is finite.
    std::vector<float> columns;
    std::vector<int> colLo, colHi;
    bool decodeFinite = true;
};

// Fills the derived decode fields of b from b.decode (every block a model holds has
// them: fitTransform and parseTransformModel call this).
void prepareDecodeColumns(TransformBlock& b);

// Per (level, kind, layer): the quantizer of each component and its coding tables.
struct TransformLevelBlock {
    std::vector<float> step;     // (C) Delta_j, 0 = not coded
    std::vector<uint8_t> maxQ;   // (C) M_j, 0 when not coded
    std::vector<std::vector<uint16_t>> freq;  // per coded component (ascending j): 2 M_j + 1 frequencies (rans)
};

// The levels a profile without "transform.levels" gets (smallest first): keys t = 0.1, 0.05,
// 0.025, 0.012, 0.006, values 10x finer; the first five levels of the shipped ladders
// (samples/profiles/*.transform.json).
std::vector<TransformLevel> defaultTransformLevels();

namespace detail {
struct TransformDecodeCache;  // transform_chunk.cpp
}
// Where a model keeps what its decoder derives per (level, kind, layer) on first use (coding
// tables, AMX tiles): not serialised and not copied (a copy starts empty), so a model must not
// be changed once it has decoded.
struct TransformDecodeSlot {
    TransformDecodeSlot() = default;
    TransformDecodeSlot(const TransformDecodeSlot&) {}
    TransformDecodeSlot& operator=(const TransformDecodeSlot&)
    {
        std::lock_guard<std::mutex> lock(m);
        cache.reset();
        return *this;
    }
    mutable std::mutex m;
    mutable std::shared_ptr<detail::TransformDecodeCache> cache;
};

// Everything a decoder needs besides the chunk payloads (the container's transform section).
// numLayers and heads are the blocks' (READ ME FIRST, 10): the cache's layers / layer_group and
// kv_heads * layer_group.
struct TransformModel {
    TransformSettings settings;
    int numLayers = 0, heads = 0, headDim = 0;
    std::vector<float> ropeInvFreq;  // (D/2) when settings.ropeUndo
    int ropePosition0 = 0;
    std::vector<TransformBlock> blocks;                  // [kind * L + layer]
    std::vector<double> keyTheta, valueTheta;            // (levels) t per level, for reports
    std::vector<std::vector<TransformLevelBlock>> levels;  // [level - 1][kind * L + layer]
    bool fittedOnCache = false;  // statistics from the cache being coded (its bytes count as side information)
    bool meansFromCache = false;  // a calibrated model whose means were re-estimated on the cache (adapt_mean)
    TransformDecodeSlot decodeCache;

    int channels() const { return heads * headDim; }
    // Block head h' of block layer j is head h' % cacheHeads() of cache layer j * layerGroup + h' / cacheHeads().
    int cacheHeads() const { return heads / settings.layerGroup; }
    int numLevels() const { return int(levels.size()); }
    const TransformBlock& block(KvKind k, int layer) const { return blocks[size_t(k) * numLayers + layer]; }
    const TransformLevelBlock& levelBlock(int level, KvKind k, int layer) const
    {
        return levels[size_t(level - 1)][size_t(k) * numLayers + layer];
    }
    // Coded components of (level, kind, layer).
    int codedComponents(int level, KvKind k, int layer) const;
};

// Binary form (FORMAT.md "Transform section"); parse validates every field against the shape and
// throws kvscope::Error "where: reason".
void serializeTransformModel(const TransformModel& m, std::vector<uint8_t>& out);
TransformModel parseTransformModel(const uint8_t* data, size_t size, const KvShape& shape, const std::string& where);

// Fits a model on calibration caches (same layers, heads and head_dim) for the given levels:
// means, weights, basis, variances, steps and (rans) tables from the caches' symbol counts.
// Throws kvscope::Error when a switch needs what a cache lacks (RoPE parameters for rope_undo,
// query_sq / value_weight for attention weighting, a power-of-two head_dim for hadamard).
TransformModel fitTransform(const TransformSettings& s, const std::vector<TransformLevel>& levels,
                            const std::vector<const KvSet*>& caches);

// The level-independent part of a fit, kept so that many levels can be fitted on the same
// calibration rows (`tune --codec transform` tries dozens): the model without levels, every
// block's calibration rows as components z (rows[kind * L + layer], counts[...] rows of C floats)
// and lambda_bar per kind (READ ME FIRST, 4).
struct TransformFit {
    TransformModel model;
    std::vector<std::vector<float>> rows;
    std::vector<size_t> counts;
    double meanVariance[2] = {1.0, 1.0};
};
// With layer_group > 1, `shape` is the level whose per-layer scales weight the layers of a group
// (READ ME FIRST, 10; nullptr: all layers alike).
TransformFit fitTransformBlocks(const TransformSettings& s, const std::vector<const KvSet*>& caches,
                                const TransformLevel* shape = nullptr);
// The cache as the blocks of layer group G see it: L / G layers of G * H heads (the data, the RoPE,
// attention mass and, divided by rel_l of the given per-layer scales (empty: 1), the query
// second moments and value weights). G = 1 returns a plain copy.
KvSet groupLayers(const KvSet& kv, int G, const std::vector<double>& keyScale = {},
                  const std::vector<double>& valueScale = {});
// Steps, alphabets and (rans) counted tables of one level on the fit's rows, per block
// [kind * L + layer] (counted with the fit's rounding rule, READ ME FIRST 8); throws kvscope::Error when a layer-scale list has the wrong length.
// With layer groups, a level's scales may list the cache's layers (L * G): a group takes their geometric mean.
std::vector<TransformLevelBlock> fitTransformLevel(const TransformFit& fit, const TransformLevel& level);

// The model an encoder uses for `kv`: the profile's calibrated model (its RoPE set to kv's), or
// one fitted on kv itself (basis pca falls back to hadamard, tables parametric) when the profile
// has none. Stores it in p.transform. Throws kvscope::Error naming `source` on any mismatch.
void prepareTransform(CodecParams& p, const KvSet& kv, const std::string& source);

// Code length in bits of every symbol of a table (-log2 of its probability).
std::vector<float> transformCodeLengths(const std::vector<uint16_t>& freq);
// READ ME FIRST, 8: of the interior symbol `sym` (nearest q = sym - M of x = z / Delta, q not an
// escape) and its neighbour toward zero, the one of least (x - q)^2 + kappa (ln 2 / 6) bits.
inline int rdoSymbol(double x, int sym, int M, const float* bits, double kappa)
{
    const int q = sym - M;
    if (q == 0) return sym;
    const int s1 = q > 0 ? sym - 1 : sym + 1;
    const double w = kappa * 0.11552453009332421;  // ln 2 / 6
    const double c0 = (x - q) * (x - q) + w * double(bits[sym]);
    const double q1 = double(s1 - M);
    const double c1 = (x - q1) * (x - q1) + w * double(bits[s1]);
    return c1 < c0 ? s1 : sym;
}

// Bytes of the model's serialised form.
size_t transformModelBytes(const TransformModel& m);
// What a model fitted on the cache itself adds to that cache's size: everything but the decode
// matrices, which a hadamard or identity basis derives from the seed and the model's weights.
// For a calibrated model: 0 (per-model data, like calibrated tables), or the means when they were
// re-estimated on the cache (adapt_mean).
size_t transformSideBytes(const TransformModel& m);

// Linear algebra used by the fit (exposed for tests). Symmetric eigendecomposition by cyclic
// Jacobi rotations: a (n x n, row-major, symmetric) -> eigenvalues descending in values,
// eigenvectors as the ROWS of vectors (n x n), orthonormal.
void symmetricEigen(const std::vector<double>& a, int n, std::vector<double>& values, std::vector<double>& vectors);
// Inverse of a (n x n) by Gauss-Jordan with partial pivoting; throws kvscope::Error when singular.
std::vector<double> invertMatrix(const std::vector<double>& a, int n, const std::string& what);
// Applies (inverse = true: undoes) RoPE to one (tokens, head_dim) row block of tokens at positions
// position0 + t0 + t, in place.
void applyRope(float* rows, int tokens, int headDim, const float* invFreq, int position0, int t0, bool inverse);
// The same in two steps, for callers that rotate many blocks of the same tokens: ropeTable fills
// cs with {cos a, sin a} of a = (position0 + t0 + t) * invFreq[i] (double, the C library) for
// t < tokens, i < headDim / 2; applyRopeTable rotates with it. Same bytes as applyRope.
void ropeTable(int tokens, int headDim, const float* invFreq, int position0, int t0, std::vector<double>& cs);
void applyRopeTable(float* rows, int tokens, int headDim, const double* cs, bool inverse);

}  // namespace kvscope
