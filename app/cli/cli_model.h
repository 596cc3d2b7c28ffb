// What `info`, `capture` and `generate` compute, apart from their options and printing: the
// Python module's kvscope.Model (app/python/runtime_module.cpp) calls the same functions, so the
// two give the same cache and the same tokens.
#pragma once

#include "cli_common.h"

#include "kv/kv_set.h"
#include "model/generate.h"
#include "model/model.h"

#include <string>
#include <vector>

namespace kvscope::cli {

// `info --json`: architecture, sizes, tokenizer, fingerprint, runtime.
json modelInfoJson(const Model& m);

// `capture`: the context's prefill (Model::contextTokens: BOS, and for chat models the opened
// user turn) and the cache it leaves, with the attention statistics the runtime records
// (querySq, valueWeight; attnMass when the model was opened with RuntimeOptions::attnMass) and
// `text` as its context. *prefillSeconds (when given) receives the prefill's wall time.
KvSet captureContext(const Model& m, const std::string& text, const ProgressFn& progress = {},
                     double* prefillSeconds = nullptr);

struct GenerateRequest {
    std::string prompt;
    int maxNew = 64;
    SamplingOptions sampling;
    bool chat = false;    // without a cache: wrap the prompt in the chat format (ChatML models)
    bool noStop = false;  // do not stop at EOS / end-of-turn tokens
    // A captured context to continue (`generate KV.h5`): the prompt is then asked after it as the
    // question, as eval and stream ask theirs (Model::questionTokens), and chat is not consulted.
    const KvSet* kv = nullptr;
};

// `generate --json`: prompt_tokens (the tokens run after the cache, if any), tokens, text,
// stopped_at_eos, cached_tokens and the timings. Throws kvscope::Error for max_new < 1 and for a
// cache that does not fit the model.
json generateJson(const Model& m, const GenerateRequest& r);

}  // namespace kvscope::cli
