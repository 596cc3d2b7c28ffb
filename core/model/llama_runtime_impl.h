// Private to the runtime's translation units (llama_runtime.cpp: weights and the runtime;
// llama_session.cpp: the session, its forward pass and attention; llama_branches.cpp: the
// session's branch passes): the torch-side state behind llama_runtime.h. Includes torch, so
// nothing else may include it.
#pragma once

#include "model/llama_runtime.h"
#include "model/weight_kernels.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {
namespace runtime_detail {

// A weight matrix (out, in): expanded (`dense`, in the compute dtype), or packed in the file's
// ggml blocks (`packed`) and expanded tile by tile each time the forward uses it, or both: an
// expanded matrix keeps its blocks too when a weight kernel can multiply them (`blocks`), for
// decode steps.
struct Weight {
    torch::Tensor dense;                        // undefined when the matrix is only packed
    std::shared_ptr<const HostTensor> packed;   // null for a float32 matrix
    PackedMatrix blocks;                        // packed's view for the kernels; data null when none
    int64_t rows = 0, cols = 0;
};

inline torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps)
{
    const torch::Tensor var = x.pow(2).mean(-1, /*keepdim=*/true);
    return w * (x * torch::rsqrt(var + eps));
}

// Throws kvscope::Error naming a token id outside the vocabulary.
void checkTokens(const ModelConfig& c, const std::vector<int32_t>& tokens);

// Rows [r0, r0 + n) of a packed weight as float32 into out (n x cols), over torch's threads.
inline void expandRows(const HostTensor& t, int64_t r0, int64_t n, float* out)
{
    const int64_t cols = t.shape[1];
    at::parallel_for(0, n, 16, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) t.readRow(r0 + r, out + r * cols);
    });
}

// Values of one expanded tile: 4 MB of fp32, small enough to stay in cache between its
// expansion and its matmul.
constexpr int64_t kTileValues = int64_t(1) << 20;

struct Layer {
    torch::Tensor inNorm, postNorm;
    torch::Tensor qNorm, kNorm;             // qkNorm only (per-head RMSNorm weights, head_dim)
    torch::Tensor preFfnNorm, postFfnNorm;  // sandwichNorm only (Gemma)
    Weight wq, wk, wv, wo;
    torch::Tensor bq, bk, bv;  // undefined without q/k/v biases
    Weight wGate, wUp, wDown;
    bool sliding = false;  // attends within the config's sliding window, with the local RoPE base
};

}  // namespace runtime_detail

struct LlamaRuntime::Impl {
    using Weight = runtime_detail::Weight;
    using Layer = runtime_detail::Layer;
    LlamaSpec spec;
    RuntimeOptions options;
    std::string fingerprint;
    Weight embed;   // (vocab, hidden); expanded: fp32, for the lookup
    Weight lmHead;  // (vocab, hidden); the same packed rows as embed when tied
    torch::Tensor norm;
    torch::Tensor invFreq;       // (head_dim / 2), global layers
    torch::Tensor invFreqLocal;  // sliding layers (Gemma 3's own base); = invFreq otherwise
    std::vector<Layer> layers;
    torch::ScalarType compute = torch::kFloat32;
    torch::ScalarType kvType = torch::kFloat16;
    bool geglu = false;  // GeGLU (Gemma) instead of SwiGLU
    bool packedWeights = false;  // some matrices are held in their stored ggml blocks
    // Decode steps (up to kWeightKernelMaxBatch tokens) multiply the stored blocks of the matrices
    // that have them (Weight::blocks), and one-token steps attend with decode_attention.h, on this
    // instruction set: RuntimeOptions::decodeKernels with fp32 compute.
    bool kernels = false;
    SimdPath kernelPath = SimdPath::Scalar;

    torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {}) const
    {
        if (compute == torch::kFloat32) return torch::linear(x, w, b);
        torch::Tensor y = torch::linear(x.to(compute), w, b.defined() ? b.to(compute) : b);
        return y.to(torch::kFloat32);
    }

    // x (T, in) times w^T (+ b): a packed weight is expanded kTileValues at a time into one
    // scratch tile, so memory holds the stored blocks plus one tile, never the fp32 matrix.
    torch::Tensor linear(const torch::Tensor& x, const Weight& w, const torch::Tensor& b = {}) const
    {
        if (w.blocks.data && x.size(0) <= kWeightKernelMaxBatch && kernels) return kernelLinear(x, w, b);
        if (w.dense.defined()) return linear(x, w.dense, b);
        const int64_t N = w.rows, K = w.cols, T = x.size(0);
        const int64_t tile = std::max<int64_t>(1, std::min<int64_t>(N, runtime_detail::kTileValues / K));
        const torch::Tensor xc = compute == torch::kFloat32 ? x.contiguous() : x.to(compute).contiguous();
        torch::Tensor scratch = torch::empty({tile, K});
        torch::Tensor out = torch::empty({T, N});
        for (int64_t n0 = 0; n0 < N; n0 += tile) {
            const int64_t n = std::min(tile, N - n0);
            runtime_detail::expandRows(*w.packed, n0, n, scratch.data_ptr<float>());
            torch::Tensor wt = scratch.narrow(0, 0, n);
            if (compute != torch::kFloat32) wt = wt.to(compute);
            if (n == N) {
                out = torch::mm(xc, wt.t());
                if (compute != torch::kFloat32) out = out.to(torch::kFloat32);
            } else {
                out.narrow(1, n0, n).copy_(torch::mm(xc, wt.t()));
            }
        }
        if (b.defined()) out.add_(b);
        return out;
    }

    // x (T, in) times w^T (+ b) on the stored blocks (weight_kernels.h), output rows split over
    // torch's threads, activation rows kWeightKernelMaxBatch per kernel call: a row's result does
    // not depend on the others, and a range of weight rows stays in cache across the calls.
    torch::Tensor kernelLinear(const torch::Tensor& x, const Weight& w, const torch::Tensor& b) const
    {
        const torch::Tensor xc = x.contiguous();
        const int64_t T = xc.size(0), N = w.rows, K = w.cols;
        torch::Tensor out = torch::empty({T, N});
        const float* xp = xc.data_ptr<float>();
        float* yp = out.data_ptr<float>();
        at::parallel_for(0, N, 256, [&](int64_t r0, int64_t r1) {
            for (int64_t t = 0; t < T; t += kWeightKernelMaxBatch) {
                const int n = int(std::min<int64_t>(kWeightKernelMaxBatch, T - t));
                packedMatmul(w.blocks, r0, r1, xp + t * K, n, yp + t * N, N, kernelPath);
            }
        });
        if (b.defined()) out.add_(b);
        return out;
    }

    // x (T, in) made of independent spans of rows (first row, rows), each given to the bit what
    // linear() gives it alone: spans of up to kWeightKernelMaxBatch rows on the kernels, all in one
    // call (the weights read once for them), and every other span in its own product, as alone
    // (BLAS's per-row sums can depend on the size of a small product: measured, tst_suite).
    torch::Tensor linearSpans(const torch::Tensor& x, const Weight& w, const torch::Tensor& b,
                              const std::vector<std::pair<int, int>>& spans) const
    {
        torch::Tensor out = torch::empty({x.size(0), w.rows});
        std::vector<int64_t> small;
        for (const auto& [first, n] : spans) {
            if (n <= kWeightKernelMaxBatch && w.blocks.data && kernels) {
                for (int i = 0; i < n; ++i) small.push_back(first + i);
                continue;
            }
            out.narrow(0, first, n).copy_(linear(x.narrow(0, first, n), w, b));
        }
        if (!small.empty()) {
            const torch::Tensor at = torch::tensor(small);
            out.index_copy_(0, at, kernelLinear(x.index_select(0, at), w, b));
        }
        return out;
    }

    // The whole weight as float32 (out, in).
    torch::Tensor expanded(const Weight& w) const
    {
        if (w.dense.defined()) return w.dense.to(torch::kFloat32);
        torch::Tensor t = torch::empty({w.rows, w.cols});
        runtime_detail::expandRows(*w.packed, 0, w.rows, t.data_ptr<float>());
        return t;
    }

    // Embedding rows of `ids` (T) as float32 (T, hidden): a packed table expands only those rows.
    torch::Tensor embedRows(const torch::Tensor& ids) const
    {
        if (embed.dense.defined()) return embed.dense.index_select(0, ids);
        const int64_t T = ids.size(0);
        torch::Tensor x = torch::empty({T, embed.cols});
        const int64_t* id = ids.data_ptr<int64_t>();
        for (int64_t i = 0; i < T; ++i) embed.packed->readRow(id[i], x.data_ptr<float>() + i * embed.cols);
        return x;
    }
};

