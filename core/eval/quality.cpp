#include "eval/quality.h"

#include "common/error.h"
#include "model/generate.h"

#include <chrono>
#include <cmath>

namespace kvscope {

double tokenAgreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b)
{
    const size_t n = std::max(a.size(), b.size());
    if (n == 0) return 1.0;
    size_t same = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) same += a[i] == b[i] ? 1 : 0;
    return double(same) / double(n);
}

QualityReference::QualityReference(const LlamaRuntime& runtime, EvalTask task, const KvSet& original)
    : runtime_(&runtime), task_(std::move(task))
{
    if (task_.context.size() < 2) throw Error("evaluation needs a context of at least 2 tokens");
    if (original.shape().numTokens != int(task_.context.size()))
        throw Error("the original KV holds " + std::to_string(original.shape().numTokens) + " tokens, the context " +
                    std::to_string(task_.context.size()));
    const auto t0 = std::chrono::steady_clock::now();
    ref_ = run(original, true, true);
    original_.nll = ref_.nll;
    original_.ppl = std::exp(ref_.nll);
    original_.answer = ref_.answer;
    original_.scoreSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

QualityReference::Pass QualityReference::run(const KvSet& kv, bool keepDistributions, bool withAnswer) const
{
    Pass pass;
    const int n = int(task_.context.size());
    const size_t m = task_.continuation.size();
    if (m > 0) {
        InferenceSession s(*runtime_);
        s.loadKv(kv);
        s.truncate(n - 1);
        std::vector<int32_t> input = {task_.context.back()};
        input.insert(input.end(), task_.continuation.begin(), task_.continuation.end() - 1);
        std::vector<float> logits;
        s.append(input, nullptr, &logits);
        const size_t vocab = logits.size() / m;
        std::vector<double> row;
        double nll = 0.0;
        if (keepDistributions) pass.logProbs.resize(m * vocab);
        for (size_t i = 0; i < m; ++i) {
            logSoftmax(logits.data() + i * vocab, vocab, row);
            nll -= row[size_t(task_.continuation[i])];
            if (keepDistributions)
                for (size_t v = 0; v < vocab; ++v) pass.logProbs[i * vocab + v] = float(row[v]);
            else  // keep the candidate's log-probs in place of its logits for the KL below
                for (size_t v = 0; v < vocab; ++v) logits[i * vocab + v] = float(row[v]);
        }
        pass.nll = nll / double(m);
        if (!keepDistributions) pass.logProbs = std::move(logits);
    }
    if (withAnswer && !task_.question.empty() && task_.answerTokens > 0) {
        InferenceSession s(*runtime_);
        s.loadKv(kv);
        pass.answer = generate(s, task_.question, task_.answerTokens, SamplingOptions{}, task_.stopIds).tokens;
    }
    return pass;
}

Quality QualityReference::measure(const KvSet& candidate, bool withAnswer) const
{
    const auto t0 = std::chrono::steady_clock::now();
    if (!(candidate.shape() == runtime_->kvShape(int(task_.context.size()))))
        throw Error("the candidate KV cache does not have the original's shape");
    const Pass p = run(candidate, false, withAnswer);
    Quality q;
    q.nll = p.nll;
    q.ppl = std::exp(p.nll);
    q.deltaPplPct = task_.continuation.empty() ? 0.0 : 100.0 * (q.ppl / original_.ppl - 1.0);
    const size_t m = task_.continuation.size();
    if (m > 0) {
        const size_t vocab = ref_.logProbs.size() / m;
        double kl = 0.0;
        for (size_t i = 0; i < m; ++i) {
            const float* r = ref_.logProbs.data() + i * vocab;
            const float* c = p.logProbs.data() + i * vocab;
            double sum = 0.0;
            for (size_t v = 0; v < vocab; ++v) sum += std::exp(double(r[v])) * (double(r[v]) - double(c[v]));
            kl += std::max(0.0, sum);
        }
        q.kl = kl / double(m);
    }
    q.answer = p.answer;
    q.tokenAgreement = withAnswer ? tokenAgreement(ref_.answer, p.answer) : 1.0;
    q.scoreSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return q;
}

}  // namespace kvscope
