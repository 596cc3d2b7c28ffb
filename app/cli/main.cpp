// kvscope-cli: one subcommand per task (README.md "Command line"); with --json each prints exactly
// one JSON object on stdout. Exit 0 on success; on failure one line "error: ..." on stderr and a
// non-zero status (1 for bad input, 2 for bad usage).
#include "cli_common.h"

#include "common/error.h"
#include "kvscope/config.h"

#include <iostream>

int main(int argc, char** argv)
{
    using namespace kvscope::cli;
    CLI::App app{"kvscope-cli: inspect and tune KV-cache compression"};
    app.set_version_flag("--version", std::string("kvscope ") + KVSCOPE_VERSION);
    app.require_subcommand(1);
    Output out;
    addInfoCommand(app, out);
    addTokenizeCommand(app, out);
    addGenerateCommand(app, out);
    addCaptureCommand(app, out);
    addStatsCommand(app, out);
    addSynthCommand(app, out);
    addEncodeCommand(app, out);
    addCalibrateCommand(app, out);
    addDecodeCommand(app, out);
    addBenchCommand(app, out);
    addBenchModelCommand(app, out);
    addEvalCommand(app, out);
    addProfileCommand(app, out);
    addSensitivityCommand(app, out);
    addSweepCommand(app, out);
    addTuneCommand(app, out);
    addDemoCommand(app, out);
    addStreamCommand(app, out);
    addServeCommand(app, out);
    addPushCommand(app, out);
    addVerifyCommand(app, out);
    addFetchModelCommand(app, out);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "error: " << e.what() << " (see --help)" << std::endl;
        return 2;
    } catch (const ExitStatus& e) {
        return e.code;
    } catch (const kvscope::Error& e) {
        std::cerr << "error: " << e.what() << std::endl;
        return 1;
    } catch (const std::bad_alloc&) {
        std::cerr << "error: out of memory" << std::endl;
        return 1;
    }
    return 0;
}