// How the tokens of one forward block attend. No masks and no groups: causal, with each layer's
// sliding window, blocked over keys (attend). Masks (T, length + T, additive): dense, maskLocal on
// sliding layers. Groups: rows [start, start + size) of the block attend as a block of their own
// right after the cache (slots [length, length + size)), dense with their own (size, length +
// size) masks, as if each group were the only one; the first `trunk` K/V rows of each group are
// stashed per layer (State::stashKeys, stashValues) for InferenceSession::resumeGroup.
struct BlockAttention {
    torch::Tensor maskGlobal, maskLocal;
    struct Group {
        int start = 0, size = 0, trunk = 0, index = 0;  // index: the group's number in the stash
        torch::Tensor maskGlobal, maskLocal;
    };
    std::vector<Group> groups;
    // Extensions (InferenceSession::extendGroups): rows [start, start + size) run after stashed group
    // `index`, as one append after resumeGroup(index) would run them, and join its stash.
    struct Extend {
        int start = 0, size = 0, index = 0;
    };
    std::vector<Extend> extends;
};

struct InferenceSession::State {
    // Per layer (kv_heads, capacity, head_dim) in RuntimeOptions::kvDtype, as a serving stack holds
    // them (fp16 by default: half the bytes a decode step reads); attention converts what it reads.
    std::vector<torch::Tensor> keys, values;
    int length = 0;
    int capacity = 0;
    std::vector<int32_t> tokens;
    // Codec statistics (see accumulateQuerySq): per layer (kv_heads, head_dim) sums of q^2, and
    // how many query positions they cover.
    std::vector<torch::Tensor> querySq;
    int64_t queryCount = 0;
    // Per layer (kv_heads, slots) sums over query heads and queries of the softmax probability each
    // cache slot received, and (slots) how many recorded queries saw each slot.
    std::vector<torch::Tensor> attnMass;
    torch::Tensor attnSeen;
    // appendBranchGroups' trunks (and what extendGroups ran after them): per group, per layer
    // (kv_heads, stashed tokens, head_dim) keys and values as the cache held them, valid while the
    // cache ends at stashLength.
    std::vector<std::vector<torch::Tensor>> stashKeys, stashValues;
    std::vector<std::vector<int32_t>> stashTokens;  // per group, its trunk and extensions
    int stashLength = -1;

    void reserve(const LlamaRuntime::Impl& d, int needed)
    {
        if (needed <= capacity) return;
        const ModelConfig& c = d.spec.config;
        const int cap = std::max(needed, std::max(64, capacity * 2));
        for (size_t l = 0; l < size_t(c.numLayers); ++l) {
            for (auto* cache : {&keys, &values}) {
                torch::Tensor fresh = torch::zeros({c.numKvHeads, cap, c.headDim}, torch::TensorOptions().dtype(d.kvType));
                if (length > 0) fresh.narrow(1, 0, length).copy_((*cache)[l].narrow(1, 0, length));
                if (cache->size() <= l) cache->push_back(fresh);
                else (*cache)[l] = fresh;
            }
        }
        capacity = cap;
    }

    // One forward over T tokens written to cache slots [length, length + T) (per group, see
    // BlockAttention): `pos` (T, 1) are their RoPE positions. Returns the final hidden states
    // (T, hidden) before the last norm; length is left to the caller. With recordQueries the
    // queries' second moments are added to querySq (the caller counts them).
    torch::Tensor forwardBlock(const LlamaRuntime::Impl& d, const int32_t* tokens, int T, const torch::Tensor& pos,
                               const BlockAttention& attention, bool recordQueries);
    // Layer l's attention of q (H, T, hd) whose k, v (KH, T, hd) are not yet in the cache: writes
    // them (rounded to kvType) and returns (H, T, hd), as forwardBlock describes.
    torch::Tensor attendLayer(const LlamaRuntime::Impl& d, size_t l, const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const BlockAttention& attention, bool recordQueries);
};

}  // namespace kvscope
