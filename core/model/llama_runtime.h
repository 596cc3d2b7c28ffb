// The Llama-family forward pass (libtorch, CPU), behind a torch-free interface so that Qt code
// and the CLI can include it. Torch lives in llama_runtime.cpp (weights), llama_session.cpp (the
// session and forward pass), llama_branches.cpp (its branch passes) and their private
// llama_runtime_impl.h, nowhere else.
//
// READ ME FIRST
//  - One forward serves prefill, generation, scoring and prefill-with-past: an InferenceSession
//    holds a KV cache and append() runs new tokens after it, returning logits.
//  - Numerics: RMSNorm, softmax and the residual stream in fp32; matmuls in fp32 (default) or
//    bf16 (RuntimeOptions::compute). RoPE in the Hugging Face rotate_half layout, GQA (query head
//    h reads KV head h / (heads / kv_heads)), SwiGLU or GeGLU, sliding windows on all or some
//    layers (Gemma 3: 5 local layers with their own RoPE base per global one), q/k RMSNorm
//    (Qwen3, Gemma 3), Gemma's sandwich norms, embedding scale and soft-capping.
//  - Attention is blocked over keys (RuntimeOptions::keyBlock) with a running softmax, and over
//    queries (queryBlock), each query block reading only the keys it sees: memory per layer is
//    O(queryBlock x keyBlock), whatever the context length.
//  - KV precision: every K/V row is rounded to RuntimeOptions::kvDtype (fp16 by default, as a
//    serving stack stores it) *before* attention reads it, during prefill too, and the session
//    holds it in that dtype (attention converts what it reads to fp32, exactly). So the cache a
//    session exports (exportKv) is exactly the cache the model attended to, and generating from
//    a KvSet read back from disk reproduces generation right after prefill, token for token.
//    Use kvDtype F32 to reproduce fp32 reference implementations (llama2.c's run.c).
//  - Threads: torch's intra-op pool, RuntimeOptions::threads (0 = all cores).
#pragma once

#include "kv/kv_set.h"
#include "modelio/llama_weights.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct RuntimeOptions {
    int threads = 0;           // 0 = every core
    DType compute = DType::F32;  // F32 or BF16 matmuls
    DType kvDtype = DType::F16;  // precision of the cache (F16, BF16 or F32)
    int prefillBlock = 512;    // tokens per forward during long prefills (bounds memory)
    int keyBlock = 1024;       // keys per step of the blocked attention (bounds the score buffer)
    int queryBlock = 128;      // queries per sub-block of the blocked attention (each reads only its keys)
    // Record, during prefills, the attention probability each cached token receives (exported as
    // KvSet::attnMass, what the transform codec's token_importance weights errors by). Costs a
    // second pass over the key blocks (the scores again with the final normaliser): off unless a
    // consumer needs it.
    bool attnMass = false;
    // Quantised (GGUF) matrices: Packed keeps them in their stored blocks and expands them tile
    // by tile as each matmul runs (memory: about the file size; slower, decode more than prefill:
    // docs/models.md, --weights); Expanded converts them all at load to the compute dtype
    // (4 bytes per weight in fp32); Auto packs when the expanded matrices would exceed
    // kAutoExpandLimit bytes (a 7B model), and expands smaller models.
    enum class Weights { Auto, Packed, Expanded };
    Weights weights = Weights::Auto;
    static constexpr uint64_t kAutoExpandLimit = uint64_t(2) << 30;
    // Decode steps (up to 4 tokens, model/weight_kernels.h) multiply the GGUF's stored blocks
    // directly, whatever `weights` says, for the types that have a kernel: a step then reads the
    // file's bytes, not 4 bytes per weight (expanded matrices keep their blocks too: memory grows
    // by about the file size); a one-token step attends with model/decode_attention.h instead of
    // BLAS. fp32 compute only; results differ from the torch path's only in the order of the sums.
    // false: every step runs as a prefill block does.
    bool decodeKernels = true;
};

class LlamaRuntime {
public:
    // Takes the weights (their host buffers move into torch tensors without a copy).
    // Throws kvscope::Error for unsupported options (RoPE scaling kinds, dtypes).
    LlamaRuntime(LlamaWeights weights, const RuntimeOptions& options);
    ~LlamaRuntime();
    LlamaRuntime(const LlamaRuntime&) = delete;
    LlamaRuntime& operator=(const LlamaRuntime&) = delete;

    const LlamaSpec& spec() const;
    const RuntimeOptions& options() const;
    const std::string& fingerprint() const;
    bool packedWeights() const;  // some matrices are held in their stored (quantised) blocks
    // The instruction set of the decode steps' kernels ("scalar", "avx2", "avx512"), or "off"
    // (RuntimeOptions::decodeKernels false or bf16 compute).
    const char* decodeKernels() const;
    KvShape kvShape(int tokens) const;  // the shape of this model's cache for `tokens` tokens
    // "libtorch 1.13.1, 2 threads, fp32" for reports.
    std::string describe() const;

    struct Impl;
    const Impl& impl() const { return *d_; }

private:
    std::unique_ptr<Impl> d_;
};

