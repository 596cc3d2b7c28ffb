// InferenceSession's branch passes (llama_runtime.h): appendBranches, appendBranchGroups and
// extendGroups run many independent continuations after one cache in one forward, as a
// multiple-choice scorer and its greedy answers need; the forward itself is llama_session.cpp's.
#include "model/llama_runtime_impl.h"

#include "common/error.h"

namespace kvscope {

using runtime_detail::checkTokens;
using runtime_detail::rmsNorm;

namespace {

// The positions and masks of one trunk with its branches after P0 cached slots (appendBranches'
// layout): posv receives the NT + branch tokens' RoPE positions, mask and maskLocal (T, P0 + T)
// the additive masks of global and sliding layers.
void branchMasks(const ModelConfig& c, int P0, int NT, const std::vector<std::vector<int32_t>>& branches,
                 std::vector<float>& posv, torch::Tensor& mask, torch::Tensor& maskLocal)
{
    std::vector<int> branchStart;
    int T = NT;
    for (const auto& b : branches) {
        branchStart.push_back(T);
        T += int(b.size());
    }
    // Positions: the trunk continues the cache; every branch starts right after the trunk.
    posv.assign(size_t(T), 0.0f);
    for (int i = 0; i < NT; ++i) posv[size_t(i)] = float(P0 + i);
    for (size_t b = 0; b < branches.size(); ++b)
        for (size_t o = 0; o < branches[b].size(); ++o) posv[size_t(branchStart[b]) + o] = float(P0 + NT + int(o));
    // Mask (T, P0 + T): trunk token i sees slots j <= P0 + i; branch token (b, o) sees the
    // context and the trunk (j < P0 + NT) and its own branch's slots up to itself.
    torch::Tensor allowed = torch::zeros({T, P0 + T}, torch::kBool);
    auto a = allowed.accessor<bool, 2>();
    for (int i = 0; i < NT; ++i)
        for (int j = 0; j <= P0 + i; ++j) a[i][j] = true;
    for (size_t b = 0; b < branches.size(); ++b)
        for (size_t o = 0; o < branches[b].size(); ++o) {
            const int i = branchStart[b] + int(o);
            for (int j = 0; j < P0 + NT; ++j) a[i][j] = true;
            for (int j = P0 + branchStart[b]; j <= P0 + i; ++j) a[i][j] = true;
        }
    mask = torch::zeros({T, P0 + T}).masked_fill(allowed.logical_not(), -INFINITY);
    maskLocal = mask;
    if (c.slidingWindow > 0) {  // sliding layers: slot j < P0 + NT holds position j, a branch slot its own
        torch::Tensor windowed = allowed.clone();
        auto w = windowed.accessor<bool, 2>();
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < P0 + T; ++j) {
                const float keyPos = j < P0 + NT ? float(j) : posv[size_t(j - P0)];
                if (w[i][j] && keyPos <= posv[size_t(i)] - float(c.slidingWindow)) w[i][j] = false;
            }
        maskLocal = torch::zeros({T, P0 + T}).masked_fill(windowed.logical_not(), -INFINITY);
    }
}

// Final norm and LM head of the rows `rows` of x (hidden states before the last norm): (rows, vocab).
torch::Tensor headLogits(const LlamaRuntime::Impl& d, const torch::Tensor& x, const std::vector<int64_t>& rows)
{
    const ModelConfig& c = d.spec.config;
    const torch::Tensor sel = torch::from_blob(const_cast<int64_t*>(rows.data()), {int64_t(rows.size())}, torch::kLong).clone();
    return d.linear(rmsNorm(x.index_select(0, sel), d.norm, c.rmsNormEps), d.lmHead).contiguous();
}

}  // namespace

