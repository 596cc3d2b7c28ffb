// Shared plumbing of kvscope-cli: every subcommand registers itself on the CLI11 app and prints
// exactly one JSON object on stdout with --json (logs go to stderr), or readable text without.
#pragma once

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include "common/error.h"

#include <cmath>
#include <functional>
#include <string>

namespace kvscope::cli {

using kvscope::Error;

using json = nlohmann::json;

struct Output {
    bool asJson = false;
    // Prints j as one JSON object, or hands it to `text` for a human-readable rendering.
    void emit(const json& j, const std::function<void(const json&)>& text) const;
};

// Each registers a subcommand; the callback it installs runs the command.
void addStatsCommand(CLI::App& app, Output& out);
void addSynthCommand(CLI::App& app, Output& out);
void addEncodeCommand(CLI::App& app, Output& out);
void addCalibrateCommand(CLI::App& app, Output& out);
void addDecodeCommand(CLI::App& app, Output& out);
void addBenchCommand(CLI::App& app, Output& out);
void addDemoCommand(CLI::App& app, Output& out);
void addEvalCommand(CLI::App& app, Output& out);
void addProfileCommand(CLI::App& app, Output& out);
void addSensitivityCommand(CLI::App& app, Output& out);
void addSweepCommand(CLI::App& app, Output& out);
void addTuneCommand(CLI::App& app, Output& out);
void addInfoCommand(CLI::App& app, Output& out);
void addTokenizeCommand(CLI::App& app, Output& out);
void addGenerateCommand(CLI::App& app, Output& out);
void addCaptureCommand(CLI::App& app, Output& out);
void addBenchModelCommand(CLI::App& app, Output& out);  // after addBenchCommand
void addStreamCommand(CLI::App& app, Output& out);
void addServeCommand(CLI::App& app, Output& out);
void addPushCommand(CLI::App& app, Output& out);
void addVerifyCommand(CLI::App& app, Output& out);
void addFetchModelCommand(CLI::App& app, Output& out);

// Thrown by a command that has already reported its errors on stderr and only needs the process to
// exit with `code` (kvscope-cli verify: one error line per damaged place, then status 1).
struct ExitStatus {
    int code = 1;
};

// Seconds since an arbitrary epoch, for timings.
double nowSeconds();
// JSON has no infinity: finite numbers pass, others become null.
inline json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace kvscope::cli
