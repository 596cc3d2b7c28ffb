#include "cli_grammar.h"

#include "model/model.h"

#include <cstdio>
#include <mutex>
#include <set>

namespace kvscope::cli {

void ModelOpts::add(CLI::App* sub, bool attnMassFlag)
{
    sub->add_option("--model", model, "model folder, GGUF or llama2.c file (default: the embedded SmolLM2-135M)")
        ->group(kModelGroup);
    sub->add_option("--tokenizer", tokenizer, "tokenizer file (required for llama2.c checkpoints)")->group(kModelGroup);
    sub->add_option("--threads", threads, "CPU threads (0 = all cores)")->capture_default_str()->group(kModelGroup);
    sub->add_option("--compute", compute, "matmul precision: fp32 or bf16")->capture_default_str()->group(kModelGroup);
    sub->add_option("--kv-dtype", kvDtype, "precision of the KV cache: fp16, bf16 or fp32")->capture_default_str()->group(kModelGroup);
    sub->add_option("--block", block, "prefill block in tokens (bounds memory)")->capture_default_str()->group(kModelGroup);
    sub->add_option("--weights", weights,
                    "quantised weights in memory: packed (stored blocks, expanded per matmul), expanded "
                    "(to the compute dtype at load) or auto (packed when expanded would exceed 2 GiB)")
        ->capture_default_str()
        ->group(kModelGroup);
    sub->add_option("--decode-kernels", decodeKernels,
                    "decode steps (1-4 tokens) multiply the GGUF's stored blocks directly (Q4_0, Q4_1, Q5_0, Q8_0, "
                    "Q4_K, Q6_K) and one-token steps attend without BLAS (on, fp32 compute; KVSCOPE_SIMD picks the "
                    "instruction set), or every step runs as a prefill block does (off)")
        ->capture_default_str()
        ->group(kModelGroup);
    if (attnMassFlag)
        sub->add_flag("--attn-mass", attnMass,
                      "record the attention each token receives during the prefill (KvSet attn_mass, needed by the "
                      "transform codec's token_importance; a second pass over the keys; the quality commands turn it "
                      "on when a profile needs it)")
            ->group(kModelGroup);
}

RuntimeOptions ModelOpts::runtime() const
{
    RuntimeOptions o;
    o.threads = threads;
    o.prefillBlock = block;
    o.attnMass = attnMass;
    if (!parseDType(compute, &o.compute) || o.compute == DType::F16)
        throw Error("--compute: '" + compute + "' is not fp32 or bf16");
    if (!parseDType(kvDtype, &o.kvDtype)) throw Error("--kv-dtype: '" + kvDtype + "' is not fp16, bf16 or fp32");
    if (block < 1) throw Error("--block must be at least 1");
    if (weights == "packed") o.weights = RuntimeOptions::Weights::Packed;
    else if (weights == "expanded") o.weights = RuntimeOptions::Weights::Expanded;
    else if (weights != "auto") throw Error("--weights: '" + weights + "' is not auto, packed or expanded");
    if (decodeKernels != "on" && decodeKernels != "off")
        throw Error("--decode-kernels: '" + decodeKernels + "' is not on or off");
    o.decodeKernels = decodeKernels == "on";
    return o;
}

std::unique_ptr<Model> ModelOpts::open() const
{
    const RuntimeOptions ro = runtime();
    std::fprintf(stderr, "loading %s\n", resolveModelPath(model).c_str());
    return Model::open(model, tokenizer, ro);
}

CLI::Option* addContextOption(CLI::App* sub, std::string& context, bool required)
{
    auto* c = sub->add_option("--context", context, "a sample id (long_1k, long_4k, story, ...) or a UTF-8 text file")
                  ->group(kContextGroup);
    if (required) c->required();
    return c;
}

void addContinuationOption(CLI::App* sub, std::string& continuationFile)
{
    sub->add_option("--continuation", continuationFile,
                    "held-out text file scored for perplexity (default: the sample's, or X.continuation.txt next to X.txt)")
        ->group(kContextGroup);
}

void addQuestionOption(CLI::App* sub, std::string& question)
{
    sub->add_option("--question", question, "question asked after the context (default: the sample's, or the X.json sidecar's)")
        ->group(kContextGroup);
}

void addJsonFlag(CLI::App* sub, Output& out, const std::string& help)
{
    sub->add_flag("--json", out.asJson, help)->group(kOutputGroup);
}

CLI::Option* addOutOption(CLI::App* sub, std::string& path, const std::string& help, bool required)
{
    auto* o = sub->add_option("--out", path, help)->group(kOutputGroup);
    if (required) o->required();
    return o;
}

void setExample(CLI::App* sub, const std::string& example) { sub->footer("Example:\n  " + example); }

void noteDeprecated(const std::string& oldName, const std::string& newName)
{
    static std::mutex mutex;
    static std::set<std::string> said;
    const std::lock_guard<std::mutex> lock(mutex);
    if (said.insert(oldName).second) std::fprintf(stderr, "kvscope-cli: %s is deprecated, use %s\n", oldName.c_str(), newName.c_str());
}

CLI::Option* addDeprecated(CLI::App* sub, const std::string& oldName, CLI::Option* target, const std::string& newName,
                           std::function<std::string(const std::string&)> translate)
{
    // Triggered as it is parsed, so that the value reaches `target` before the options' callbacks run.
    auto forward = [oldName, newName, target, translate](const std::string& v) {
        noteDeprecated(oldName, newName);
        target->add_result(translate ? translate(v) : v);
    };
    return sub->add_option_function<std::string>(oldName, forward, "deprecated: use " + newName)->group("")->trigger_on_parse();
}

void requireInput(const std::string& value, const std::string& name)
{
    if (value.empty()) throw CLI::RequiredError(name);
}

int parseDevice(const std::string& s)
{
    if (s == "cpu") return -1;
    if (s == "cuda") return 0;
    if (s.rfind("cuda:", 0) == 0) {
        try {
            size_t used = 0;
            const int n = std::stoi(s.substr(5), &used);
            if (used == s.size() - 5 && n >= 0) return n;
        } catch (const std::exception&) {
        }
    }
    throw Error("--device: '" + s + "' is not cpu, cuda or cuda:N");
}

}  // namespace kvscope::cli