void InferenceSession::appendBranches(const std::vector<int32_t>& trunk, const std::vector<std::vector<int32_t>>& branches,
                                      std::vector<float>* trunkLastLogits, std::vector<std::vector<float>>* branchLogits)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    if (trunk.empty()) throw Error("no tokens to run");
    std::vector<int32_t> all = trunk;
    for (const auto& b : branches) all.insert(all.end(), b.begin(), b.end());
    checkTokens(c, all);
    const int P0 = s_->length, NT = int(trunk.size()), T = int(all.size());
    if (size_t(P0) + size_t(T) > size_t(KvLimits::maxTokens))
        throw Error("context longer than " + std::to_string(KvLimits::maxTokens) + " tokens");

    c10::InferenceMode guard;
    s_->reserve(d, P0 + T);
    std::vector<float> posv;
    BlockAttention attention;
    branchMasks(c, P0, NT, branches, posv, attention.maskGlobal, attention.maskLocal);
    const torch::Tensor pos = torch::from_blob(posv.data(), {T, 1}, torch::kFloat32).clone();
    const torch::Tensor x = s_->forwardBlock(d, all.data(), T, pos, attention, false);
    // Keep the trunk; the branches' slots are scratch, overwritten by the next append.
    s_->length = P0 + NT;
    s_->tokens.insert(s_->tokens.end(), trunk.begin(), trunk.end());
    s_->stashLength = -1;
    std::vector<int64_t> rowsWanted = {NT - 1};
    for (int i = NT; i < T; ++i) rowsWanted.push_back(i);
    const torch::Tensor logits = headLogits(d, x, rowsWanted);
    const float* p = logits.data_ptr<float>();
    const size_t V = size_t(c.vocabSize);
    if (trunkLastLogits) trunkLastLogits->assign(p, p + V);
    if (branchLogits) {
        branchLogits->assign(branches.size(), {});
        for (size_t b = 0, row = 1; b < branches.size(); row += branches[b].size(), ++b)
            (*branchLogits)[b].assign(p + V * row, p + V * (row + branches[b].size()));
    }
}

std::vector<InferenceSession::BranchGroupLogits> InferenceSession::appendBranchGroups(const std::vector<BranchGroup>& groups)
{
    static_assert(kBranchGroupAlone == kWeightKernelMaxBatch, "a group alone must run as appendBranches runs it");
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    const int P0 = s_->length;
    std::vector<int> sizes;
    for (const BranchGroup& g : groups) {
        if (g.trunk.empty()) throw Error("no tokens to run");
        checkTokens(c, g.trunk);
        int T = int(g.trunk.size());
        for (const auto& b : g.branches) {
            checkTokens(c, b);
            T += int(b.size());
        }
        if (size_t(P0) + size_t(T) > size_t(KvLimits::maxTokens))
            throw Error("context longer than " + std::to_string(KvLimits::maxTokens) + " tokens");
        sizes.push_back(T);
    }
    c10::InferenceMode guard;
    s_->stashTokens.assign(groups.size(), {});
    s_->stashKeys.assign(groups.size(), std::vector<torch::Tensor>(d.layers.size()));
    s_->stashValues.assign(groups.size(), std::vector<torch::Tensor>(d.layers.size()));
    s_->stashLength = -1;
    std::vector<BranchGroupLogits> out(groups.size());
    // A group small enough for the decode kernels runs alone, as appendBranches would run it; the
    // others share passes of up to prefillBlock tokens (a larger group has one of its own).
    std::vector<std::vector<int>> passes;
    std::vector<int> batch;
    int filled = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
        if (sizes[g] <= kBranchGroupAlone) {
            passes.push_back({int(g)});
            continue;
        }
        if (!batch.empty() && filled + sizes[g] > d.options.prefillBlock) {
            passes.push_back(std::move(batch));
            batch.clear();
            filled = 0;
        }
        batch.push_back(int(g));
        filled += sizes[g];
    }
    if (!batch.empty()) passes.push_back(std::move(batch));
    for (const std::vector<int>& pass : passes) runBranchPass(groups, pass, out);
    s_->stashLength = P0;
    return out;
}

