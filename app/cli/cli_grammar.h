// The grammar of kvscope-cli, defined once (docs/cli.md "Grammar"):
// - a command's input (a KV file, a container, KV files to calibrate on) is positional;
// - options come in one group per noun, each added by one helper here, so that a spelling means
//   the same in every command: Model (ModelOpts), Context (addContextOption and friends), Codec
//   (ProfileOptions in cli_codec.h), Link (LinkOpts in cmd_stream.cpp), Output (--json, --out);
// - --device is cpu, cuda or cuda:N wherever a device is chosen; --repeats counts timed passes of
//   a benchmark, --runs repetitions of a whole measurement; an option taking a list takes
//   comma-separated values;
// - an old spelling stays as a hidden alias (group "") for one release and prints
//   "kvscope-cli: --old is deprecated, use --new" once on stderr;
// - every command's --help ends with one example line (setExample).
#pragma once

#include "cli_common.h"

#include "model/model.h"

#include <memory>
#include <string>

namespace kvscope::cli {

// Group headings as --help shows them.
inline const std::string kModelGroup = "Model";
inline const std::string kContextGroup = "Context";
inline const std::string kCodecGroup = "Codec";
inline const std::string kLinkGroup = "Link";
inline const std::string kOutputGroup = "Output";
inline const std::string kSuiteGroup = "Suite";  // eval, sweep, tune: what a quality suite scores

// The model group: what loads a model and how it runs. Every command that loads a model adds it.
struct ModelOpts {
    std::string model, tokenizer;
    int threads = 0;
    std::string compute = "fp32", kvDtype = "fp16", weights = "auto", decodeKernels = "on";
    int block = 512;
    bool attnMass = false;

    // attnMassFlag false: no --attn-mass (the command never needs the attention mass).
    void add(CLI::App* sub, bool attnMassFlag = true);
    RuntimeOptions runtime() const;
    // Logs "loading PATH" on stderr and opens the model with runtime().
    std::unique_ptr<Model> open() const;
};

// The context group. --context takes a sample id (long_1k, story, ...) or a UTF-8 text file in
// every command.
CLI::Option* addContextOption(CLI::App* sub, std::string& context, bool required);
void addContinuationOption(CLI::App* sub, std::string& continuationFile);
void addQuestionOption(CLI::App* sub, std::string& question);

// The output group: --json, and --out (what the command writes).
void addJsonFlag(CLI::App* sub, Output& out, const std::string& help = "print one JSON object");
CLI::Option* addOutOption(CLI::App* sub, std::string& path, const std::string& help, bool required);

// The one example line that `COMMAND --help` ends with (docs/make_cli.py copies it).
void setExample(CLI::App* sub, const std::string& example);

// Prints "kvscope-cli: OLD is deprecated, use NEW" on stderr, once per OLD.
void noteDeprecated(const std::string& oldName, const std::string& newName);

// OLD as a hidden alias of the option `target`: each value OLD is given (through `translate`
// when set) becomes a value of `target`, which converts and checks it under its own name.
CLI::Option* addDeprecated(CLI::App* sub, const std::string& oldName, CLI::Option* target, const std::string& newName,
                           std::function<std::string(const std::string&)> translate = {});

// A positional input that may also come through a deprecated option: a usage error when absent.
void requireInput(const std::string& value, const std::string& name);

// --device: "cpu", "cuda" or "cuda:N". The CUDA device index, or -1 for the CPU.
int parseDevice(const std::string& s);

}  // namespace kvscope::cli
