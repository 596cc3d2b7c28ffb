// kvscope-cli verify X.kvc: every CRC, every level of every chunk decoded; one "error:" line per
// damaged place and a non-zero exit status unless all is sound.
#include "cli_common.h"
#include "cli_grammar.h"

#include "codec/verify.h"

#include <cstdio>
#include <iostream>

namespace kvscope::cli {

void addVerifyCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("verify", "Check every CRC and decode every level of every chunk of a .kvc");
    auto in = std::make_shared<std::string>();
    sub->add_option("kvc", *in, "container (.kvc)")->required();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli verify kv.kvc");
    sub->callback([in, &out] {
        const double t0 = nowSeconds();
        const auto reader = KvcReader::openFile(*in);  // header, sections and index: throws when damaged
        const KvcVerifyReport r = verifyKvc(*reader);
        json damaged = json::array();
        for (const KvcDamage& d : r.damaged) {
            std::cerr << "error: " << d.reason << std::endl;
            damaged.push_back({{"chunk", d.chunk}, {"level", d.level}, {"error", d.reason}});
        }
        out.emit({{"file", *in}, {"codec", codecName(reader->params().codec)}, {"chunks", r.chunks},
                  {"levels", r.levels}, {"checked", r.checked}, {"damaged", damaged}, {"ok", r.ok()},
                  {"seconds", nowSeconds() - t0}},
                 [](const json& j) {
                     std::printf("%s: %d chunks x %d levels checked, %zu damaged\n",
                                 j["file"].get<std::string>().c_str(), j["chunks"].get<int>(),
                                 j["levels"].get<int>(), j["damaged"].size());
                 });
        if (!r.ok()) throw ExitStatus{1};
    });
}

}  // namespace kvscope::cli
