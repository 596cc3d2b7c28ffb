// A backward-adaptive basis for the transform codec (issue 30): chunk n of a (kind, layer) block
// is coded in the eigenbasis of a covariance that the decoder can compute itself, from the
// symbols of chunks 0..n-1 and the calibrated model, so no basis travels. The building blocks,
// a stepwise chain coder over them (AdaptiveChain) and whole-level ones (encodeAdaptiveChunks,
// decodeAdaptiveChunks) that reuse the chunk payloads of FORMAT.md unchanged. The profile option
// `"adapt_basis"` turns it on: eval codes the cache as one chain, and `.kvc` files of format 2.3
// hold one chain per level and segment between reset points (container_chain.h;
// docs/transform.md, "Chained .kvc files" and "Reset points and a stepwise chain").
//
// READ ME FIRST: what makes the chain decodable.
// - Everything is in the calibrated model's component coordinates z (transform.h READ ME FIRST,
//   3): the calibrated covariance there is diag(lambda), and a chunk's basis is a rotation R
//   (C x C, row j = component j of the chunk in calibrated coordinates): y = R z, z = R^T y.
// - Chunk n's covariance is (P diag(lambda) + S) / (P + N), S = sum of zhat zhat^T over the N
//   coded tokens of chunks 0..n-1 AS RECONSTRUCTED: zhat = R_c^T (q * Delta) with the integer
//   symbols q (escapes resolved) of chunk c and its rotation. P (prior tokens) shrinks toward the
//   calibration, which carries the components that are never coded.
// - The state is that covariance, times P + N, IN THE CURRENT BASIS (`cov` = R (P diag(lambda) +
//   S) R^T): in chunk c's own basis its tokens add exactly Y^T Y (y = q * Delta), an O(K^2)
//   update, and the Jacobi starts from it, nearly diagonal, with no change of basis to compute.
// - Encoder and every decoder must derive bit-identical R: they start from the same exact
//   integers and doubles and run the same double arithmetic in a fixed order (these files are
//   compiled with -ffp-contract=off; vector paths only for element-wise products and sums, which
//   round as the scalar ones; no reordered sums, no threads inside one block). The float inverse
//   transforms differ by an ulp between SIMD paths, which is why the chain reads the symbols, not
//   the decoded floats.
// - The eigensolver is cyclic Jacobi warm-started in the previous chunk's basis with a fixed
//   number of sweeps, skipping pairs correlated by less than kAdaptiveMinCorrelation: the result
//   need not be an exact eigenbasis (any orthonormal R decodes, and what a chunk leaves undone
//   stays in `cov` for the next), only the same on both sides, and a fixed budget bounds the
//   decoder's time.
// - The chain depends on the level of every earlier chunk (the symbols it accumulated), so a
//   stream whose chunks switch levels needs every earlier chunk at the level the encoder used.
//   Reset points ("reset_chunks": G) bound that: chunk n with n % G == 0 starts the chain afresh
//   (the calibrated model, as chunk 0), so it decodes alone and the level may change there.
#pragma once

#include "codec/chunk_codec.h"
#include "codec/transform.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace kvscope {

struct AdaptiveBasis {
    int C = 0;
    double priorTokens = 0;       // P, > 0
    std::vector<double> lambda;   // (C) the calibrated variances, descending (the prior's diagonal)
    std::vector<double> sum;      // unused, empty: the state is `cov` (kept for source compatibility)
    double tokens = 0;            // N
    // (C, C) (P + N) times the covariance, in the basis `rotation` (row i, column j: components i
    // and j of the next chunk before its Jacobi, or of this chunk after it), exactly symmetric.
    std::vector<double> cov;
    std::vector<double> rotation; // (C, C) R of the next chunk (identity before the first)
    std::vector<double> variance; // (C) the next chunk's component variances, descending
};

// The state before chunk 0: R = I, cov = P diag(lambda), variances lambda. Throws kvscope::Error
// when priorTokens <= 0.
AdaptiveBasis startAdaptiveBasis(const std::vector<float>& lambda, double priorTokens);

// Derives R and the variances of the next chunk: at most `sweeps` Jacobi sweeps on cov (pairs of
// correlation under kAdaptiveMinCorrelation skipped), rotations composed into R, components sorted
// by descending variance (stable), variances cov's diagonal / (P + N). With N = 0 it leaves R = I.
void advanceAdaptiveBasis(AdaptiveBasis& a, int sweeps);

// The next chunk's quantizer at water level theta (READ ME FIRST, 4 and 5 of transform.h): the
// components of variance > theta coded with step sqrt(12 theta), alphabets from their variances,
// Laplace tables of their variances (what a model fitted on the cache uses).
TransformLevelBlock adaptiveLevelBlock(const AdaptiveBasis& a, double theta);