// Progress of a long append: tokens done so far of the total. Return false to cancel (append
// then throws kvscope::Error "cancelled").
using ProgressFn = std::function<bool(int done, int total)>;

class InferenceSession {
public:
    explicit InferenceSession(const LlamaRuntime& runtime);
    ~InferenceSession();
    InferenceSession(InferenceSession&&) noexcept;

    // Replaces the cache with `kv` (any dtype; values are rounded to the runtime's kvDtype).
    // Throws kvscope::Error when its shape does not match the model.
    void loadKv(const KvSet& kv);
    // The cache as a KvSet in the runtime's kvDtype, with tokens, model name and fingerprint, the
    // RoPE table, and (after a prefill) the codec statistics querySq and valueWeight, plus
    // attnMass when RuntimeOptions::attnMass was set.
    KvSet exportKv() const;
    int position() const;          // tokens in the cache
    const std::vector<int32_t>& tokens() const;
    void truncate(int tokens);     // keeps the first `tokens` positions

    // Runs `tokens` after the cache (in blocks of prefillBlock) and appends their K/V.
    // lastLogits (vocab) receives the logits of the last token; allLogits (tokens x vocab,
    // row-major) those of every token, when not null. Throws kvscope::Error for an empty input,
    // a token id outside the vocabulary, a position past the model's limit, or cancellation.
    void append(const std::vector<int32_t>& tokens, std::vector<float>* lastLogits,
                std::vector<float>* allLogits = nullptr, const ProgressFn& progress = {});

    // Appends `trunk` (kept in the cache, like append), then runs every branch after the trunk
    // in the same forward pass, each as if it were the only one (a block-diagonal mask; branch b's
    // token o sits at position trunk end + o). The branches are not kept: the cache ends after
    // the trunk. trunkLastLogits (vocab): the trunk's last token; branchLogits[b] (tokens x vocab):
    // every token of branch b. Branches may be empty. What a multiple-choice scorer needs in one
    // pass: the question as the trunk, each option (less its last token) as a branch.
    // Throws like append.
    void appendBranches(const std::vector<int32_t>& trunk, const std::vector<std::vector<int32_t>>& branches,
                        std::vector<float>* trunkLastLogits, std::vector<std::vector<float>>* branchLogits);

    // Several independent branch sets ("groups") after the cache, in forward passes of up to
    // prefillBlock tokens: group g gets what appendBranches(trunk_g, branches_g, ...) from the
    // current cache would give, to the bit on one thread (the same per-group attention, the same
    // rows through every matrix product, whose per-row sums do not depend on how many rows share
    // the product; with more threads, elementwise kernels may split rows elsewhere and differ in
    // the last bit), while all groups' tokens share each pass over the weights. Groups of at most
    // kBranchGroupAlone tokens run one per pass, as appendBranches would (on the decode kernels). The
    // cache is left as it was; every group's trunk K/V is kept aside until the next call,
    // loadKv, or truncation below the current position, and resumeGroup(g) puts it after the
    // cache (where appendBranches leaves it) to generate after that trunk. Throws like append,
    // and for an empty trunk.
    struct BranchGroup {
        std::vector<int32_t> trunk;
        std::vector<std::vector<int32_t>> branches;
    };
    struct BranchGroupLogits {
        std::vector<float> trunkLast;                // (vocab) the trunk's last token
        std::vector<std::vector<float>> branches;    // per branch (tokens x vocab)
    };
    static constexpr int kBranchGroupAlone = 4;
    std::vector<BranchGroupLogits> appendBranchGroups(const std::vector<BranchGroup>& groups);
    // Puts group g's trunk (of the last appendBranchGroups) after the cache, which must still end
    // where it ended then. Throws kvscope::Error otherwise or for a g out of range.
    void resumeGroup(int g);
    // Runs tokens[i] after group groups[i]'s stash (its trunk, then whatever earlier calls ran after
    // it) for every i in one forward pass, and returns the logits of each one's last token (vocab):
    // what truncate to the cache's end, resumeGroup(groups[i]), append(tokens[i]) would give, to
    // the bit on one thread (each one's rows go through the products and the attention that append
    // uses for that many tokens: those of up to kWeightKernelMaxBatch tokens share one pass of the
    // decode kernels over the weights, longer ones get a product each). The tokens join their
    // group's stash; the cache is left as it was. What a scorer needs to generate the greedy
    // answers of many questions together. Throws kvscope::Error when the stash is gone (see
    // appendBranchGroups), for a group out of range or given twice, and like append.
    std::vector<std::vector<float>> extendGroups(const std::vector<int>& groups,
                                                 const std::vector<std::vector<int32_t>>& tokens);

private:
    void exportCodecStatistics(KvSet& kv) const;
    // One forward over the groups `pass` of appendBranchGroups; their logits into out.
    void runBranchPass(const std::vector<BranchGroup>& groups, const std::vector<int>& pass,
                       std::vector<BranchGroupLogits>& out);
    struct State;
    const LlamaRuntime* runtime_;
    std::unique_ptr<State> s_;
};

}  // namespace kvscope
