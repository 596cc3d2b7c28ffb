// Quality of a (decoded) KV cache against the original, measured by what a user notices: the
// model's answers and its confidence on held-out text.
//
// READ ME FIRST
//  - One QualityReference per (model, context, continuation, question): its constructor runs the
//    original KV once (continuation log-probs, next-token distributions, the greedy answer) and
//    keeps them, so measuring a candidate cache costs one scoring pass and one short generation,
//    not a prefill.
//  - Scoring from a cache of n context tokens: the cache is loaded, cut to n-1 tokens, and the
//    last context token is run again followed by the continuation, so every continuation token
//    (the first included) is scored. The last context token's own K/V is therefore recomputed
//    rather than taken from the candidate cache: 1 token of n, the same for every codec.
//  - delta_ppl_pct = 100 (ppl(candidate) / ppl(original) - 1); kl = mean over continuation
//    positions of KL(original || candidate) in nats; token_agreement = identical positions of the
//    two greedy answers / the longer answer's length (1 when both are empty).
#pragma once

#include "kv/kv_compare.h"
#include "kv/kv_set.h"
#include "model/llama_runtime.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct EvalTask {
    std::vector<int32_t> context;       // tokens whose KV is compressed (at least 2)
    std::vector<int32_t> continuation;  // held-out text scored for perplexity (may be empty)
    std::vector<int32_t> question;      // asked after the context (may be empty: no answer)
    int answerTokens = 32;              // greedy tokens generated for the answer
    std::vector<int32_t> stopIds;       // end the answer early
};

struct Quality {
    double nll = 0.0;            // mean negative log-likelihood of the continuation (nats)
    double ppl = 0.0;            // exp(nll)
    double deltaPplPct = 0.0;
    double kl = 0.0;
    double tokenAgreement = 1.0;
    std::vector<int32_t> answer;
    double scoreSeconds = 0.0;   // scoring + generation time of this measurement
};

class QualityReference {
public:
    // Runs the original cache (shape of the runtime's model, `task.context` tokens).
    QualityReference(const LlamaRuntime& runtime, EvalTask task, const KvSet& original);

    const Quality& original() const { return original_; }
    const EvalTask& task() const { return task_; }
    // Measures `candidate` (same shape as the original) against the stored reference. Without
    // the answer (withAnswer false) only the continuation is scored: one pass, no generation;
    // the answer is then empty and token_agreement is left at 1.
    Quality measure(const KvSet& candidate, bool withAnswer = true) const;

private:
    struct Pass {
        std::vector<float> logProbs;  // (continuation, vocab) log-softmax, empty without continuation
        double nll = 0.0;
        std::vector<int32_t> answer;
    };
    Pass run(const KvSet& kv, bool keepDistributions, bool withAnswer) const;

    const LlamaRuntime* runtime_;
    EvalTask task_;
    Pass ref_;
    Quality original_;
};

// Fraction of identical positions of two token sequences over the longer one (1 when both empty).
double tokenAgreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace kvscope
