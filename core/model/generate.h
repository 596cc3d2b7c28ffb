// Token selection and generation on top of an InferenceSession (torch-free).
//
//  - Greedy: the arg-max, the lowest id on ties (as llama2.c's run.c).
//  - Sampling: softmax(logits / temperature), then nucleus (top-p) truncation, then one draw from
//    a seeded 64-bit Mersenne Twister turned into a double in [0, 1) with 53 bits (no
//    std::uniform_real_distribution: its output differs between standard libraries), so a seed
//    gives the same tokens on every machine.
#pragma once

#include "model/llama_runtime.h"

#include <cstdint>
#include <random>
#include <vector>

namespace kvscope {

struct SamplingOptions {
    double temperature = 0.0;  // 0 = greedy
    double topP = 1.0;         // (0, 1]
    uint64_t seed = 0;
};

class TokenSampler {
public:
    // Throws kvscope::Error for a negative temperature or topP outside (0, 1].
    explicit TokenSampler(const SamplingOptions& options);
    int32_t next(const std::vector<float>& logits);

private:
    SamplingOptions opt_;
    std::mt19937_64 rng_;
};

// Index of the largest value; the lowest index on ties.
int32_t argmax(const float* values, size_t n);

// log softmax(logits)[id], computed in double.
double logSoftmaxAt(const float* logits, size_t n, int32_t id);
// The whole log-softmax in double.
void logSoftmax(const float* logits, size_t n, std::vector<double>& out);

struct Generation {
    std::vector<int32_t> tokens;  // generated ids, without the input
    bool stoppedAtEos = false;
    double seconds = 0.0;         // wall time of the generation loop (input included)
    double firstTokenSeconds = 0.0;  // time to the first generated token
};

// Appends `input` (at least one token) to the session, then generates up to maxNew tokens, each
// fed back, stopping after a token in stopIds (that token is kept in the output).
Generation generate(InferenceSession& session, const std::vector<int32_t>& input, int maxNew,
                    const SamplingOptions& sampling, const std::vector<int32_t>& stopIds = {});

}  // namespace kvscope