void InferenceSession::runBranchPass(const std::vector<BranchGroup>& groups, const std::vector<int>& pass,
                                     std::vector<BranchGroupLogits>& out)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    const int P0 = s_->length;
    BlockAttention attention;
    std::vector<int32_t> all;
    std::vector<float> posAll;
    int largest = 0;
    for (int g : pass) {
        const BranchGroup& bg = groups[size_t(g)];
        BlockAttention::Group span;
        span.start = int(all.size());
        span.trunk = int(bg.trunk.size());
        span.index = g;
        all.insert(all.end(), bg.trunk.begin(), bg.trunk.end());
        for (const auto& b : bg.branches) all.insert(all.end(), b.begin(), b.end());
        span.size = int(all.size()) - span.start;
        std::vector<float> posv;
        branchMasks(c, P0, span.trunk, bg.branches, posv, span.maskGlobal, span.maskLocal);
        posAll.insert(posAll.end(), posv.begin(), posv.end());
        largest = std::max(largest, span.size);
        s_->stashTokens[size_t(g)] = bg.trunk;
        attention.groups.push_back(std::move(span));
    }
    s_->reserve(d, P0 + largest);
    const int T = int(all.size());
    const torch::Tensor pos = torch::from_blob(posAll.data(), {T, 1}, torch::kFloat32).clone();
    const torch::Tensor x = s_->forwardBlock(d, all.data(), T, pos, attention, false);

    // The LM head on the rows appendBranches would read (the trunk's last token, every branch
    // token): a group with few enough rows for the decode kernels alone, as there; the others in
    // one product.
    std::vector<int64_t> sharedRows;
    std::vector<std::pair<size_t, int64_t>> sharedAt;  // (index in pass, first row in the shared product)
    auto rowsOf = [&](const BlockAttention::Group& span) {
        std::vector<int64_t> rows;
        for (int i = span.trunk - 1; i < span.size; ++i) rows.push_back(span.start + i);
        return rows;
    };
    const size_t V = size_t(c.vocabSize);
    auto deliver = [&](const BlockAttention::Group& span, const float* p) {
        BranchGroupLogits& o = out[size_t(span.index)];
        o.trunkLast.assign(p, p + V);
        const BranchGroup& bg = groups[size_t(span.index)];
        o.branches.assign(bg.branches.size(), {});
        for (size_t b = 0, row = 1; b < bg.branches.size(); row += bg.branches[b].size(), ++b)
            o.branches[b].assign(p + V * row, p + V * (row + bg.branches[b].size()));
    };
    for (size_t i = 0; i < attention.groups.size(); ++i) {
        const std::vector<int64_t> rows = rowsOf(attention.groups[i]);
        if (int(rows.size()) <= kWeightKernelMaxBatch) {
            deliver(attention.groups[i], headLogits(d, x, rows).data_ptr<float>());
        } else {
            sharedAt.emplace_back(i, int64_t(sharedRows.size()));
            sharedRows.insert(sharedRows.end(), rows.begin(), rows.end());
        }
    }
    if (sharedRows.empty()) return;
    const torch::Tensor logits = headLogits(d, x, sharedRows);
    for (const auto& [i, row] : sharedAt) deliver(attention.groups[i], logits.data_ptr<float>() + size_t(row) * V);
}