// Adds a chunk's reconstructed tokens to cov and N: q (rows x K, row-major) are the exact integer
// symbols (escapes resolved) of the coded components of lb, in ascending component order, coded
// in the state's current basis (before the next advanceAdaptiveBasis).
void accumulateAdaptive(AdaptiveBasis& a, const TransformLevelBlock& lb, const int32_t* q, int rows);

// Cyclic Jacobi on the exactly symmetric m (n x n, row-major, kept exactly symmetric: its
// diagonal ends as the eigenvalues), accumulating the rotations into v (n x n, rows rotated:
// v <- J^T v) for at most `sweeps` sweeps, until the off-diagonal mass is below 1e-24 of the total
// or a sweep rotates nothing. A pair (p, q) is skipped when m_pq^2 <= minCorrelation^2 |m_pp m_qq|.
// Returns the sweeps run. Deterministic: the same inputs give the same bits on every x86-64 and
// ARM build and SIMD path.
int jacobiSweeps(std::vector<double>& m, int n, std::vector<double>& v, int sweeps, double minCorrelation = 0);

// The chain's Jacobi skips pairs whose correlation is under this: a residual correlation rho
// costs about 0.72 rho^2 bits per pair of coded components, and it stays in cov for the next chunk.
constexpr double kAdaptiveMinCorrelation = 1e-4;

// The chain over a whole cache at one level. Chunk 0 is coded exactly as the calibrated codec
// codes it; chunk n > 0 in the basis derived from the symbols of chunks 0..n-1 (escapes
// resolved), its tables Laplace laws of the derived variances, each block at the water level of
// its calibrated steps (a block with no coded component stays uncoded). The payloads have the
// layout of FORMAT.md "Chunk payloads (transform)"; only the model they decode with differs.
struct AdaptiveSettings {
    double priorTokens = 2000;  // P
    int sweeps = 3;             // Jacobi sweeps per block and chunk
    int resetChunks = 0;        // G: chunks n % G == 0 restart the chain (0: only chunk 0 starts it)
};

// The chain's settings of a chained cache (p.chainsChunks()): the profile's or the file's.
AdaptiveSettings chainSettings(const CodecParams& p);

// True when chunk `chunk` starts a chain: chunk 0, or a multiple of s.resetChunks.
inline bool chainStartsAt(const AdaptiveSettings& s, int chunk)
{
    return chunk == 0 || (s.resetChunks > 0 && chunk % s.resetChunks == 0);
}
// The first chunk after `chunk` that starts a chain (numChunks when none does).
int nextChainStart(const AdaptiveSettings& s, int chunk, int numChunks);

// One level's chain, stepwise: chunk next() is coded or decoded with the model the chunks before
// it (since the last chain start) derive, then the state advances with its symbols. At a chain
// start (chainStartsAt) the state restarts from the calibrated model by itself. One chain per
// level; not thread-safe (the chunk coders inside it run OpenMP over blocks).
class AdaptiveChain {
public:
    // Starts at chunk `first`, which must start a chain (chainStartsAt). p: a transform codec whose
    // model prepareTransform set. Throws kvscope::Error for what the chain does not support
    // (entropy "fixed", token importance, layer groups), a level outside the model's, or `first`.
    AdaptiveChain(const CodecParams& p, int level, const AdaptiveSettings& s, int first = 0);
    ~AdaptiveChain();
    AdaptiveChain(AdaptiveChain&&) noexcept;
    AdaptiveChain& operator=(AdaptiveChain&&) noexcept;

    int level() const;
    int next() const;  // the chunk the chain codes next; numChunks after the last

    // Codes chunk next() of kv (the payload of FORMAT.md "Chunk payloads (transform)") and advances.
    std::vector<uint8_t> encodeNext(const KvSet& kv);
    // Decodes chunk next() from its payload into its tokens of out (p.shape) and advances. Throws
    // kvscope::Error "chunk N: reason" on a damaged payload; the chain is then unusable until a
    // new one starts (the state may hold part of the chunk).
    void decodeNext(const uint8_t* data, size_t size, KvSet& out);

private:
    struct Impl;
    std::unique_ptr<Impl> m;
};

// Every chunk of one level, through AdaptiveChain from chunk 0 (chains restart at s's reset
// points). Throws kvscope::Error as AdaptiveChain.
std::vector<std::vector<uint8_t>> encodeAdaptiveChunks(const CodecParams& p, const KvSet& kv, int level,
                                                       const AdaptiveSettings& s);
// Decodes every chunk, in order (chunk n needs the chunks since its chain's start at the same level), into out
// (p.shape, zero-filled or not). Throws kvscope::Error naming the chunk on a damaged payload.
void decodeAdaptiveChunks(const CodecParams& p, const std::vector<std::vector<uint8_t>>& chunks, int level,
                          const AdaptiveSettings& s, KvSet& out);

}  // namespace kvscope