void InferenceSession::resumeGroup(int g)
{
    if (s_->stashLength < 0 || s_->length != s_->stashLength || g < 0 || size_t(g) >= s_->stashKeys.size())
        throw Error("no branch group " + std::to_string(g) + " to resume after a cache of " + std::to_string(s_->length) +
                    " tokens");
    const LlamaRuntime::Impl& d = runtime_->impl();
    c10::InferenceMode guard;
    const std::vector<int32_t>& trunk = s_->stashTokens[size_t(g)];
    const int NT = int(trunk.size());
    KVSCOPE_ASSERT(s_->stashKeys[size_t(g)].front().size(1) == NT);
    s_->reserve(d, s_->length + NT);
    for (size_t l = 0; l < d.layers.size(); ++l) {
        s_->keys[l].narrow(1, s_->length, NT).copy_(s_->stashKeys[size_t(g)][l]);
        s_->values[l].narrow(1, s_->length, NT).copy_(s_->stashValues[size_t(g)][l]);
    }
    s_->length += NT;
    s_->tokens.insert(s_->tokens.end(), trunk.begin(), trunk.end());
}

std::vector<std::vector<float>> InferenceSession::extendGroups(const std::vector<int>& groups,
                                                               const std::vector<std::vector<int32_t>>& tokens)
{
    const LlamaRuntime::Impl& d = runtime_->impl();
    const ModelConfig& c = d.spec.config;
    const int P0 = s_->length;
    if (groups.size() != tokens.size()) throw Error("extendGroups: one token list per group");
    if (s_->stashLength < 0 || P0 != s_->stashLength)
        throw Error("no branch groups to extend after a cache of " + std::to_string(P0) + " tokens");
    BlockAttention attention;
    std::vector<int32_t> all;
    std::vector<float> posAll;
    std::vector<bool> seen(s_->stashKeys.size(), false);
    int reach = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
        const int g = groups[i];
        if (g < 0 || size_t(g) >= seen.size() || seen[size_t(g)])
            throw Error("extendGroups: group " + std::to_string(g) + " is out of range or given twice");
        seen[size_t(g)] = true;
        if (tokens[i].empty()) throw Error("no tokens to run");
        checkTokens(c, tokens[i]);
        const int stashed = int(s_->stashTokens[size_t(g)].size());
        if (size_t(P0) + size_t(stashed) + tokens[i].size() > size_t(KvLimits::maxTokens))
            throw Error("context longer than " + std::to_string(KvLimits::maxTokens) + " tokens");
        attention.extends.push_back({int(all.size()), int(tokens[i].size()), g});
        all.insert(all.end(), tokens[i].begin(), tokens[i].end());
        for (size_t o = 0; o < tokens[i].size(); ++o) posAll.push_back(float(P0 + stashed + int(o)));
        reach = std::max(reach, stashed + int(tokens[i].size()));
    }
    std::vector<std::vector<float>> out(groups.size());
    if (all.empty()) return out;
    c10::InferenceMode guard;
    s_->reserve(d, P0 + reach);
    const int T = int(all.size());
    const torch::Tensor pos = torch::from_blob(posAll.data(), {T, 1}, torch::kFloat32).clone();
    const torch::Tensor x = s_->forwardBlock(d, all.data(), T, pos, attention, false);
    // The LM head on each extension's last row, as append runs it: one row.
    std::vector<int64_t> last;
    std::vector<std::pair<int, int>> rows;
    for (const BlockAttention::Extend& e : attention.extends) {
        rows.emplace_back(int(last.size()), 1);
        last.push_back(e.start + e.size - 1);
    }
    const torch::Tensor sel = torch::tensor(last);
    torch::Tensor logits = d.linearSpans(rmsNorm(x.index_select(0, sel), d.norm, c.rmsNormEps), d.lmHead, {}, rows);
    if (c.finalSoftcap > 0) logits = torch::tanh(logits / c.finalSoftcap) * c.finalSoftcap;
    logits = logits.contiguous();
    const size_t V = size_t(c.vocabSize);
    for (size_t i = 0; i < groups.size(); ++i) {
        const float* p = logits.data_ptr<float>() + i * V;
        out[i].assign(p, p + V);
        std::vector<int32_t>& stashed = s_->stashTokens[size_t(groups[i])];
        stashed.insert(stashed.end(), tokens[i].begin(), tokens[i].end());
    }
    return out;
}

}  // namespace kvscope
